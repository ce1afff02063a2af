"""Recomputation as an action: R(stage, mb) re-runs a forward to rebuild the activations its backward needs.

An F whose (stage, microbatch) has an R keeps only its input; the R, costing
a forward, holds the activations again until the backward frees them
(:mod:`schedules.timing` keeps the arithmetic). Two passes place the R's:

* :func:`recompute_full` puts each R right before its backward (B, I, or the
  overlapped pair holding it): least memory, a forward more on the critical path;
* :func:`recompute_in_bubbles` spends a memory limit on the two ideas of
  Mario (Liu et al., PPoPP 2025): recompute only what the limit requires
  (it drops each R whose microbatch can keep its activations within the
  limit without lengthening the step), and hide the recomputation that is
  left in the pipeline bubbles (it moves each remaining R earlier, into idle
  time of its rank before the backward). Each move lands in a gap at least
  one recompute long; the held activations grow between the new place and
  the backward, so the limit decides how many move.
"""

from __future__ import annotations

from common.errors import ConfigError, check_choice, check_positive
from schedules.ir import Action, Kind, Schedule
from schedules.timing import MW_RUNTIME, evaluate, pass_time

__all__ = ["RECOMPUTE_PLACEMENTS", "check_recompute", "place_recompute", "recompute_full", "recompute_in_bubbles"]

# How a run or a simulation places R actions: none, R right before every backward, or Mario's pass.
RECOMPUTE_PLACEMENTS = ("none", "full", "bubbles")


def check_recompute(owner: str, mode: str, limit: float | None) -> None:
    """ConfigError unless ``mode`` is a placement and ``limit`` is given exactly when it is ``bubbles`` (> 0)."""
    check_choice(owner, "recompute", mode, RECOMPUTE_PLACEMENTS)
    if mode == "bubbles":
        if limit is None:
            raise ConfigError(f"{owner}: recompute bubbles needs recompute_limit, the activation memory (M_B per "
                              "rank) the moved R's may use, e.g. 2", field="recompute_limit")
        check_positive(owner, "recompute_limit", limit, " M_B")
    elif limit is not None:
        raise ConfigError(f"{owner}: recompute_limit {limit!r} applies to recompute bubbles only, not {mode}; "
                          "drop it or use recompute bubbles", field="recompute_limit")


def place_recompute(schedule: Schedule, mode: str, limit: float | None = None,
                    times: tuple[float, float, float, float, float] = (1.0, 1.0, 1.0, 0.0, MW_RUNTIME)) -> Schedule:
    """``schedule`` with R actions placed by ``mode`` (:data:`RECOMPUTE_PLACEMENTS`).

    ``bubbles`` needs ``limit`` (M_B per rank) and times the moves with
    ``times`` = (tf, tb, tw, tcomm, mw) (default: unit passes, no message
    delay, the runtime's memory: I frees nothing); the other modes take no limit. A schedule that already has R
    actions is only accepted with ``none``.
    """
    owner = f"recompute of schedule {schedule.name!r}"
    check_recompute(owner, mode, limit)
    if mode == "none":
        return schedule
    if any(a.kind is Kind.R for prog in schedule.programs for x in prog for a in x.parts()):
        raise ConfigError(f"{owner}: the schedule already has R actions; run it with recompute none",
                          field="recompute")
    return recompute_full(schedule) if mode == "full" else recompute_in_bubbles(schedule, limit, *times)


def _backward_parts(action: Action) -> list[Action]:
    return [a for a in action.parts() if a.kind in (Kind.B, Kind.I)]


def recompute_full(schedule: Schedule) -> Schedule:
    """Every (stage, microbatch) recomputed: an R right before the action holding its backward."""
    programs = []
    for prog in schedule.programs:
        out: list[Action] = []
        for action in prog:
            out += [Action(Kind.R, a.stage, a.microbatch) for a in _backward_parts(action)]
            out.append(action)
        programs.append(out)
    return Schedule(schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches,
                    schedule.stage_to_rank, tuple(tuple(p) for p in programs),
                    {**schedule.params, "recompute": "full"})


def recompute_in_bubbles(schedule: Schedule, mem_limit: float, tf: float = 1.0, tb: float = 1.0,
                         tw: float = 1.0, tcomm: float = 0.0, mw: float = MW_RUNTIME) -> Schedule:
    """R right before each backward; then each R dropped whose removal keeps every rank's peak within
    ``mem_limit`` M_B at no longer step; then each R left moved into the earliest idle gap after its F
    that is at least a recompute long, within the limit and at no longer step.

    Ranks and their R's are taken in program order; each accepted change is timed again before the next.
    """
    times = (tf, tb, tw, tcomm, mw)
    current = _drop(recompute_full(schedule), mem_limit, times)
    r_time = pass_time(Kind.R, tf, tb, tw) / schedule.chunks
    for rank in range(schedule.num_ranks):
        index = 0
        while index < len(current.programs[rank]):
            prog = current.programs[rank]
            action = prog[index]
            if action.kind is not Kind.R:
                index += 1
                continue
            moved = _move_earlier(current, rank, index, r_time, mem_limit, (tf, tb, tw, tcomm, mw))
            if moved is not None:
                current = moved
            index += 1
    return Schedule(current.name, current.num_ranks, current.num_stages, current.num_microbatches,
                    current.stage_to_rank, current.programs,
                    {**schedule.params, "recompute": "bubbles", "recompute_mem_limit": mem_limit})


def _with_program(s: Schedule, rank: int, program: list[Action]) -> Schedule:
    programs = list(s.programs)
    programs[rank] = tuple(program)
    return Schedule(s.name, s.num_ranks, s.num_stages, s.num_microbatches, s.stage_to_rank, tuple(programs), s.params)


def _drop(current: Schedule, mem_limit: float, times: tuple[float, ...]) -> Schedule:
    """Each R removed (its forward keeps the activations) where the limit holds and the step is no longer."""
    timing = evaluate(current, *times)
    for rank in range(current.num_ranks):
        index = 0
        while index < len(current.programs[rank]):
            prog = current.programs[rank]
            if prog[index].kind is Kind.R:
                cand = _with_program(current, rank, [*prog[:index], *prog[index + 1:]])
                t = evaluate(cand, *times)
                if max(t.peaks) <= mem_limit + 1e-9 and t.makespan <= timing.makespan + 1e-9:
                    current, timing = cand, t
                    continue
            index += 1
    return current


def _move_earlier(current: Schedule, rank: int, index: int, r_time: float, mem_limit: float,
                  times: tuple[float, ...]) -> Schedule | None:
    prog = list(current.programs[rank])
    r = prog[index]
    timing = evaluate(current, *times[:4], times[4])
    starts, ends = timing.starts[rank], timing.ends[rank]
    first = next(i for i, a in enumerate(prog) if any(p.kind is Kind.F and p.stage == r.stage
                                                         and p.microbatch == r.microbatch for p in a.parts())) + 1
    for pos in range(first, index):
        gap = starts[pos] - ends[pos - 1]
        if gap + 1e-12 < r_time:
            continue
        cand = _with_program(current, rank, [*prog[:pos], r, *prog[pos:index], *prog[index + 1:]])
        t = evaluate(cand, *times[:4], times[4])
        if max(t.peaks) <= mem_limit + 1e-9 and t.makespan <= timing.makespan + 1e-9:
            return cand
    return None
