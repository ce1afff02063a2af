"""A transformer layer as a list of GPU operations, each timed by a roofline with a measured GEMM efficiency.

Each operation costs ``max(FLOPs / (peak x e(shape)), bytes / HBM bandwidth)``:

* GEMMs (the four weight matmuls of a layer, the two batched attention
  matmuls, the LM head) by their FLOPs, 2mkn per (m x k) @ (k x n), at an
  efficiency ``e`` that grows with the GEMM's size (:class:`GemmEfficiency`),
  unless their operands and result (bytes 2(mk + kn + mn)) take longer to
  move than to multiply: the attention matmuls with their small head size are
  near that line;
* LayerNorm, the fused scale-mask-softmax, dropout (a 1-byte mask), the fused
  bias+GeLU and the fused bias+dropout+residual-add, as Megatron-LM runs them,
  by the bytes they read and write (16-bit activations).

Per layer, for one microbatch of b sequences of length s on one of t tensor
shards (hidden h, a heads, FFN f; T = sb tokens): QKV T x h x (h + 2 h_kv)/t,
scores b a/t x (s x h/a x s), context b a/t x (s x s x h/a), out-projection
T x h/t x h, fc1 T x h x f/t (2f/t gated), fc2 T x f/t x h. The LayerNorms
and the dropout-add run on all T tokens on every shard, or on T/t with
sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2).

The backward: every weight GEMM runs twice at its forward shape's size, once
for the input gradient (the I pass) and once for the weight gradient (W); the
attention matmuls twice in I (both operands need gradients); each
memory-bound operation moves twice its forward bytes in I (it reads the
saved input and the incoming gradient, writes the outgoing one).

Tensor-parallel communication (Shoeybi et al. 2019; with sequence parallelism
Korthikanti et al. 2022, sec. 4.2.2): per layer two all-reduces of the 2Th-byte
activation in the forward and two in the input-gradient pass; with sequence
parallelism each becomes a reduce-scatter plus an all-gather (the same bytes
over the wire). The group is t devices of one node (NVLink), ring
algorithms (:mod:`sim.collectives`), not overlapped with compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedules.errors import ConfigError, check_choice
from sim import collectives as coll
from sim.cluster import DeviceSpec, Link

__all__ = ["CALIBRATED", "RECOMPUTE_MODES", "GemmEfficiency", "LayerCosts", "Op", "layer_ops"]

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmEfficiency:
    """Fraction of dense peak a GEMM of ``flops`` FLOPs reaches: ``peak_fraction * flops / (flops + half_flops)``.

    A saturating curve: large GEMMs approach ``peak_fraction``; one of
    ``half_flops`` FLOPs reaches half of it (launch, tail waves, tile quantisation).
    """

    peak_fraction: float
    half_flops: float
    source: str = ""

    def __post_init__(self) -> None:
        if not 0 < self.peak_fraction <= 1:
            raise ConfigError(f"gemm efficiency: peak_fraction must be in (0, 1], got {self.peak_fraction!r}",
                              field="peak_fraction")
        if not 0 <= self.half_flops < float("inf"):
            raise ConfigError(f"gemm efficiency: half_flops must be a finite number >= 0, got {self.half_flops!r}",
                              field="half_flops")

    def __call__(self, flops: float) -> float:
        return self.peak_fraction * flops / (flops + self.half_flops)


# Calibrated once per device type; see experiments/published.py and the README ("Measured efficiency").
# A100: the two parameters were fitted (least squares on the relative error) to the four full-recomputation
# iteration times of Korthikanti et al. 2022, Table 5 (22B 1.42 s, 175B 18.13 s, 530B 49.05 s, 1T 94.42 s);
# the four sequence-parallel + selective-recomputation rows of the same table were not used in the fit and
# serve as the held-out check.
CALIBRATED: dict[str, GemmEfficiency] = {
    "A100": GemmEfficiency(peak_fraction=0.778, half_flops=3.2e10,
                           source="fitted on Korthikanti et al. 2022 Table 5, full-recomputation rows"),
}


@dataclass(frozen=True, slots=True)
class Op:
    """One GPU operation of a forward pass: its name, FLOPs, bytes moved, and whether it is a GEMM."""

    name: str
    flops: float
    bytes: float
    gemm: bool
    weight: bool = False  # a weight GEMM (has a weight-gradient GEMM in W); else an activation-activation one
    attention_core: bool = False  # recomputed by selective recomputation

    def time(self, spec: DeviceSpec, efficiency: GemmEfficiency) -> float:
        move = self.bytes / spec.memory_bw
        if not self.gemm:
            return move
        return max(self.flops / (spec.peak_flops * efficiency(self.flops)), move)


def _gemm(name: str, m: float, k: float, n: float, batch: float = 1, **kind: bool) -> Op:
    return Op(name, 2.0 * batch * m * k * n, 2.0 * batch * (m * k + k * n + m * n), True, **kind)


def layer_ops(*, hidden: int, heads: int, kv_hidden: int, ffn: int, gated: bool, seq_len: int, b: int, tp: int,
              sp: bool) -> list[Op]:
    """The forward operations of one transformer layer on one tensor shard (module docstring)."""
    h, s, t = hidden, seq_len, tp
    tokens = s * b
    rep = tokens / t if sp else tokens  # tokens of the LayerNorm / dropout region on this shard
    heads_t = heads / t
    d = h / heads
    f_out = (2 if gated else 1) * ffn / t
    score_elems = b * heads_t * s * s
    return [
        Op("layernorm1", 0.0, 4.0 * rep * h, False),
        _gemm("qkv", tokens, h, (h + 2 * kv_hidden) / t, weight=True),
        _gemm("scores", s, d, s, batch=b * heads_t, attention_core=True),
        Op("softmax", 0.0, 4.0 * score_elems, False, attention_core=True),
        Op("attn-dropout", 0.0, 5.0 * score_elems, False, attention_core=True),
        _gemm("context", s, s, d, batch=b * heads_t, attention_core=True),
        _gemm("out-proj", tokens, h / t, h, weight=True),
        Op("dropout-add1", 0.0, 7.0 * rep * h, False),
        Op("layernorm2", 0.0, 4.0 * rep * h, False),
        _gemm("fc1", tokens, h, f_out, weight=True),
        Op("gelu", 0.0, (6.0 if gated else 4.0) * tokens * ffn / t, False),
        _gemm("fc2", tokens, ffn / t, h, weight=True),
        Op("dropout-add2", 0.0, 7.0 * rep * h, False),
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCosts:
    """Seconds of one layer's passes for one microbatch on one tensor shard, split into compute and TP comm."""

    ops: tuple[Op, ...]
    spec: DeviceSpec
    efficiency: GemmEfficiency
    link: Link  # the tensor-parallel group's link (intra-node)
    tp: int
    sp: bool
    activation_bytes: float  # 2Th: the full activation a TP collective reduces or gathers

    def forward(self) -> float:
        return sum(op.time(self.spec, self.efficiency) for op in self.ops)

    def input_grad(self) -> float:
        """I: dX of every GEMM, both attention matmuls' operand gradients, memory ops at twice their bytes."""
        total = 0.0
        for op in self.ops:
            one = op.time(self.spec, self.efficiency)
            total += 2 * one if (not op.gemm or not op.weight) else one
        return total

    def weight_grad(self) -> float:
        return sum(op.time(self.spec, self.efficiency) for op in self.ops if op.weight)

    def recompute(self, mode: str) -> float:
        """Extra forward work inside the backward: the whole forward (full) or the attention core (selective)."""
        check_choice("costs", "recompute", mode, RECOMPUTE_MODES)
        if mode == "full":
            return self.forward()
        if mode == "selective":
            return sum(op.time(self.spec, self.efficiency) for op in self.ops if op.attention_core)
        return 0.0

    def tp_comm(self, collectives: int = 2) -> float:
        """``collectives`` all-reduces (or reduce-scatter + all-gather pairs with SP) of the layer activation."""
        return collectives * tp_collective(self.activation_bytes, self.tp, self.link, self.sp)

    def describe(self) -> dict[str, Any]:
        return {op.name: op.time(self.spec, self.efficiency) for op in self.ops}


def tp_collective(n: float, tp: int, link: Link, sp: bool) -> float:
    """One tensor-parallel all-reduce of n bytes, or with SP one reduce-scatter plus one all-gather."""
    if tp <= 1:
        return 0.0
    if sp:
        return 2 * coll.ring_gather(n, tp, link)
    return coll.ring_allreduce(n, tp, link)
