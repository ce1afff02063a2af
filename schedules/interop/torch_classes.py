"""torch.distributed.pipelining's own schedule classes as :class:`Schedule`s.

:func:`from_torch` instantiates one of torch's schedule classes with mock
stages (no process group), the way torch's ``_schedule_visualizer`` does, and
returns its per-rank compute order. torch is optional: only this module
imports it, and only when called.
"""

from __future__ import annotations

import logging
from typing import Any

from common.errors import ScheduleError, quote
from schedules.interop.torch_csv import SKIPPED_CELL
from schedules.ir import Action, Schedule
from schedules.registry import PipelineParams, check_size

__all__ = ["TORCH_VERSION", "from_torch", "torch_schedule_names"]

log = logging.getLogger(__name__)

TORCH_VERSION = "2.13.0"  # the release these readers and orders are checked against
_INSTALL_HINT = f"pip install torch=={TORCH_VERSION}"


def _torch_schedules() -> Any:
    """torch.distributed.pipelining.schedules, or a ScheduleError saying how to get it."""
    try:
        import torch
        from torch.distributed.pipelining import schedules as torch_schedules
    except ImportError as exc:
        raise ScheduleError(f"torch interop needs torch ({_INSTALL_HINT}); import failed: {exc}") from None
    if not torch.__version__.startswith(TORCH_VERSION):
        log.warning("torch %s found; schedlab's torch interop is checked against %s", torch.__version__, TORCH_VERSION)
    return torch_schedules


def _concrete_classes(ts: Any) -> dict[str, type]:
    """{name: class} for every class get_schedule_class knows that has its own order.

    torch names each concrete class ``Schedule<name>`` (Schedule1F1B, ScheduleDualPipeV,
    ...); the base classes it also accepts (PipelineScheduleSingle/Multi) define none.
    """
    found = {}
    for attr, obj in vars(ts).items():
        if not (attr.startswith("Schedule") and isinstance(obj, type)):
            continue
        try:
            if ts.get_schedule_class(attr.removeprefix("Schedule")) is obj:
                found[attr.removeprefix("Schedule")] = obj
        except ValueError:
            continue
    return found


def torch_schedule_names() -> list[str]:
    """The torch schedule classes :func:`from_torch` accepts, e.g. ``['1F1B', 'DualPipeV', ...]``."""
    return sorted(_concrete_classes(_torch_schedules()))


def _resolve_class(ts: Any, class_name: str) -> tuple[str, type]:
    concrete = _concrete_classes(ts)
    valid = ", ".join(sorted(concrete))
    try:
        cls = ts.get_schedule_class(class_name)  # case-insensitive, as torch resolves names
    except ValueError:
        raise ScheduleError(f"unknown torch schedule class {quote(class_name)}; valid: {valid}") from None
    for name, c in concrete.items():
        if c is cls:
            return name, cls
    raise ScheduleError(f"torch class {quote(class_name)} is a base class without a schedule of its own; valid: {valid}")


def _mock_stages(ts: Any, cls: type, name: str, pp: int, chunks: int | None) -> tuple[Any, int]:
    """Mock stages as torch's _schedule_visualizer.get_schedule_ops builds them: rank 0 of pp, no process group."""
    from unittest import mock

    from torch.distributed.pipelining.stage import PipelineStage

    single = issubclass(cls, ts.PipelineScheduleSingle)
    v = (1 if single else 2) if chunks is None else chunks
    if single and v != 1:
        raise ScheduleError(f"torch:{name} runs one stage per rank (chunks=1), got chunks={v}")
    if not single and v < 2:
        raise ScheduleError(f"torch:{name} is a multi-stage schedule, needs chunks (v) >= 2 stages per rank, got {v}")
    PipelineParams(pp=pp, microbatches=1, chunks=v)  # same checks and messages as build()
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, pp, None, pp * v
    return (stage if single else [stage] * v), v


def _placement(instance: Any, single: bool, pp: int, num_stages: int, name: str) -> tuple[int, ...]:
    if single:
        # PipelineScheduleSingle orders use stage index == rank (_Action(rank, ...)).
        return tuple(range(pp))
    # Multi-stage classes hold stage -> rank in stage_index_to_group_rank: looped or, for the
    # V classes, generate_stage_to_rank_mapping(style="v"), re-derived from the order by torch's
    # _validate_and_set_stage_mapping.
    mapping = instance.stage_index_to_group_rank
    missing = [s for s in range(num_stages) if s not in mapping]
    if missing:
        raise ScheduleError(f"torch:{name} places no rank for stage(s) {missing} of {num_stages}")
    return tuple(int(mapping[s]) for s in range(num_stages))


def _torch_order(instance: Any, pp: int) -> list[list[Action]]:
    """Each rank's compute actions: None padding and skipped bookkeeping kinds dropped."""
    order = instance.pipeline_order or {}
    programs = []
    for rank in range(pp):
        cells = [str(a) for a in order.get(rank, []) if a is not None]
        programs.append([Action.parse(c) for c in cells if not SKIPPED_CELL.match(c)])
    return programs


def from_torch(class_name: str, pp: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """torch's own per-rank compute order of ``class_name`` as a Schedule named ``torch:<ClassName>``.

    ``class_name`` is any concrete name ``get_schedule_class`` knows ("GPipe", "1F1B",
    "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
    "DualPipeV"; case-insensitive). Single-stage classes take chunks 1, multi-stage
    ones default to 2. The order is returned as torch computes it, not validated:
    call :func:`schedules.validate` on it. Parameters torch's class rejects raise
    ScheduleError with torch's reason.
    """
    ts = _torch_schedules()
    name, cls = _resolve_class(ts, class_name)
    PipelineParams(pp=pp, microbatches=microbatches)
    stages, v = _mock_stages(ts, cls, name, pp, chunks)
    check_size(f"torch:{name}", pp, v, microbatches)
    try:
        instance = cls(stages, microbatches)
    except Exception as exc:  # torch's checks raise ValueError/AssertionError; report any failure the same way
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ScheduleError(
            f"torch:{name} rejects pp={pp}, microbatches={microbatches}, chunks={v}: {reason}"
        ) from None
    single = issubclass(cls, ts.PipelineScheduleSingle)
    return Schedule(
        name=f"torch:{name}",
        num_ranks=pp,
        num_stages=pp * v,
        num_microbatches=microbatches,
        stage_to_rank=_placement(instance, single, pp, pp * v, name),
        programs=_torch_order(instance, pp),
        params={"pp": pp, "microbatches": microbatches, "chunks": v, "source": f"torch {cls.__name__}"},
    )
