"""schedlab.schedules: WHAT runs. The schedule IR and the schedule library (no torch needed).

    >>> from schedules import build, validate
    >>> graph = validate(build("1f1b", pp=4, microbatches=8))

In flow order: ``ir`` (Action, Kind, Schedule) -> ``registry`` and the
generators (``flush``, ``looped``, ``zero_bubble``, ``zb_auto``; ``policy``: a schedule written as a rule
that picks each rank's next action, ``from_policy``) -> ``check``
(a schedule's work) -> ``lower`` (SEND/RECV and dependencies, a ``graph``) ->
``validate`` (deadlocks) -> ``dp`` (data-parallel collectives). ``load``
resolves any schedule reference; ``torch_csv`` and ``torch_interop`` speak
torch.distributed.pipelining's formats; ``trace`` is the shared trace format.
"""

from common.errors import (
    CheckpointError,
    ClusterError,
    ConfigError,
    CostFileError,
    OutputError,
    SchedlabError,
    ScheduleError,
)
from schedules.check import check_schedule
from schedules.graph import Stream, Task, TaskGraph, find_cycle, topological_order
from schedules.interop.torch_classes import from_torch, torch_schedule_names
from schedules.interop.torch_csv import read_torch_csv, read_torch_csv_graph, write_torch_csv
from schedules.ir import Action, Kind, Schedule
from schedules.library import controllable, flush, looped, zb_auto, zero_bubble  # noqa: F401  (registers the generators)
from schedules.library.policy import PassTimes, Policy, RankState, from_policy
from schedules.library.zb_auto import ZBAutoOptions
from schedules.load import import_schedules, load_graph, load_schedule, schedule_spec
from schedules.lower import graph_from_programs, insert_comms, lower
from schedules.registry import PipelineParams, build, make_schedule, names, register, spec
from schedules.validate import validate

__all__ = [
    "Action",
    "CheckpointError",
    "ClusterError",
    "ConfigError",
    "CostFileError",
    "Kind",
    "OutputError",
    "PassTimes",
    "PipelineParams",
    "Policy",
    "RankState",
    "SchedlabError",
    "Schedule",
    "ScheduleError",
    "Stream",
    "Task",
    "TaskGraph",
    "ZBAutoOptions",
    "build",
    "check_schedule",
    "find_cycle",
    "from_policy",
    "from_torch",
    "graph_from_programs",
    "import_schedules",
    "insert_comms",
    "load_graph",
    "load_schedule",
    "lower",
    "make_schedule",
    "names",
    "read_torch_csv",
    "read_torch_csv_graph",
    "register",
    "schedule_spec",
    "spec",
    "topological_order",
    "torch_schedule_names",
    "validate",
    "write_torch_csv",
]
