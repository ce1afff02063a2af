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
  by the bytes they read and write (16-bit activations);
* with ``attention = "flash"`` the scores, softmax, dropout and context are one
  fused kernel (:func:`flash_attention_flops`): causal, it computes half of
  the s x s blocks, 4bs^2h/(2t) FLOPs forward and 2.5 times that backward (the
  backward recomputes QK^T and runs four more matmuls: Dao 2023,
  FlashAttention-2, sec. 3.1), at the device's fused-attention fraction of
  peak (:class:`DeviceModel`), forward and backward apart.

FP8 (``fp8``): the weight GEMMs (forward, input and weight gradients, as
torchao's float8 training and Transformer Engine run them) at the device's FP8
peak and FP8 GEMM efficiency; attention and memory-bound operations stay 16-bit.
Each FP8 GEMM's 16-bit operand is quantized first, with current scaling
(Transformer Engine's ``Float8CurrentScaling``, the "FP8-CS" of Megatron-Bridge's
tables): a pass that takes its amax, then a cast that writes it in FP8 twice,
row-wise and transposed (Hopper's FP8 tensor cores take only the "TN" layout, so
the weight gradient needs the transpose: TE's fused cast-transpose): 2 + 2 + 2
bytes per element at HBM bandwidth (:data:`FP8_CAST_BYTES`), the input X in the
forward and the output gradient dY in the input gradient (the weight gradient
reuses both). The weights' own casts, once per step, are left out.

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
algorithms (:mod:`sim.costs.collectives`), not overlapped with compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from sim.costs import collectives as coll
from sim.costs.cluster import Cluster, DeviceSpec, Link
from sim.costs.nccl import on_cluster, runs_nccl
from sim.costs.recompute_modes import PLANNER_MODES, layer_every

__all__ = ["RECOMPUTE_MODES", "DeviceModel", "GemmEfficiency", "LayerCosts", "Op", "flash_attention_flops",
           "layer_ops"]

RECOMPUTE_MODES = PLANNER_MODES  # the planner's default choices; every policy: sim.costs.recompute_modes
FLASH_BACKWARD_FACTOR = 2.5  # the fused backward's FLOPs over its forward's (module docstring)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceModel:
    """How fast one device type runs each kind of operation (the registry with sources: :mod:`sim.costs.devices`).

    ``gemm``: a 16-bit GEMM's fraction of dense peak by its size; ``attention_forward`` and
    ``attention_backward``: a fused (flash) attention kernel's fraction of dense 16-bit peak, on the FLOPs
    it computes (causal: half the blocks); ``fp8_gemm``: an FP8 GEMM's fraction of the FP8 peak (None: the
    device has no FP8 tensor cores). Memory-bound operations run at the vendor's HBM bandwidth.
    """

    name: str
    gemm: GemmEfficiency
    attention_forward: float
    attention_backward: float
    fp8_gemm: GemmEfficiency | None = None
    comm_slowdown: float = 0.0  # compute runs 1 + this times longer while the device communicates (sim.network)
    source: str = ""


#: Bytes per element of an FP8 current-scaling quantization: the amax pass reads 2, the cast reads 2 and writes 1 row-wise
#: and 1 transposed (module docstring).
FP8_CAST_BYTES = 6


@dataclass(frozen=True, slots=True)
class Op:
    """One GPU operation of a forward pass: its name, FLOPs, bytes moved, and whether it is a GEMM."""

    name: str
    flops: float
    bytes: float
    gemm: bool
    weight: bool = False  # a weight GEMM (has a weight-gradient GEMM in W); else an activation-activation one
    attention_core: bool = False  # recomputed by selective recomputation
    fused_attention: bool = False  # a flash-attention kernel: timed at the device's attention fractions
    op_share: float = 1.0  # the share of this operation torchtitan's selective-op policy recomputes
    in_elems: float = 0.0  # a GEMM's input activation elements (m x k): quantized before an FP8 forward
    out_elems: float = 0.0  # its output elements (m x n): the output gradient quantized before an FP8 dX

    def time(self, spec: DeviceSpec, efficiency: GemmEfficiency, device: DeviceModel | None = None,
             fp8: bool = False) -> float:
        """The forward's seconds: max(FLOPs / (peak x efficiency), bytes / HBM bandwidth)."""
        move = self.bytes / spec.memory_bw
        if not self.gemm:
            return move
        if self.fused_attention and device is not None:
            return max(self.flops / (spec.peak_flops * device.attention_forward), move)
        if self.fp8_gemm(device, fp8):
            return max(self.flops / (spec.fp8_flops * device.fp8_gemm(self.flops)), move)
        return max(self.flops / (spec.peak_flops * efficiency(self.flops)), move)

    def fp8_gemm(self, device: DeviceModel | None, fp8: bool) -> bool:
        return fp8 and self.gemm and self.weight and device is not None and device.fp8_gemm is not None

    def fp8_cast_time(self, spec: DeviceSpec, device: DeviceModel | None, fp8: bool, backward: bool = False) -> float:
        """Seconds of quantizing an FP8 GEMM's 16-bit operand (module docstring): its input in the forward,
        its output gradient in the backward; 0 for an operation that does not run in FP8."""
        if not self.fp8_gemm(device, fp8):
            return 0.0
        return FP8_CAST_BYTES * (self.out_elems if backward else self.in_elems) / spec.memory_bw

    def input_grad_time(self, spec: DeviceSpec, efficiency: GemmEfficiency, device: DeviceModel | None = None,
                        fp8: bool = False) -> float:
        """The I pass: dX of a weight GEMM (its forward's size), both operands' gradients of an attention
        matmul and twice the bytes of a memory-bound operation (2x), the fused attention backward (2.5x its
        forward's FLOPs at the backward's fraction of peak)."""
        if self.fused_attention and device is not None:
            return max(FLASH_BACKWARD_FACTOR * self.flops / (spec.peak_flops * device.attention_backward),
                       2 * self.bytes / spec.memory_bw)
        one = self.time(spec, efficiency, device, fp8)
        return one if (self.gemm and self.weight) else 2 * one


def _gemm(name: str, m: float, k: float, n: float, batch: float = 1, **kind: bool | float) -> Op:
    return Op(name, 2.0 * batch * m * k * n, 2.0 * batch * (m * k + k * n + m * n), True, **kind,
              in_elems=batch * m * k, out_elems=batch * m * n)


def flash_attention_flops(*, seq_len: int, b: int, heads: float, head_dim: float, causal: bool = True) -> float:
    """Forward FLOPs a fused attention kernel computes: QK^T and PV, 2 x 2 s^2 d per head, half with a causal mask
    (the kernel skips the blocks above the diagonal; the diagonal blocks' extra is neglected)."""
    full = 4.0 * b * heads * seq_len * seq_len * head_dim
    return full / 2 if causal else full


def _attention_ops(attention: str, *, s: int, b: int, heads_t: float, d: float, kv_share: float,
                   context: int = 1) -> list[Op]:
    if attention == "flash":  # reads Q, K, V and writes the output once (16-bit), no s x s tensor in HBM
        # with context parallelism (cp ranks of s tokens each), a rank's s queries meet all cp x s keys: causal
        # and load-balanced, cp times the FLOPs of its own s x s block
        return [Op("flash-attn", context * flash_attention_flops(seq_len=s, b=b, heads=heads_t, head_dim=d),
                   2.0 * b * s * heads_t * d * (2 + 2 * kv_share), True, attention_core=True, fused_attention=True)]
    score_elems = b * heads_t * s * s
    return [_gemm("scores", s, d, s, batch=b * heads_t, attention_core=True),
            Op("softmax", 0.0, 4.0 * score_elems, False, attention_core=True),
            Op("attn-dropout", 0.0, 5.0 * score_elems, False, attention_core=True),
            _gemm("context", s, s, d, batch=b * heads_t, attention_core=True)]


# Bytes per element that a memory-bound operation reads and writes, 16-bit activations. "fused": one kernel
# (Megatron-LM's fused kernels, torch.compile): a norm reads 2 and writes 2, rotary embedding the same, a gated
# activation reads the 2f-wide input (4) and writes 2, GeLU 4. "eager": PyTorch's eager kernels as torchtitan's
# Llama runs them (torchtitan/models/llama: RMSNorm upcasts to fp32, squares, averages, scales, casts back,
# multiplies by the weight: r2 w4, r4 w4, r4, r4 w4, r4 w2, r2 w2 = 36; rotary embedding upcasts to fp32
# complex, multiplies, casts back: r2 w4, r4 w4, r4 w2 = 20; SwiGLU as silu then mul: r2 w2 + r4 w2 = 10).
ELEMENTWISE_BYTES = {"fused": {"norm": 4.0, "rope": 4.0, "swiglu": 6.0, "gelu": 4.0},
                     "eager": {"norm": 36.0, "rope": 20.0, "swiglu": 10.0, "gelu": 4.0}}


def layer_ops(*, hidden: int, heads: int, kv_hidden: int, ffn: int, gated: bool, seq_len: int, b: int, tp: int,
              sp: bool, attention: str = "unfused", elementwise: str = "fused", rotary: bool = False,
              dropout: bool = True, context: int = 1, mla: Any = None, head_dim: float = 0) -> list[Op]:
    """The forward operations of one transformer layer on one tensor shard (module docstring).

    ``elementwise``: the bytes of the norms, rotary embedding and activation (:data:`ELEMENTWISE_BYTES`);
    ``rotary``: Q and K rotated (Llama); ``dropout``: the residual adds also write a 1-byte mask;
    ``context``: the context-parallel degree (``seq_len`` is then one rank's share of the sequence).
    ``op_share``: what torchtitan's selective-op policy recomputes of each (sim.costs.recompute_modes): every
    memory-bound operation, and every second matmul (GPT: out and fc2; Llama: k, out and up).
    ``mla`` (sim.costs.moe.MLAConfig): latent attention's four projections in place of q, k, v (the two down
    projections replicated over the tensor-parallel group, the up projections split by heads), the attention
    kernel over heads of (nope + rope) query/key and v value dimensions, the output projection from heads x v.
    """
    h, s, t = hidden, seq_len, tp
    tokens = s * b
    rep = tokens / t if sp else tokens  # tokens of the LayerNorm / dropout region on this shard
    f_out = (2 if gated else 1) * ffn / t
    d = head_dim or h / heads
    q = heads * d  # the queries' width: h unless head_dim is given
    kv_share = kv_hidden / q
    qkv_share = kv_hidden / (q + 2 * kv_hidden) if gated else 0.0  # Llama recomputes k of q, k, v
    per = ELEMENTWISE_BYTES[elementwise]
    add = 7.0 if dropout else 6.0
    rope = [Op("rope", 0.0, per["rope"] * tokens * (q + kv_hidden) / t, False)] if rotary else []
    if mla is not None:
        qk, a_t = mla.nope_dim + mla.rope_dim, heads / t
        proj = [_gemm("q-down", tokens, h, mla.q_rank, weight=True), _gemm("q-up", tokens, mla.q_rank, a_t * qk, weight=True),
                _gemm("kv-down", tokens, h, mla.kv_rank + mla.rope_dim, weight=True),
                _gemm("kv-up", tokens, mla.kv_rank, a_t * (mla.nope_dim + mla.v_dim), weight=True)]
        rope = [Op("rope", 0.0, per["rope"] * tokens * (a_t + 1) * mla.rope_dim, False)] if rotary else []
        core = _attention_ops(attention, s=s, b=b, heads_t=a_t, d=(qk + mla.v_dim) / 2, kv_share=1.0, context=context)
        out = _gemm("out-proj", tokens, a_t * mla.v_dim, h, weight=True)
    else:
        proj = [_gemm("qkv", tokens, h, (q + 2 * kv_hidden) / t, weight=True, op_share=qkv_share)]
        core = _attention_ops(attention, s=s, b=b, heads_t=heads / t, d=d, kv_share=kv_share, context=context)
        out = _gemm("out-proj", tokens, q / t, h, weight=True)
    return [
        Op("layernorm1", 0.0, per["norm"] * rep * h, False),
        *proj,
        *rope,
        *core,
        out,
        Op("dropout-add1", 0.0, add * rep * h, False),
        Op("layernorm2", 0.0, per["norm"] * rep * h, False),
        _gemm("fc1", tokens, h, f_out, weight=True, op_share=0.5 if gated else 0.0),
        Op("gelu", 0.0, per["swiglu" if gated else "gelu"] * tokens * ffn / t, False),
        _gemm("fc2", tokens, ffn / t, h, weight=True, op_share=0.0 if gated else 1.0),
        Op("dropout-add2", 0.0, add * rep * h, False),
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
    device: DeviceModel | None = None  # None: a fused attention kernel is timed as a GEMM of its FLOPs
    fp8: bool = False
    cluster: Cluster | None = None  # an NCCL cluster: the TP collectives as NCCL picks them (tp_collective)
    algorithm: str = "auto"  # a forced collective algorithm (ParallelConfig.collective)

    def _t(self, op: Op) -> float:
        return op.time(self.spec, self.efficiency, self.device, self.fp8)

    def forward(self) -> float:
        return sum(self._t(op) + op.fp8_cast_time(self.spec, self.device, self.fp8) for op in self.ops)

    def input_grad(self) -> float:
        """I: dX of every GEMM, the attention core's backward, memory ops at twice their bytes (:meth:`Op.input_grad_time`),
        and under FP8 each output gradient's quantization."""
        return sum(op.input_grad_time(self.spec, self.efficiency, self.device, self.fp8)
                   + op.fp8_cast_time(self.spec, self.device, self.fp8, backward=True) for op in self.ops)

    def weight_grad(self) -> float:
        return sum(self._t(op) for op in self.ops if op.weight)

    def recompute(self, mode: str) -> float:
        """Extra forward work inside the backward (sim.costs.recompute_modes): the whole forward (full), the attention
        core (selective), each operation's ``op_share`` (selective-op), one layer's forward in N (layer:N)."""
        if mode == "full":
            return self.forward()
        if mode == "selective":
            return sum(self._t(op) for op in self.ops if op.attention_core)
        if mode == "selective-op":
            return sum(op.op_share * self._t(op) for op in self.ops if not op.fused_attention)
        if n := layer_every(mode):
            return self.forward() / n
        return 0.0

    def tp_comm(self, collectives: int = 2) -> float:
        """``collectives`` all-reduces (or reduce-scatter + all-gather pairs with SP) of the layer activation."""
        return collectives * tp_collective(self.activation_bytes, self.tp, self.link, self.sp, self.cluster,
                                           self.algorithm)

    def describe(self) -> dict[str, Any]:
        return {op.name: self._t(op) for op in self.ops}


def tp_collective(n: float, tp: int, link: Link, sp: bool, cluster: Cluster | None = None,
                  algorithm: str = "auto") -> float:
    """One tensor-parallel all-reduce of n bytes, or with SP one reduce-scatter plus one all-gather: as NCCL runs
    them inside one node of ``cluster`` when it is given and runs NCCL (sim.costs.nccl), else as rings on ``link``."""
    if tp <= 1:
        return 0.0
    if cluster is not None and runs_nccl(cluster, algorithm):
        def t(op: str) -> float:
            return on_cluster(cluster, op, n, tp, 1, algorithm).time
        return t("reduce_scatter") + t("all_gather") if sp else t("allreduce")
    if sp:
        return 2 * coll.ring_gather(n, tp, link)
    return coll.ring_allreduce(n, tp, link)
