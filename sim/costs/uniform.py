"""Cost models: how long a task takes, how many bytes it moves, what memory it holds.

Every cost formula of the simulator lives in a cost model; the engine only
asks. The uniform model here is the one the pipeline literature draws its
schedules with: fixed pass times, a fixed message delay.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from common.errors import check_fraction
from schedules import Action, Kind, ScheduleError, Task, TaskGraph
from schedules.registry import check_uniform_times
from schedules.timing import MW_RUNTIME, action_held_freed, pass_time, recomputed_keys

_RECOMPUTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # graph -> its recomputed (stage, mb)


def recomputed_in(graph: TaskGraph) -> frozenset[tuple[int, int | None]]:
    """The (stage, microbatch) pairs some R of ``graph`` recomputes (computed once per graph)."""
    found = _RECOMPUTED.get(graph)
    if found is None:
        found = _RECOMPUTED[graph] = recomputed_keys(graph.schedule.programs)
    return found

__all__ = ["CostModel", "UniformCosts", "memoized_durations"]


def memoized_durations(model: CostModel, graph: TaskGraph, key: Callable[[Task], Hashable]) -> list[float]:
    """Every task's duration in task-id order, asking ``model.duration`` once per distinct ``key(task)``.

    For a cost model's ``durations`` fast path: ``key`` must capture everything
    the model's duration depends on.
    """
    memo: dict[Hashable, float] = {}
    out = []
    for task in graph.tasks:
        k = key(task)
        d = memo.get(k)
        if d is None:
            d = memo[k] = model.duration(task, graph)
        out.append(d)
    return out


@runtime_checkable
class CostModel(Protocol):
    """What the simulator needs to know about a task on its device."""

    def duration(self, task: Task, graph: TaskGraph) -> float:
        """Seconds (or unit-free time) the task occupies its stream.

        A model may also define ``durations(graph) -> list[float]`` giving every
        task's duration in task-id order; the engine then uses that instead.
        """

    def bytes(self, task: Task, graph: TaskGraph) -> float:
        """Bytes the task moves (0 for compute)."""

    def activations(self, action: Action, graph: TaskGraph) -> tuple[float, float]:
        """(held from the start, freed at the end) of a compute action, in M_B."""

    def describe(self) -> dict[str, Any]:
        """The model's parameters, for trace metadata and reports."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UniformCosts:
    """Fixed pass times per rank-stage, a pure delay per cross-rank message.

    ``tf``, ``tb`` and ``tw`` are the times of the forward, the input-gradient
    backward and the weight-gradient backward of one microbatch through one
    rank's whole share of layers; a full backward B costs tb + tw. With v
    chunks per rank each chunk's pass costs 1/v of that. ``tcomm`` delays every
    cross-rank message: the consumer starts no earlier than producer end + tcomm.

    Activations, in M_B (one microbatch through a rank's whole share): a chunk's
    F holds 1/v; B frees it; I frees all but the fraction ``mw`` that W still
    needs, and W frees that. The default ``mw`` = 1 is the runtime's: its I keeps
    the whole autograd graph until W (:data:`schedules.timing.MW_RUNTIME`);
    ``mw`` = 0 models a runtime that frees everything at I (the zero-bubble
    paper's accounting as reproduced here). A recomputed microbatch's F keeps
    only its input, ``input_fraction`` of the chunk's share (default 0), and its
    R, costing a forward, holds the rest again until the backward
    (:mod:`schedules.timing` has the arithmetic).

    An overlapped pair (OVERLAP_F_B, DualPipe's F of one chunk with B of the
    other) costs the sum of its passes less ``pair_overlap`` times the shorter
    one: 0 (default) runs them back to back, 1 hides the shorter completely.
    """

    tf: float = 1.0
    tb: float = 1.0
    tw: float = 1.0
    tcomm: float = 0.0
    mw: float = MW_RUNTIME
    pair_overlap: float = 0.0
    input_fraction: float = 0.0

    def __post_init__(self) -> None:
        check_uniform_times(tf=self.tf, tb=self.tb, tw=self.tw, tcomm=self.tcomm, mw=self.mw)
        check_fraction("uniform costs", "pair_overlap", self.pair_overlap, "a fraction of the shorter pass hidden",
                       error=ScheduleError)
        check_fraction("uniform costs", "input_fraction", self.input_fraction,
                       "a fraction of the chunk's activations", error=ScheduleError)

    def _pass(self, kind: Kind) -> float:
        return pass_time(kind, self.tf, self.tb, self.tw)

    def duration(self, task: Task, graph: TaskGraph) -> float:
        action = task.action
        if action.sub_actions is not None:
            times = [self._pass(a.kind) for a in action.sub_actions]
            return (sum(times) - self.pair_overlap * min(times)) / graph.schedule.chunks
        if action.is_compute:
            return self._pass(action.kind) / graph.schedule.chunks
        if action.kind in (Kind.SEND_F, Kind.SEND_B):
            return self.tcomm  # the message's flight time sits on the send
        return 0.0

    def durations(self, graph: TaskGraph) -> list[float]:
        """All tasks' durations at once (the engine's fast path): a task's cost depends only on its kinds."""
        return memoized_durations(self, graph, lambda t: (t.action.kind, *(a.kind for a in t.action.parts())))

    def bytes(self, task: Task, graph: TaskGraph) -> float:
        return 0.0

    def activations(self, action: Action, graph: TaskGraph) -> tuple[float, float]:
        share = 1.0 / graph.schedule.chunks
        return action_held_freed(action, lambda _a: share, self.mw, recomputed_in(graph), self.input_fraction)

    def describe(self) -> dict[str, Any]:
        return {"model": "uniform", **asdict(self)}
