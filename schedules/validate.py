"""Static checks: every error is found before anything runs, and names schedule, rank and action."""

from __future__ import annotations

from schedules.errors import ScheduleError
from schedules.graph import TaskGraph, lower, paused_gc
from schedules.ir import COMPUTE_KINDS, Action, Kind, Schedule

__all__ = ["check_schedule", "find_cycle", "topological_order", "validate"]


def check_schedule(schedule: Schedule) -> None:
    """Check the work of a schedule's compute programs.

    Rejects: non-compute actions, stages or microbatches out of range, a stage
    run on a rank it is not placed on, missing or duplicate (stage, microbatch)
    work, B mixed with I/W for the same work, and a backward (or W) that comes
    before the pass it depends on on its rank.
    """
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
                    "actions only (F, I, W, B, OVERLAP_F_B); communication is added by lower()"
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


def topological_order(graph: TaskGraph) -> tuple[list[int], list[int]]:
    """Task ids in an order where each comes after its deps (Kahn), and each task's unmet deps.

    The order covers every task exactly when the graph has no cycle; the tasks
    left out (unmet deps > 0) are those waiting on a cycle.
    """
    indeg = [len(t.deps) for t in graph.tasks]
    succ = graph.successors
    ready = [i for i, d in enumerate(indeg) if d == 0]
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return order, indeg


def find_cycle(graph: TaskGraph) -> list[int] | None:
    """Task ids of one cycle of waits (first == last), or None if the graph is acyclic."""
    order, indeg = topological_order(graph)
    n = len(graph.tasks)
    if len(order) == n:
        return None
    # Every unfinished task waits on an unfinished task: walk those waits until one repeats.
    stuck = {i for i in range(n) if indeg[i] > 0}
    node = min(stuck)
    path: list[int] = []
    index: dict[int, int] = {}
    while node not in index:
        index[node] = len(path)
        path.append(node)
        node = next(d for d in graph.tasks[node].deps if d in stuck)
    cycle = [*path[index[node] :], node]
    return cycle[::-1]  # in the direction of time: each waits for the one before


def validate(target: Schedule | TaskGraph) -> TaskGraph:
    """Check a schedule (lowering it) or a task graph; return the graph or raise ScheduleError.

    On top of :func:`check_schedule` this finds any deadlock statically: a
    cycle of waits across ranks (program order plus data dependencies).
    """
    with paused_gc():
        return _validate(target)


def _validate(target: Schedule | TaskGraph) -> TaskGraph:
    graph = lower(target) if isinstance(target, Schedule) else target
    if not isinstance(target, Schedule):
        compute_only = [[a for a in graph.program_actions(r) if a.is_compute] for r in range(graph.num_ranks)]
        check_schedule(Schedule.from_programs(
            compute_only,
            name=graph.schedule.name,
            stage_to_rank=graph.schedule.stage_to_rank,
            num_microbatches=graph.schedule.num_microbatches,
        ))
    cycle = find_cycle(graph)
    if cycle is not None:
        steps = " -> ".join(f"rank {graph.tasks[i].rank} {graph.tasks[i].action}" for i in cycle)
        first = graph.tasks[cycle[1]]
        raise ScheduleError(
            f"schedule {graph.schedule.name!r}, rank {first.rank}, action {first.action}: deadlock, "
            f"a cycle of waits (each waits for the one before): {steps}"
        )
    return graph
