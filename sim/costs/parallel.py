"""Parallel layout: pp x dp (x tp) ranks on a cluster's devices, and each dp group's collective costs.

Global rank order (Megatron-LM's default, tensor innermost, then data, then
pipeline) with ``order = "dp-inner"``: device = (r * dp + d) * tp + t for
pipeline rank r, replica d, tensor rank t. ``order = "pp-inner"`` puts a whole
pipeline replica on consecutive devices: device = (d * pp + r) * tp + t.

Tensor parallelism (Megatron-style) splits a rank's FLOPs and parameters
over tp devices; its activations per Korthikanti et al. 2022 (the LayerNorm and
dropout ones split too only with sequence parallelism, ``sp``); its
collectives, two per layer in the forward and two in the backward, are timed
inside the passes (:mod:`sim.costs.gpu_model`), not overlapped. tp must still divide what it splits (heads, hidden size, ...: see
:meth:`ParallelConfig.check_tp`) and the devices of every node, so that a
tensor-parallel group, tp consecutive devices, sits inside one node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common import parse
from common.errors import (
    ClusterError,
    ConfigError,
    check_positive,
    check_positive_ints,
    choice,
)
from schedules.dp.codecs import check_dp_mode, parse_compression
from schedules.dp.modes import DP_MODES, PEER_SELECTIONS
from sim.costs import collectives as coll
from sim.costs.async_ps import check_speeds
from sim.costs.cluster import Cluster, Link
from sim.costs.nccl import NcclChoice, on_cluster, runs_nccl
from sim.network import LINK_MODELS

__all__ = ["EMBEDDING_ALLREDUCE", "PS_MODES", "DPGroup", "ParallelConfig"]

EMBEDDING_ALLREDUCE = ("auto", "on", "off")
PS_MODES = ("ps", "async-ps")  # the modes with parameter servers (the cluster's pservers)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """How the job is split: ``pp`` pipeline ranks, ``dp`` replicas, ``tp`` tensor shards; DP mode and buckets."""

    pp: int
    dp: int = 1
    tp: int = 1
    cp: int = 1  # context parallelism: the sequence split over cp ranks (ring attention, sim.costs.transformer_costs)
    ep: int = 1  # expert parallelism: a MoE model's routed experts split over ep of the dp x cp ranks (sim.costs.moe)
    dp_mode: str = "none"
    order: str = "dp-inner"
    bucket_mb: float = 25.0  # PyTorch DDP's default bucket_cap_mb (MiB)
    collective: str = "auto"
    sp: bool = False  # sequence parallelism in the tensor-parallel group (Korthikanti et al. 2022)
    link_model: str = "fair"  # transfers on one port: max-min fair flows, or fcfs (one at a time); sim.network
    fsdp_reshard_after_forward: bool = True  # zero3/fsdp: False keeps a forward's gathered parameters for the backward
    fsdp_prefetch: int = 1  # zero3/fsdp: a pass's all-gathers issued this many passes ahead (0: on demand)
    embedding_allreduce: str = "auto"  # the tied embedding's gradient between the first and last stage: auto|on|off
    grad_compression: str = "none"  # codec of the gradient collectives (schedules.dp.codecs): bytes and codec time
    codec_ns_per_param: float = 0.0  # the codec's compress+decompress time per gradient element (real.dp.compress profile)
    peer_selection: str = "ring"  # decentralized: both ring neighbours per step, or one random peer (schedules.dp.modes)
    sync_every: int = 1  # local-sgd: the parameters are averaged once every sync_every steps
    overlap_param_gather: bool = False  # zero1/zero2: the updated parameters' all-gather under the next forward
    staleness: int = 0  # async-ps: the steps a trainer may run ahead of the slowest (sim.costs.async_ps)
    trainer_speeds: tuple[float, ...] = ()  # async-ps: each replica's compute speed (1: the device's; empty: all 1)

    def __post_init__(self) -> None:
        check_positive_ints("parallel", pp=self.pp, dp=self.dp, tp=self.tp, cp=self.cp, ep=self.ep)
        if (self.dp * self.cp) % self.ep:
            valid = [d for d in range(1, self.dp * self.cp + 1) if self.dp * self.cp % d == 0]
            raise ConfigError(f"parallel: ep {self.ep} must divide dp x cp = {self.dp * self.cp} (expert parallelism "
                              f"folds over the data-parallel ranks, as Megatron-Core and torchtitan do); valid: "
                              f"{', '.join(map(str, valid))}", field="ep")
        if not isinstance(self.sp, bool):
            raise ConfigError(f"parallel: sp must be true or false, got {self.sp!r}", field="sp")
        if self.sp and self.tp == 1:  # nothing to split the sequence over: the setting would have no effect
            raise ConfigError("parallel: sequence parallelism splits across the tensor-parallel group, so it needs "
                              "tp > 1; give tp > 1 or leave sp out", field="sp")
        for key, valid in (("dp_mode", DP_MODES), ("order", ("dp-inner", "pp-inner")), ("collective", coll.ALGORITHMS)):
            object.__setattr__(self, key, choice("parallel", key, getattr(self, key), valid))  # DDP is ddp
        check_positive("parallel", "bucket_mb", self.bucket_mb, " MiB")
        parse.canonical_field(self, "link_model", "parallel", LINK_MODELS)
        comp = parse_compression(self.grad_compression)
        check_dp_mode(comp, self.dp_mode)
        object.__setattr__(self, "grad_compression", comp.spec)
        c = self.codec_ns_per_param
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0 <= c < math.inf:
            raise ConfigError(f"parallel: codec_ns_per_param must be a finite number >= 0 (nanoseconds per "
                              f"gradient element), got {c!r}", field="codec_ns_per_param")
        if c and comp.exact:
            raise ConfigError("parallel: codec_ns_per_param times a codec; give a grad_compression other than none "
                              "or leave it out", field="codec_ns_per_param")
        parse.canonical_field(self, "peer_selection", "parallel", PEER_SELECTIONS)
        check_positive_ints("parallel", sync_every=self.sync_every)
        self._check_peer_options()
        self._check_overlap()
        self._check_async()

    def _check_async(self) -> None:
        """staleness and trainer_speeds: async-ps's only (sim.costs.async_ps)."""
        s = self.staleness
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"parallel: staleness must be a whole number of steps >= 0, got {s!r}", field="staleness")
        given = [k for k, v in (("staleness", s), ("trainer_speeds", self.trainer_speeds)) if v]
        if given and self.dp_mode != "async-ps":
            raise ConfigError(f"parallel: {given[0]} applies to dp_mode async-ps, not {self.dp_mode!r}; use dp_mode "
                              "async-ps or leave it out", field=given[0])
        if self.trainer_speeds:
            object.__setattr__(self, "trainer_speeds", check_speeds(self.trainer_speeds, self.dp))

    def _check_overlap(self) -> None:
        """The FSDP and embedding options: each of its kind, and only where it has an effect."""
        if not isinstance(self.fsdp_reshard_after_forward, bool):
            raise ConfigError(f"parallel: fsdp_reshard_after_forward must be true or false (on or off), got "
                              f"{self.fsdp_reshard_after_forward!r}", field="fsdp_reshard_after_forward")
        p = self.fsdp_prefetch
        if isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise ConfigError(f"parallel: fsdp_prefetch must be a whole number of passes >= 0 (0: on demand), "
                              f"got {p!r}", field="fsdp_prefetch")
        if not isinstance(self.overlap_param_gather, bool):
            raise ConfigError(f"parallel: overlap_param_gather must be true or false, got {self.overlap_param_gather!r}",
                              field="overlap_param_gather")
        if self.overlap_param_gather and self.dp_mode not in ("zero1", "zero2"):
            raise ConfigError(f"parallel: overlap_param_gather applies to dp_mode zero1 or zero2 (Megatron-LM's "
                              f"overlap_param_gather), not {self.dp_mode!r}; use one of them or leave it out",
                              field="overlap_param_gather")
        fsdp = self.dp_mode in ("zero3", "fsdp")
        given = [k for k, v in (("fsdp_reshard_after_forward", not self.fsdp_reshard_after_forward),
                                ("fsdp_prefetch", p != 1)) if v]
        if given and not fsdp:
            raise ConfigError(f"parallel: {given[0]} applies to dp_mode zero3 (fsdp), not {self.dp_mode!r}; "
                              "use dp_mode fsdp or leave it out", field=given[0])
        parse.canonical_field(self, "embedding_allreduce", "parallel", EMBEDDING_ALLREDUCE)
        if self.embedding_allreduce == "on" and self.dp_mode in PS_MODES:
            raise ConfigError(f"parallel: embedding_allreduce on does not combine with dp_mode {self.dp_mode} (the "
                              "servers hold the update); use auto or off", field="embedding_allreduce")

    def _check_peer_options(self) -> None:
        """sync_every only with local-sgd, peer_selection only with decentralized; random pairs an even dp."""
        for key, mode, default in (("sync_every", "local-sgd", 1), ("peer_selection", "decentralized", "ring")):
            if getattr(self, key) != default and self.dp_mode != mode:
                raise ConfigError(f"parallel: {key} applies to dp_mode {mode}, not {self.dp_mode!r}; use dp_mode "
                                  f"{mode} or leave it out", field=key)
        if self.peer_selection == "random" and self.dp % 2:
            raise ConfigError(f"parallel: peer_selection random pairs the replicas and needs an even dp, got dp "
                              f"{self.dp}; use an even dp or peer_selection ring", field="peer_selection")

    def embedding_sync(self, tied: bool) -> bool:
        """Whether the first and the last stage all-reduce the word embedding's gradient: ``on``, or ``auto``
        with tied embeddings (Megatron-LM, ``share_embeddings_and_output_weights``) and no parameter servers."""
        if self.embedding_allreduce == "auto":
            return tied and self.pp > 1 and self.dp_mode not in PS_MODES
        return self.embedding_allreduce == "on"

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp * self.cp

    @property
    def bucket_bytes(self) -> float:
        return self.bucket_mb * 2**20

    def device(self, r: int, d: int = 0, t: int = 0, c: int = 0) -> int:
        """Index into ``cluster.devices`` of pipeline rank r, replica d, tensor rank t, context rank c (the
        tp x cp ranks of one (r, d) are consecutive, tensor innermost: Llama 3's [TP, CP, PP, DP] order)."""
        width = self.tp * self.cp
        if self.order == "dp-inner":
            return (r * self.dp + d) * width + c * self.tp + t
        return (d * self.pp + r) * width + c * self.tp + t

    def check_fits(self, cluster: Cluster) -> None:
        if self.world > cluster.num_devices:
            raise ClusterError(
                f"pp*dp*tp{'*cp' if self.cp > 1 else ''} = {self.pp}*{self.dp}*{self.tp}"
                f"{f'*{self.cp}' if self.cp > 1 else ''} = {self.world} devices do not fit cluster "
                f"{cluster.name!r} with {cluster.num_devices}; use fewer ranks or a larger cluster"
            )
        if self.collective in ("nvls", "pat") and cluster.backend != "nccl":
            raise ClusterError(f"collective {self.collective!r} is an NCCL algorithm; cluster {cluster.name!r} runs "
                               "gloo (CPU devices): use auto, ring, tree or hierarchical")
        if self.collective == "nvls" and not cluster.nvls:
            raise ClusterError(f"collective 'nvls' needs NVLink SHARP switches (dgx-h100, dgx-h200, or nvls = true "
                               f"in a [cluster] table); cluster {cluster.name!r} has none: use auto, ring or tree")
        if self.dp_mode in PS_MODES and not cluster.pservers:
            raise ClusterError(
                f"dp mode {self.dp_mode!r} needs parameter servers, cluster {cluster.name!r} has none; "
                "add '/pserver/CPU:0' devices or use a preset like 'dgx-h100:2+ps2'"
            )

    def check_tp(self, cluster: Cluster, **sizes: int) -> None:
        """tp divides every one of ``sizes`` (e.g. the model's heads, hidden) and each node's device count.

        A tensor-parallel group is tp consecutive devices (tensor rank innermost), so it sits inside one
        node exactly when tp divides the device count of every node. The error lists the tp that would do.
        """
        nodes = cluster.node_sizes
        counts = {**sizes, "devices per node": math.gcd(*nodes)}
        if all(n % self.tp == 0 for n in counts.values()):
            return
        common = math.gcd(*counts.values())
        valid = [t for t in range(1, common + 1) if common % t == 0]
        what = ", ".join(f"{k} ({v})" for k, v in sizes.items())
        raise ConfigError(
            f"parallel: tp={self.tp} must divide the model's {what} and the devices per node "
            f"({'/'.join(map(str, nodes))} on cluster {cluster.name!r}; a tensor-parallel group sits inside a node); "
            f"valid tp: {', '.join(map(str, valid))}", field="tp")

    def group(self, cluster: Cluster, r: int) -> DPGroup:
        """The dp group of pipeline rank r (its tensor rank 0; the others are symmetric). With context
        parallelism the gradients are reduced over the dp x cp ranks that hold the same weights.

        Its spread over nodes is arithmetic where the layout allows (rank order dp-inner on a cluster whose nodes
        all hold the same number of devices, a multiple of tp): the group is then dp x cp consecutive multiples
        of tp, so its cost does not grow with dp; otherwise its devices are listed (:meth:`_group_listed`, the
        definition, to which the arithmetic is checked equal in the tests).
        """
        n, width = cluster.node_size, self.tp * self.cp
        size = self.dp * self.cp
        first = r * self.dp * width  # device(r, 0, 0, 0) under dp-inner
        if self.order != "dp-inner" or not n or n % self.tp or first + (size - 1) * self.tp >= cluster.num_devices:
            return self._group_listed(cluster, r)
        q = n // self.tp  # members of the group a whole node holds: every tp-th device
        lo = first // self.tp  # the members are the devices tp * u for u in [lo, lo + size)
        b0, b1 = lo // q, (lo + size - 1) // q
        if b0 == b1:
            counts = (size,)
        else:
            counts = ((b0 + 1) * q - lo, *((q,) if b1 - b0 > 1 else ()), lo + size - b1 * q)
        return DPGroup(cluster=cluster, config=self, device=first, size=size, nodes=b1 - b0 + 1,
                       per_node=max(counts), even=len(set(counts)) == 1)

    def _group_listed(self, cluster: Cluster, r: int) -> DPGroup:
        """:meth:`group` from the list of the group's devices (any rank order, any cluster)."""
        devs = [self.device(r, d, 0, c) for d in range(self.dp) for c in range(self.cp)]
        nodes: dict[int, int] = {}
        for g in devs:
            node = cluster.devices[g].node
            nodes[node] = nodes.get(node, 0) + 1
        return DPGroup(cluster=cluster, config=self, device=devs[0], size=self.dp * self.cp,
                       nodes=len(nodes), per_node=max(nodes.values()), even=len(set(nodes.values())) == 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class DPGroup:
    """One dp group: its size, how it spreads over nodes, and the cost of its collectives."""

    cluster: Cluster
    config: ParallelConfig
    device: int  # the simulated replica's device
    size: int
    nodes: int
    per_node: int
    even: bool

    @property
    def nccl(self) -> bool:
        """Whether NCCL runs this group's collectives and picks their algorithm per call (GPU clusters, with
        ``collective`` auto, ring, tree, nvls or pat: :mod:`sim.costs.nccl`); else the alpha-beta formulas of
        :mod:`sim.costs.collectives` (gloo on CPU clusters, and ``hierarchical``, a 2D scheme NCCL does not run)."""
        return runs_nccl(self.cluster, self.config.collective)

    @property
    def algorithm(self) -> str:
        """The algorithm forced, or 'auto' chosen per call: NCCL's ('nccl' in the description), gloo's ring
        on one node and the hierarchical scheme across nodes of equal share."""
        if self.config.collective != "auto":
            return self.config.collective
        if self.nccl:
            return "nccl"
        if self.nodes == 1 or self.per_node == 1 or not self.even:
            return "ring"
        return "hierarchical"

    @property
    def link(self) -> Link:
        """The slowest link a flat algorithm crosses."""
        return self.cluster.intra if self.nodes == 1 else self.cluster.inter

    @property
    def uses(self) -> tuple[str, ...]:
        """Which of the device's ports a collective of this group occupies: 'intra', 'inter'."""
        if self.nodes == 1:
            return ("intra",)
        if self.nccl:  # NCCL's rings and trees cross the node's NVLink to reach the GPUs' NICs
            return ("intra", "inter") if self.per_node > 1 else ("inter",)
        return ("intra", "inter") if self.algorithm == "hierarchical" else ("inter",)

    def choice(self, op: str, n: float) -> NcclChoice:
        """NCCL's algorithm, protocol, time and latency for ``op`` on an n-byte buffer of this group."""
        return on_cluster(self.cluster, op, n, self.size, self.nodes, self.config.collective)

    def allreduce(self, n: float) -> float:
        if self.nccl:
            return self.choice("allreduce", n).time
        p, alg = self.size, self.algorithm
        if alg == "hierarchical" and self.nodes > 1:
            return coll.hierarchical_allreduce(n, self.per_node, self.nodes, self.cluster.intra, self.cluster.inter)
        if alg == "tree":
            return coll.tree_allreduce(n, p, self.link)
        return coll.ring_allreduce(n, p, self.link)

    def gather(self, n: float, op: str = "reduce_scatter") -> float:
        """Reduce-scatter or all-gather (``op``) of an n-byte buffer (2D when hierarchical: intra, then inter on
        n/g)."""
        if self.nccl:
            return self.choice(op, n).time
        if self.algorithm == "hierarchical" and self.nodes > 1:
            g = self.per_node
            return coll.ring_gather(n, g, self.cluster.intra) + coll.ring_gather(n / g, self.nodes, self.cluster.inter)
        return coll.ring_gather(n, self.size, self.link)

    def latency(self, op: str, n: float) -> float:
        """The part of ``op`` on n bytes paid before bytes move: NCCL's latency of the algorithm it picks for n
        bytes, else the formula at zero bytes."""
        if self.nccl:
            return self.choice(op, n).latency if self.size > 1 else 0.0
        return self.allreduce(0.0) if op == "allreduce" else self.gather(0.0, op)

    def exchange(self, n: float) -> float:
        """One decentralized replica's send of n bytes to a peer while the peer's n arrive (full duplex): alpha +
        n/B on the slowest link of the group (the replicas step together, so the slowest pair sets the time)."""
        return self.link.time(n) if self.size > 1 else 0.0

    def ps(self, n: float, *, alone: bool = False) -> float:
        """One push or pull of n bytes through all the cluster's parameter servers: with every replica's at once
        (ps: in lockstep, they share the servers' links), or ``alone`` (async-ps: trainers do not wait for each
        other, so their transfers are taken not to meet at the servers)."""
        c = self.cluster
        return coll.ps_transfer(n, 1 if alone else self.size, len(c.pservers), c.inter, c.inter)
