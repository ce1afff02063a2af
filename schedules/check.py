"""Static checks of a schedule's work: every error names schedule, rank and action.

:func:`check_schedule` runs before lowering; deadlocks (cycles of waits) are
found on the lowered graph by :func:`schedules.validate`.
"""

from __future__ import annotations

from common.errors import ScheduleError
from schedules.ir import COMPUTE_KINDS, Action, Kind, Schedule

__all__ = ["check_schedule"]

_F, _I, _W, _B, _OV = Kind.F, Kind.I, Kind.W, Kind.B, Kind.OVERLAP_F_B


def check_schedule(schedule: Schedule) -> None:
    """Check the work of a schedule's compute programs.

    Rejects: non-compute actions, stages or microbatches out of range, a stage
    run on a rank it is not placed on, missing or duplicate (stage, microbatch)
    work, B mixed with I/W for the same work, and a backward (or W) that comes
    before the pass it depends on on its rank.
    """
    if _valid_fast(schedule):
        return
    name = schedule.name
    n_st, n_mb = schedule.num_stages, schedule.num_microbatches
    if schedule.num_ranks < 1 or n_st < 1 or n_mb < 1:
        raise ScheduleError(
            f"schedule {name!r}: needs >= 1 rank, stage and microbatch, got "
            f"{schedule.num_ranks} ranks, {n_st} stages, {n_mb} microbatches"
        )
    seen: dict[tuple[Kind, int, int], tuple[int, int]] = {}  # work -> (rank, position)
    for rank, prog in enumerate(schedule.programs):
        for pos, action in enumerate(prog):
            if action.kind not in COMPUTE_KINDS:
                raise ScheduleError(
                    f"schedule {name!r}, rank {rank}, action {action}: a Schedule holds compute "
                    "actions only (F, I, W, B, R, OVERLAP_F_B); communication is added by lower()"
                )
            for a in action.parts():
                _check_one(schedule, rank, a)
                key = (a.kind, a.stage, a.microbatch)
                if key in seen:
                    r0, p0 = seen[key]
                    where = f"at positions {p0} and {pos}" if r0 == rank else f"also on rank {r0}"
                    raise ScheduleError(f"schedule {name!r}, rank {rank}, action {a}: duplicate work, runs twice ({where})")
                seen[key] = (rank, pos)
    _check_coverage(schedule, seen)
    _check_order(schedule, seen)
    _check_recompute(schedule, seen)


def _valid_fast(schedule: Schedule) -> bool:
    """True when :func:`check_schedule` would accept the schedule; False when it might not (it then looks closely).

    One pass: every action of a known kind (F, I, W, B, OVERLAP_F_B of those), in range, on its stage's rank,
    once, each backward after its forward and each W after its I on the rank, never B and I for the same work;
    then the coverage by counting. Positions are kept in a table per kind indexed [stage][microbatch].
    """
    n_st, n_mb = schedule.num_stages, schedule.num_microbatches
    if schedule.num_ranks < 1 or n_st < 1 or n_mb < 1:
        return False
    s2r = schedule.stage_to_rank
    f_at = [[-1] * n_mb for _ in range(n_st)]  # position of each piece of work on its (only) rank, -1: none yet
    i_at = [[-1] * n_mb for _ in range(n_st)]
    b_at = [[-1] * n_mb for _ in range(n_st)]
    w_at = [[-1] * n_mb for _ in range(n_st)]
    forwards = inputs = fulls = weights = 0
    for rank, prog in enumerate(schedule.programs):
        for pos, action in enumerate(prog):
            kind = action.kind
            if kind is _OV:
                parts = action.sub_actions
                if not parts:
                    return False
            elif kind is _F or kind is _I or kind is _W or kind is _B:
                parts = (action,)
            else:
                return False
            for a in parts:
                k, st, mb = a.kind, a.stage, a.microbatch
                if type(mb) is not int or type(st) is not int or not (0 <= st < n_st and 0 <= mb < n_mb) \
                        or s2r[st] != rank:
                    return False
                if k is _F:
                    row = f_at[st]
                    if row[mb] >= 0:
                        return False
                    row[mb] = pos
                    forwards += 1
                elif k is _W:
                    row = w_at[st]
                    if row[mb] >= 0 or not 0 <= i_at[st][mb] < pos:
                        return False
                    row[mb] = pos
                    weights += 1
                elif k is _I or k is _B:
                    row, other = (i_at[st], b_at[st]) if k is _I else (b_at[st], i_at[st])
                    if row[mb] >= 0 or other[mb] >= 0 or not 0 <= f_at[st][mb] < pos:
                        return False
                    row[mb] = pos
                    if k is _I:
                        inputs += 1
                    else:
                        fulls += 1
                else:
                    return False
    # No work twice and B, I disjoint: all forwards present, each work has B or I (not both), each I its W.
    total = n_st * n_mb
    return forwards == total and inputs + fulls == total and weights == inputs


def _check_one(schedule: Schedule, rank: int, a: Action) -> None:
    n_st, n_mb = schedule.num_stages, schedule.num_microbatches
    if not 0 <= a.stage < n_st:
        why = f"stage {a.stage} out of range, valid stages are 0..{n_st - 1}"
    elif a.microbatch is None or not 0 <= a.microbatch < n_mb:
        why = f"microbatch {a.microbatch} out of range, valid are 0..{n_mb - 1}"
    elif schedule.stage_to_rank[a.stage] != rank:
        why = f"stage {a.stage} is placed on rank {schedule.stage_to_rank[a.stage]}; a stage cannot run on two ranks"
    else:
        return
    raise ScheduleError(f"schedule {schedule.name!r}, rank {rank}, action {a}: {why}")


def _check_coverage(schedule: Schedule, seen: dict) -> None:
    name = schedule.name
    for s in range(schedule.num_stages):
        rank = schedule.stage_to_rank[s]
        for mb in range(schedule.num_microbatches):
            has = {k for k in (Kind.F, Kind.B, Kind.I, Kind.W) if (k, s, mb) in seen}
            where = f"schedule {name!r}, rank {rank}"
            if Kind.F not in has:
                raise ScheduleError(f"{where}: missing work {s}F{mb} (stage {s} microbatch {mb} has no forward)")
            if Kind.B in has and has & {Kind.I, Kind.W}:
                raise ScheduleError(
                    f"{where}, action {s}B{mb}: mixes a full backward with I/W for the same work; "
                    f"run either {s}B{mb} or {s}I{mb} and {s}W{mb}"
                )
            if not has & {Kind.B, Kind.I, Kind.W}:
                raise ScheduleError(
                    f"{where}: missing work, stage {s} microbatch {mb} has no backward ({s}B{mb} or {s}I{mb}+{s}W{mb})"
                )
            if Kind.I in has and Kind.W not in has:
                raise ScheduleError(f"{where}, action {s}I{mb}: missing work {s}W{mb} (each I needs its W)")
            if Kind.W in has and Kind.I not in has:
                raise ScheduleError(f"{where}, action {s}W{mb}: has no {s}I{mb} before it (W needs its I)")


def _check_order(schedule: Schedule, seen: dict) -> None:
    # Same rank for all of one stage's work (checked above), so positions compare directly.
    for (kind, s, mb), (rank, pos) in seen.items():
        before = {Kind.B: Kind.F, Kind.I: Kind.F, Kind.W: Kind.I}.get(kind)
        if before is None:
            continue
        _, pos0 = seen[(before, s, mb)]
        where = f"schedule {schedule.name!r}, rank {rank}, action {s}{kind.value}{mb}"
        if pos0 == pos:
            raise ScheduleError(
                f"{where}: overlapped with its own forward {s}F{mb}; an overlapped pair needs two independent passes"
            )
        if pos0 > pos:
            raise ScheduleError(
                f"{where}: runs before {s}{before.value}{mb} (position {pos} < {pos0}); move it after"
            )


def _check_recompute(schedule: Schedule, seen: dict) -> None:
    """An R(s, mb) lies between its forward and its backward (B, or I) on the stage's rank."""
    for (kind, s, mb), (rank, pos) in seen.items():
        if kind is not Kind.R:
            continue
        where = f"schedule {schedule.name!r}, rank {rank}, action {s}R{mb}"
        fwd = seen[(Kind.F, s, mb)][1]
        back = seen.get((Kind.B, s, mb)) or seen.get((Kind.I, s, mb))
        if pos <= fwd:
            raise ScheduleError(f"{where}: recomputes before its forward {s}F{mb} (position {pos} <= {fwd}); "
                                "an R rebuilds what the forward dropped, so it goes after it")
        if back is not None and pos >= back[1]:
            kind_b = "B" if (Kind.B, s, mb) in seen else "I"
            raise ScheduleError(f"{where}: comes after its backward {s}{kind_b}{mb} (position {pos} >= {back[1]}); "
                                "move it before the backward that needs its activations")
