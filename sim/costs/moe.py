"""Mixture-of-experts layers: their shape, routing load, expert-parallel all-to-all, and two-stream overlap.

A MoE layer replaces the dense MLP by ``experts`` routed expert MLPs of width ``expert_ffn`` (each token goes to
``top_k`` of them, picked by a linear router of h x E weights) plus ``shared_experts`` MLPs every token passes
through (DeepSeek's shared experts). Per token, forward FLOPs: the router 2hE, and (top_k + shared) expert MLPs
of 2 x 3hf_e each (gated) or 2 x 2hf_e. Parameters: all E routed experts, the shared ones and the router.

Expert parallelism (``ep``): the routed experts are split over ep ranks (E / ep each), folded over the
data-parallel (x context-parallel) ranks, as Megatron-Core and torchtitan do. Each rank routes its own tokens;
a *dispatch* all-to-all sends every (token, expert) pair to the rank holding the expert, the experts run, and a
*combine* all-to-all sends the results back. The backward runs both in reverse (the combine's gradient first,
then the dispatch's): the input-gradient pass (I) carries them, the weight-gradient pass (W) none (expert
weight gradients are local to the rank holding the expert).

Bytes: a rank of n tokens sends n x top_k x h 16-bit values per all-to-all, of which the fraction (ep - 1)/ep
leaves the rank under uniform routing; the all-to-all lasts as long as its busiest receiver, whose share of
the (token, expert) pairs is :func:`max_load`'s ``imbalance`` over uniform. Expert compute is set by that
busiest rank as well.

Routing load (:func:`expert_shares`): ``uniform`` (each expert 1/E of the pairs), a ``skew`` s (expert e's share
proportional to (e + 1)^-s, a Zipf law; 0 is uniform), or a measured histogram of pairs per expert. A capacity
factor c caps each expert at c x (pairs / E) (tokens over it are dropped, GShard's rule: Lepikhin et al. 2020,
arXiv 2006.16668, sec. 2.2); 0 means dropless (Megatron-Core's and DeepSeek-V3's default).

Overlap (:func:`two_stream_time`): two microbatches' passes, each a chain of compute and communication
segments, on one compute stream and one communication stream. A segment starts when its chain's previous
segment has ended and its stream is free; the streams serve ready segments in the order they became ready
(ties to the first chain). DualPipe's F+B pair (DeepSeek-AI 2024, arXiv 2412.19437, sec. 3.2.1, Figure 4: one
microbatch's all-to-all under the other's attention and MLP) is the two chains of one forward and one backward
(TransformerCosts.segments);
its time follows from the segments, not from a given fraction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import ConfigError, quote
from sim.costs.cluster import Cluster
from sim.costs.gpu_model import ELEMENTWISE_BYTES, Op, _gemm

if TYPE_CHECKING:
    from sim.costs.transformer import TransformerConfig

__all__ = ["DISPATCHERS", "MLP_OPS", "ROUTINGS", "MLAConfig", "MoEConfig", "Segment", "all_to_all_bytes",
           "dispatch_time", "ep_all_to_all_time", "expert_ops", "expert_shares", "max_load", "remote_nodes",
           "two_stream_time"]

ROUTINGS = ("uniform", "skew", "histogram")


@dataclass(frozen=True, slots=True, kw_only=True)
class MoEConfig:
    """The MoE part of a model: routed ``experts``, ``top_k`` per token, expert width, shared experts, the
    first ``dense_layers`` layers dense, the router's load (``skew`` or a ``histogram``) and capacity factor."""

    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int = 0
    dense_layers: int = 0  # the first layers keep a dense MLP (DeepSeek-V3: 3)
    capacity_factor: float = 0.0  # 0: dropless
    skew: float = 0.0  # Zipf exponent of the experts' load; 0: uniform
    histogram: tuple[float, ...] | None = None  # measured pairs per expert (any scale); overrides skew

    def __post_init__(self) -> None:
        owner = "moe"
        for key in ("experts", "top_k", "expert_ffn"):
            v = getattr(self, key)
            if type(v) is not int or v < 1:
                raise ConfigError(f"{owner}: {key} must be an integer >= 1, got {quote(v)}", field=key)
        for key in ("shared_experts", "dense_layers"):
            v = getattr(self, key)
            if type(v) is not int or v < 0:
                raise ConfigError(f"{owner}: {key} must be an integer >= 0, got {quote(v)}", field=key)
        if self.top_k > self.experts:
            raise ConfigError(f"{owner}: top_k {self.top_k} must be at most experts {self.experts}", field="top_k")
        for key in ("capacity_factor", "skew"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise ConfigError(f"{owner}: {key} must be a finite number >= 0, got {quote(v)}", field=key)
        if 0 < self.capacity_factor < 1:
            raise ConfigError(f"{owner}: capacity_factor must be 0 (dropless) or >= 1, got {self.capacity_factor}",
                              field="capacity_factor")
        if self.histogram is not None:
            h = tuple(self.histogram)
            if len(h) != self.experts or any(isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0
                                              or x == math.inf for x in h) or not sum(h) > 0:
                raise ConfigError(f"{owner}: histogram must give {self.experts} counts >= 0 (one per expert, not "
                                  f"all 0), got {quote(self.histogram)}", field="histogram")
            object.__setattr__(self, "histogram", h)

    @property
    def routing(self) -> str:
        return "histogram" if self.histogram is not None else "skew" if self.skew else "uniform"

    def check_layers(self, layers: int, model: str = "model") -> None:
        if self.dense_layers >= layers:
            raise ConfigError(f"{model}: dense_layers {self.dense_layers} leaves no MoE layer of {layers}",
                              field="dense_layers")

    def check_ep(self, ep: int) -> None:
        """ep ranks must split the routed experts evenly."""
        if type(ep) is not int or ep < 1 or self.experts % ep:
            divisors = [d for d in range(1, self.experts + 1) if self.experts % d == 0]
            raise ConfigError(f"ep {quote(ep)} must divide the {self.experts} experts; valid: "
                              f"{', '.join(map(str, divisors))}", field="ep")

    # --- shape ---------------------------------------------------------------------------------------
    def expert_params(self, hidden: int, gated: bool = True) -> int:
        """One expert MLP's weights: 3hf_e gated (SwiGLU), 2hf_e otherwise."""
        return (3 if gated else 2) * hidden * self.expert_ffn

    def layer_mlp_params(self, hidden: int, gated: bool = True) -> int:
        """A MoE layer's MLP: E routed and the shared experts, and the router's h x E."""
        return (self.experts + self.shared_experts) * self.expert_params(hidden, gated) + hidden * self.experts

    def layer_mlp_params_per_rank(self, hidden: int, ep: int, gated: bool = True) -> float:
        """What one of ep expert-parallel ranks holds: E/ep routed experts, the shared experts and the router."""
        self.check_ep(ep)
        return ((self.experts // ep + self.shared_experts) * self.expert_params(hidden, gated)
                + hidden * self.experts)

    def mlp_flops(self, hidden: int, gated: bool = True) -> float:
        """Forward FLOPs per token of a MoE layer's MLP: the router and top_k + shared expert MLPs."""
        return 2.0 * hidden * self.experts + (self.top_k + self.shared_experts) * 2.0 * self.expert_params(hidden, gated)


def expert_shares(moe: MoEConfig) -> tuple[float, ...]:
    """Each expert's share of the (token, expert) pairs after the capacity cap, summing to at most 1."""
    e = moe.experts
    if moe.histogram is not None:
        total = sum(moe.histogram)
        shares = [x / total for x in moe.histogram]
    else:
        w = [(i + 1) ** -moe.skew for i in range(e)]
        shares = [x / sum(w) for x in w]
    if moe.capacity_factor:
        cap = moe.capacity_factor / e
        shares = [min(s, cap) for s in shares]
    return tuple(shares)


def max_load(moe: MoEConfig, ep: int) -> float:
    """The busiest of ep ranks' share of the pairs over the uniform 1/ep (1.0: balanced). Rank r holds experts
    r E/ep .. (r + 1) E/ep - 1, Megatron-Core's contiguous placement."""
    moe.check_ep(ep)
    shares, per = expert_shares(moe), moe.experts // ep
    return ep * max(sum(shares[r * per:(r + 1) * per]) for r in range(ep))


def all_to_all_bytes(moe: MoEConfig, tokens: float, hidden: int, ep: int, bytes_per_value: int = 2) -> float:
    """Bytes the busiest rank receives from the others in one dispatch (or combine) of ``tokens`` tokens per rank:
    its share of every rank's top_k x h values, less what it keeps from itself (module docstring)."""
    if ep == 1:
        return 0.0
    pairs = tokens * moe.top_k * hidden * bytes_per_value  # one rank's bytes at uniform load
    return pairs * max_load(moe, ep) * (ep - 1) / ep


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of a pass: ``comm`` on the communication stream, else compute; ``seconds`` long."""

    seconds: float
    comm: bool = False
    name: str = ""


def two_stream_time(chains: Sequence[Sequence[Segment]]) -> float:
    """Makespan of chains of segments sharing one compute and one communication stream (module docstring)."""
    pos = [0] * len(chains)
    ready = [0.0] * len(chains)  # when each chain's next segment may start
    free = {False: 0.0, True: 0.0}  # each stream's next free time
    end = 0.0
    while True:
        waiting = [(max(ready[c], free[chains[c][pos[c]].comm]), ready[c], c)
                   for c in range(len(chains)) if pos[c] < len(chains[c])]
        if not waiting:
            return end
        start, _, c = min(waiting)
        seg = chains[c][pos[c]]
        finish = start + seg.seconds
        free[seg.comm] = finish
        ready[c] = finish
        pos[c] += 1
        end = max(end, finish)


def threaded_pair_time(chains: Sequence[Sequence[Segment]], slowdown: float = 1.0, stall: float = 1.0,
                       share: float = 1.0) -> float:
    """Makespan of chains run by threads of one process on one core, each chain's communication on a group of
    its own (the real runtime's overlapped F/B pair on a CPU: :class:`real.executor.Executor`'s pair, forward in a
    thread beside the backward, their all-to-alls on two ep groups).

    Processor sharing: the compute segments running at once share the core equally; while one or more of the
    chains' communication segments is in flight, compute runs ``slowdown`` times slower (gloo's threads take the
    core's cycles: :mod:`sim.slowdown`'s ``comm_slowdown``), and a communication segment is served ``stall``
    times slower while compute runs (its ``comm_stall``). Each chain runs its segments in order, so one chain's
    communication hides behind the other's compute. ``share``: while two or more chains compute at once, the
    core serves them ``share`` times slower than one at a time (the threads' switching, the interpreter lock and
    the caches; measured by :mod:`real.profile.pair`). With one chain, or no communication and ``share`` 1, it is
    the sum. Hand arithmetic (tests/test_moe.py): two chains of compute 4 each share the core, 8 (at share 1.25,
    10); compute 4 beside a communication of 2 (slowdown 2, stall 1) ends at 5 (2 at half speed, then 3), the
    communication at 2."""
    pos = [0] * len(chains)
    left = [chains[c][0].seconds if chains[c] else 0.0 for c in range(len(chains))]
    now = 0.0
    while True:
        active = [c for c in range(len(chains)) if pos[c] < len(chains[c])]
        if not active:
            return now
        computing = [c for c in active if not chains[c][pos[c]].comm]
        talking = len(active) - len(computing)
        shared = len(computing) * (share if len(computing) > 1 else 1.0)
        rate = {c: ((1.0 / shared) / (slowdown if talking else 1.0)) if c in computing
                else (1.0 / stall if computing else 1.0) for c in active}
        dt = min(left[c] / rate[c] for c in active)
        now += dt
        for c in active:
            left[c] -= dt * rate[c]
            if left[c] <= 1e-15:
                pos[c] += 1
                left[c] = chains[c][pos[c]].seconds if pos[c] < len(chains[c]) else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a rank-``q_rank`` bottleneck, keys and
    values through one of rank ``kv_rank`` shared by all heads, plus a decoupled rotary key of ``rope_dim``
    per token; per head ``nope_dim`` + ``rope_dim`` query/key dimensions and ``v_dim`` value dimensions."""

    q_rank: int
    kv_rank: int
    rope_dim: int
    nope_dim: int
    v_dim: int

    def params(self, hidden: int, heads: int) -> int:
        """W_DQ h x q_rank (+ its norm), W_UQ q_rank x heads(nope + rope), W_DKV h x (kv_rank + rope) (+ norm),
        W_UKV kv_rank x heads(nope + v), W_O heads v x h (DeepSeek-AI 2024, arXiv 2412.19437, sec. 2.1.1)."""
        qk = self.nope_dim + self.rope_dim
        return (hidden * self.q_rank + self.q_rank + self.q_rank * heads * qk + hidden * (self.kv_rank + self.rope_dim)
                + self.kv_rank + self.kv_rank * heads * (self.nope_dim + self.v_dim) + heads * self.v_dim * hidden)

    def core_flops(self, seq_len: int, heads: int) -> float:
        """Forward FLOPs per token of the attention core over the whole sequence (as Megatron counts it):
        QK^T 2s heads (nope + rope), the product with V 2s heads v."""
        return 2.0 * seq_len * heads * (self.nope_dim + self.rope_dim + self.v_dim)


DISPATCHERS = ("alltoall", "deepep")


def remote_nodes(moe: MoEConfig, nodes: int) -> float:
    """Expected nodes other than its own that a token's top_k experts sit on, of an ep group spread over ``nodes``
    nodes holding E / nodes experts each, under uniform routing: (nodes - 1) x (1 - C(E - E/nodes, k) / C(E, k))."""
    if nodes <= 1:
        return 0.0
    e, k = moe.experts, moe.top_k
    return (nodes - 1) * (1 - math.comb(e - e // nodes, k) / math.comb(e, k))


def dispatch_time(moe: MoEConfig, tokens: float, hidden: int, ep: int, tp: int, cluster: Cluster,
                  dispatcher: str = "alltoall") -> float:
    """Seconds of one dispatch (or combine) of ``tokens`` tokens per rank over the ep group.

    ``alltoall`` (Megatron-Core's alltoall dispatcher, torchtitan's): every (token, expert) pair is sent to its expert's
    rank, :func:`all_to_all_bytes` into the busiest one (:func:`ep_all_to_all_time`). ``deepep`` (DeepEP, and
    Megatron's HybridEP: deepseek-ai/DeepEP README, "forwarding data from NVLink domain to RDMA domain"; DeepSeek-AI
    2024, arXiv 2412.19437, sec. 3.2.2): a token crosses the NIC once per remote node its experts sit on
    (:func:`remote_nodes`), to the GPU of the same in-node index, which forwards it to the experts' GPUs over NVLink;
    NIC and NVLink work at once, the slower sets the time.
    """
    if ep == 1:
        return 0.0
    pairs = all_to_all_bytes(moe, tokens, hidden, ep)
    node = cluster.node_size or len(cluster.devices)
    per_node = max(1, min(ep, node // tp))
    nodes = math.ceil(ep / per_node)
    if dispatcher == "alltoall" or nodes == 1:
        return ep_all_to_all_time(pairs, ep, tp, cluster)
    inter = tokens * hidden * 2 * remote_nodes(moe, nodes) * max_load(moe, ep)
    intra = pairs * (per_node - 1) / per_node
    return cluster.inter.alpha + max(intra / cluster.intra.rate, inter / cluster.inter.rate)


def ep_all_to_all_time(nbytes: float, ep: int, tp: int, cluster: Cluster) -> float:
    """One all-to-all of an ep group moving ``nbytes`` into its busiest rank. The group is ep consecutive
    data-parallel ranks (tp devices apart, Megatron-Core's order); the peers on the rank's node send over
    NVLink, the others over the NIC, both at once: the slower part sets the time, plus one latency."""
    if ep == 1 or nbytes <= 0:
        return 0.0
    node = cluster.node_size or len(cluster.devices)
    per_node = max(1, min(ep, node // tp))
    intra = nbytes * (per_node - 1) / (ep - 1)
    inter = nbytes - intra
    if inter <= 0:
        return cluster.intra.alpha + intra / cluster.intra.rate
    return cluster.inter.alpha + max(intra / cluster.intra.rate, inter / cluster.inter.rate)


#: The dense MLP's operations in sim.costs.gpu_model.layer_ops: what a MoE layer replaces.
MLP_OPS = frozenset({"fc1", "gelu", "fc2"})


def expert_ops(model: TransformerConfig, *, tokens: float, tp: int, ep: int, elementwise: str = "fused") -> list[Op]:
    """A MoE layer's MLP operations on the busiest of ep expert ranks, for ``tokens`` tokens per rank: the router,
    the permutation (a read and a write of each routed 16-bit token) and un-permutation, the shared experts on the
    rank's own tokens, and its E/ep experts as one grouped GEMM over the tokens all ep ranks route to them
    (tokens x top_k x :func:`max_load` pairs), expert widths split over ``tp`` (expert TP = TP)."""
    m, h = model.moe, model.hidden
    assert m is not None
    per, act = ELEMENTWISE_BYTES[elementwise], "swiglu" if model.gated_mlp else "gelu"
    fe = m.expert_ffn
    width = (2 if model.gated_mlp else 1) * fe / tp
    routed = tokens * m.top_k * max_load(m, ep)
    local = m.experts // ep
    ops = [_gemm("router", tokens, h, m.experts, weight=True), Op("permute", 0.0, 2 * 2.0 * routed * h, False)]
    if m.shared_experts:
        ops += [_gemm("shared-fc1", tokens, h, m.shared_experts * width, weight=True),
                Op("shared-act", 0.0, per[act] * tokens * m.shared_experts * fe / tp, False),
                _gemm("shared-fc2", tokens, m.shared_experts * fe / tp, h, weight=True)]
    return [*ops, _gemm("experts-fc1", routed / local, h, width, batch=local, weight=True),
            Op("experts-act", 0.0, per[act] * routed * fe / tp, False),
            _gemm("experts-fc2", routed / local, fe / tp, h, batch=local, weight=True),
            Op("unpermute", 0.0, 2 * 2.0 * routed * h, False)]
