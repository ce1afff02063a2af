"""The discrete-event engine: a TaskGraph, a CostModel -> a SimResult.

SimPy keeps the clock and the event queue; tasks are not SimPy processes.
Each task has a counter of unfinished dependencies; when a task ends, a
callback decrements its successors' counters and starts those that reach
zero (design note: this is 5-8x faster than one generator process per task).
A task that becomes ready starts at once: a compute stream is serial because
program order is a dependency, so no resource is needed.

Tasks of zero duration (a RECV whose message has arrived, communication at
t_comm = 0) finish without an event, and tasks that end at the same instant
share one event. Ties are broken by SimPy's insertion
order, which follows task ids, so the same inputs give the same result bit
for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import simpy

from schedules import ScheduleError, Stream, TaskGraph, validate
from schedules.trace import make_trace
from schedules.util import paused_gc
from sim.costs import CostModel

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RankStats", "SimResult", "simulate"]


@dataclass(frozen=True, slots=True)
class RankStats:
    rank: int
    busy: float  # compute-busy time
    first_start: float  # first compute task's start
    last_end: float  # last compute task's end
    peak_activations: float  # in M_B

    def to_dict(self) -> dict[str, float]:
        return {
            "rank": self.rank,
            "busy": self.busy,
            "first_start": self.first_start,
            "last_end": self.last_end,
            "peak_activations": self.peak_activations,
        }


@dataclass(frozen=True, eq=False)
class SimResult:
    """Times of every task plus the summary figures; the trace DataFrame is built on first use."""

    graph: TaskGraph
    costs: dict[str, Any]
    start: list[float] = field(repr=False)
    end: list[float] = field(repr=False)
    bytes_moved: list[float] = field(repr=False)
    ranks: tuple[RankStats, ...]

    @property
    def schedule(self) -> str:
        return self.graph.schedule.name

    @property
    def makespan(self) -> float:
        return max(self.end, default=0.0) - min(self.start, default=0.0)

    @property
    def bubble_ratio(self) -> float:
        """1 - (sum of compute-busy time) / (ranks x makespan)."""
        span = self.makespan
        if span <= 0:
            return 0.0
        return 1.0 - sum(r.busy for r in self.ranks) / (len(self.ranks) * span)

    @property
    def span_bubble(self) -> float:
        """The zero-bubble papers' bubble rate: 1 - busy / cost, cost the largest span (last end - first start)
        of a rank, busy the largest busy time (Qi et al. 2024, Table 5)."""
        cost = max((r.last_end - r.first_start for r in self.ranks), default=0.0)
        if cost <= 0:
            return 0.0
        return 1.0 - max(r.busy for r in self.ranks) / cost

    @property
    def peak_activations(self) -> float:
        return max(r.peak_activations for r in self.ranks)

    def meta(self) -> dict[str, Any]:
        sched = self.graph.schedule
        return {
            "source": "sim",
            "schedule": sched.name,
            "params": dict(sched.params),
            "costs": self.costs,
        }

    @cached_property
    def trace(self) -> pd.DataFrame:
        tasks = self.graph.tasks
        cols = {
            "rank": [t.rank for t in tasks],
            "stream": [t.stream.value for t in tasks],
            "action": [str(t.action) for t in tasks],
            "kind": [t.action.kind.value for t in tasks],
            "stage": [t.action.stage for t in tasks],
            "microbatch": [-1 if t.action.microbatch is None else t.action.microbatch for t in tasks],
            "start": self.start,
            "end": self.end,
            "bytes": self.bytes_moved,
        }
        return make_trace(cols, self.meta())

    def to_dict(self) -> dict[str, Any]:
        sched = self.graph.schedule
        return {
            "schedule": sched.name,
            "pp": sched.num_ranks,
            "microbatches": sched.num_microbatches,
            "chunks": sched.chunks,
            "stages": sched.num_stages,
            "makespan": self.makespan,
            "bubble_ratio": self.bubble_ratio,
            "span_bubble": self.span_bubble,
            "peak_activations": self.peak_activations,
            "costs": self.costs,
            "ranks": [r.to_dict() for r in self.ranks],
            # zb-auto: what its exact refinement did (schedules.zb_auto's module doc)
            **({"refinement": sched.params["refinement"], "refined": sched.params["refined"]}
               if "refinement" in sched.params else {}),
        }


def simulate(graph: TaskGraph, costs: CostModel, *, check: bool = True) -> SimResult:
    """Run the task graph under the cost model; deterministic.

    ``check`` validates the graph first (a deadlock is reported, not simulated);
    pass False only for a graph that :func:`schedules.validate` already accepted.
    """
    if check:
        validate(graph)
    with paused_gc():  # millions of small allocations; a full collection would walk the whole graph
        return _simulate(graph, costs)


def _simulate(graph: TaskGraph, costs: CostModel) -> SimResult:
    tasks = graph.tasks
    n = len(tasks)
    batch = getattr(costs, "durations", None)  # optional: a model may answer for the whole graph at once
    if batch is not None:
        dur = [float(d) for d in batch(graph)]
    else:
        duration = costs.duration
        dur = [float(duration(t, graph)) for t in tasks]
    if not all(0.0 <= d < math.inf for d in dur):  # also catches NaN
        t, d = next((t, d) for t, d in zip(tasks, dur, strict=True) if not 0.0 <= d < math.inf)
        raise ScheduleError(f"schedule {graph.schedule.name!r}: the cost model gives task {t.action} on rank {t.rank} "
                            f"duration {d}; need a finite time >= 0 (are the pass times so large that they overflow?)")
    start = [math.nan] * n
    end = [math.nan] * n
    network = getattr(costs, "network", None)  # optional: delays and shared links (physical-units models)
    hooks = network(graph, dur) if network is not None else None  # None: nothing for this graph
    if hooks is None:
        _run_engine(graph, dur, start, end)
    else:
        lag, links = hooks
        _run_engine_links(graph, dur, lag, links, start, end)
    if n and not math.isfinite(max(end)):
        raise ScheduleError(f"schedule {graph.schedule.name!r}: the simulated step overflows to {max(end)} "
                            "(finite pass times whose sum exceeds the largest float); use smaller times")
    return SimResult(
        graph=graph,
        costs=costs.describe(),
        start=start,
        end=end,
        bytes_moved=[0.0 if t.stream is Stream.COMPUTE else float(costs.bytes(t, graph)) for t in tasks],
        ranks=_rank_stats(graph, costs, start, end),
    )


def _counters(graph: TaskGraph, end: list[float]) -> tuple[Callable[[int, float, list[int]], None], list[int]]:
    """The two engines' shared dependency counting: ``finish(i, now, ready)`` ends task i and appends the
    successors it frees to ``ready``; the second value is the tasks ready at time 0, highest id first (a
    stack pops the lowest first)."""
    succ = graph.successors
    waiting = [len(t.deps) for t in graph.tasks]

    def finish(i: int, now: float, ready: list[int]) -> None:
        end[i] = now
        for j in succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)

    return finish, [i for i in range(len(waiting) - 1, -1, -1) if waiting[i] == 0]


def _drain(env: simpy.Environment, release: Callable[[list[int], float], None], ready: list[int],
           end: list[float]) -> None:
    """Release the tasks ready at 0, run the clock out, and refuse a graph some of whose tasks never ran."""
    release(ready, 0.0)
    env.run()
    unfinished = sum(1 for e in end if e != e)  # NaN: never ran
    if unfinished:
        raise RuntimeError(f"simulation stalled with {unfinished} tasks never run; validate the graph first")


def _run_engine(graph: TaskGraph, dur: list[float], start: list[float], end: list[float]) -> None:
    """Dependency counters on a SimPy clock, one SimPy event per distinct end time.

    Tasks that end at the same instant share one event (uniform costs end whole
    wavefronts together) and finish in the order they started. The callbacks
    are closures over plain lists: this loop is the simulator's hot path.
    """
    env = simpy.Environment(initial_time=0.0)
    finish, initial = _counters(graph, end)
    ending: dict[float, list[int]] = {}  # end time -> tasks running until then
    timeout = env.timeout

    def release(stack: list[int], now: float) -> None:
        # Start every task on the stack; zero-length ones finish at once (a worklist, no recursion).
        while stack:
            i = stack.pop()
            start[i] = now
            d = dur[i]
            if d > 0.0:
                t = now + d
                batch = ending.get(t)
                if batch is None:
                    ending[t] = [i]
                    timeout(d, t).callbacks.append(on_end)
                else:
                    batch.append(i)
                continue
            more: list[int] = []
            finish(i, now, more)
            stack.extend(reversed(more))

    def on_end(event: simpy.Event) -> None:
        now = event.value
        ready: list[int] = []
        for i in ending.pop(now):
            finish(i, now, ready)
        if ready:
            ready.reverse()
            release(ready, now)

    _drain(env, release, initial, end)


def _run_engine_links(
    graph: TaskGraph, dur: list[float], lag: list[float], links: list[tuple[int, ...]],
    start: list[float], end: list[float],
) -> None:
    """The engine with ready delays and FIFO links, for cost models that define ``network``.

    A task whose dependencies are done waits ``lag[i]`` (e.g. a gradient bucket
    that is ready part-way through a backward), then reserves every link in
    ``links[i]``: it starts when the last of them is free and holds them all
    until it ends. Reservations happen in the order tasks become ready (event
    time, then task order), so each link is a FIFO queue.
    """
    env = simpy.Environment(initial_time=0.0)
    finish, initial = _counters(graph, end)
    free_at: dict[int, float] = {}
    events: dict[float, list[tuple[bool, int]]] = {}  # time -> [(is_end, task)]

    def at(t: float, item: tuple[bool, int]) -> None:
        batch = events.get(t)
        if batch is None:
            events[t] = [item]
            env.timeout(t - env.now, t).callbacks.append(on_event)
        else:
            batch.append(item)

    def acquire(i: int, now: float, ready: list[int]) -> None:
        s = now
        for link in links[i]:
            s = max(s, free_at.get(link, 0.0))
        e = s + dur[i]
        for link in links[i]:
            free_at[link] = e
        start[i] = s
        if e > now:
            at(e, (True, i))
        else:
            finish(i, now, ready)

    def release(stack: list[int], now: float) -> None:
        while stack:
            i = stack.pop()
            if lag[i] > 0.0:
                at(now + lag[i], (False, i))
            else:
                more: list[int] = []
                acquire(i, now, more)
                stack.extend(reversed(more))

    def on_event(event: simpy.Event) -> None:
        now = event.value
        ready: list[int] = []
        for is_end, i in events.pop(now):
            if is_end:
                finish(i, now, ready)
            else:
                acquire(i, now, ready)
        if ready:
            ready.reverse()
            release(ready, now)

    _drain(env, release, initial, end)


def _rank_stats(graph: TaskGraph, costs: CostModel, start: list[float], end: list[float]) -> tuple[RankStats, ...]:
    stats = []
    tasks, activations, compute = graph.tasks, costs.activations, Stream.COMPUTE
    for rank, prog in enumerate(graph.programs):
        ids = [i for i in prog if tasks[i].stream is compute]
        busy = sum(end[i] - start[i] for i in ids)
        first = min((start[i] for i in ids), default=0.0)
        last = max((end[i] for i in ids), default=0.0)
        # Compute is serial on a rank, so memory follows program order:
        # a pass holds its activations from its start and frees at its end.
        held = peak = 0.0
        for i in ids:
            alloc, free = activations(tasks[i].action, graph)
            held += alloc
            if held > peak:
                peak = held
            held -= free
        stats.append(RankStats(rank, busy, first, last, peak))
    return tuple(stats)
