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

The default ``mw`` is :data:`MW_RUNTIME` = 1: I frees nothing and W frees the
whole microbatch, because that is what schedlab's runtime does (and what
torch.distributed.pipelining does): I runs ``autograd.grad`` with the graph
retained (:mod:`real.backward`), so what the forward saved lives until W has
run (only nodes above a stage's last weight op may go earlier); the runtime's
ActivationMeter counts every saved tensor until that W. ``mw`` = 0
(:data:`MW_FREED_AT_I`) models a runtime that frees at I everything W does not
need and counts W's remnant as nothing, the accounting of the zero-bubble
paper's schedules (Qi et al. 2024) as this project reproduces them; a value in
between is that paper's M_W / M_B. A recomputed forward keeps, in the runtime,
its stage's input tensor (and nothing else until its R); ``input_fraction`` is
that input's share of the chunk's activations, 0 by default (one boundary
tensor against everything a stage's layers save).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from schedules.ir import Action, Kind, Schedule

__all__ = ["MW_FREED_AT_I", "MW_RUNTIME", "CompiledTiming", "Timing", "action_held_freed", "compile_timing",
           "evaluate", "held_freed", "pass_time", "rank_ends", "recomputed_keys"]

MW_RUNTIME = 1.0  # the runtime's: I keeps the autograd graph (retain_graph) until W, which frees it all
MW_FREED_AT_I = 0.0  # the zero-bubble paper's accounting as reproduced here: I frees everything, W holds nothing


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


@dataclass(frozen=True, slots=True)
class CompiledTiming:
    """A schedule's compute actions in an order every dependency respects (:func:`compile_timing`).

    Per action: its rank, its duration slot (``slots[k]``: the (kind, stage)
    parts whose times it sums) and its data dependencies as (action, hop slot)
    pairs. Hop slot 0 is a same-rank dependency (no delay); ``1 + 2 s`` the
    activation crossing from stage s to s + 1, ``2 + 2 s`` the gradient
    crossing back from s + 1 to s. Each rank's actions keep their program order.
    """

    ranks: tuple[int, ...]
    dslot: tuple[int, ...]
    deps: tuple[tuple[tuple[int, int], ...], ...]
    slots: tuple[tuple[tuple[Kind, int], ...], ...]
    num_ranks: int
    num_stages: int


def compile_timing(schedule: Schedule) -> CompiledTiming:
    """Order the compute actions as the ranks would run them with every pass instantly done (a topological order).

    Each rank runs its program until an input is missing, then waits on that input alone (woken when it is
    made), so each action is looked at once or twice; a plain action's inputs are read inline (what
    :func:`_data_deps` says), an overlapped pair's through it. Raises ValueError when the programs wait on each
    other in a cycle or on work no rank runs (:func:`schedules.validate` says which).
    """
    progs, s2r, last = schedule.programs, schedule.stage_to_rank, schedule.num_stages - 1
    n_stages = schedule.num_stages
    # made[kind][stage]: microbatch -> the action's index; waiters[kind][stage]: microbatch -> ranks waiting on it
    made: dict[Kind, list[dict]] = {}
    waiters: dict[Kind, list[dict]] = {}
    for kind in Kind:
        made[kind] = [{} for _ in range(n_stages)]
        waiters[kind] = [{} for _ in range(n_stages)]
    F, I, B, W, R = Kind.F, Kind.I, Kind.B, Kind.W, Kind.R  # noqa: N806, E741 (the pass kinds, as the IR names them)
    made_f, made_i, made_b = made[F], made[I], made[B]
    slot_of: dict[tuple[tuple[Kind, int], ...], int] = {}
    plain_slot: dict[tuple[Kind, int], int] = {}
    ranks: list[int] = []
    dslot: list[int] = []
    deps: list[tuple[tuple[int, int], ...]] = []
    pos = [0] * len(progs)
    ready = deque(range(len(progs)))

    def wait_on(kind: Kind, st: int, mb: int | None, r: int) -> None:
        waiters[kind][st].setdefault(mb, []).append(r)
        if kind is I:  # a B makes the input gradient too
            waiters[B][st].setdefault(mb, []).append(r)

    while ready:
        r = ready.popleft()
        prog, n = progs[r], len(progs[r])
        while pos[r] < n:
            action = prog[pos[r]]
            idx = len(ranks)
            if action.sub_actions is None:  # a plain pass: its inputs inline
                kind, st, mb = action.kind, action.stage, action.microbatch
                if kind is F:
                    if st > 0:
                        k = made_f[st - 1].get(mb)
                        if k is None:
                            wait_on(F, st - 1, mb, r)
                            break
                        dd: tuple[tuple[int, int], ...] = ((k, 0 if s2r[st - 1] == r else 2 * st - 1),)
                    else:
                        dd = ()
                elif kind is I or kind is B:
                    k = made_f[st].get(mb)
                    if k is None:
                        wait_on(F, st, mb, r)
                        break
                    first = (k, 0 if s2r[st] == r else 1 + 2 * st)
                    if st < last:
                        k2 = made_i[st + 1].get(mb)
                        if k2 is None:
                            k2 = made_b[st + 1].get(mb)
                            if k2 is None:
                                wait_on(I, st + 1, mb, r)
                                break
                        dd = (first, (k2, 0 if s2r[st + 1] == r else 2 * st + 2))
                    else:
                        dd = (first,)
                elif kind is W:
                    k = made_i[st].get(mb)
                    if k is None:
                        k = made_b[st].get(mb)
                        if k is None:
                            wait_on(I, st, mb, r)
                            break
                    dd = ((k, 0 if s2r[st] == r else 2 * st),)
                elif kind is R:
                    k = made_f[st].get(mb)
                    if k is None:
                        wait_on(F, st, mb, r)
                        break
                    dd = ((k, 0 if s2r[st] == r else 1 + 2 * st),)
                else:  # no pass reads what another kind makes (_data_deps)
                    dd = ()
                    ranks.append(r)
                    dslot.append(slot_of.setdefault(((kind, st),), len(slot_of)))
                    deps.append(dd)
                    pos[r] += 1
                    continue
                slot = plain_slot.get((kind, st))
                if slot is None:
                    slot = plain_slot[(kind, st)] = slot_of.setdefault(((kind, st),), len(slot_of))
                ranks.append(r)
                dslot.append(slot)
                deps.append(dd)
                made[kind][st][mb] = idx
                woken = waiters[kind][st].pop(mb, None) if waiters[kind][st] else None
                if woken is not None:
                    ready.extend(woken)
                pos[r] += 1
                continue
            parts = action.parts()
            found: list[tuple[int, int]] = []
            missing = None
            for a in parts:
                for key in _data_deps(a, last):
                    kind, st, mb = key
                    k = made[kind][st].get(mb)
                    if k is None and kind is I:
                        k = made_b[st].get(mb)
                    if k is None:
                        missing = key
                        break
                    # an activation crosses from s to s + 1, a gradient from s back to s - 1
                    found.append((k, 0 if s2r[st] == r else (1 + 2 * st if kind is F else 2 * st)))
                if missing is not None:
                    break
            if missing is not None:
                wait_on(*missing, r)
                break
            ranks.append(r)
            dslot.append(slot_of.setdefault(tuple((a.kind, a.stage) for a in parts), len(slot_of)))
            deps.append(tuple(found))
            for a in parts:
                made[a.kind][a.stage][a.microbatch] = idx
                woken = waiters[a.kind][a.stage].pop(a.microbatch, None)
                if woken is not None:
                    ready.extend(woken)
            pos[r] += 1
    if len(ranks) < sum(len(p) for p in progs):
        raise ValueError(f"schedule {schedule.name!r}: the programs wait on each other (a cycle) or on missing work")
    return CompiledTiming(tuple(ranks), tuple(dslot), tuple(deps), tuple(slot_of), len(progs), schedule.num_stages)


def _timeline(ct: CompiledTiming, durations: list[float], hops: list[float],
              starts: list[float] | None = None) -> tuple[list[float], list[float]]:
    """(each action's end, each rank's last end); also each action's start into ``starts`` if given."""
    end: list[float] = [0] * len(ct.ranks)  # ints stay exact (evaluate takes ints)
    free: list[float] = [0] * ct.num_ranks
    k = 0
    for r, ds, dd in zip(ct.ranks, ct.dslot, ct.deps, strict=True):
        t = free[r]
        for d, h in dd:
            x = end[d] + hops[h]
            if x > t:
                t = x
        if starts is not None:
            starts.append(t)
        t += durations[ds]
        end[k] = free[r] = t
        k += 1
    return end, free


def rank_ends(ct: CompiledTiming, durations: list[float], hops: list[float]) -> list[float]:
    """Per rank, when its last compute action ends: every action as early as its rank and its inputs allow.

    ``durations[slot]`` per duration slot, ``hops[slot]`` per hop slot (see :class:`CompiledTiming`).
    """
    return _timeline(ct, durations, hops)[1]


def evaluate(schedule: Schedule, tf: float, tb: float, tw: float, tcomm: float = 0.0, mw: float = MW_RUNTIME,
             pair_overlap: float = 0.0, input_fraction: float = 0.0) -> Timing:
    """The simulator's timing of ``schedule`` under uniform costs, without lowering it.

    Each rank runs its program in order; an action starts when the previous one
    on its rank has ended and its inputs are there (a cross-rank input
    ``tcomm`` after its producer ended). Numbers may be ints (exact) or floats.
    Raises ValueError when the programs wait on each other in a cycle or on
    work no rank runs (:func:`schedules.validate` says which).
    """
    v = schedule.chunks
    ct = compile_timing(schedule)
    durations = []
    for parts in ct.slots:
        times = [pass_time(k, tf, tb, tw) for k, _ in parts]
        t = sum(times) - (pair_overlap * min(times) if len(times) > 1 else 0)
        durations.append(t / v if v > 1 else t)
    start_of: list[float] = []
    end_of, _ = _timeline(ct, durations, [0] + [tcomm] * (2 * ct.num_stages), start_of)
    progs = schedule.programs
    starts: list[list[float]] = [[] for _ in progs]
    ends: list[list[float]] = [[] for _ in progs]
    for r, st, en in zip(ct.ranks, start_of, end_of, strict=True):
        starts[r].append(st)
        ends[r].append(en)
    share = 1.0 / v
    recomputed = recomputed_keys(progs)
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
