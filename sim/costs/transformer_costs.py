"""The analytic cost model in real units: seconds from FLOPs and bytes, links with FIFO contention.

* Compute: a pass of stage s covers stage s's own layers (``partition_layers``)
  for one microbatch of ``microbatch_size`` sequences on one tensor shard;
  stage 0 adds the embedding, the last stage the LM head and the loss.
  With ``efficiency`` None (the default) each layer is a list of operations
  timed by :mod:`sim.costs.gpu_model`: GEMMs by FLOPs at the device's calibrated,
  size-dependent efficiency, the rest by the bytes they move at HBM bandwidth
  (``sim.costs.devices.DEVICE_MODELS``; a device without a model falls back to
  0.6). A number ``efficiency`` overrides: FLOPs / (tp * peak * efficiency),
  the matmuls only.
* Tensor parallelism: two all-reduces of the 2sbh-byte activation per layer in
  F and two in I (a reduce-scatter plus an all-gather each with ``parallel.sp``),
  over the node's NVLink, added to the pass (not overlapped).
* Recomputation (``recompute``): ``full`` re-runs each layer's forward (and its
  TP collectives) inside I; ``selective`` the attention core (QK^T, softmax,
  dropout, the product with V). Activations per Korthikanti et al. 2022
  (:meth:`TransformerConfig.layer_activation_bytes`).
* Recomputation as an action (an R task of the schedule, :mod:`schedules.library.recompute`):
  R re-runs the forward of the stage's transformer layers with their TP
  collectives, exactly the work ``full`` adds to I (with SP, I keeps its two
  extra all-gathers: R rebuilds the activations as F stores them). The
  recomputed microbatch's F keeps the layers' input (one layer's ``full``
  bytes: 2sbh, 2sbh/t with SP) and, on the last stage, the logits (the
  embedding and the LM head are not recomputed, as in Megatron); R holds the
  rest until the backward. Costs with ``recompute`` full refuse a schedule
  with R's (the layers would be recomputed twice); selective combines.
* An overlapped pair (OVERLAP_F_B) costs the sum of its passes less
  ``pair_overlap`` times the shorter one, as in UniformCosts.
* OPTIM (Adam, mixed precision) is memory-bound: per parameter it reads the
  fp16 gradient (2 bytes) and fp32 master weight, momentum and variance (12)
  and writes those three (12) and the fp16 weight (2): 28 bytes at HBM
  bandwidth, on the rank's shard of the parameters (1/dp under ZeRO). dp mode
  ps: the OPTIM of a stage is the parameter servers' update (on the collective
  stream, :mod:`schedules.dp.modes`): each of the K servers moves the same 28 bytes
  per parameter of its 1/K of the stage (every tensor-parallel shard) at the
  server's memory bandwidth (:func:`sim.costs.async_ps.update_time`, async-ps's too).
* A pipeline SEND moves one boundary activation (2sbh/tp bytes): alpha + n/B
  over the link between the two ranks' devices (NVLink on one node, the NIC
  across nodes).
* Collectives: :class:`sim.costs.parallel.DPGroup` (formulas in :mod:`sim.costs.collectives`)
  on the bucket's bytes (fp16 gradients or parameters, 2 bytes each, /tp).

Contention: every device has four ports (NVLink out/in, NIC out/in) and each
parameter server two (NIC out/in). A transfer holds all ports it crosses for
its whole duration; a port serves transfers one at a time in the order they
became ready (a FIFO queue per port). So two transfers on one port take the
sum of their times, not the max. (Tensor-parallel collectives sit inside the
passes and hold no port.) That is ``link_model`` fcfs; fair shares a port's
bandwidth (:mod:`sim.network`) and slows a rank's compute while it communicates
by ``contention`` (default: the device model's ``comm_slowdown``, sim.costs.devices).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from common import parse
from common.errors import ConfigError, check_fraction, check_positive_ints, quote
from schedules import Action, Kind, Stream, Task, TaskGraph
from schedules.dp.codecs import parse_compression
from schedules.dp.modes import DataParallelGraph, server_update
from schedules.timing import action_held_freed
from sim.costs import collectives as coll
from sim.costs.async_ps import update_time
from sim.costs.cluster import Cluster, Link
from sim.costs.compression import compressed_bytes, powersgd_ratio
from sim.costs.devices import DEVICE_MODELS
from sim.costs.gpu_model import DeviceModel, GemmEfficiency, LayerCosts, Op, layer_ops, tp_collective
from sim.costs.moe import DISPATCHERS, MLP_OPS, Segment, dispatch_time, expert_ops, two_stream_time
from sim.costs.nccl import on_cluster, runs_nccl
from sim.costs.parallel import PS_MODES, DPGroup, ParallelConfig
from sim.costs.recompute_modes import check_recompute, layer_every
from sim.costs.stacks import after_p2p, check_stack, pass_kernels, stack_of
from sim.costs.transformer import TransformerConfig, partition_layers
from sim.costs.uniform import memoized_durations, recomputed_in
from sim.network import Network

__all__ = ["ADAM_BYTES_PER_PARAM", "TransformerCosts"]

ADAM_BYTES_PER_PARAM = 28  # see the module docstring
DTYPES = ("bf16", "fp8")
FALLBACK_EFFICIENCY = 0.6  # a device without a calibration: the matmuls' assumed fraction of peak
_PORTS = ("intra-out", "intra-in", "inter-out", "inter-in")
# Moved in fp32 with reduce_dtype fp32: gradient reductions, and the fp32 master parameters that decentralized SGD
# exchanges (local SGD's parameter average is an ALLREDUCE too).
_FP32_KINDS = (Kind.ALLREDUCE, Kind.REDUCE_SCATTER, Kind.EXCHANGE)
_OP = {Kind.REDUCE_SCATTER: "reduce_scatter", Kind.ALL_GATHER: "all_gather"}  # NCCL's names (sim.costs.nccl)


def _is_embedding(task: Task, graph: TaskGraph) -> bool:
    """The task is one end of the embedding gradient all-reduce (:attr:`schedules.dp.modes.DPPlan.embedding`)."""
    plan = getattr(graph, "plan", None)
    return plan is not None and task.id in plan.embedding


@lru_cache(maxsize=64)
def _split(layers: int, stages: int, explicit: tuple[int, ...] | None) -> tuple[int, ...]:
    return partition_layers(layers, stages, explicit)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerCosts:
    """Durations in seconds, bytes moved, activations in bytes, and port use for contention."""

    model: TransformerConfig
    cluster: Cluster
    parallel: ParallelConfig
    microbatch_size: int = 1
    efficiency: float | None = None  # None: the device's calibrated GEMM efficiency model (module docstring)
    pair_overlap: float = 0.0
    layers_per_stage: tuple[int, ...] | None = None
    recompute: str = "none"
    dtype: str = "bf16"  # fp8: the weight GEMMs at the device's FP8 peak (sim.costs.gpu_model)
    reduce_dtype: str = "bf16"  # fp32: gradient reductions move 4 bytes per parameter (collective_bytes)
    elementwise: str = "fused"  # eager: PyTorch's unfused norm, rotary and activation kernels (sim.costs.gpu_model)
    tp_overlap: bool = False  # SP collectives hidden behind their GEMMs (Megatron --tp-comm-overlap): exposed_tp
    device_model: DeviceModel | None = None  # None: sim.costs.devices.DEVICE_MODELS of the cluster's device
    contention: float | None = None  # compute slowdown while communicating; None: the device model's (network)
    stack: str = "none"  # the training stack's p2p semantics and host costs (sim.costs.stacks)
    post_validation: bool = False  # the optimizer step goes ahead of the global gradient norm (zero-bubble's)
    moe_dispatcher: str = "alltoall"  # a MoE layer's token dispatch: alltoall or deepep (sim.costs.moe.dispatch_time)
    # rank -> its dp group: asked once per collective task (hundreds of thousands per graph), the same answer
    _groups: dict[int, DPGroup] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_positive_ints("costs", microbatch_size=self.microbatch_size)
        if self.efficiency is not None:
            check_fraction("costs", "efficiency", self.efficiency, "a fraction of peak", open_low=True)
        if isinstance(self.recompute, str):  # names are case-insensitive, as everywhere
            object.__setattr__(self, "recompute", self.recompute.lower())
        check_recompute("costs", self.recompute)
        parse.canonical_field(self, "dtype", "costs", DTYPES)
        parse.canonical_field(self, "reduce_dtype", "costs", ("bf16", "fp32"))
        parse.canonical_field(self, "elementwise", "costs", ("fused", "eager"))
        if self.parallel.cp > 1 and (self.model.attention != "flash" or self.model.seq_len % self.parallel.cp):
            raise ConfigError(f"costs: context parallelism (cp={self.parallel.cp}) is ring attention over a fused "
                              f"kernel: it needs attention flash and a sequence length divisible by cp, got "
                              f"{self.model.attention} attention and sequence {self.model.seq_len}", field="cp")
        if self.tp_overlap and not self.parallel.sp:
            raise ConfigError("costs: tp_overlap hides the sequence-parallel all-gathers and reduce-scatters behind "
                              "their GEMMs, so it needs sp (and tp > 1); add sp or leave tp_overlap out",
                              field="tp_overlap")
        if self.dtype == "fp8" and not (self.cluster.spec.fp8_flops and self.device and self.device.fp8_gemm):
            raise ConfigError(f"costs: dtype fp8 needs a device with FP8 tensor cores and an FP8 GEMM model; "
                              f"{self.cluster.spec.name} has none (valid there: bf16)", field="dtype")
        check_fraction("costs", "pair_overlap", self.pair_overlap)
        if isinstance(self.stack, str):
            object.__setattr__(self, "stack", self.stack.lower())
        check_stack("costs", self.stack)
        if not isinstance(self.post_validation, bool):
            raise ConfigError(f"costs: post_validation must be true or false, got {quote(self.post_validation)}",
                              field="post_validation")
        if self.post_validation and not stack_of(self.stack).optimizer_sync:
            raise ConfigError(f"costs: post_validation removes the optimizer's wait for the global gradient norm, "
                              f"which stack {self.stack!r} does not have; use stack megatron or torchtitan, or "
                              "leave it out", field="post_validation")
        if self.contention is not None and not (isinstance(self.contention, (int, float))
                                                and 0 <= self.contention < math.inf):
            raise ConfigError(f"costs: contention must be a finite slowdown >= 0 (0: none), got "
                              f"{quote(self.contention)}", field="contention")
        if self.layers_per_stage is not None:
            if isinstance(self.layers_per_stage, str) or not isinstance(self.layers_per_stage, Sequence):
                raise ConfigError(f"costs: layers_per_stage must be a list of layer counts, one per stage, "
                                  f"got {quote(self.layers_per_stage)}", field="layers_per_stage")
            object.__setattr__(self, "layers_per_stage", tuple(self.layers_per_stage))  # hashable, for _split
        self.parallel.check_fits(self.cluster)
        m = self.model
        self._check_moe()
        # What tp splits: the attention heads (and the K/V heads), the hidden size, the MLP's width.
        kv = {"kv_heads": m.kv_heads} if m.kv_heads != m.heads else {}
        self.parallel.check_tp(self.cluster, heads=m.heads, **kv, hidden=m.hidden, ffn=m.ffn)

    def _check_moe(self) -> None:
        parse.canonical_field(self, "moe_dispatcher", "costs", DISPATCHERS)
        m, ep = self.model.moe, self.parallel.ep
        if m is None:
            if ep > 1:
                raise ConfigError(f"costs: ep {ep} splits a MoE model's experts, and model {self.model.name!r} has "
                                  "none; use a MoE model (e.g. mixtral-8x7b, deepseek-v3) or leave ep out", field="ep")
            return
        m.check_ep(ep)
        if self.recompute == "selective-op":
            raise ConfigError(f"costs: recompute selective-op is not modelled for MoE layers (model "
                              f"{self.model.name!r}); use none, selective, full or layer:N", field="recompute")
        if self.efficiency is not None or self.device is None:
            raise ConfigError(f"costs: a MoE model is timed by the device's operation model, which "
                              f"{self.cluster.spec.name} lacks or a constant efficiency overrides; use a device "
                              f"with a model ({', '.join(DEVICE_MODELS)}) and no efficiency", field="efficiency")

    # --- per-stage figures ---------------------------------------------------------------------------
    def stage_layers(self, num_stages: int) -> tuple[int, ...]:
        return _split(self.model.layers, num_stages, self.layers_per_stage)

    def stage_moe(self, stage: int, num_stages: int) -> int:
        """How many of ``stage``'s layers are MoE layers (the dense ones come first: ``moe.dense_layers``)."""
        counts = self.stage_layers(num_stages)
        return self.model.moe_in(sum(counts[:stage]), counts[stage])

    def _moe(self, layers: int, first: bool, moe: int | None) -> int:
        """MoE layers of a stage of ``layers`` layers given by count: ``moe`` if given, else those of the first
        ``layers`` layers (the first stage) or of the last ``layers`` (any other)."""
        if moe is not None or self.model.moe is None:
            return moe or 0
        return self.model.moe_in(0 if first else self.model.layers - layers, layers)

    def stage_params(self, stage: int, num_stages: int) -> float:
        """Parameters of one stage per tensor shard: its layers; stage 0 the embedding; the last
        stage the final layer norm and its own copy of the tied word embedding (as Megatron keeps)."""
        return self.params_of(self.stage_layers(num_stages)[stage], stage == 0, stage == num_stages - 1,
                              num_stages > 1, moe=self.stage_moe(stage, num_stages))

    def params_of(self, layers: int, first: bool, last: bool, split: bool = True, moe: int | None = None) -> float:
        """:meth:`stage_params` of a stage of ``layers`` layers, the first and/or the last; ``split``: more than one
        stage; ``moe``: how many are MoE layers (:meth:`_moe`), each with its E/ep routed experts."""
        m = self.model
        n_moe = self._moe(layers, first, moe)
        n = (layers - n_moe) * m.layer_params + (n_moe * m.moe_layer_params(self.parallel.ep) if n_moe else 0)
        if first:
            n += m.embedding_params
        if last:
            n += 2 * m.hidden + (m.vocab * m.hidden if split else 0)
        return n / self.parallel.tp

    def stage_expert_params(self, stage: int, num_stages: int) -> float:
        """Of :meth:`stage_params`, the routed experts' (E/ep per MoE layer, per tensor shard): the parameters whose
        replicas are the rank's ``expert_dp`` peers rather than its dp x cp ones."""
        m = self.model
        if m.moe is None:
            return 0.0
        n = self.stage_moe(stage, num_stages) * (m.moe.experts // self.parallel.ep)
        return n * m.moe.expert_params(m.hidden, m.gated_mlp) / self.parallel.tp

    @property
    def expert_dp(self) -> int:
        """The routed experts' data-parallel degree: dp x cp / ep (Megatron-Core's expert data parallelism)."""
        p = self.parallel
        return p.dp * p.cp // p.ep

    def expert_bytes_scale(self, stage: int, num_stages: int) -> float:
        """A gradient or parameter collective's bytes relative to its bucket's: the experts' share reduces over their
        ``expert_dp`` replicas, so it moves (n - 1)/n of that group's ring against the dp x cp group's (1 without
        expert parallelism; 0 for the experts when every replica holds its own)."""
        p = self.parallel
        e, n = self.stage_expert_params(stage, num_stages), p.dp * p.cp
        if not e or p.ep == 1 or n <= 1:
            return 1.0
        total, edp = self.stage_params(stage, num_stages), self.expert_dp
        return (total - e + e * ((edp - 1) / edp) / ((n - 1) / n)) / total

    def bucket_sizes(self, stage: int, num_stages: int) -> tuple[float, ...]:
        """Bytes of each gradient/parameter bucket of a stage (fp16, 2 bytes per parameter)."""
        total, cap = 2.0 * self.stage_params(stage, num_stages), self.parallel.bucket_bytes
        return tuple(min(cap, total - k * cap) for k in range(max(1, math.ceil(total / cap))))

    def bucket_size(self, stage: int, num_stages: int, bucket: int) -> float:
        """``bucket_sizes(stage, num_stages)[bucket]`` without building the tuple (once per collective task)."""
        total, cap = 2.0 * self.stage_params(stage, num_stages), self.parallel.bucket_bytes
        if not 0 <= bucket < max(1, math.ceil(total / cap)):
            raise IndexError(f"stage {stage} has no bucket {bucket}")
        return min(cap, total - bucket * cap)

    def buckets(self, num_stages: int) -> list[int]:
        return [len(self.bucket_sizes(s, num_stages)) for s in range(num_stages)]

    def pass_flops(self, kind: Kind, stage: int, num_stages: int) -> float:
        """Hardware FLOPs of one microbatch's pass on one tensor shard (I includes recomputation). B = I + W."""
        return self.flops_of(kind, self.stage_layers(num_stages)[stage], stage == num_stages - 1,
                             moe=self.stage_moe(stage, num_stages))

    def flops_of(self, kind: Kind, layers: int, last: bool, moe: int | None = None, first: bool = False) -> float:
        """:meth:`pass_flops` of a stage of ``layers`` layers (``last``: it runs the LM head; ``moe``, ``first``:
        :meth:`_moe`)."""
        n_moe = self._moe(layers, first, moe)
        if kind is Kind.B:
            return self.flops_of(Kind.I, layers, last, n_moe) + self.flops_of(Kind.W, layers, last, n_moe)
        m, k = self.model, kind.value
        tokens = self.local.seq_len * self.microbatch_size  # per context-parallel rank
        if kind is Kind.R:  # the stage's layers' forward again (module docstring)
            return ((layers - n_moe) * m.layer_flops("F") + n_moe * m.layer_flops("F", True)) * tokens / self.parallel.tp

        def per_layer(moe_layer: bool) -> float:
            rec = m.recompute_flops(self.recompute, moe_layer) if kind is Kind.I else 0.0
            return m.layer_flops(k, moe_layer) + rec

        per_token = (layers - n_moe) * per_layer(False) + (n_moe * per_layer(True) if n_moe else 0.0)
        if last:
            per_token += m.head_flops(k)
        return per_token * tokens / self.parallel.tp

    # --- seconds of a pass -----------------------------------------------------------------------------
    @property
    def local(self) -> TransformerConfig:
        """The model as one context-parallel rank sees it: s / cp tokens of each sequence (the model itself
        without context parallelism). Attention still spans the whole sequence (:meth:`cp_exchange`)."""
        cp = self.parallel.cp
        return self.model if cp == 1 else dataclasses.replace(self.model, seq_len=self.model.seq_len // cp)

    def cp_exchange(self, kind: Kind) -> float:
        """Seconds of ring attention's K/V exchange a layer's pass leaves exposed (context parallelism).

        Each of the cp ranks holds s/cp queries and passes its K and V blocks around the ring: cp - 1 steps,
        each sending 2 x (s/cp) b h_kv / t 16-bit values over the CP link, while the attention kernel works on
        the block it has (Liu et al. 2023, "Ring Attention"); the backward sends K, V and their gradients
        (twice the bytes). Only the time the exchange exceeds the attention kernel's is exposed.
        """
        p, m = self.parallel, self.local
        if p.cp == 1 or kind is Kind.W:
            return 0.0
        block = 2 * 2.0 * m.seq_len * self.microbatch_size * m.kv_hidden / p.tp
        width = p.tp * p.cp
        cl = self.cluster
        first_node = cl.node_size or sum(1 for d in cl.devices if d.node == cl.devices[0].node)
        per_node = min(first_node, width)
        link = self.cluster.intra if width <= per_node else self.cluster.inter
        lc = self.layer_costs()
        attn = [op for op in lc.ops if op.fused_attention]
        if kind is Kind.I:
            ring, kernel = 2 * (p.cp - 1) * link.time(block), sum(
                op.input_grad_time(lc.spec, lc.efficiency, lc.device, lc.fp8) for op in attn)
        else:
            ring, kernel = (p.cp - 1) * link.time(block), sum(lc._t(op) for op in attn)
        return max(0.0, ring - kernel)

    @property
    def device(self) -> DeviceModel | None:
        """The device model timing each operation (sim.costs.devices); None for a device without one."""
        return self.device_model or DEVICE_MODELS.get(self.cluster.spec.name)

    @property
    def gemm_efficiency(self) -> GemmEfficiency | None:
        """The operation-level model's GEMM efficiency; None when a constant ``efficiency`` applies."""
        if self.efficiency is not None or self.device is None:
            return None
        return self.device.gemm

    @property
    def matmul_efficiency(self) -> float:
        """The constant fraction of peak in use (an override, or the fallback of an uncalibrated device)."""
        return self.efficiency if self.efficiency is not None else FALLBACK_EFFICIENCY

    def layer_costs(self) -> LayerCosts:
        m, p = self.local, self.parallel
        ops = layer_ops(hidden=m.hidden, heads=m.heads, kv_hidden=m.kv_hidden, ffn=m.ffn, gated=m.gated_mlp,
                        seq_len=m.seq_len, b=self.microbatch_size, tp=p.tp, sp=p.sp, attention=m.attention,
                        elementwise=self.elementwise, rotary=not m.learned_positions, dropout=m.dropout,
                        context=p.cp, mla=m.mla, head_dim=m.head_dim)
        return LayerCosts(ops=tuple(ops), spec=self.cluster.spec,
                          efficiency=self.gemm_efficiency or GemmEfficiency(peak_fraction=self.matmul_efficiency,
                                                                            half_flops=0.0),
                          link=self.cluster.intra, tp=p.tp, sp=p.sp, activation_bytes=self.tp_bytes(),
                          device=self.device if self.gemm_efficiency is not None else None, fp8=self.dtype == "fp8",
                          cluster=self.cluster, algorithm=p.collective)

    def moe_costs(self, part: str = "layer") -> LayerCosts:
        """A MoE layer's operations as a :class:`LayerCosts`: its attention block and experts (``part`` layer),
        the attention block alone (attention) or the experts alone (experts; sim.costs.moe.expert_ops)."""
        lc, m, p = self.layer_costs(), self.local, self.parallel
        attention = [op for op in lc.ops if op.name not in MLP_OPS]
        if part == "attention":
            return dataclasses.replace(lc, ops=tuple(attention))
        experts = expert_ops(m, tokens=m.seq_len * self.microbatch_size, tp=p.tp, ep=p.ep, elementwise=self.elementwise)
        return dataclasses.replace(lc, ops=tuple(experts if part == "experts" else attention + experts))

    def all_to_all_time(self) -> float:
        """Seconds of one dispatch (or combine) all-to-all of a MoE layer over the ep group (sim.costs.moe): each
        rank's tokens (its sequence shard with SP) x top_k x h 16-bit values, the busiest rank's share."""
        m, p = self.local, self.parallel
        if m.moe is None or p.ep == 1:
            return 0.0
        tokens = m.seq_len * self.microbatch_size / (p.tp if p.sp else 1)
        return dispatch_time(m.moe, tokens, m.hidden, p.ep, p.tp, self.cluster, self.moe_dispatcher)

    def all_to_alls(self, kind: Kind) -> float:
        """All-to-alls per MoE layer in a pass: dispatch and combine in F and R, their gradients in I (and B), and
        again in I the recomputation's (full: 2, layer:N: 2/N); none in W."""
        if kind is Kind.W:
            return 0.0
        if kind is not Kind.I and kind is not Kind.B:
            return 2.0
        rec = 2.0 if self.recompute == "full" else 2.0 / n if (n := layer_every(self.recompute)) else 0.0
        return 2.0 + rec

    def tp_bytes(self) -> float:
        """Bytes of one tensor-parallel collective's full buffer: the 16-bit activation, 2sbh."""
        return self.local.boundary_bytes(self.microbatch_size)

    def tp_comm(self, kind: Kind, stage: int, num_stages: int) -> float:
        """Seconds of the pass's tensor-parallel collectives: 2 per layer in F and in I (+2 in I if full
        recomputation, +2 all-gathers with SP otherwise); the embedding's one in F (stage 0) and the LM
        head's input gradient in I (last stage)."""
        return self.tp_comm_of(kind, self.stage_layers(num_stages)[stage], stage == 0, stage == num_stages - 1)

    def tp_comm_of(self, kind: Kind, layers: int, first: bool, last: bool) -> float:
        """:meth:`tp_comm` of a stage of ``layers`` layers, the first and/or the last."""
        p = self.parallel
        if p.tp <= 1 or kind is Kind.W:
            return 0.0
        if kind is Kind.B:
            return self.tp_comm_of(Kind.I, layers, first, last)
        one = tp_collective(self.tp_bytes(), p.tp, self.cluster.intra, p.sp, self.cluster, p.collective)
        if kind is Kind.R:
            return layers * 2 * one
        per_layer = 2 + (self._recompute_collectives() if kind is Kind.I else 0)
        if kind is Kind.I and p.sp and self.recompute != "full":
            # SP keeps only its shard of the inputs of QKV and fc1 and gathers them again for the weight
            # gradients: two more all-gathers, half a collective pair each (Korthikanti et al. 2022, sec. 4.2.2)
            per_layer += 1
        count = layers * per_layer
        if kind is Kind.F and first:
            count += 1
        if kind is Kind.I and last:
            count += 1
        return count * one

    def _recompute_collectives(self) -> float:
        """TP collectives per layer the recomputation repeats: full 2, layer:N 2/N, selective-op 1 (out-proj's)."""
        if self.recompute == "full":
            return 2.0
        if n := layer_every(self.recompute):
            return 2.0 / n
        return 1.0 if self.recompute == "selective-op" else 0.0

    def _edge_ops(self, first: bool, last: bool) -> list[Op]:
        """Forward operations outside the layers: the embedding (stage 0); final norm, LM head, loss (last)."""
        m, p, b = self.local, self.parallel, self.microbatch_size
        tokens = m.seq_len * b
        rep = tokens / p.tp if p.sp else tokens
        ops = []
        if first:
            ops.append(Op("embedding", 0.0, 4.0 * tokens * m.hidden + 5.0 * rep * m.hidden, False))
        if last:
            v = m.vocab / p.tp
            ops += [Op("final-norm", 0.0, 4.0 * rep * m.hidden, False),
                    Op("lm-head", 2.0 * tokens * m.hidden * v, 2.0 * (tokens * m.hidden + m.hidden * v + tokens * v),
                       True, weight=True),
                    Op("cross-entropy", 0.0, 10.0 * tokens * v, False)]  # 16-bit logits in, fp32 softmax out
        return ops

    def pass_time(self, kind: Kind, stage: int, num_stages: int) -> float:
        """Seconds of one microbatch's pass of ``stage`` on one tensor shard: compute plus TP collectives, at
        least the host time to launch its kernels (:meth:`host_time`)."""
        layers = self.stage_layers(num_stages)[stage]
        gpu = self.time_of(kind, layers, stage == 0, stage == num_stages - 1, self.stage_moe(stage, num_stages))
        return max(gpu, self.host_time(kind, layers))

    def host_time(self, kind: Kind, layers: int) -> float:
        """Seconds the stack's host takes to launch a pass's kernels (sim.costs.stacks: ``launch_s`` per kernel;
        0 with stack none, or with a constant ``efficiency``, which times FLOPs alone)."""
        launch = stack_of(self.stack).launch_s
        if not launch or self.gemm_efficiency is None:
            return 0.0
        ops = self.layer_costs().ops
        return launch * layers * pass_kernels(len(ops), sum(op.weight for op in ops), kind)

    def fsdp_copy_out(self, stage: int, num_stages: int, bucket: int) -> float:
        """Seconds of FSDP2's copy-out after one bucket's all-gather: its 16-bit bytes read and written at HBM
        bandwidth (sim.costs.stacks ``fsdp_copies``)."""
        return 2 * self.bucket_size(stage, num_stages, bucket) / self.cluster.spec.memory_bw

    def fsdp_copy_in(self, stage: int, num_stages: int, bucket: int) -> float:
        """Seconds of FSDP2's copy-in before one bucket's reduce-scatter: per element a 16-bit read and a write
        in the reduce dtype (sim.costs.stacks ``fsdp_copies``)."""
        elements = self.bucket_size(stage, num_stages, bucket) / 2
        return elements * (2 + (4 if self.reduce_dtype == "fp32" else 2)) / self.cluster.spec.memory_bw

    def _fsdp_copies(self, graph: TaskGraph, lag: list[float]) -> None:
        n_st, tasks = graph.schedule.num_stages, graph.tasks
        for t in tasks:
            a = t.action
            if t.stream is Stream.COLLECTIVE and a.kind is Kind.REDUCE_SCATTER and not _is_embedding(t, graph):
                lag[t.id] += self.fsdp_copy_in(a.stage, n_st, a.bucket or 0)
            elif a.is_compute:
                for d in t.deps:
                    g = tasks[d].action
                    if g.kind is Kind.ALL_GATHER:
                        lag[t.id] += self.fsdp_copy_out(g.stage, n_st, g.bucket or 0)

    def p2p_gather_time(self) -> float:
        """Seconds of the received boundary tensor's all-gather over the TP group (stack megatron-legacy without
        SP: sim.costs.stacks ``p2p_gather``), as the TP collectives are timed; 0 with SP or tp 1."""
        p = self.parallel
        if p.tp <= 1 or p.sp:
            return 0.0
        c, n = self.cluster, self.local.boundary_bytes(self.microbatch_size)
        if runs_nccl(c, p.collective):
            return on_cluster(c, "all_gather", n, p.tp, 1, p.collective).time
        return coll.ring_gather(n, p.tp, c.intra)

    def optimizer_fixed(self, stage: int, num_stages: int) -> float:
        """The optimizer step's fixed part (sim.costs.stacks ``optimizer_sync``): the global gradient norm's
        all-reduce of one fp32 value over the rank's model-parallel group (its pp x tp x cp ranks, NCCL's pick)
        and the host synchronize that reads it; 0 without the sync or with ``post_validation``."""
        st = stack_of(self.stack)
        if not st.optimizer_sync or self.post_validation:
            return 0.0
        p, c = self.parallel, self.cluster
        devs = {p.device(r, 0, t, k) for r in range(p.pp) for t in range(p.tp) for k in range(p.cp)}
        nodes = len({c.devices[g].node for g in devs})
        if c.backend == "nccl":
            norm = on_cluster(c, "allreduce", 4.0, len(devs), nodes).time
        else:
            norm = coll.ring_allreduce(4.0, len(devs), c.intra if nodes == 1 else c.inter)
        return norm + st.launch_s

    def time_of(self, kind: Kind, layers: int, first: bool, last: bool, moe: int | None = None) -> float:
        """:meth:`pass_time` of a stage of ``layers`` layers, the first and/or the last (the same arithmetic);
        ``moe`` of them MoE layers (:meth:`_moe`), each with its all-to-alls (:meth:`all_to_alls`) exposed."""
        n_moe = self._moe(layers, first, moe)
        comm = self.tp_comm_of(kind, layers, first, last)
        if self.gemm_efficiency is None:
            return self.flops_of(kind, layers, last) / (self.cluster.spec.peak_flops * self.matmul_efficiency) + comm
        if kind is Kind.B:
            return self.time_of(Kind.I, layers, first, last, n_moe) + self.time_of(Kind.W, layers, first, last, n_moe)
        lc, n = self.layer_costs(), layers - n_moe
        lm = self.moe_costs() if n_moe else lc
        edge = [lc._t(op) for op in self._edge_ops(first, last)]
        edge_w = [lc._t(op) for op in self._edge_ops(first, last) if op.weight]
        a2a = n_moe * self.all_to_alls(kind) * self.all_to_all_time() if n_moe else 0.0
        if kind is not Kind.W:
            comm = self.exposed_tp(comm, n * lc.weight_grad() + n_moe * lm.weight_grad())  # the weight GEMMs
            comm += layers * self.cp_exchange(Kind.F if kind is Kind.R else kind)
        if kind is Kind.F:
            return n * lc.forward() + n_moe * lm.forward() + sum(edge) + comm + a2a
        if kind is Kind.R:
            return n * lc.recompute("full") + n_moe * lm.recompute("full") + comm + a2a
        if kind is Kind.I:
            return (n * (lc.input_grad() + lc.recompute(self.recompute))
                    + n_moe * (lm.input_grad() + lm.recompute(self.recompute))
                    + 2 * sum(edge) - sum(edge_w) + comm + a2a)
        return n * lc.weight_grad() + n_moe * lm.weight_grad() + sum(edge_w)

    def exposed_tp(self, comm: float, gemms: float) -> float:
        """Seconds of a pass's TP collectives left on its critical path. Without ``tp_overlap``, all of them.

        With it (Megatron-LM --tp-comm-overlap, Transformer Engine's userbuffers), each sequence-parallel
        all-gather is split into chunks pipelined with the GEMM that consumes it, and each reduce-scatter with
        the GEMM that produces it: the collectives run under the pass's weight GEMMs (``gemms``: the forward
        GEMMs in F, the dX and recomputed GEMMs in I), and only what exceeds them is exposed. The GEMMs are
        not slowed by the SMs the communication kernels take (not modelled).
        """
        return max(0.0, comm - gemms) if self.tp_overlap else comm

    def stage_activations(self, stage: int, num_stages: int) -> float:
        """Bytes a microbatch's pass of ``stage`` keeps per tensor shard; the last stage adds its fp32 logits."""
        return self.activations_of(self.stage_layers(num_stages)[stage], stage == num_stages - 1,
                                   moe=self.stage_moe(stage, num_stages))

    def activations_of(self, layers: int, last: bool, moe: int | None = None, first: bool = False) -> float:
        """:meth:`stage_activations` of a stage of ``layers`` layers (``last``: it holds the logits; ``moe``,
        ``first``: :meth:`_moe`)."""
        m, b, p = self.local, self.microbatch_size, self.parallel
        n_moe = self._moe(layers, first, moe)
        held = (layers - n_moe) * m.layer_activation_bytes(b, p.tp, p.sp, self.recompute)
        if n_moe:
            held += n_moe * m.layer_activation_bytes(b, p.tp, p.sp, self.recompute, moe=True)
        if last:
            held += m.head_activation_bytes(b) / p.tp
        return held

    def recompute_kept(self, stage: int, num_stages: int) -> float:
        """Bytes a forward that an R recomputes keeps: its layers' input, and the last stage's logits."""
        m, b, p = self.local, self.microbatch_size, self.parallel
        kept = m.layer_activation_bytes(b, p.tp, p.sp, "full") if self.stage_layers(num_stages)[stage] else 0.0
        if stage == num_stages - 1:
            kept += m.head_activation_bytes(b) / p.tp
        return kept

    def _check_recompute(self, graph: TaskGraph) -> frozenset[tuple[int, int | None]]:
        recomputed = recomputed_in(graph)
        if recomputed and self.recompute == "full":
            raise ConfigError(f"schedule {graph.schedule.name!r} recomputes with R actions and the costs' recompute "
                              "is full, which recomputes every layer inside I as well; use recompute none or "
                              "selective with a schedule that has R's", field="recompute")
        return recomputed

    # --- the CostModel protocol ---------------------------------------------------------------------------
    def _compute(self, action: Action, n_st: int) -> float:
        times = [self.pass_time(a.kind, a.stage, n_st) for a in action.parts()]
        if action.sub_actions is not None:
            if self.pair_overlap or not self.all_to_all_time():
                return sum(times) - self.pair_overlap * min(times)
            return two_stream_time([self.segments(a.kind, a.stage, n_st) for a in action.parts()])
        return times[0]

    def segments(self, kind: Kind, stage: int, num_stages: int) -> list[Segment]:
        """One pass of ``stage`` as compute and all-to-all segments (sim.costs.moe.two_stream_time), in the
        order it runs them: per MoE layer in F its attention block, dispatch, experts, combine; in I and B (the
        layers reversed) the combine's gradient, the experts, the dispatch's gradient, the attention block (after
        the recomputed forward's own all-to-alls, with full recomputation). The rest of the pass (dense layers,
        embedding, head, TP and CP communication) is one compute segment before (F) or after (I, B) them; the
        segments add up to :meth:`pass_time`."""
        total = self.pass_time(kind, stage, num_stages)
        n_moe, a2a = self.stage_moe(stage, num_stages), self.all_to_all_time()
        if kind is Kind.W or not n_moe or not a2a:
            return [Segment(total)]
        att, exp = self.moe_costs("attention"), self.moe_costs("experts")
        rec = self.all_to_alls(kind) - 2  # the recomputation's all-to-alls per layer (I, B)
        if kind in (Kind.F, Kind.R):
            a_t, e_t = att.forward(), exp.forward()
        else:
            a_t = att.input_grad() + att.recompute(self.recompute) + (att.weight_grad() if kind is Kind.B else 0.0)
            e_t = exp.input_grad() + exp.recompute(self.recompute) + (exp.weight_grad() if kind is Kind.B else 0.0)
        rest = total - n_moe * (a_t + e_t + (2 + rec) * a2a)
        if kind in (Kind.F, Kind.R):
            layer = [Segment(a_t, name="attention"), Segment(a2a, True, "dispatch"), Segment(e_t, name="experts"),
                     Segment(a2a, True, "combine")]
            return [Segment(rest, name="rest"), *layer * n_moe]
        layer = [*([Segment(a2a * rec / 2, True, "recompute-dispatch"), Segment(a2a * rec / 2, True,
                                                                                "recompute-combine")] if rec else []),
                 Segment(a2a, True, "combine-grad"), Segment(e_t, name="experts"), Segment(a2a, True, "dispatch-grad"),
                 Segment(a_t, name="attention")]
        return [*layer * n_moe, Segment(rest, name="rest")]

    def optim_time(self, stage: int, n_st: int) -> float:
        """Seconds of one stage's optimizer step on its rank (see the module docstring)."""
        return self._optim(stage, n_st)

    def server_update_time(self, stage: int, n_st: int) -> float:
        """Seconds of the parameter servers' update of one stage (dp modes ps and async-ps; module docstring)."""
        servers = max(len(self.cluster.pservers), 1)
        return update_time(self.stage_params(stage, n_st) * self.parallel.tp, servers,
                           self.cluster.pserver_spec.memory_bw, ADAM_BYTES_PER_PARAM)

    def _optim(self, stage: int, n_st: int) -> float:
        sharded = self.parallel.dp_mode in ("zero1", "zero2", "zero3", "fsdp")
        shard = self.parallel.dp if sharded else 1
        experts = self.stage_expert_params(stage, n_st)
        params = (self.stage_params(stage, n_st) - experts) / shard + experts / (self.expert_dp if sharded else 1)
        return ADAM_BYTES_PER_PARAM * params / self.cluster.spec.memory_bw + self.optimizer_fixed(stage, n_st)

    def collective_bytes(self, kind: Kind, stage: int, num_stages: int, bucket: int) -> float:
        """Bytes of one bucket's collective: the 16-bit bucket, twice that for a gradient reduction (all-reduce,
        reduce-scatter) in fp32 (``reduce_dtype``, torchtitan's default ``mixed_precision_reduce``)."""
        n = self.bucket_size(stage, num_stages, bucket) * self.expert_bytes_scale(stage, num_stages)
        if kind not in _FP32_KINDS:
            return n
        comp = parse_compression(self.parallel.grad_compression)
        if comp.exact or kind is Kind.EXCHANGE:  # a codec applies to gradient reductions only
            return 2 * n if self.reduce_dtype == "fp32" else n
        # a codec's bytes (sim.costs.compression): int8 + scales, PowerSGD's (n + m) R per matrix, 16-bit casts
        ratio = 1.0 if comp.codec != "powersgd" else powersgd_ratio(
            self.model, self.stage_layers(num_stages)[stage], stage == 0, stage == num_stages - 1, num_stages > 1,
            comp.rank)
        return compressed_bytes(comp, n, 4 if self.reduce_dtype == "fp32" else 2,
                                self.parallel.dp * self.parallel.cp, ratio)

    def codec_time(self, kind: Kind, stage: int, num_stages: int, bucket: int) -> float:
        """Seconds of a gradient reduction's compress and decompress (``parallel.codec_ns_per_param`` per element
        of the bucket; sim.costs.compression), 0 for other collectives."""
        if kind not in (Kind.ALLREDUCE, Kind.REDUCE_SCATTER) or not self.parallel.codec_ns_per_param:
            return 0.0
        return self.parallel.codec_ns_per_param * 1e-9 * self.bucket_size(stage, num_stages, bucket) / 2

    def _collective(self, task: Task, graph: TaskGraph) -> float:
        if _is_embedding(task, graph):
            return self.embedding_allreduce(self._embedding_link(graph))
        a, n_st = task.action, graph.schedule.num_stages
        n = self.collective_bytes(a.kind, a.stage, n_st, a.bucket or 0)
        group = self.group(task.rank)
        if self.parallel.dp_mode in PS_MODES:
            return group.ps(n, alone=self.parallel.dp_mode == "async-ps")
        if self.parallel.dp <= 1:
            return 0.0
        if a.kind is Kind.EXCHANGE:
            return group.exchange(n)
        codec = self.codec_time(a.kind, a.stage, n_st, a.bucket or 0)
        return codec + (group.allreduce(n) if a.kind is Kind.ALLREDUCE else group.gather(n, _OP[a.kind]))

    def embedding_allreduce(self, link: Link, latency: bool = False) -> float:
        """The tied embedding's all-reduce between the first and the last stage's devices, over ``link``: NCCL's
        two-rank all-reduce on a GPU cluster (sim.costs.nccl), a two-rank ring otherwise; ``latency``: its
        latency part."""
        c, n = self.cluster, self.embedding_bytes()
        if runs_nccl(c, self.parallel.collective):
            ch = on_cluster(c, "allreduce", n, 2, 1 if link is c.intra else 2, self.parallel.collective)
            return ch.latency if latency else ch.time
        return coll.ring_allreduce(0.0 if latency else n, 2, link)

    def group(self, rank: int) -> DPGroup:
        found = self._groups.get(rank)
        if found is None:
            found = self._groups[rank] = self.parallel.group(self.cluster, rank)
        return found

    def duration(self, task: Task, graph: TaskGraph) -> float:
        a, n_st = task.action, graph.schedule.num_stages
        if a.is_compute:
            return self._compute(a, n_st)
        if server_update(task):  # ps: the servers' update (schedules.dp.modes)
            return self.server_update_time(a.stage, n_st)
        if a.kind is Kind.OPTIM:
            return self._optim(a.stage, n_st)
        if a.kind in (Kind.SEND_F, Kind.SEND_B):
            p = self.parallel
            link = self.cluster.link_between(p.device(task.rank), p.device(task.peer))
            return link.time(self.bytes(task, graph))
        if task.stream is Stream.COLLECTIVE:
            return self._collective(task, graph)
        return 0.0

    def durations(self, graph: TaskGraph) -> list[float]:
        """A task's cost depends on where it runs and what it does, never on the microbatch."""
        self._check_recompute(graph)
        return memoized_durations(self, graph, lambda t: (
            t.rank, t.peer, t.action.kind, t.action.stage, t.action.bucket,
            None if t.action.sub_actions is None else tuple((p.kind, p.stage) for p in t.action.sub_actions)))

    def bytes(self, task: Task, graph: TaskGraph) -> float:
        a = task.action
        if a.kind in (Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B):
            return self.local.boundary_bytes(self.microbatch_size) / self.parallel.tp
        if task.stream is Stream.COLLECTIVE and not server_update(task):  # ps's server update moves no bytes
            if _is_embedding(task, graph):
                return self.embedding_bytes()
            return self.collective_bytes(a.kind, a.stage, graph.schedule.num_stages, a.bucket or 0)
        return 0.0

    # --- the tied word embedding's gradient all-reduce between the first and the last stage (schedules.dp.modes) ---
    def embedding_bytes(self) -> float:
        """The word embedding's 16-bit gradient on one tensor shard: 2 V h / tp bytes."""
        return 2.0 * self.model.vocab * self.model.hidden / self.parallel.tp

    def _embedding_link(self, graph: TaskGraph) -> Link:
        s2r, p = graph.schedule.stage_to_rank, self.parallel
        return self.cluster.link_between(p.device(s2r[0]), p.device(s2r[-1]))

    def activations(self, action: Action, graph: TaskGraph) -> tuple[float, float]:
        """Bytes held / freed by a pass: W keeps ``w_held_fraction`` after I (ZB Megatron's; ours holds all)."""
        n_st, mw = graph.schedule.num_stages, self.model.w_held_fraction(self.recompute)
        return action_held_freed(action, lambda a: self.stage_activations(a.stage, n_st), mw,
                                 self._check_recompute(graph), kept_of=lambda a: self.recompute_kept(a.stage, n_st))

    # --- contention: delays and ports (the engine's optional ``network`` hook) -------------------------
    def network(self, graph: TaskGraph, dur: list[float]) -> Network:
        """Per task: the delay after its dependencies before it is ready, the ports it crosses, and its
        latency (its duration at zero bytes); ports shared as ``parallel.link_model`` says (:mod:`sim.network`)."""
        lag = [0.0] * len(graph.tasks)
        plan = graph.plan if isinstance(graph, DataParallelGraph) else None
        if plan is not None:
            for c, (anchor, frac) in plan.ready.items():
                lag[c] = frac * dur[anchor]
        st = stack_of(self.stack)
        if st.blocking(graph):  # after a blocking send/receive the host synchronizes, then launches (stacks)
            gather = self.p2p_gather_time() if st.p2p_gather else 0.0
            for i, received in after_p2p(graph):
                lag[i] += st.launch_s + (gather if received else 0.0)
        if st.fsdp_copies and self.parallel.dp_mode in ("zero2", "zero3", "fsdp") and self.parallel.dp > 1:
            self._fsdp_copies(graph, lag)
        n_dev = self.cluster.num_devices
        port = {name: i * n_dev for i, name in enumerate(_PORTS)}
        ps0 = len(_PORTS) * n_dev  # parameter-server ports after the devices' ports
        links: list[tuple[int, ...]] = []
        p = self.parallel
        for t in graph.tasks:
            if t.stream is Stream.SEND:
                a, b = p.device(t.rank), p.device(t.peer)
                kind = "intra" if self.cluster.devices[a].node == self.cluster.devices[b].node else "inter"
                links.append((port[kind + "-out"] + a, port[kind + "-in"] + b))
            elif t.stream is Stream.COLLECTIVE and dur[t.id] > 0 and _is_embedding(t, graph):
                kind = "intra" if self._embedding_link(graph) is self.cluster.intra else "inter"
                links.append((port[kind + "-out"] + p.device(t.rank), port[kind + "-in"] + p.device(t.rank)))
            elif t.stream is Stream.COLLECTIVE and dur[t.id] > 0 and not server_update(t):
                links.append(self._collective_ports(t.rank, port, ps0))
            else:
                links.append(())
        memo: dict[tuple, float] = {}  # a transfer's latency depends on where it runs and what it is, not on the microbatch
        latency = [0.0] * len(links)
        for t, ports in zip(graph.tasks, links, strict=True):
            if ports:
                key = (t.rank, t.peer, t.action.kind, t.id in plan.embedding if plan is not None else False)
                if key not in memo:
                    memo[key] = self.latency(t, graph)
                latency[t.id] = memo[key]
        # one communicator per rank's data-parallel group (another for the embedding's): each runs its
        # collectives one at a time, in order
        n_r = graph.num_ranks
        queue = [-1 if t.stream is not Stream.COLLECTIVE or server_update(t)  # ps: the servers' update
                 else n_r + t.rank if _is_embedding(t, graph) else t.rank for t in graph.tasks]
        return Network(lag=lag, links=links, latency=latency, model=p.link_model, queue=queue,
                       contention=self.compute_contention if p.link_model == "fair" else 0.0)

    @property
    def compute_contention(self) -> float:
        """How much longer compute runs while its rank communicates: ``contention``, else the device model's
        (only with its calibrated operation model: a constant ``efficiency`` keeps the plain passes)."""
        if self.contention is not None:
            return float(self.contention)
        return self.device.comm_slowdown if self.gemm_efficiency is not None else 0.0

    def latency(self, task: Task, graph: TaskGraph) -> float:
        """The part of a transfer's duration that moves no bytes: its formula at zero bytes (the alpha terms)."""
        if task.stream is Stream.SEND:
            p = self.parallel
            return self.cluster.link_between(p.device(task.rank), p.device(task.peer)).alpha
        if _is_embedding(task, graph):
            return self.embedding_allreduce(self._embedding_link(graph), latency=True)
        group = self.group(task.rank)
        if self.parallel.dp_mode in PS_MODES:
            return group.ps(0.0)
        a = task.action
        if a.kind is Kind.EXCHANGE:
            return group.exchange(0.0)
        n_st = graph.schedule.num_stages
        codec = self.codec_time(a.kind, a.stage, n_st, a.bucket or 0)
        n = self.collective_bytes(a.kind, a.stage, n_st, a.bucket or 0)
        return codec + group.latency("allreduce" if a.kind is Kind.ALLREDUCE else _OP[a.kind], n)

    def _collective_ports(self, rank: int, port: dict[str, int], ps0: int) -> tuple[int, ...]:
        g = self.parallel.device(rank)
        if self.parallel.dp_mode in PS_MODES:
            servers = len(self.cluster.pservers)
            return (port["inter-out"] + g, port["inter-in"] + g, *range(ps0, ps0 + 2 * servers))
        group = self.group(rank)
        uses = ("inter" if group.nodes > 1 else "intra",) if self.parallel.dp_mode == "decentralized" else group.uses
        return tuple(port[f"{kind}-{d}"] + g for kind in uses for d in ("out", "in"))

    def describe(self) -> dict[str, Any]:
        p = self.parallel
        return {
            "model": "transformer",
            "transformer": self.model.name,
            "cluster": self.cluster.name,
            "pp": p.pp, "dp": p.dp, "tp": p.tp, "dp_mode": p.dp_mode, "order": p.order,
            "bucket_mb": p.bucket_mb, "collective": p.collective,
            "microbatch_size": self.microbatch_size,
            "efficiency": self.matmul_efficiency if self.gemm_efficiency is None else "calibrated",
            "gemm_efficiency": None if (e := self.gemm_efficiency) is None else {
                "peak_fraction": e.peak_fraction, "half_flops": e.half_flops, "source": e.source},
            "sp": p.sp, "recompute": self.recompute, "attention": self.model.attention, "dtype": self.dtype,
            "reduce_dtype": self.reduce_dtype, "elementwise": self.elementwise, "tp_overlap": self.tp_overlap,
            "pair_overlap": self.pair_overlap, "link_model": p.link_model,
            "fsdp_reshard_after_forward": p.fsdp_reshard_after_forward, "fsdp_prefetch": p.fsdp_prefetch,
            "embedding_allreduce": p.embedding_allreduce, "overlap_param_gather": p.overlap_param_gather,
            "contention": self.compute_contention, "stack": self.stack, "post_validation": self.post_validation,
            **({} if p.grad_compression == "none" else {"grad_compression": p.grad_compression,
                                                        "codec_ns_per_param": p.codec_ns_per_param}),
            **({"peer_selection": p.peer_selection} if p.dp_mode == "decentralized" else {}),
            **({"sync_every": p.sync_every} if p.dp_mode == "local-sgd" else {}),
        }
