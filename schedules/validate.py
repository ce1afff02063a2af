"""validate: a schedule or a task graph checked whole, deadlocks included, before anything runs."""

from __future__ import annotations

from common.errors import ScheduleError
from schedules.check import check_schedule
from schedules.graph import TaskGraph, find_cycle
from schedules.ir import Schedule
from schedules.lower import lower, work_checked
from schedules.util import paused_gc

__all__ = ["validate"]


def validate(target: Schedule | TaskGraph) -> TaskGraph:
    """Check a schedule (lowering it) or a task graph; return the graph or raise ScheduleError.

    On top of :func:`check_schedule` this finds any deadlock statically: a
    cycle of waits across ranks (program order plus data dependencies).
    """
    with paused_gc():
        return _validate(target)


def _validate(target: Schedule | TaskGraph) -> TaskGraph:
    graph = lower(target) if isinstance(target, Schedule) else target
    if not isinstance(target, Schedule) and not work_checked(graph):
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
