"""One home for uniform pass times and activation accounting (torch-free).

Every place that needs "how long is this pass" or "what does this pass hold
and free" under the uniform model asks here: the simulator's
:class:`sim.UniformCosts`, the real-units cost model's activation steps, and
zb-auto's search (its list scheduler and its exact refinement evaluate
candidates with :func:`evaluate`, which gives the simulator's times without
building a task graph).

Pass times (per microbatch through a rank's whole share of layers; a chunk of
a rank with v chunks takes 1/v): F ``tf``, I ``tb``, W ``tw``, B ``tb + tw``,
R (a recomputed forward) ``tf``. A cross-rank message delays its consumer by
``tcomm`` (an edge delay: sends do not queue).

Activations, in M_B per chunk share (``size``): F holds ``size`` from its
start, or only ``input_fraction * size`` when its microbatch is recomputed
later; R holds the rest again from its start; B frees what is held at its end;
I frees all but the fraction ``mw`` that W needs, and W frees that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from schedules.ir import Action, Kind, Schedule

__all__ = ["Timing", "action_held_freed", "evaluate", "held_freed", "pass_time", "recomputed_keys"]


def pass_time(kind: Kind, tf: float, tb: float, tw: float) -> float:
    """Time of one plain pass through a rank's whole share (divide by v for a chunk)."""
    if kind is Kind.F or kind is Kind.R:
        return tf
    if kind is Kind.I:
        return tb
    if kind is Kind.W:
        return tw
    if kind is Kind.B:
        return tb + tw
    raise AssertionError(f"not a compute pass: {kind}")


def held_freed(kind: Kind, size: float, mw: float, *, recomputed: bool = False,
               input_fraction: float = 0.0, kept: float | None = None) -> tuple[float, float]:
    """(held from the start, freed at the end) of one plain pass whose full activations are ``size``.

    ``recomputed``: the (stage, microbatch) has an R later, so its F keeps only
    what R starts from, ``kept`` (or ``input_fraction * size``), and its R holds
    the rest again. The backward frees everything either way.
    """
    keep = input_fraction * size if kept is None else kept
    if kind is Kind.F:
        return (keep if recomputed else size), 0.0
    if kind is Kind.R:
        return size - keep, 0.0
    if kind is Kind.B:
        return 0.0, size
    if kind is Kind.I:
        return 0.0, size * (1.0 - mw)
    if kind is Kind.W:
        return 0.0, size * mw
    return 0.0, 0.0


def recomputed_keys(programs: Iterable[Iterable[Action]]) -> frozenset[tuple[int, int | None]]:
    """The (stage, microbatch) pairs that some R recomputes."""
    return frozenset((a.stage, a.microbatch) for prog in programs for x in prog for a in x.parts()
                     if a.kind is Kind.R)


def action_held_freed(action: Action, size_of: Callable[[Action], float], mw: float,
                      recomputed: frozenset[tuple[int, int | None]] = frozenset(),
                      input_fraction: float = 0.0, kept_of: Callable[[Action], float] | None = None
                      ) -> tuple[float, float]:
    """(held, freed) of a compute action, summing an overlapped pair's parts; ``size_of(part)`` is its full size,
    ``kept_of(part)`` (if given) what a recomputed forward keeps, instead of ``input_fraction`` of it."""
    held = freed = 0.0
    for a in action.parts():
        h, f = held_freed(a.kind, size_of(a), mw, recomputed=(a.stage, a.microbatch) in recomputed,
                          input_fraction=input_fraction, kept=None if kept_of is None else kept_of(a))
        held += h
        freed += f
    return held, freed


@dataclass(frozen=True, slots=True)
class Timing:
    """Start and end of every compute action (per rank, program order) and what follows from them."""

    starts: tuple[tuple[float, ...], ...]
    ends: tuple[tuple[float, ...], ...]
    busy: tuple[float, ...]
    peaks: tuple[float, ...]  # activations, M_B, following program order

    @property
    def makespan(self) -> float:
        return max((e[-1] for e in self.ends if e), default=0.0)

    @property
    def spans(self) -> tuple[float, ...]:
        """Per rank, last end - first start (0 for an empty rank)."""
        return tuple(e[-1] - s[0] if s else 0.0 for s, e in zip(self.starts, self.ends, strict=True))

    @property
    def span_bubble(self) -> float:
        """The zero-bubble paper's bubble rate: (cost - busy) / cost, cost the largest span of a rank."""
        cost = max(self.spans, default=0.0)
        return 0.0 if cost <= 0 else 1.0 - max(self.busy) / cost


def _data_deps(a: Action, last: int) -> list[tuple[Kind, int, int | None]]:
    """The plain passes whose output ``a`` consumes (kind B and I both produce an input gradient)."""
    s, mb = a.stage, a.microbatch
    if a.kind is Kind.F:
        return [(Kind.F, s - 1, mb)] if s > 0 else []
    if a.kind is Kind.R:
        return [(Kind.F, s, mb)]
    if a.kind in (Kind.I, Kind.B):
        deps = [(Kind.F, s, mb)]
        if s < last:
            deps.append((Kind.I, s + 1, mb))
        return deps
    if a.kind is Kind.W:
        return [(Kind.I, s, mb)]
    return []


def evaluate(schedule: Schedule, tf: float, tb: float, tw: float, tcomm: float = 0.0, mw: float = 0.0,
             pair_overlap: float = 0.0, input_fraction: float = 0.0) -> Timing:
    """The simulator's timing of ``schedule`` under uniform costs, without lowering it.

    Each rank runs its program in order; an action starts when the previous one
    on its rank has ended and its inputs are there (a cross-rank input
    ``tcomm`` after its producer ended). Numbers may be ints (exact) or floats.
    Raises ValueError when the programs wait on each other in a cycle or on
    work no rank runs (:func:`schedules.validate` says which).
    """
    v = schedule.chunks
    s2r, last = schedule.stage_to_rank, schedule.num_stages - 1
    recomputed = recomputed_keys(schedule.programs)

    def dur(action: Action) -> float:
        times = [pass_time(a.kind, tf, tb, tw) for a in action.parts()]
        extra = pair_overlap * min(times) if len(times) > 1 else 0
        return (sum(times) - extra) / v if v > 1 else sum(times) - extra

    done: dict[tuple[Kind, int, int | None], tuple[float, int]] = {}  # produced value -> (end, rank)
    progs = schedule.programs
    pos = [0] * len(progs)
    free = [0] * len(progs)
    starts: list[list[float]] = [[] for _ in progs]
    ends: list[list[float]] = [[] for _ in progs]
    pending = sum(len(p) for p in progs)
    while pending:
        moved = False
        for r, prog in enumerate(progs):
            while pos[r] < len(prog):
                action = prog[pos[r]]
                ready = free[r]
                blocked = False
                for a in action.parts():
                    for key in _data_deps(a, last):
                        kind, s, mb = key
                        hit = done.get(key) or (done.get((Kind.B, s, mb)) if kind is Kind.I else None)
                        if hit is None:
                            blocked = True
                            break
                        t = hit[0] + (tcomm if hit[1] != r else 0)
                        ready = max(ready, t)
                    if blocked:
                        break
                if blocked:
                    break
                end = ready + dur(action)
                starts[r].append(ready)
                ends[r].append(end)
                free[r] = end
                for a in action.parts():
                    done[(a.kind, a.stage, a.microbatch)] = (end, s2r[a.stage])
                pos[r] += 1
                pending -= 1
                moved = True
        if not moved:
            raise ValueError(f"schedule {schedule.name!r}: the programs wait on each other (a cycle) or on missing work")
    share = 1.0 / v
    peaks = []
    for prog in progs:
        held = peak = 0.0
        for action in prog:
            h, f = action_held_freed(action, lambda _a: share, mw, recomputed, input_fraction)
            held += h
            peak = max(peak, held)
            held -= f
        peaks.append(peak)
    busy = tuple(sum(e - s for s, e in zip(st, en, strict=True)) for st, en in zip(starts, ends, strict=True))
    return Timing(tuple(map(tuple, starts)), tuple(map(tuple, ends)), busy, tuple(peaks))
