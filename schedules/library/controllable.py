"""Controllable-memory V schedules: v-half and v-min (Qi et al., "Pipeline Parallelism with Controllable
Memory", NeurIPS 2024).

Every rank holds two stages in a V (rank r: stages r and 2p-1-r, as in ZB-V),
passes are split into F, I and W, and a rank holds at most ``cap`` M_B of
activations (1/2 M_B per chunk of a microbatch, from its F to its I). The
down-leg activations live long (the microbatch's whole trip down and back up
the V), the up-leg ones briefly; so a cap well under p M_B still keeps the
pipeline fed. That is the paper's lever: a building block's lifespan sets the peak.

The paper's figures, at t_F = t_B = t_W (the authors' summary of the paper,
bubble rate 1 - (F+B+W) m / longest stage time):

=========  ===========  =============
schedule   peak (M_B)   bubble rate
=========  ===========  =============
1F1B       p            ~ p/m
v-min      (p+4)//3     ~ 2p/(3m)
v-half     (p+2)//2     ~ p/(2m)
zb-v       p            0
=========  ===========  =============

v-min is the paper's repeating building block (:func:`v_min_offsets`,
:func:`v_block_schedule`): each microbatch's four passes on a rank at fixed
slot offsets, one block every 6 slots, W's in the free slots, then run as early
as dependencies allow. Its peak is exactly (p+4)//3 M_B under the paper's
accounting (an activation held until its W, ``mw`` = 1, also the runtime's and
the simulator's default) and p//3 + 1 with I freeing it (``mw`` = 0); its span
bubble is under 2p/(3m) for p = 2..16 (13.3% at p=16, m=64). The block applies to every p >= 1 and m >= 1.

v-half is our own list scheduler under a cap of (p+2)//2 M_B, counted with I
freeing its microbatch (``mw`` = 0); held until W, as the runtime holds it, its
deferred W's keep more than 1F1B (7 M_B at p=4, m=8). The paper's
V-Half block run the same way (without its greedy reordering) measured worse
than the list scheduler at every p in 2..16 we tried, so v-half keeps it. It
walks the ranks in time order: a free
rank runs the oldest backward (I) whose gradient has arrived, else the up-leg
forward of a microbatch it already holds, else a new down-leg forward if that
leaves room for one up-leg forward under the cap (so the V always drains),
else a pending W, else it waits. A rank
whose next I is due within one forward waits for it rather than start a
forward that would hold it up (the same lookahead as zb-auto's).
"""

from __future__ import annotations

import math
from collections import deque

from schedules.ir import Action, Kind, Schedule
from schedules.library.zero_bubble import v_placement
from schedules.registry import PipelineParams, make_schedule, register

__all__ = ["V_MIN_INTERVAL", "v_block_schedule", "v_half", "v_half_cap", "v_list_schedule", "v_min", "v_min_offsets"]


def v_list_schedule(p: int, m: int, cap: int, tf: float = 1.0, tb: float = 1.0, tw: float = 1.0,
                    tcomm: float = 0.0, f_wait: float | None = None, admitted: int | None = None
                    ) -> list[list[Action]]:
    """Per-rank programs on the V placement holding at most ``cap`` >= 1 M_B of activations per rank.

    Pass times are per microbatch through a rank's whole share (a chunk takes half). ``admitted``: stop as
    stage 0 runs that many forwards and return the programs so far, each a prefix of its whole program at
    ``m`` (programs only grow as the scheduler runs), at a fraction of the cost: the planner's memory floor.
    """
    n = 2 * p
    rank_of = v_placement(p)
    f, b, w = tf / 2, tb / 2, tw / 2
    wait = f if f_wait is None else f_wait
    f_arrive = [[math.inf] * m for _ in range(n)]  # when stage s may start F of microbatch j
    i_arrive = [[math.inf] * m for _ in range(n)]  # when stage s may start I of microbatch j
    f_arrive[0] = [0.0] * m
    nf, ni = [0] * n, [0] * n
    free = [0.0] * p
    held = [0] * p  # activations on each rank, in half-M_B units (one chunk of one microbatch)
    wq: list[deque[Action]] = [deque() for _ in range(p)]
    progs: list[list[Action]] = [[] for _ in range(p)]
    eps = 1e-9

    def delay(s: int, t: int) -> float:
        return tcomm if rank_of[s] != rank_of[t] else 0.0

    active = list(range(p))  # the ranks not done, ascending (done: its down-leg I's, its last, and every W run)
    finished = [False] * p
    waiting = [False] * p  # nothing to do at its instant, letting the other ranks there act first
    # The instant t and the ranks free at it (ascending), kept while any is: free times only grow, so the next
    # rank is among them; ``later``: the earliest free time after t (exact: lowered as ranks move on, recomputed
    # when t moves or a rank is done).
    t, tied, later = -math.inf, [], math.inf
    nwait = 0  # how many of ``tied`` are waiting
    r = -1  # the rank that acted last: the only one whose free time or state an iteration changes
    while active:
        # the next rank: the earliest free, a waiting one after the others at its instant, then the lowest
        if r >= 0 and (free[r] != t or finished[r]):
            tied.remove(r)
        if not tied:
            t = min([free[x] for x in active])
            tied = [x for x in active if free[x] == t]
            later = min([free[x] for x in active if free[x] > t], default=math.inf)
            nwait = sum(waiting[x] for x in tied)
        r = next((x for x in tied if not waiting[x]), tied[0]) if nwait else tied[0]
        down, up = r, n - 1 - r
        backs = [s for s in (up, down) if ni[s] < m and i_arrive[s][ni[s]] <= t + eps]
        if backs:
            s = min(backs, key=lambda x: (ni[x], x == down))
            j = ni[s]
            ni[s] += 1
            end = t + b
            if s > 0:
                i_arrive[s - 1][j] = end + delay(s, s - 1)
            held[r] -= 1
            wq[r].append(Action(Kind.W, s, j))
            progs[r].append(Action(Kind.I, s, j))
            free[r] = end
            later = min(later, end) if end > t else later
            waiting, nwait = [False] * p, 0
            continue
        fwd = None
        if nf[up] < m and f_arrive[up][nf[up]] <= t + eps and held[r] + 1 <= 2 * cap:
            fwd = up
        elif nf[down] < m and f_arrive[down][nf[down]] <= t + eps and held[r] + 2 <= 2 * cap:
            fwd = down  # leaving room for one up-leg forward, so the V always drains
        due = [i_arrive[s][ni[s]] for s in (up, down) if ni[s] < m and i_arrive[s][ni[s]] < math.inf]
        soon = min(due, default=math.inf)
        if fwd is not None and not soon < t + min(wait, f) - eps:
            j = nf[fwd]
            nf[fwd] += 1
            if fwd == 0 and j == admitted:
                return progs
            end = t + f
            held[r] += 1
            if fwd < n - 1:
                f_arrive[fwd + 1][j] = end + delay(fwd, fwd + 1)
            else:
                i_arrive[fwd][j] = end
            progs[r].append(Action(Kind.F, fwd, j))
            free[r] = end
            later = min(later, end) if end > t else later
            waiting, nwait = [False] * p, 0
            continue
        if wq[r] and (fwd is None or soon >= t + w - eps):
            progs[r].append(wq[r].popleft())
            free[r] = t + w
            later = min(later, t + w) if t + w > t else later
            waiting, nwait = [False] * p, 0
            if ni[r] == m and not wq[r]:  # the down-leg stage's backward is the rank's last
                active.remove(r)
                finished[r] = True
                later = min([free[x] for x in active if free[x] > t], default=math.inf)
            continue
        near = t + eps
        if later > near:  # the ranks at t, give or take eps, are those tied: nwait of them waiting
            others_go = len(tied) - nwait - (not waiting[r]) > 0
        else:
            others_go = any(not waiting[x] for x in active if free[x] <= near and x != r)
        if others_go:
            if not waiting[r]:
                waiting[r] = True
                nwait += 1
            elif later <= near:
                # Every rank at t waits, for one free within eps of t but not at it (a float's last digits):
                # waiting on at t would spin for ever, so step to its instant, still letting it go first.
                nwait -= 1
                free[r] = later
            continue
        nxt = [x for x in (soon, *_f_times(f_arrive, nf, up, down, m, held[r] + 1 <= 2 * cap, held[r] + 2 <= 2 * cap)) if x > near]
        others = [later] if later > near else [free[x] for x in active if x != r and free[x] > near]
        wake = min(nxt + others, default=math.inf)
        if math.isinf(wake):
            raise AssertionError(f"V list scheduler stuck at t={t} on rank {r}")
        if waiting[r]:
            nwait -= 1
        free[r], waiting[r] = wake, False
        later = min(later, wake)
    return progs


def _f_times(f_arrive, nf, up, down, m, room_up, room_down) -> list[float]:
    out = []
    if room_up and nf[up] < m:
        out.append(f_arrive[up][nf[up]])
    if room_down and nf[down] < m:
        out.append(f_arrive[down][nf[down]])
    return out


# The V-Min building block (Qi et al. 2024, sec. 4; offsets from the authors' V-schedule code,
# sail-sg/zero-bubble-pipeline-parallelism, its stable V-Min pattern): in slots of one chunk pass at
# t_F = t_B = t_W, rank i runs microbatch j's down-leg F at i, up-leg F at 2p-1-i, up-leg I at 2p+g+i and
# down-leg I at 4p+g-1-i, each plus 6j (one block every 6 slots), with the gap g = 2 when 3 divides p, else 0.
V_MIN_INTERVAL = 6


def v_min_offsets(p: int) -> list[tuple[int, int, int, int]]:
    """Per rank, the V-Min block's slots of (down F, up F, up I, down I) for microbatch 0."""
    g = 2 if p % 3 == 0 else 0
    return [(i, 2 * p - 1 - i, 2 * p + g + i, 4 * p + g - 1 - i) for i in range(p)]


def v_block_schedule(p: int, m: int, offsets: list[tuple[int, int, int, int]],
                     interval: int = V_MIN_INTERVAL) -> list[list[Action]]:
    """Per-rank programs from a repeating building block on the V placement.

    Microbatch j's four passes on rank i sit at ``offsets[i]`` + ``interval`` j. The block's four slots
    are distinct modulo the interval, so blocks never collide, and each pass's slot is after its
    producer's (the slot arithmetic in :func:`v_min_offsets`). Every slot the blocks leave free takes
    the oldest pending W (a rank's I's, in slot order); the rest follow the last block. The simulator
    then runs each program as early as its dependencies allow: the paper's squeeze.
    """
    n = 2 * p
    progs: list[list[Action]] = []
    for r, offs in enumerate(offsets):
        down, up = r, n - 1 - r
        kinds = ((Kind.F, down), (Kind.F, up), (Kind.I, up), (Kind.I, down))
        slots: dict[int, Action] = {}
        for j in range(m):
            for off, (kind, stage) in zip(offs, kinds, strict=True):
                t = off + interval * j
                if t in slots:
                    raise AssertionError(f"building block collides on rank {r} at slot {t}")
                slots[t] = Action(kind, stage, j)
        prog: list[Action] = []
        pending: deque[Action] = deque()
        for t in range(max(slots) + 1):
            a = slots.get(t)
            if a is None:
                if pending:
                    prog.append(pending.popleft())
                continue
            prog.append(a)
            if a.kind is Kind.I:
                pending.append(Action(Kind.W, a.stage, a.microbatch))
        prog.extend(pending)
        progs.append(prog)
    return progs


def _build(name: str, params: PipelineParams, cap: int) -> Schedule:
    p, m = params.pp, params.microbatches
    progs = v_list_schedule(p, m, cap)
    return make_schedule(name, params, progs, v_placement(p), lifespan_cap=cap)


def v_half_cap(p: int) -> int:
    """V-Half's activation cap per rank in M_B: (p+2)//2, half of 1F1B's p."""
    return (p + 2) // 2


@register("v-half", fixed_chunks=2)
def v_half(params: PipelineParams) -> Schedule:
    """V-Half (Qi et al. 2024, controllable memory): V placement at (p+2)//2 M_B, half of 1F1B; bubble ~ p/(2m)."""
    return _build("v-half", params, v_half_cap(params.pp))


@register("v-min", fixed_chunks=2)
def v_min(params: PipelineParams) -> Schedule:
    """V-Min (Qi et al. 2024, controllable memory): V placement at (p+4)//3 M_B, a third of 1F1B; bubble ~ 2p/(3m)."""
    p, m = params.pp, params.microbatches
    progs = v_block_schedule(p, m, v_min_offsets(p))
    return make_schedule("v-min", params, progs, v_placement(p), lifespan_cap=(p + 4) // 3)
