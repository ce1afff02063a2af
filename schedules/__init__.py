"""schedlab.schedules: WHAT runs. The schedule IR and the schedule library (no torch needed).

    >>> from schedules import build, validate
    >>> graph = validate(build("1f1b", pp=4, microbatches=8))
"""

from schedules import flush, looped, zb_auto, zero_bubble  # noqa: F401  (registers the generators)
from schedules.errors import ScheduleError
from schedules.graph import Stream, Task, TaskGraph, graph_from_programs, insert_comms, lower
from schedules.interop import (
    from_torch,
    load_graph,
    load_schedule,
    read_torch_csv,
    read_torch_csv_graph,
    torch_schedule_names,
    write_torch_csv,
)
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
    "from_torch",
    "graph_from_programs",
    "insert_comms",
    "load_graph",
    "load_schedule",
    "lower",
    "names",
    "read_torch_csv",
    "read_torch_csv_graph",
    "register",
    "spec",
    "torch_schedule_names",
    "validate",
    "write_torch_csv",
]
