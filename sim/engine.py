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

A cost model with a ``network`` hook (:class:`sim.network.Network`) adds ready
delays and ports: transfers on one port queue (``fcfs``) or share its
bandwidth as max-min fair flows (``fair``). One event loop serves every case.

Compute slowed by concurrent communication has two paths, one per network
model, for the same effect:

* ``fcfs`` (the profiled cost models of this machine): a cost model with a
  ``comm_slowdown`` factor other than 1.0 (measured by ``real.profile``,
  :mod:`sim.slowdown`) stretches the compute of a rank while one of its
  collectives is in flight, ready delays counted on the same slowed clock, and
  one with a ``max_inflight`` bound stops a zero2/zero3 rank's compute while
  more of its reduce-scatters are in flight;
* ``fair`` (the GPU device models): a network with ``contention`` (the
  device's ``comm_slowdown``, a sourced mean, :mod:`sim.costs.devices`) slows a
  rank's compute while any transfer of the rank is in flight
  (:func:`_contended`).

1.0 and 0 (or no such attributes) take the plain paths, bit for bit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import simpy

from schedules import Schedule, ScheduleError, Stream, TaskGraph, lower, validate
from schedules.dp.modes import server_update
from schedules.trace import make_trace
from schedules.util import paused_gc
from sim.costs.uniform import CostModel, UniformCosts
from sim.network import FairLinks, Network
from sim.slowdown import check_factor, check_max_inflight, slowed_links

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RankStats", "SimResult", "activation_peaks", "simulate"]


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
            # zb-auto: what its exact refinement did (schedules.library.zb_auto's module doc)
            **({"refinement": sched.params["refinement"], "refined": sched.params["refined"]}
               if "refinement" in sched.params else {}),
        }


def simulate(graph: TaskGraph | Schedule, costs: CostModel | None = None, *, check: bool = True,
             peaks: bool = True) -> SimResult:
    """Run the task graph (or a schedule, lowered here) under the cost model (default: :class:`UniformCosts`);
    deterministic: ``simulate(schedule, costs)`` is ``simulate(lower(schedule), costs)``.

    ``check`` validates the graph first (a deadlock is reported, not simulated);
    pass False only for a graph that :func:`schedules.validate` already accepted.
    ``peaks=False`` leaves each rank's ``peak_activations`` NaN (for a caller
    that has the peak already, e.g. the planner's activation rows: on a large
    graph the accounting is a tenth of the run).
    """
    if isinstance(graph, Schedule):
        graph = validate(graph) if check else lower(graph)
    elif not isinstance(graph, TaskGraph):
        raise ScheduleError(f"simulate: graph must be a Schedule or a TaskGraph (schedules.build, schedules.lower), "
                            f"got {type(graph).__name__}", field="graph")
    elif check:
        validate(graph)
    if costs is None:
        costs = UniformCosts()
    with paused_gc():  # millions of small allocations; a full collection would walk the whole graph
        return _simulate(graph, costs, peaks)


def _simulate(graph: TaskGraph, costs: CostModel, peaks: bool = True) -> SimResult:
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
    if hooks is not None and not isinstance(hooks, Network):  # (lag, links): the older hook, first come first served
        lag, links = hooks
        hooks = Network(lag=lag, links=links, latency=[0.0] * n, model="fcfs")
    if hooks is not None:
        sizes = {k: len(v) for k, v in (("lag", hooks.lag), ("links", hooks.links), ("latency", hooks.latency),
                                        ("queue", hooks.queue or [0] * n))}
        if any(size != n for size in sizes.values()):
            raise ValueError(f"the cost model's network gives {sizes} entries for a graph of {n} tasks; give one per task")
    _run(graph, dur, start, end, hooks, check_factor(getattr(costs, "comm_slowdown", 1.0)),
         check_max_inflight(getattr(costs, "max_inflight", 0)), check_factor(getattr(costs, "comm_stall", 1.0)))
    if n and not math.isfinite(max(end)):
        raise ScheduleError(f"schedule {graph.schedule.name!r}: the simulated step overflows to {max(end)} "
                            "(finite pass times whose sum exceeds the largest float); use smaller times")
    return SimResult(
        graph=graph,
        costs=costs.describe(),
        start=start,
        end=end,
        bytes_moved=[0.0 if t.stream is Stream.COMPUTE else float(costs.bytes(t, graph)) for t in tasks],
        ranks=_rank_stats(graph, costs, start, end, peaks),
    )


def _counters(graph: TaskGraph, end: list[float]) -> tuple[Callable[[int, float, list[int]], None], list[int]]:
    """Dependency counting: ``finish(i, now, ready)`` ends task i and appends the successors it frees to
    ``ready``; the second value is the tasks ready at time 0, highest id first (a stack pops the lowest first)."""
    succ = graph.successors
    waiting = [len(t.deps) for t in graph.tasks]

    def finish(i: int, now: float, ready: list[int]) -> None:
        end[i] = now
        for j in succ[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                ready.append(j)

    return finish, [i for i in range(len(waiting) - 1, -1, -1) if waiting[i] == 0]


# network events: a transfer's latency is over; a flow's bytes have moved (if still current); a queued task
# that moves no bytes ends; a compute task slowed by communication ends (if still current)
_JOIN, _DONE, _END, _CEND = 0, 1, 2, 3


def _run(graph: TaskGraph, dur: list[float], start: list[float], end: list[float], net: Network | None,
         slowdown: float = 1.0, max_inflight: int = 0, stall: float = 1.0) -> None:
    """The event loop: dependency counters on a SimPy clock, one SimPy event per distinct time.

    An event's items run in the order they were scheduled: a task id (>= 0)
    ends that task; ``~i`` (< 0) ends task i's ready delay (``net.lag``), and a
    tuple is a network event (:func:`_links`). What starting a ready task means
    is ``begin``: run it for its duration, or hand it to the links. The
    callbacks are closures over plain lists: this loop is the simulator's hot path.
    With a network and ``slowdown`` other than 1.0 or a ``max_inflight`` bound,
    :func:`sim.slowdown.slowed_links` gives ``begin``, ``on_network`` and ``delay`` (ready delays counted in
    the rank's compute work).
    """
    env = simpy.Environment(initial_time=0.0)
    finish, initial = _counters(graph, end)
    events: dict[float, list[Any]] = {}  # time -> items due then
    timeout = env.timeout

    def at(t: float, delay: float, item: Any) -> None:
        batch = events.get(t)
        if batch is None:
            events[t] = [item]
            timeout(delay, t).callbacks.append(on_event)
        else:
            batch.append(item)

    def run_alone(i: int, now: float, ready: list[int]) -> None:
        start[i] = now
        d = dur[i]
        if d > 0.0:
            at(now + d, d, i)
        else:
            finish(i, now, ready)

    delay = None
    if net is None:
        begin, on_network, flush = run_alone, None, None
    elif slowdown != 1.0 or max_inflight or stall != 1.0:
        (begin, on_network, delay), flush = slowed_links(graph, net, dur, start, finish, at, slowdown,
                                                         max_inflight, stall), None
    elif net.model == "fair" and net.contention > 0.0:
        finish, run_alone, begin, on_network, flush = _contended(graph, net, dur, start, finish, at, run_alone)
    else:
        begin, on_network, flush = _links(net, dur, start, finish, at, run_alone)
    lag = None if net is None else net.lag

    def release(stack: list[int], now: float) -> None:
        # Start every task on the stack; those that finish at once free more (a worklist, no recursion).
        # Without a network, run_alone and at are written out here: this is the hot path.
        while stack:
            i = stack.pop()
            top = len(stack)
            if lag is not None:
                if lag[i] > 0.0:
                    if delay is None:
                        at(now + lag[i], lag[i], ~i)
                    else:
                        delay(i, now)
                    continue
                begin(i, now, stack)
            else:
                start[i] = now
                d = dur[i]
                if d > 0.0:
                    t = now + d
                    batch = events.get(t)
                    if batch is None:
                        events[t] = [i]
                        timeout(d, t).callbacks.append(on_event)
                    else:
                        batch.append(i)
                    continue
                finish(i, now, stack)
            if len(stack) - top > 1:
                stack[top:] = stack[top:][::-1]  # the lowest freed id on top

    def on_event(event: simpy.Event) -> None:
        now = event.value
        ready: list[int] = []
        for item in events.pop(now):
            if item.__class__ is int:
                if item >= 0:
                    finish(item, now, ready)
                else:
                    begin(~item, now, ready)
            else:
                on_network(item, now, ready)
        if ready:
            ready.reverse()
            release(ready, now)
        if flush is not None:
            flush(now)

    release(initial, 0.0)
    if flush is not None:
        flush(0.0)
    env.run()
    unfinished = sum(1 for e in end if e != e)  # NaN: never ran
    if unfinished:
        raise RuntimeError(f"simulation stalled with {unfinished} tasks never run; validate the graph first")


def _links(net: Network, dur: list[float], start: list[float], finish: Callable[[int, float, list[int]], None],
           at: Callable[[float, float, Any], None], run_alone: Callable[[int, float, list[int]], None],
           started: Callable[[int, float], None] | None = None) -> tuple:
    """``begin``, ``on_network`` and ``flush`` for tasks on ports, under ``net.model`` (:mod:`sim.network`).

    fcfs: a ready task reserves every port in ``net.links[i]``: it starts when
    the last of them is free and holds them all until it ends; reservations
    follow the order tasks become ready (event time, then task order), so each
    port is a FIFO queue. fair: a task waits for the running task of its
    ``net.queue`` (one communicator's collectives run in order), pays its
    latency, then joins as a flow; joins and completions of one instant are
    handed to :class:`FairLinks` together (``flush``), which says which flows'
    ends moved.
    """
    links = net.links
    if net.model == "fcfs":
        free_at: dict[int, float] = {}

        def acquire(i: int, now: float, ready: list[int]) -> None:
            s = now
            for link in links[i]:
                s = max(s, free_at.get(link, 0.0))
            e = s + dur[i]
            for link in links[i]:
                free_at[link] = e
            start[i] = s
            if e > now:
                at(e, e - now, i)
            else:
                finish(i, now, ready)

        return acquire, None, None

    latency, fair = net.latency, FairLinks(links)
    queue = net.queue or [-1] * len(dur)
    busy: set[int] = set()
    waiting: dict[int, deque[int]] = {}
    joins: list[tuple[int, float, float]] = []
    leaves: list[int] = []

    def begin(i: int, now: float, ready: list[int]) -> None:
        q = queue[i]
        if q < 0 or dur[i] <= 0.0:
            go(i, now, ready)
        elif q in busy:
            waiting.setdefault(q, deque()).append(i)
        else:
            busy.add(q)
            go(i, now, ready)

    def go(i: int, now: float, ready: list[int]) -> None:
        d, lat = dur[i], latency[i]
        if not links[i] or lat >= d:  # on no port, or nothing but latency: timed alone
            if queue[i] < 0 or d <= 0.0:
                run_alone(i, now, ready)
            else:
                if started is not None:
                    started(i, now)
                start[i] = now
                at(now + d, d, (_END, i, 0))
            return
        if started is not None:
            started(i, now)
        if lat > 0.0:
            start[i] = now
            at(now + lat, lat, (_JOIN, i, now))
        else:
            start[i] = now
            joins.append((i, d, now + d))

    def done(i: int, now: float, ready: list[int]) -> None:
        finish(i, now, ready)
        q = queue[i]
        if q >= 0:
            line = waiting.get(q)
            if line:
                go(line.popleft(), now, ready)
            else:
                busy.discard(q)

    def on_network(item: tuple[int, int, float], now: float, ready: list[int]) -> None:
        what, i, x = item
        if what == _JOIN:
            joins.append((i, dur[i] - latency[i], x + dur[i]))
        elif what == _END:
            done(i, now, ready)
        elif fair.current(i, x):
            leaves.append(i)
            done(i, now, ready)

    def flush(now: float) -> None:
        if joins or leaves:
            for f, e, version in fair.update(now, joins, leaves):
                at(e, e - now, (_DONE, f, version))
            joins.clear()
            leaves.clear()

    return begin, on_network, flush


def _contended(graph: TaskGraph, net: Network, dur: list[float], start: list[float],
               finish: Callable[[int, float, list[int]], None], at: Callable[[float, float, Any], None],
               run_alone: Callable[[int, float, list[int]], None]) -> tuple:
    """The fair links plus compute slowed while its rank communicates (:class:`Network` ``contention``).

    A transfer counts from its start (its ``start`` time set) to its end, on its rank and, for a send, its
    peer. A compute task of a communicating rank runs at 1 / (1 + contention); when the rank starts or stops
    communicating its remaining work is re-timed and its end moved (a versioned ``_CEND`` event).
    """
    tasks, slow = graph.tasks, 1.0 / (1.0 + net.contention)
    sides = [() if t.stream is Stream.COMPUTE or server_update(t)  # ps: the servers' update is not the rank's
             else (t.rank,) if t.peer is None else (t.rank, t.peer) for t in tasks]
    active = [0] * graph.num_ranks
    live: set[int] = set()  # transfers started and not ended
    running: dict[int, list] = {}  # rank -> [task, work left at full speed, since, rate, version]

    def retime(r: int, now: float) -> None:
        run = running.get(r)
        new = slow if active[r] else 1.0
        if run is None or run[3] == new:
            return
        run[1] -= (now - run[2]) * run[3]
        run[2], run[3], run[4] = now, new, run[4] + 1
        at(now + run[1] / new, run[1] / new, (_CEND, run[0], run[4]))

    def started(i: int, now: float) -> None:
        live.add(i)
        for r in sides[i]:
            active[r] += 1
            if active[r] == 1:
                retime(r, now)

    def finish_c(i: int, now: float, ready: list[int]) -> None:
        if i in live:
            live.discard(i)
            for r in sides[i]:
                active[r] -= 1
                if active[r] == 0:
                    retime(r, now)
        finish(i, now, ready)

    def run_c(i: int, now: float, ready: list[int]) -> None:
        if tasks[i].stream is not Stream.COMPUTE or dur[i] <= 0.0:
            if sides[i] and dur[i] > 0.0:
                started(i, now)
            run_alone(i, now, ready)
            return
        start[i] = now
        r = tasks[i].rank
        rate = slow if active[r] else 1.0
        running[r] = [i, dur[i], now, rate, 0]
        at(now + dur[i] / rate, dur[i] / rate, (_CEND, i, 0))

    begin, on_links, flush = _links(net, dur, start, finish_c, at, run_c, started)

    def on_network(item: tuple, now: float, ready: list[int]) -> None:
        if item[0] != _CEND:
            on_links(item, now, ready)
            return
        r = tasks[item[1]].rank
        run = running.get(r)
        if run is not None and run[0] == item[1] and run[4] == item[2]:
            del running[r]
            finish(item[1], now, ready)

    return finish_c, run_c, begin, on_network, flush


def _compute_ids(graph: TaskGraph, rank: int) -> list[int]:
    tasks, compute = graph.tasks, Stream.COMPUTE
    return [i for i in graph.programs[rank] if tasks[i].stream is compute]


def _peak(graph: TaskGraph, costs: CostModel, ids: list[int]) -> float:
    # Compute is serial on a rank, so memory follows program order:
    # a pass holds its activations from its start and frees at its end.
    tasks, activations = graph.tasks, costs.activations
    held = peak = 0.0
    for i in ids:
        alloc, free = activations(tasks[i].action, graph)
        held += alloc
        if held > peak:
            peak = held
        held -= free
    return peak


def activation_peaks(graph: TaskGraph, costs: CostModel) -> list[float]:
    """Per rank: the simulation's ``peak_activations`` without simulating (the peak follows program order
    alone, not timing: the same accounting as :func:`simulate`'s rank statistics)."""
    return [_peak(graph, costs, _compute_ids(graph, r)) for r in range(len(graph.programs))]


def _rank_stats(graph: TaskGraph, costs: CostModel, start: list[float], end: list[float],
                peaks: bool = True) -> tuple[RankStats, ...]:
    stats = []
    for rank in range(len(graph.programs)):
        ids = _compute_ids(graph, rank)
        busy = sum(end[i] - start[i] for i in ids)
        first = min((start[i] for i in ids), default=0.0)
        last = max((end[i] for i in ids), default=0.0)
        stats.append(RankStats(rank, busy, first, last, _peak(graph, costs, ids) if peaks else math.nan))
    return tuple(stats)
