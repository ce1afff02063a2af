"""The analytic cost model in real units: seconds from FLOPs and bytes, links with FIFO contention.

* Compute: a pass of stage s takes FLOPs / (tp * peak * efficiency), with the
  FLOPs of stage s's own layers (``partition_layers``) for one microbatch of
  ``microbatch_size`` sequences (:mod:`sim.transformer`); the last stage adds
  the LM head. ``efficiency`` is the fraction of dense peak that the matmuls
  reach: an assumption (default 0.6), printed with every result.
* An overlapped pair (OVERLAP_F_B) costs the sum of its passes less
  ``pair_overlap`` times the shorter one, as in UniformCosts.
* OPTIM (Adam, mixed precision) is memory-bound: per parameter it reads the
  fp16 gradient (2 bytes) and fp32 master weight, momentum and variance (12)
  and writes those three (12) and the fp16 weight (2): 28 bytes at HBM
  bandwidth, on the rank's shard of the parameters (1/dp under ZeRO).
* A pipeline SEND moves one boundary activation (2sbh/tp bytes): alpha + n/B
  over the link between the two ranks' devices (NVLink on one node, the NIC
  across nodes).
* Collectives: :class:`sim.parallel.DPGroup` (formulas in :mod:`sim.collectives`)
  on the bucket's bytes (fp16 gradients or parameters, 2 bytes each, /tp).

Contention: every device has four ports (NVLink out/in, NIC out/in) and each
parameter server two (NIC out/in). A transfer holds all ports it crosses for
its whole duration; a port serves transfers one at a time in the order they
became ready (a FIFO queue per port). So two transfers on one port take the
sum of their times, not the max.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from schedules import Action, Kind, Stream, Task, TaskGraph
from schedules.dp import DataParallelGraph
from schedules.errors import ConfigError, check_fraction, check_positive_ints, quote
from sim.cluster import Cluster
from sim.costs import memoized_durations
from sim.parallel import DPGroup, ParallelConfig
from sim.transformer import TransformerConfig, partition_layers

__all__ = ["ADAM_BYTES_PER_PARAM", "TransformerCosts"]

ADAM_BYTES_PER_PARAM = 28  # see the module docstring
_PORTS = ("intra-out", "intra-in", "inter-out", "inter-in")


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
    efficiency: float = 0.6
    pair_overlap: float = 0.0
    layers_per_stage: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        check_positive_ints("costs", microbatch_size=self.microbatch_size)
        check_fraction("costs", "efficiency", self.efficiency, "a fraction of peak", open_low=True)
        check_fraction("costs", "pair_overlap", self.pair_overlap)
        if self.layers_per_stage is not None:
            if isinstance(self.layers_per_stage, str) or not isinstance(self.layers_per_stage, Sequence):
                raise ConfigError(f"costs: layers_per_stage must be a list of layer counts, one per stage, "
                                  f"got {quote(self.layers_per_stage)}", field="layers_per_stage")
            object.__setattr__(self, "layers_per_stage", tuple(self.layers_per_stage))  # hashable, for _split
        self.parallel.check_fits(self.cluster)
        m = self.model
        # What tp splits: the attention heads (and the K/V heads), the hidden size, the MLP's width.
        kv = {"kv_heads": m.kv_heads} if m.kv_heads != m.heads else {}
        self.parallel.check_tp(self.cluster, heads=m.heads, **kv, hidden=m.hidden, ffn=m.ffn)

    # --- per-stage figures ---------------------------------------------------------------------------
    def stage_layers(self, num_stages: int) -> tuple[int, ...]:
        return _split(self.model.layers, num_stages, self.layers_per_stage)

    def stage_params(self, stage: int, num_stages: int) -> float:
        """Parameters of one stage per tensor shard: its layers; stage 0 the embedding; the last
        stage the final layer norm and its own copy of the tied word embedding (as Megatron keeps)."""
        m = self.model
        n = self.stage_layers(num_stages)[stage] * m.layer_params
        if stage == 0:
            n += m.embedding_params
        if stage == num_stages - 1:
            n += 2 * m.hidden + (m.vocab * m.hidden if num_stages > 1 else 0)
        return n / self.parallel.tp

    def bucket_sizes(self, stage: int, num_stages: int) -> tuple[float, ...]:
        """Bytes of each gradient/parameter bucket of a stage (fp16, 2 bytes per parameter)."""
        total, cap = 2.0 * self.stage_params(stage, num_stages), self.parallel.bucket_bytes
        count = max(1, math.ceil(total / cap))
        return tuple(min(cap, total - k * cap) for k in range(count))

    def buckets(self, num_stages: int) -> list[int]:
        return [len(self.bucket_sizes(s, num_stages)) for s in range(num_stages)]

    def pass_flops(self, kind: Kind, stage: int, num_stages: int) -> float:
        """FLOPs of one microbatch's pass on one tensor shard. B = I + W."""
        if kind is Kind.B:
            return self.pass_flops(Kind.I, stage, num_stages) + self.pass_flops(Kind.W, stage, num_stages)
        m, k = self.model, kind.value
        per_token = self.stage_layers(num_stages)[stage] * m.layer_flops(k)
        if stage == num_stages - 1:
            per_token += m.head_flops(k)
        return per_token * m.seq_len * self.microbatch_size / self.parallel.tp

    def stage_activations(self, stage: int, num_stages: int) -> float:
        m, b = self.model, self.microbatch_size
        held = self.stage_layers(num_stages)[stage] * m.layer_activation_bytes(b)
        if stage == num_stages - 1:
            held += m.head_activation_bytes(b)
        return held / self.parallel.tp

    # --- the CostModel protocol ---------------------------------------------------------------------------
    def _compute(self, action: Action, n_st: int) -> float:
        rate = self.cluster.spec.peak_flops * self.efficiency
        times = [self.pass_flops(a.kind, a.stage, n_st) / rate for a in action.parts()]
        if action.sub_actions is not None:
            return sum(times) - self.pair_overlap * min(times)
        return times[0]

    def _optim(self, stage: int, n_st: int) -> float:
        shard = self.parallel.dp if self.parallel.dp_mode in ("zero1", "zero2", "zero3", "fsdp") else 1
        return ADAM_BYTES_PER_PARAM * self.stage_params(stage, n_st) / shard / self.cluster.spec.memory_bw

    def _collective(self, task: Task, graph: TaskGraph) -> float:
        a, n_st = task.action, graph.schedule.num_stages
        n = self.bucket_sizes(a.stage, n_st)[a.bucket or 0]
        group = self.group(task.rank)
        if self.parallel.dp_mode == "ps":
            return group.ps(n)
        if self.parallel.dp <= 1:
            return 0.0
        return group.allreduce(n) if a.kind is Kind.ALLREDUCE else group.gather(n)

    def group(self, rank: int) -> DPGroup:
        return self.parallel.group(self.cluster, rank)

    def duration(self, task: Task, graph: TaskGraph) -> float:
        a, n_st = task.action, graph.schedule.num_stages
        if a.is_compute:
            return self._compute(a, n_st)
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
        return memoized_durations(self, graph, lambda t: (
            t.rank, t.peer, t.action.kind, t.action.stage, t.action.bucket,
            None if t.action.sub_actions is None else tuple((p.kind, p.stage) for p in t.action.sub_actions)))

    def bytes(self, task: Task, graph: TaskGraph) -> float:
        a = task.action
        if a.kind in (Kind.SEND_F, Kind.SEND_B, Kind.RECV_F, Kind.RECV_B):
            return self.model.boundary_bytes(self.microbatch_size) / self.parallel.tp
        if task.stream is Stream.COLLECTIVE:
            return self.bucket_sizes(a.stage, graph.schedule.num_stages)[a.bucket or 0]
        return 0.0

    def activations(self, action: Action, graph: TaskGraph) -> tuple[float, float]:
        """Bytes held from the start / freed at the end of a pass (W keeps ``w_held_fraction`` after I)."""
        n_st, mw = graph.schedule.num_stages, self.model.w_held_fraction()
        held = freed = 0.0
        for a in action.parts():
            if a.kind not in (Kind.F, Kind.B, Kind.I, Kind.W):
                continue
            size = self.stage_activations(a.stage, n_st)
            if a.kind is Kind.F:
                held += size
            elif a.kind is Kind.B:
                freed += size
            elif a.kind is Kind.I:
                freed += size * (1 - mw)
            else:
                freed += size * mw
        return held, freed

    # --- contention: delays and ports (the engine's optional ``network`` hook) -------------------------
    def network(self, graph: TaskGraph, dur: list[float]) -> tuple[list[float], list[tuple[int, ...]]]:
        """Per task: the delay after its dependencies before it is ready, and the ports it holds."""
        lag = [0.0] * len(graph.tasks)
        plan = graph.plan if isinstance(graph, DataParallelGraph) else None
        if plan is not None:
            for c, (anchor, frac) in plan.ready.items():
                lag[c] = frac * dur[anchor]
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
            elif t.stream is Stream.COLLECTIVE and dur[t.id] > 0:
                links.append(self._collective_ports(t.rank, port, ps0))
            else:
                links.append(())
        return lag, links

    def _collective_ports(self, rank: int, port: dict[str, int], ps0: int) -> tuple[int, ...]:
        g = self.parallel.device(rank)
        if self.parallel.dp_mode == "ps":
            servers = len(self.cluster.pservers)
            return (port["inter-out"] + g, port["inter-in"] + g, *range(ps0, ps0 + 2 * servers))
        return tuple(port[f"{kind}-{d}"] + g for kind in self.group(rank).uses for d in ("out", "in"))

    def describe(self) -> dict[str, Any]:
        p = self.parallel
        return {
            "model": "transformer",
            "transformer": self.model.name,
            "cluster": self.cluster.name,
            "pp": p.pp, "dp": p.dp, "tp": p.tp, "dp_mode": p.dp_mode, "order": p.order,
            "bucket_mb": p.bucket_mb, "collective": p.collective,
            "microbatch_size": self.microbatch_size,
            "efficiency": self.efficiency,
            "pair_overlap": self.pair_overlap,
        }
