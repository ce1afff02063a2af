"""Data parallelism as a pass: a pipeline TaskGraph -> a new TaskGraph with collectives.

The graph stays one pipeline replica (its pp ranks); the ranks that hold the
same stage in the other dp replicas run the same program at the same times,
so each collective is one task of the replica's rank and its cost (set by a
cost model) covers the whole dp group. Sizes stay abstract here: the caller
says how many buckets each stage's parameters make.

Modes (``fsdp`` is an alias of ``zero3``):

* ``sync``: after a rank's last compute, ALLREDUCE every bucket of its stages,
  then one OPTIM per stage on the compute stream;
* ``ddp``: a stage's buckets are all-reduced while its last gradient pass (the
  last B or W of the stage) runs: bucket k is ready (k+1)/K of the way
  through that pass (gradients appear from the last layer backwards), then
  OPTIM after the stage's buckets;
* ``zero1``: as ddp with REDUCE_SCATTER instead of ALLREDUCE, OPTIM on the
  shard, then ALL_GATHER of the updated parameters;
* ``zero2``: gradients are kept sharded, so every microbatch's gradient pass
  reduce-scatters its buckets (ready as in ddp); OPTIM, then ALL_GATHER;
* ``zero3``: parameters are sharded too: before each F, I or B of a stage its
  buckets are all-gathered (prefetched: released when the compute before it
  starts), gradients reduce-scattered as in zero2, OPTIM on the shard;
* ``ps``: each bucket is pushed to the parameter servers (REDUCE_SCATTER) when
  ready, as in ddp, and pulled back (ALL_GATHER) after its push; the update runs
  on the servers.

Collectives go on the ``collective`` stream and do not wait for each other:
the cost model's links order them. Which compute task and how far into it
a collective becomes ready is recorded in :class:`DPPlan` (``ready``), for
the cost model to turn into a delay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from schedules.errors import ScheduleError
from schedules.graph import Stream, Task, TaskGraph
from schedules.ir import Action, Kind
from schedules.util import paused_gc

__all__ = ["DP_MODES", "DPPlan", "DataParallelGraph", "add_data_parallel"]

DP_MODES = ("none", "sync", "ddp", "zero1", "zero2", "zero3", "fsdp", "ps")
_GRAD_KINDS = (Kind.B, Kind.W)
_PARAM_KINDS = (Kind.F, Kind.I, Kind.B)


@dataclass(frozen=True, slots=True)
class DPPlan:
    """What the pass decided: the mode, buckets per stage, and each delayed collective's anchor.

    ``ready[c] = (a, f)``: collective task c becomes ready a fraction f of compute
    task a's duration after a starts (c's dependencies are a's, so both are
    released together).
    """

    mode: str
    buckets: tuple[int, ...]
    ready: Mapping[int, tuple[int, float]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class DataParallelGraph(TaskGraph):
    """A TaskGraph plus the :class:`DPPlan` that made its collectives."""

    plan: DPPlan | None = None


def add_data_parallel(graph: TaskGraph, mode: str, buckets: Sequence[int]) -> TaskGraph:
    """Return a new graph with ``mode``'s collectives and optimizer steps; ``buckets[s]`` per stage."""
    if mode not in DP_MODES:
        raise ScheduleError(f"unknown dp mode {mode!r}; valid modes: {', '.join(DP_MODES)}")
    mode = "zero3" if mode == "fsdp" else mode
    n_st = graph.schedule.num_stages
    if len(buckets) != n_st or any(not isinstance(b, int) or b < 1 for b in buckets):
        raise ScheduleError(f"buckets {list(buckets)} must give {n_st} stage(s) an integer count >= 1 each")
    if mode == "none":
        return graph
    with paused_gc():
        return _DPBuilder(graph, mode, tuple(buckets)).build()


class _DPBuilder:
    def __init__(self, graph: TaskGraph, mode: str, buckets: tuple[int, ...]) -> None:
        self.graph, self.mode, self.buckets = graph, mode, buckets
        self.tasks: list[Task] = list(graph.tasks)
        self.programs = [list(p) for p in graph.programs]
        self.ready: dict[int, tuple[int, float]] = {}

    def _add(self, rank: int, stream: Stream, action: Action, deps: Sequence[int]) -> int:
        tid = len(self.tasks)
        self.tasks.append(Task(tid, rank, stream, action, tuple(deps)))
        self.programs[rank].append(tid)
        return tid

    def _bucketed(self, rank: int, kind: Kind, stage: int, mb: int | None, anchor: int | None,
                  deps: Sequence[int]) -> list[int]:
        """One collective per bucket of ``stage``; with an anchor, bucket k is ready (k+1)/K into it."""
        n = self.buckets[stage]
        out = []
        for k in range(n):
            tid = self._add(rank, Stream.COLLECTIVE, Action(kind, stage, mb, bucket=k), deps)
            if anchor is not None:
                self.ready[tid] = (anchor, (k + 1) / n)
            out.append(tid)
        return out

    def build(self) -> DataParallelGraph:
        for rank in range(self.graph.num_ranks):
            self._rank(rank)
        plan = DPPlan(self.mode, self.buckets, MappingProxyType(self.ready))
        return DataParallelGraph(self.graph.schedule, tuple(self.tasks), tuple(tuple(p) for p in self.programs), plan)

    def _rank(self, rank: int) -> None:
        compute = [i for i in self.graph.programs[rank] if self.tasks[i].stream is Stream.COMPUTE]
        if not compute:
            return
        stages = self.graph.schedule.stages_of(rank)
        grads: dict[int, list[int]] = {s: [] for s in stages}  # stage -> its gradient collectives
        if self.mode == "zero3":
            self._gather_params(rank, compute)
        for s in stages:
            producers = [i for i in compute if any(p.stage == s and p.kind in _GRAD_KINDS for p in self.tasks[i].action.parts())]
            if self.mode == "sync":
                grads[s] = self._bucketed(rank, Kind.ALLREDUCE, s, None, None, (compute[-1],))
            elif self.mode in ("zero2", "zero3"):
                for a in producers:
                    mb = next(p.microbatch for p in self.tasks[a].action.parts() if p.stage == s)
                    grads[s] += self._bucketed(rank, Kind.REDUCE_SCATTER, s, mb, a, self.tasks[a].deps)
            else:
                kind = Kind.ALLREDUCE if self.mode == "ddp" else Kind.REDUCE_SCATTER
                last = producers[-1]
                grads[s] = self._bucketed(rank, kind, s, None, last, self.tasks[last].deps)
        prev = compute[-1]
        for s in stages:
            if self.mode == "ps":
                for k, push in enumerate(grads[s]):
                    self._add(rank, Stream.COLLECTIVE, Action(Kind.ALL_GATHER, s, None, bucket=k), (push,))
                continue
            prev = self._add(rank, Stream.COMPUTE, Action(Kind.OPTIM, s), (prev, *grads[s]))
            if self.mode in ("zero1", "zero2"):
                self._bucketed(rank, Kind.ALL_GATHER, s, None, None, (prev,))

    def _gather_params(self, rank: int, compute: list[int]) -> None:
        """ZeRO-3: all-gather a stage's parameters before each pass that reads them, one pass ahead."""
        for pos, i in enumerate(compute):
            task = self.tasks[i]
            release = self.tasks[compute[pos - 1]].deps if pos > 0 else ()
            gathers: list[int] = []
            for p in task.action.parts():
                if p.kind in _PARAM_KINDS:
                    gathers += self._bucketed(rank, Kind.ALL_GATHER, p.stage, p.microbatch, None, release)
            if gathers:
                self.tasks[i] = Task(task.id, task.rank, task.stream, task.action, (*task.deps, *gathers), task.peer)
