"""schedlab.schedules: WHAT runs. The schedule IR and the schedule library (no torch needed).

    >>> from schedules import build, validate
    >>> graph = validate(build("1f1b", pp=4, microbatches=8))
"""

from schedules import flush, looped  # noqa: F401  (registers the generators)
from schedules.errors import ScheduleError
from schedules.graph import Stream, Task, TaskGraph, graph_from_programs, insert_comms, lower
from schedules.ir import Action, Kind, Schedule
from schedules.registry import PipelineParams, build, names, register, spec
from schedules.validate import check_schedule, find_cycle, validate

__all__ = [
    "Action",
    "Kind",
    "PipelineParams",
    "Schedule",
    "ScheduleError",
    "Stream",
    "Task",
    "TaskGraph",
    "build",
    "check_schedule",
    "find_cycle",
    "graph_from_programs",
    "insert_comms",
    "lower",
    "names",
    "register",
    "spec",
    "validate",
]
