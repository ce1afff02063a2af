"""Automatic zero-bubble scheduling (Qi et al., ICLR 2024, sec. 3: the heuristic) and ZB-H2.

A list scheduler walks the ranks in time order with the given pass times
and message delay. A rank that is free picks, among the passes it can start
now: an I whose gradient has arrived (it unblocks the ranks upstream), else an
F whose input has arrived and whose activations fit under the memory limit,
else a pending W (filling what would be a bubble), else it waits for the next
arrival. One stage per rank; I frees all but ``mw`` of a microbatch, W the rest
(default 1, the runtime's: I frees nothing, :data:`schedules.timing.MW_RUNTIME`).
A rank whose next I arrives within ``f_wait`` does not start an F that would
hold that I up (each rank that does so delays the gradient on its way to rank
0: at p=8 the cascade is most of the heuristic's bubble without it).

``zb-auto`` runs the scheduler under a few policies (W fills every gap, or only
gaps at least t_w long; memory capped at the limit, or at the 1F1B-style
p - r per rank; f_wait from 0 to t_f) and keeps the candidate with the
shortest makespan, ties going to the smallest largest span (the zero-bubble
paper's cost), the handcrafted ZB-H1 and ZB-H2 joining as candidates when they
fit the limit; so the result is never slower than those at the same limit.
That seed then goes to the exact refinement (:mod:`schedules.library.zb_exact`), whose
schedule is kept only if its largest span is smaller at no larger makespan.
Candidates are timed by :func:`schedules.timing.evaluate`, the simulator's semantics.

The schedule's params say what the refinement did: ``refinement`` is the
solver's status ("optimal", "feasible", "no solution", "timed out"; see
:data:`schedules.library.zb_exact.STATUSES`), or "not run" (``time_limit`` 0, or one
rank), or "seed optimal" (no rank of the seed idles inside its span, so its
largest span is the busy time, a lower bound: nothing to search); ``refined``
is True when the schedule is the solver's rather than the seed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from common.errors import ScheduleError, quote
from schedules.ir import Action, Kind, Schedule
from schedules.library.zb_exact import solve
from schedules.library.zero_bubble import zb_h1
from schedules.registry import PipelineParams, check_uniform_times, make_schedule, register
from schedules.timing import MW_FREED_AT_I, MW_RUNTIME, evaluate

__all__ = ["ZBAutoOptions", "greedy_zero_bubble", "makespan", "peak_memory", "zb_auto", "zb_h2"]

MIN_MEM_LIMIT = 1.0  # M_B: a rank must hold one microbatch's activations between its F and its I
MAX_TIME_LIMIT = 3600.0  # an hour of search: beyond that a typo, not a plan


@dataclass(frozen=True, slots=True, kw_only=True)
class ZBAutoOptions:
    """What zb-auto plans with, beyond the pipeline's shape.

    The uniform pass times ``tf, tb, tw`` and the message delay ``tcomm`` (per
    microbatch through a rank's whole share), the fraction ``mw`` of a
    microbatch's activations that its W holds (default 1: the runtime keeps all
    of them until W; 0: the zero-bubble paper's accounting), ``mem_limit`` (M_B per rank;
    None: p) and ``time_limit`` (seconds of exact search; 0: the heuristic alone).
    """

    tf: float = 1.0
    tb: float = 1.0
    tw: float = 1.0
    tcomm: float = 0.0
    mw: float = MW_RUNTIME
    mem_limit: float | None = None
    time_limit: float = 10.0

    def __post_init__(self) -> None:
        check_uniform_times(tf=self.tf, tb=self.tb, tw=self.tw, tcomm=self.tcomm, mw=self.mw)
        if self.mem_limit is not None and not self.mem_limit > 0:
            raise ScheduleError(f"mem_limit must be > 0 M_B, got {quote(self.mem_limit)}", field="mem_limit")
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, int | float) \
                or not 0 <= self.time_limit <= MAX_TIME_LIMIT:
            raise ScheduleError(f"time_limit must be seconds in [0, {MAX_TIME_LIMIT:g}], got {quote(self.time_limit)}",
                                field="time_limit")


@dataclass(frozen=True, slots=True)
class _Policy:
    w_fills_any_gap: bool  # False: run W only if no F/I arrives within t_w
    per_rank_cap: bool  # True: rank r holds at most min(limit, p - r + extra) activations
    extra: int = 0
    f_wait: float = 0.0  # wait for an I that arrives within this long rather than start an F that would delay it


def greedy_zero_bubble(
    p: int, m: int, tf: float, tb: float, tw: float, tcomm: float, mw: float, limit: float, policy: _Policy
) -> list[list[Action]]:
    """Per-rank programs from the list scheduler (one stage per rank)."""
    caps = [min(limit, p - r + policy.extra) if policy.per_rank_cap else limit for r in range(p)]
    free = [0.0] * p  # when each rank's compute is next free
    f_arrive = [[math.inf] * m for _ in range(p)]  # when F(r, mb)'s input is available
    i_arrive = [[math.inf] * m for _ in range(p)]  # when I(r, mb)'s gradient is available
    f_arrive[0] = [0.0] * m
    nf, ni = [0] * p, [0] * p
    wq: list[deque[int]] = [deque() for _ in range(p)]
    mem = [0.0] * p
    progs: list[list[Action]] = [[] for _ in range(p)]
    eps = 1e-9

    active = list(range(p))  # the ranks not done (done: every I and every W run), ascending
    waiting = [False] * p  # idle at its time, letting ranks at the same instant go first
    while active:
        # the next rank: the earliest free, a waiting one after the others at its instant, then the lowest
        t = min([free[x] for x in active])
        tied = [x for x in active if free[x] == t]
        r = next((x for x in tied if not waiting[x]), tied[0])
        if waiting[r]:
            # Every rank at instant t has had its turn and none could act: jump all of
            # them to the next instant anything can happen (an arrival or a rank freeing).
            near = t + eps
            idle = [x for x in active if free[x] <= near]
            later = [free[x] for x in active if free[x] > near]
            arrivals = [_next_arrival(x, t, nf, ni, f_arrive, i_arrive, mem, caps, m, eps) for x in idle]
            nxt = min(later + arrivals, default=math.inf)
            if math.isinf(nxt):
                raise AssertionError(f"list scheduler stuck at t={t}")
            for x in idle:
                free[x], waiting[x] = nxt, False
            continue
        can_i = ni[r] < m and i_arrive[r][ni[r]] <= t + eps
        can_f = nf[r] < m and f_arrive[r][nf[r]] <= t + eps and mem[r] + 1.0 <= caps[r] + eps
        if can_f and not can_i and ni[r] < m and i_arrive[r][ni[r]] < t + policy.f_wait - eps:
            waiting[r] = False
            free[r] = i_arrive[r][ni[r]]  # the I is about to arrive: keep the rank free for it
            continue
        if can_i:
            mb = ni[r]
            ni[r] += 1
            end = t + tb
            mem[r] -= 1.0 - mw
            wq[r].append(mb)
            progs[r].append(Action(Kind.I, r, mb))
            if r > 0:
                i_arrive[r - 1][mb] = end + tcomm
        elif can_f:
            mb = nf[r]
            nf[r] += 1
            end = t + tf
            mem[r] += 1.0
            progs[r].append(Action(Kind.F, r, mb))
            if r < p - 1:
                f_arrive[r + 1][mb] = end + tcomm
            else:
                i_arrive[r][mb] = end
        else:
            nxt = _next_arrival(r, t, nf, ni, f_arrive, i_arrive, mem, caps, m, eps)
            low = t - eps
            others = [free[x] for x in active if free[x] >= low and x != r]
            wake = min([nxt, *others], default=math.inf)
            if wq[r] and (policy.w_fills_any_gap or wake - t >= tw - eps or wake <= t + eps):
                mb = wq[r].popleft()
                end = t + tw
                mem[r] -= mw
                progs[r].append(Action(Kind.W, r, mb))
                if ni[r] == m and not wq[r]:
                    active.remove(r)
            elif wake <= t + eps:
                waiting[r] = True  # another rank acts at this instant first; it may send us work
                continue
            else:
                end = wake
        waiting[r] = False
        free[r] = end
    return progs


def _next_arrival(r, t, nf, ni, f_arrive, i_arrive, mem, caps, m, eps) -> float:
    times = []
    if ni[r] < m and i_arrive[r][ni[r]] > t + eps:
        times.append(i_arrive[r][ni[r]])
    if nf[r] < m and f_arrive[r][nf[r]] > t + eps and mem[r] + 1.0 <= caps[r] + eps:
        times.append(f_arrive[r][nf[r]])
    return min(times, default=math.inf)


def makespan(schedule: Schedule, tf: float, tb: float, tw: float, tcomm: float) -> float:
    """Makespan under uniform costs, as the simulator times it (:func:`schedules.timing.evaluate`)."""
    try:
        return evaluate(schedule, tf, tb, tw, tcomm).makespan
    except ValueError as e:
        raise ScheduleError(f"schedule {schedule.name!r} deadlocks (cycle of waits)") from e


def peak_memory(schedule: Schedule, mw: float = MW_RUNTIME) -> list[float]:
    """Peak activations per rank in M_B, following program order (as the simulator counts them)."""
    return list(evaluate(schedule, 0.0, 0.0, 0.0, 0.0, mw).peaks)


@register("zb-h2")
def zb_h2(params: PipelineParams) -> Schedule:
    """ZB-H2 (Qi et al. 2024): extra warm-up forwards at (2p-1) M_B; bubble (p-1)(tf+tb-2tw).

    Rank r runs up to 2(p-1-r)+1 forwards before its first I, so the warm-up
    bubble fills; the tail fills with deferred W passes. The order is the list
    scheduler's at unit pass times under a 2p-1 limit, W filling every gap, in
    the paper's accounting (I frees a microbatch; the runtime holds it until W).
    """
    p, m = params.pp, params.microbatches
    progs = greedy_zero_bubble(p, m, 1.0, 1.0, 1.0, 0.0, MW_FREED_AT_I, 2 * p - 1, _Policy(True, True, extra=p - 1))
    return make_schedule("zb-h2", params, progs)


@register("zb-auto", options=ZBAutoOptions)
def zb_auto(params: PipelineParams, options: ZBAutoOptions) -> Schedule:
    """Automatic zero-bubble schedule for the given pass times and memory limit (default p M_B)."""
    p, m = params.pp, params.microbatches
    limit = float(p) if options.mem_limit is None else options.mem_limit
    if limit < MIN_MEM_LIMIT:
        raise ScheduleError(
            f"zb-auto: mem_limit {limit:g} M_B is below the minimum {MIN_MEM_LIMIT:g} M_B that any schedule "
            "needs (a rank holds one microbatch's activations from its F to its I)", field="mem_limit"
        )
    t = (options.tf, options.tb, options.tw, options.tcomm)
    if not math.isfinite(sum(t) * 2 * (m + p)):
        raise ScheduleError(f"zb-auto: pass times tf={options.tf:g}, tb={options.tb:g}, tw={options.tw:g}, "
                            f"tcomm={options.tcomm:g} are so large that a step of them overflows; use smaller times")
    seed = _best_heuristic(params, options, limit, t)
    status, refined = "not run", None
    if options.time_limit > 0 and p > 1:
        status, refined = _refine(seed, params, options, limit, t)
    out = refined or seed
    return make_schedule("zb-auto", params, out.programs, mem_limit=limit, refinement=status,
                         refined=refined is not None)


def _cost(timing) -> tuple[float, float]:
    return max(timing.spans, default=0.0), timing.makespan


def _best_heuristic(params: PipelineParams, options: ZBAutoOptions, limit: float,
                    t: tuple[float, float, float, float]) -> Schedule:
    """The list scheduler under several policies, and ZB-H1/ZB-H2 when they fit: the shortest makespan wins,
    ties (within 1e-9 relative) going to the smallest largest span (the zero-bubble paper's cost)."""
    p, m = params.pp, params.microbatches
    candidates: list[list[list[Action]]] = []
    policies = [_Policy(fills, per_rank, extra) for fills in (True, False) for per_rank in (False, True)
                for extra in ((0, p - 1) if per_rank else (0,))]
    policies += [_Policy(fills, False, 0, f_wait * options.tf) for f_wait in (0.25, 0.5, 0.75, 1.0)
                 for fills in (True, False)]
    for policy in policies:
        candidates.append(greedy_zero_bubble(p, m, *t, options.mw, limit, policy))
    for handcrafted in (zb_h1(params), zb_h2(params)):
        candidates.append([list(x) for x in handcrafted.programs])
    scored = []
    for index, progs in enumerate(candidates):
        sched = make_schedule("zb-auto", params, progs, mem_limit=limit)
        timing = evaluate(sched, *t, options.mw)
        if max(timing.peaks) > limit + 1e-9:
            continue
        scored.append((timing, index, sched))
    assert scored, "the capped list scheduler always fits the limit"
    shortest = min(x[0].makespan for x in scored)
    fastest = [x for x in scored if x[0].makespan <= shortest * (1 + 1e-9)]
    return min(fastest, key=lambda x: (max(x[0].spans), x[0].makespan, x[1]))[2]


def _refine(seed: Schedule, params: PipelineParams, options: ZBAutoOptions, limit: float,
            t: tuple[float, float, float, float]) -> tuple[str, Schedule | None]:
    """The refinement's status, and its schedule if that has a smaller largest span at no larger makespan."""
    base = evaluate(seed, *t, options.mw)
    if max(base.spans) <= max(base.busy) * (1 + 1e-12):
        return "seed optimal", None  # no rank idles inside its span: nothing to gain
    found = solve(seed, *t, options.mw, limit, options.time_limit)
    if found.schedule is None:
        return found.status, None
    out = make_schedule("zb-auto", params, found.schedule.programs, mem_limit=limit)
    timing = evaluate(out, *t, options.mw)
    fits = max(timing.peaks) <= limit + 1e-9
    if fits and timing.makespan <= base.makespan * (1 + 1e-12) and max(timing.spans) < max(base.spans):
        return found.status, out
    return found.status, None
