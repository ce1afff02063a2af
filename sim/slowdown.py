"""Compute slowed by concurrent communication: a rank's passes run ``factor`` times longer while a collective
of that rank is in flight.

On the CPU testbed a gloo collective runs on a thread of its own that takes
cycles and memory bandwidth from the rank's compute (the overlapped
all-reduce of ddp stretched the last backward from 13 ms to 18-25 ms); on GPUs
NCCL kernels take SMs from compute. ``real.profile`` measures the factor as a
device property (``comm_slowdown`` in the cost file: a stage's passes timed
alone and with a bucket-sized all-reduce in flight), and a cost model hands it
to the engine as its ``comm_slowdown`` attribute (:class:`sim.costs.profiled.ProfiledCosts`).
1.0, the default, leaves the engine's ordinary path, so every figure is
unchanged bit for bit.

The model: each rank has a work clock that advances by one second of compute
per second while none of the rank's collectives is in flight, and by
1 / ``factor`` while one or more is. A compute task of duration d ends when
its rank's clock has advanced d from its start; a collective's ready delay
(the fraction of its anchor pass after which its bucket is ready,
:class:`schedules.dp.modes.DPPlan`) is counted on the same clock, so a bucket is
ready when its pass has done that fraction of its work. A collective is in
flight from its start (after any wait for its port) to its end. When a rank's
rate changes, every end and ready delay pending on that rank is re-timed.

Closed form, one pass overlapping one collective entirely: a pass of d that
runs during a transfer of t (t <= the stretched pass) takes d + t (1 - 1/factor).

A runtime may also stop a rank's compute for its collectives: the zero2 and
zero3 runtime (``real.dp.zero.MAX_INFLIGHT``) issues a gradient bucket's
reduce-scatter from the backward and then waits until at most that many are
issued and not done, so that flat gradients do not pile up. A cost model's
``max_inflight`` (> 0) says so: while more of a zero2/zero3 rank's
reduce-scatters are issued (ready, queued or in service) than that, its clock
stops, so its pass and its next buckets' readiness wait with it.

The converse: compute slows communication. On the CPU testbed both cores run
the two ranks' passes, and gloo's collective threads get little of them: a
cost model's ``comm_stall`` (> 1; :class:`sim.costs.profiled.ProfiledCosts`, fitted
on a data-parallel run by :func:`analysis.validation.dp_transfer.fitted_stall`) serves
each rank's collectives one at a time, in issue order, the one in service at
1 / ``comm_stall`` of its speed while its rank computes (a compute task in
progress and not waiting for its reduce-scatters) and at full speed otherwise.
Closed form, at ``factor`` 1: a collective of t issued a time a before the end
of a pass ends after a + (t - a / stall) if t > a / stall, else after stall t.
At 1.0 (the default) the ports are the engine's ordinary ones.

Only first-come-first-served ports (the ``fcfs`` network model, the one the
profiled cost model uses) are supported; ``comm_stall`` needs each collective
on its own rank's port (the profiled model's network).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from schedules import Kind, Stream, TaskGraph
from schedules.dp.modes import server_update
from sim.network import Network

__all__ = ["SLOWED_WORK", "check_factor", "check_max_inflight", "slowed_links"]

# event items of the slowed path (tuples, beside sim.network's 0, 1, 2): a work-timed item is due; a transfer
# whose port was busy starts; a transfer ends
SLOWED_WORK, _XON, _XOFF, _XEND = 3, 4, 5, 6
_BOUNDED_MODES = ("zero2", "zero3")  # the runtime bounds their per-microbatch reduce-scatters (real.dp.zero)
_EPS = 1e-12  # relative: a re-timed end this close to now is due now (float rounding of the clock)


def check_factor(factor: Any) -> float:
    """A finite factor > 0, or a ValueError naming it."""
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor < math.inf:
        raise ValueError(f"comm_slowdown must be a finite factor > 0 (1.0: communication does not slow compute), "
                         f"got {factor!r}")
    return float(factor)


def check_max_inflight(limit: Any) -> int:
    """A whole number >= 0 (0: no bound), or a ValueError naming it."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"max_inflight must be a whole number of collectives >= 0 (0: no bound), got {limit!r}")
    return limit


class _Clocks:
    """Per rank: the work clock, its rate, the collectives in flight and the work-timed items pending."""

    def __init__(self, num_ranks: int, factor: float, at: Callable[[float, float, Any], None]) -> None:
        self.factor, self.at = factor, at
        self.work = [0.0] * num_ranks  # the clock's value at ``since``
        self.since = [0.0] * num_ranks
        self.mult = [1.0] * num_ranks  # wall seconds per second of work, now
        self.inflight = [0] * num_ranks
        self.blocked = [False] * num_ranks  # the rank waits for its reduce-scatters in flight (max_inflight)
        self.epoch = [0] * num_ranks  # bumped at each rate change: older events of the rank are stale
        self.pending: list[dict[int, float]] = [{} for _ in range(num_ranks)]  # item -> clock value it is due at

    def clock(self, r: int, now: float) -> float:
        return self.work[r] + (now - self.since[r]) / self.mult[r]  # a blocked rank's mult is inf: no progress

    def after(self, r: int, now: float, work: float, item: int) -> None:
        """``item`` is due once rank r's clock has advanced ``work`` from now."""
        self.pending[r][item] = self.clock(r, now) + work
        if not self.blocked[r]:  # a blocked rank's items are timed when it resumes
            d = work * self.mult[r]
            self.at(now + d, d, (SLOWED_WORK, item, r, self.epoch[r]))

    def due(self, r: int, item: int, epoch: int) -> bool:
        """True (and no longer pending) if this event of ``item`` is its current one."""
        if epoch != self.epoch[r]:
            return False
        del self.pending[r][item]
        return True

    def transfer(self, r: int, now: float, delta: int) -> None:
        """A collective of rank r starts (+1) or ends (-1): re-time the rank's pending items if its rate changes."""
        self.inflight[r] += delta
        self._retime(r, now)

    def block(self, r: int, now: float, blocked: bool) -> None:
        """Rank r's compute waits (True) for its reduce-scatters in flight, or resumes (False)."""
        if blocked != self.blocked[r]:
            self.blocked[r] = blocked
            self._retime(r, now)

    def _retime(self, r: int, now: float) -> None:
        mult = math.inf if self.blocked[r] else self.factor if self.inflight[r] > 0 else 1.0
        if mult == self.mult[r]:
            return
        self.work[r], self.since[r], self.mult[r] = self.clock(r, now), now, mult
        self.epoch[r] += 1
        if self.blocked[r]:
            return
        for item, target in self.pending[r].items():
            left = target - self.work[r]
            d = left * mult if left > _EPS * max(1.0, abs(target)) else 0.0
            self.at(now + d, d, (SLOWED_WORK, item, r, self.epoch[r]))


class _Ports:
    """Collectives stalled by their rank's compute: each rank's one port serves its collectives in order, the
    one in service progressing at 1 / ``stall`` while the rank computes (a compute task in progress and not
    waiting for its reduce-scatters) and at full speed otherwise."""

    def __init__(self, num_ranks: int, stall: float, at: Callable[[float, float, Any], None]) -> None:
        self.stall, self.at = stall, at
        self.queue: list[list[int]] = [[] for _ in range(num_ranks)]  # the head is in service
        self.running = [0] * num_ranks  # compute tasks in progress
        self.mult = [1.0] * num_ranks
        self.epoch = [0] * num_ranks
        self.left: dict[int, float] = {}  # collective in service -> seconds of service left at full speed, at since
        self.since: dict[int, float] = {}

    def serve(self, r: int, i: int, now: float) -> None:
        self.left[i], self.since[i] = self.left.get(i, 0.0), now
        d = self.left[i] * self.mult[r]
        self.at(now + d, d, (_XEND, i, r, self.epoch[r]))

    def retime(self, r: int, now: float, blocked: bool) -> None:
        """The rank's compute started, ended, waits or resumes: re-time the collective in service."""
        mult = self.stall if self.running[r] > 0 and not blocked else 1.0
        if mult == self.mult[r]:
            return
        q = self.queue[r]
        if q:
            h = q[0]
            self.left[h] = max(self.left[h] - (now - self.since[h]) / self.mult[r], 0.0)
        self.mult[r] = mult
        self.epoch[r] += 1
        if q:
            self.serve(r, q[0], now)


def slowed_links(graph: TaskGraph, net: Network, dur: list[float], start: list[float],
                 finish: Callable[[int, float, list[int]], None], at: Callable[[float, float, Any], None],
                 factor: float, max_inflight: int = 0, stall: float = 1.0
                 ) -> tuple[Callable, Callable, Callable[[int, float], None]]:
    """``begin``, ``on_network`` and ``delay`` (a ready delay, counted in its rank's work) for the engine's loop
    (:func:`sim.engine._run`), with compute slowed by ``factor`` while a collective of its rank is in flight,
    (``max_inflight`` > 0, zero2/zero3 graphs) stopped while more than that many of its gradient
    reduce-scatters are issued and not done, and (``stall`` other than 1.0) each collective served at
    1 / ``stall`` of its speed while its rank computes (see the module doc)."""
    if net.model != "fcfs":
        raise ValueError(f"comm_slowdown {factor} is modelled with first-come-first-served ports only; the cost "
                         f"model's network uses {net.model!r} (give comm_slowdown 1.0 or link model fcfs)")
    tasks, links = graph.tasks, net.links
    rank = [t.rank for t in tasks]
    compute = [t.stream is Stream.COMPUTE for t in tasks]
    moving = [t.stream is Stream.COLLECTIVE and not server_update(t) for t in tasks]  # ps: the servers' work
    clocks = _Clocks(graph.num_ranks, factor, at)
    free_at: dict[int, float] = {}
    plan = getattr(graph, "plan", None)
    bounded = [max_inflight > 0 and plan is not None and plan.mode in _BOUNDED_MODES
               and t.action.kind is Kind.REDUCE_SCATTER for t in tasks]
    issued: list[list[int]] = [[] for _ in range(graph.num_ranks)]  # bounded collectives issued, not done
    ports = _Ports(graph.num_ranks, stall, at) if stall != 1.0 else None
    if ports is not None and any(moving[i] and tuple(links[i]) != (rank[i],) for i in range(len(tasks))):
        raise ValueError(f"comm_stall {stall} needs each collective on one port, its rank's (the profiled cost "
                         "model's network); give comm_stall 1.0")

    def block(r: int, now: float, blocked: bool) -> None:
        clocks.block(r, now, blocked)
        if ports is not None:
            ports.retime(r, now, blocked)

    def computing(r: int, now: float, delta: int) -> None:
        if ports is not None:
            ports.running[r] += delta
            ports.retime(r, now, clocks.blocked[r])

    def issue(i: int, now: float) -> None:
        if bounded[i]:  # the runtime issues it, then waits until at most max_inflight are left in flight
            issued[rank[i]].append(i)
            if len(issued[rank[i]]) > max_inflight:
                block(rank[i], now, True)

    def done(i: int, now: float, ready: list[int]) -> None:
        clocks.transfer(rank[i], now, -1)
        if bounded[i]:
            mine = issued[rank[i]]
            mine.remove(i)
            if len(mine) <= max_inflight:
                block(rank[i], now, False)
        finish(i, now, ready)

    def queued(i: int, now: float) -> None:
        """A collective on its rank's stalled port: served now if the port is free, else after those before."""
        r = rank[i]
        q = ports.queue[r]
        q.append(i)
        ports.left[i] = dur[i]
        if len(q) == 1:
            start[i] = now
            clocks.transfer(r, now, 1)
            ports.serve(r, i, now)
        issue(i, now)

    def begin(i: int, now: float, ready: list[int]) -> None:
        d = dur[i]
        if compute[i]:
            start[i] = now
            if d > 0.0:
                clocks.after(rank[i], now, d, i)
                computing(rank[i], now, 1)
            else:
                finish(i, now, ready)
            return
        if ports is not None and moving[i]:
            queued(i, now)
            return
        s = now
        for link in links[i]:
            s = max(s, free_at.get(link, 0.0))
        e = s + d
        for link in links[i]:
            free_at[link] = e
        start[i] = s
        if e <= now:
            finish(i, now, ready)
        elif moving[i] and d > 0.0:
            if s > now:
                at(s, s - now, (_XON, i, 0))
            else:
                clocks.transfer(rank[i], now, 1)
            at(e, e - now, (_XOFF, i, 0))
            issue(i, now)
        else:
            at(e, e - now, i)

    def on_network(item: tuple[int, int, int] | tuple[int, int, int, int], now: float, ready: list[int]) -> None:
        what, i = item[0], item[1]
        if what == SLOWED_WORK:
            if clocks.due(item[2], i, item[3]):
                if i >= 0:
                    computing(rank[i], now, -1)
                    finish(i, now, ready)
                else:
                    begin(~i, now, ready)
        elif what == _XON:
            clocks.transfer(rank[i], now, 1)
        elif what == _XOFF:
            done(i, now, ready)
        elif what == _XEND:
            r = item[2]
            if item[3] == ports.epoch[r] and ports.queue[r] and ports.queue[r][0] == i:
                ports.queue[r].pop(0)
                del ports.left[i], ports.since[i]
                if ports.queue[r]:  # the next one is served from now on
                    nxt = ports.queue[r][0]
                    start[nxt] = now
                    clocks.transfer(r, now, 1)
                    ports.serve(r, nxt, now)
                done(i, now, ready)
        else:
            raise AssertionError(f"unknown event {item!r}")

    def delay(i: int, now: float) -> None:
        clocks.after(rank[i], now, net.lag[i], ~i)

    return begin, on_network, delay
