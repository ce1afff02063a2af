"""Links shared by concurrent transfers: the network a cost model hands the engine, and max-min fair sharing.

A cost model that times transfers on ports (:class:`sim.costs.transformer_costs.TransformerCosts`)
gives the engine a :class:`Network`: per task, a delay after its dependencies
before it is ready (``lag``), the ports it crosses (``links``), the part of its
duration that is latency rather than bytes on the wire (``latency``), and how
the ports are shared (``model``):

* ``fcfs``: a port serves one transfer at a time, first come first served; a
  transfer starts when the last of its ports is free and holds them all until
  it ends (the simulator's model before fair sharing, kept to reproduce its
  numbers);
* ``fair``: transfers on a port share its bandwidth. A transfer pays its
  latency first, then joins as a flow over its ports; every port has the
  capacity of one transfer at full speed, and the flows' rates are max-min
  fair (progressive filling: raise every rate together, freeze the flows of a
  port once it is full; Bertsekas & Gallager, "Data Networks", 2nd ed.,
  sec. 6.5.2). This is the flow-level model of SimGrid (Velho et al. 2013,
  "On the validity of flow-level TCP network models for grid and cloud
  simulations", ACM TOMACS 23(4)). Whenever a flow joins or leaves, the rates
  of the flows connected to it through shared ports are recomputed and their
  completions rescheduled. Two equal transfers on one port both end at twice
  one's time; a transfer alone ends exactly when it would under ``fcfs``.

A communicator runs its collectives one at a time, in the order they are
issued (NCCL executes the operations of a communicator in order): tasks that
share a ``queue`` number wait for each other, and only the running one is a
flow. So a rank's data-parallel buckets follow each other, and the running
bucket shares the port with the pipeline's sends, each at half speed, where
under ``fcfs`` a send waits for the bucket to end.

Rates are fractions of a transfer's full speed: a flow of rate 1/2 moves its
bytes at half its port's bandwidth. A transfer's full speed is the one its
duration was timed at, so a collective that alternates between NVLink and
the NIC (hierarchical) is slowed by the same fraction on both.

Compute slowed by communication (``contention``, fair only): NCCL's kernels
occupy streaming multiprocessors for as long as a transfer runs, so a rank's
compute runs at rate 1 / (1 + contention) while any of its transfers is in
flight (a collective of the rank, a send from or to it: from the moment it
starts, latency included, to its end). The running compute task's remaining
work is re-timed whenever the rank starts or stops communicating.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from common.errors import ConfigError, check_choice

__all__ = ["LINK_MODELS", "FairLinks", "Network", "check_link_model", "max_min_rates"]

LINK_MODELS = ("fair", "fcfs")


def check_link_model(owner: str, value: object) -> None:
    """``value`` one of :data:`LINK_MODELS` (a one-line ConfigError naming it otherwise)."""
    check_choice(owner, "link_model", value, LINK_MODELS, ConfigError)


@dataclass(frozen=True, slots=True)
class Network:
    """What the engine needs to time transfers on shared ports (one entry per task of the graph)."""

    lag: Sequence[float]  # seconds after its dependencies end before the task is ready
    links: Sequence[tuple[int, ...]]  # the ports it crosses; () = none (timed alone)
    latency: Sequence[float]  # the part of its duration paid before it moves bytes (alpha terms)
    model: str = "fair"
    queue: Sequence[int] | None = None  # fair: tasks of one queue (>= 0) run one at a time, in ready order
    contention: float = 0.0  # fair: a rank's compute runs 1 + contention times longer while it communicates

    def __post_init__(self) -> None:
        check_link_model("network", self.model)
        if not 0.0 <= self.contention < math.inf:
            raise ConfigError(f"network: contention must be a finite slowdown >= 0, got {self.contention!r}",
                              field="contention")


def max_min_rates(flows: Mapping[int, Sequence[int]],
                  capacity: Callable[[int], float] | Mapping[int, float] | None = None) -> dict[int, float]:
    """Max-min fair rates of ``flows`` (flow id -> the links it crosses) by progressive filling.

    ``capacity`` gives each link's capacity (default 1). Repeatedly the link with
    the smallest fair share (capacity left / flows not yet fixed, the lowest id
    on a tie) fixes its flows at that share. Deterministic: flows and links are
    visited in sorted order.
    """
    cap = (lambda _link: 1.0) if capacity is None else (capacity.__getitem__ if isinstance(capacity, Mapping) else capacity)
    users: dict[int, list[int]] = {}
    for f in sorted(flows):
        for link in dict.fromkeys(flows[f]):
            users.setdefault(link, []).append(f)
    left = {link: float(cap(link)) for link in users}
    rate: dict[int, float] = {}
    order = sorted(users)
    while len(rate) < len(flows):
        best, share = -1, math.inf
        for link in order:
            n = len(users[link])
            if n and left[link] / n < share:
                best, share = link, left[link] / n
        if best < 0:  # flows with no link: nothing limits them but their own speed
            rate.update(dict.fromkeys((f for f in flows if f not in rate), 1.0))
            break
        for f in users[best][:]:
            rate[f] = share
            for link in dict.fromkeys(flows[f]):
                left[link] = max(0.0, left[link] - share)
                users[link].remove(f)
    return rate


class FairLinks:
    """The flows in flight on the ports and their rates; the engine asks it when each flow will end.

    :meth:`update` returns the flows whose rate changed, each with its new
    end time and a version number; a completion whose version is older than
    the flow's current one is stale and is ignored (:meth:`current`).
    """

    __slots__ = ("_alone", "_flows_on", "_left", "_links", "_rate", "_since", "_version")

    def __init__(self, links: Sequence[tuple[int, ...]]) -> None:
        self._links = links
        self._flows_on: dict[int, list[int]] = {}  # port -> flows on it, in joining order
        self._rate: dict[int, float] = {}  # flow -> its rate (a fraction of full speed)
        self._left: dict[int, float] = {}  # flow -> seconds of work left at full speed, at time _since
        self._since: dict[int, float] = {}
        self._alone: dict[int, float] = {}  # flow -> its end had it always run at full speed (dropped when slowed)
        self._version: dict[int, int] = {}

    def current(self, flow: int, version: int) -> bool:
        return self._version.get(flow) == version

    def update(self, now: float, joins: Sequence[tuple[int, float, float]] = (),
               leaves: Sequence[int] = ()) -> list[tuple[int, float, int]]:
        """At ``now``, flows ``leaves`` have moved their bytes and flows ``joins`` start; returns the flows whose
        rate changed as (flow, end, version), by flow id.

        A join is (flow, work, alone_end): seconds of bytes to move at full speed, and its end if nothing ever
        slows it (the engine's ready time + duration, so a flow alone ends exactly as under fcfs).
        """
        seeds: dict[int, None] = {}
        for flow in leaves:
            for link in dict.fromkeys(self._links[flow]):
                self._flows_on[link].remove(flow)
                seeds[link] = None
            for table in (self._rate, self._left, self._since, self._alone, self._version):
                table.pop(flow, None)
        for flow, work, alone_end in joins:
            for link in dict.fromkeys(self._links[flow]):
                self._flows_on.setdefault(link, []).append(flow)
                seeds[link] = None
            self._left[flow], self._since[flow], self._rate[flow] = work, now, 0.0
            self._alone[flow], self._version[flow] = alone_end, -1
        return self._rebalance(list(seeds), now)

    def _component(self, seeds: Sequence[int]) -> dict[int, tuple[int, ...]]:
        """Every flow connected to the ports ``seeds`` through shared ports, with its ports."""
        flows: dict[int, tuple[int, ...]] = {}
        seen, todo = set(seeds), list(seeds)
        while todo:
            for f in self._flows_on.get(todo.pop(), ()):
                if f not in flows:
                    flows[f] = self._links[f]
                    for link in self._links[f]:
                        if link not in seen:
                            seen.add(link)
                            todo.append(link)
        return flows

    def _rebalance(self, seeds: Sequence[int], now: float) -> list[tuple[int, float, int]]:
        flows = self._component(seeds)
        rates = max_min_rates(flows)
        changed = []
        for f in sorted(flows):
            new, old = rates[f], self._rate[f]
            if new == old:
                continue
            self._left[f] -= (now - self._since[f]) * old
            self._since[f], self._rate[f] = now, new
            alone = self._alone.get(f)
            if alone is not None and new == 1.0:
                end = alone
            else:
                self._alone.pop(f, None)
                end = now + max(0.0, self._left[f]) / new
            self._version[f] += 1
            changed.append((f, end, self._version[f]))
        return changed
