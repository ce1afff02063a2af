"""One name for any schedule: a registered name, ``torch:<ClassName>``, ``csv:<PATH>``, or the user's own code.

A user's schedule is ``path/file.py:NAME`` or ``pkg.module:NAME``: NAME is a function the file registered with
:func:`schedules.register` (or the name it registered it under), or a plain function ``(PipelineParams) ->
Schedule``; importing the file or module is all it takes, in every process that resolves the reference (each
torchrun worker does). :func:`import_schedules` imports modules whose registered names are then used plainly.

:func:`load_schedule` resolves the reference to a :class:`Schedule`; :func:`load_graph` to a lowered
:class:`TaskGraph` (a csv: file keeps its own SEND/RECV placement if it has any); :func:`schedule_spec` to the
generator behind it (its name, chunks and options), so that a user's schedule goes wherever a built-in goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from common.errors import ScheduleError, quote
from common.usercode import import_user
from schedules.graph import TaskGraph
from schedules.interop.torch_classes import from_torch
from schedules.interop.torch_csv import read_torch_csv, read_torch_csv_graph
from schedules.ir import Schedule
from schedules.lower import lower
from schedules.registry import PipelineParams, ScheduleSpec, build, is_user_ref, lookup, spec

__all__ = ["import_schedules", "load_graph", "load_schedule", "schedule_spec"]


def import_schedules(modules: Iterable[str]) -> None:
    """Import each module (``pkg.module``) or file (``path/file.py``) so that the schedules it registers are known."""
    for module in modules:
        import_user(module, f"schedule module {quote(module)}", "imports")


def schedule_spec(ref: str) -> ScheduleSpec | None:
    """The generator behind a registered name or a user's ``file.py:NAME`` / ``pkg.module:NAME``
    (:func:`schedules.registry.spec`); None for ``torch:`` and ``csv:`` (their own orders, of their own shape).
    Unknown names and missing functions raise."""
    if ref.startswith(("torch:", "csv:")):
        _split_ref(ref)  # an empty torch: / csv: is refused here
        return None
    return spec(ref)


def _split_ref(ref: str) -> tuple[str, str]:
    if is_user_ref(ref):
        return "user", ref
    for prefix in ("torch:", "csv:"):
        if ref.startswith(prefix):
            rest = ref[len(prefix):]
            if not rest:
                what = "a class name, e.g. torch:ZBVZeroBubble" if prefix == "torch:" else "a file, e.g. csv:run.csv"
                raise ScheduleError(f"schedule {quote(ref)}: {prefix} needs {what}")
            return prefix[:-1], rest
    return "name", ref


def _need(ref: str, **values: int | None) -> None:
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise ScheduleError(f"schedule {quote(ref)} needs {' and '.join(missing)}; only csv: files carry their own")


def _check_chunks(ref: str, schedule: Schedule, chunks: int | None) -> None:
    if chunks is not None and chunks != schedule.chunks:
        raise ScheduleError(f"schedule {quote(ref)} has {schedule.chunks} stage(s) per rank "
                            f"({schedule.num_stages} stages on {schedule.num_ranks} ranks) but chunks={chunks} "
                            f"was given; use {schedule.chunks} or leave it out")


def load_schedule(
    ref: str, params: PipelineParams | None = None, options: Any = None, /, *, pp: int | None = None,
    microbatches: int | None = None, chunks: int | None = None, **option_fields: Any
) -> Schedule:
    """Resolve ``ref``: a registered name, ``torch:<ClassName>``, ``csv:<PATH>``, ``file.py:NAME`` or ``module:NAME``.

    The shape comes as a :class:`PipelineParams` or as keywords. Registered
    names and torch classes need ``pp`` and ``microbatches``; a csv: file
    carries its own, and any given must agree with it. An adaptive schedule's
    ``options`` (:class:`schedules.ZBAutoOptions`), or their fields as
    keywords, go to :func:`schedules.build`.
    """
    if params is not None:
        return load_schedule(ref, None, options, pp=params.pp, microbatches=params.microbatches,
                             chunks=params.chunks, **option_fields)
    kind, rest = _split_ref(ref)
    if kind == "csv":
        schedule = read_torch_csv(rest, pp=pp, microbatches=microbatches)
        _check_chunks(ref, schedule, chunks)
        return schedule
    _need(ref, pp=pp, microbatches=microbatches)
    if kind == "torch":
        return from_torch(rest, pp, microbatches, chunks)
    if kind == "user":  # its own errors (the user's file, line and function) as they are
        return build(rest, None, options, pp=pp, microbatches=microbatches, chunks=chunks, **option_fields)
    try:
        return build(rest, None, options, pp=pp, microbatches=microbatches, chunks=chunks, **option_fields)
    except ScheduleError as exc:
        if lookup(rest) is not None:
            raise
        raise ScheduleError(f"{exc}; or torch:<ClassName>, csv:<FILE>") from None


def load_graph(
    ref: str, params: PipelineParams | None = None, options: Any = None, /, *, pp: int | None = None,
    microbatches: int | None = None, chunks: int | None = None, **option_fields: Any
) -> TaskGraph:
    """Like :func:`load_schedule`, lowered; a csv: file keeps its own SEND/RECV if it has any."""
    if params is not None:
        return load_graph(ref, None, options, pp=params.pp, microbatches=params.microbatches, chunks=params.chunks,
                          **option_fields)
    kind, rest = _split_ref(ref)
    if kind != "csv":
        return lower(load_schedule(ref, None, options, pp=pp, microbatches=microbatches, chunks=chunks,
                                   **option_fields))
    graph = read_torch_csv_graph(rest, pp=pp, microbatches=microbatches)
    _check_chunks(ref, graph.schedule, chunks)
    return graph
