"""Two-way interop with torch.distributed.pipelining's schedules.

* :func:`from_torch` instantiates one of torch's own schedule classes with mock
  stages (no process group), the way torch's ``_schedule_visualizer`` does, and
  returns its per-rank compute order as a :class:`Schedule`.
* :func:`write_torch_csv` / :func:`read_torch_csv` / :func:`read_torch_csv_graph`
  write and read the CSV that ``_PipelineScheduleRuntime._load_csv`` loads:
  one row per rank (row i is rank i), one action per cell in torch's notation,
  compute-only or compute plus SEND/RECV.
* :func:`load_schedule` / :func:`load_graph` resolve a reference: a registered
  name, ``torch:<ClassName>`` or ``csv:<PATH>``.

torch is optional: only :func:`from_torch` and :func:`torch_schedule_names`
import it. Reading and writing CSV needs no torch.

Facts about torch (2.13.0) this module relies on, from
``torch/distributed/pipelining/schedules.py``:

* ``_PipelineScheduleRuntime._load_csv`` reads the file with ``csv.reader``;
  the row index is the rank and every cell goes through ``_Action.from_str``,
  which strips it and maps an empty cell to ``None`` (skipped).
* ``_add_reduce_grad`` and ``_add_unshard_reshard`` add ``REDUCE_GRAD``,
  ``UNSHARD`` and ``RESHARD`` actions (data-parallel gradient reduction and FSDP
  bookkeeping). The single-stage classes put ``REDUCE_GRAD`` into their
  ``pipeline_order`` and ``_dump_csv(format="compute_comms")`` writes all three.
  They are no pipeline work, have no counterpart in a :class:`Schedule`, and
  are skipped by the readers here (:data:`TORCH_SKIPPED_KINDS`).
"""

from __future__ import annotations

import csv
import logging
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from schedules.errors import ScheduleError
from schedules.graph import TaskGraph, graph_from_programs, lower
from schedules.ir import Action, Kind, Schedule
from schedules.registry import PipelineParams, build, names

__all__ = [
    "TORCH_SKIPPED_KINDS",
    "TORCH_VERSION",
    "check_csv_path",
    "from_torch",
    "load_graph",
    "load_schedule",
    "read_torch_csv",
    "read_torch_csv_graph",
    "torch_csv_text",
    "torch_schedule_names",
    "write_torch_csv",
]

log = logging.getLogger(__name__)

TORCH_VERSION = "2.13.0"  # the release these readers and orders are checked against
_INSTALL_HINT = f"pip install torch=={TORCH_VERSION}"

#: torch action kinds that are not pipeline work; the CSV readers skip them.
TORCH_SKIPPED_KINDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
_SKIPPED_RE = re.compile(r"^\d+(?:" + "|".join(TORCH_SKIPPED_KINDS) + r")\d*$")
# Kinds torch's CSV loader understands (its _ComputationType, less the skipped ones).
_TORCH_KINDS = frozenset({Kind.F, Kind.I, Kind.W, Kind.B, Kind.OVERLAP_F_B,
                          Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
_VALID_CELLS = (
    "valid cells: <stage><kind><microbatch> with kind F, I, W, B, SEND_F, RECV_F, SEND_B or RECV_B "
    "(e.g. '2F0', '1I3', '0SEND_F1'), '(<action>;<action>)OVERLAP_F_B', an empty cell, or "
    + "/".join(TORCH_SKIPPED_KINDS) + " (skipped)"
)


# ---------------------------------------------------------------- torch's own schedules


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
        raise ScheduleError(f"unknown torch schedule class {class_name!r}; valid: {valid}") from None
    for name, c in concrete.items():
        if c is cls:
            return name, cls
    raise ScheduleError(f"torch class {class_name!r} is a base class without a schedule of its own; valid: {valid}")


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
        programs.append([Action.parse(c) for c in cells if not _SKIPPED_RE.match(c)])
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


# ---------------------------------------------------------------- writing CSV


def check_csv_path(path: str | os.PathLike) -> Path:
    """Reject a CSV output name :func:`write_torch_csv` cannot write, before any work is done."""
    p = Path(path)
    if p.suffix.lower() != ".csv":
        raise ScheduleError(f"torch CSV file {str(p)!r}: use a name ending in .csv")
    if p.is_dir():
        raise ScheduleError(f"torch CSV file {str(p)!r} is a directory; give a file name ending in .csv")
    return p


def _rows(target: Schedule | TaskGraph, comms: bool) -> list[list[Action]]:
    if isinstance(target, Schedule):
        if not comms:
            return [list(p) for p in target.programs]
        target = lower(target)
    if not isinstance(target, TaskGraph):
        raise ScheduleError(f"write_torch_csv takes a Schedule or a TaskGraph, got {type(target).__name__}")
    rows = [target.program_actions(r) for r in range(target.num_ranks)]
    return rows if comms else [[a for a in row if a.is_compute] for row in rows]


def torch_csv_text(target: Schedule | TaskGraph, comms: bool = False) -> str:
    """The file :func:`write_torch_csv` writes, as text."""
    lines = []
    for row in _rows(target, comms):
        cells = [str(a) for a in row]
        bad = [c for c in cells if not set(c).isdisjoint(',"\r\n')]
        assert not bad, f"action strings never need CSV quoting: {bad}"
        lines.append(",".join(cells))
    return "".join(line + "\n" for line in lines)


def write_torch_csv(target: Schedule | TaskGraph, path: str | os.PathLike, comms: bool = False) -> Path:
    """Write one row per rank in torch's notation; atomic (a temp file, then os.replace).

    ``comms=False``: compute actions only (a Schedule's programs, or a graph's
    compute tasks), what ``_load_csv(format="compute_only")`` takes.
    ``comms=True``: compute plus SEND/RECV as the TaskGraph orders them (a
    Schedule is lowered first), what ``_load_csv(format="compute_comms")`` takes.
    Lines end in ``\\n``; no cell needs quoting, so this is exactly csv.writer's output.
    """
    p = check_csv_path(path)
    text = torch_csv_text(target, comms)  # everything is computed before the file is touched
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


# ---------------------------------------------------------------- reading CSV


def _read_rows(path: Path) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return list(csv.reader(fh))
    except FileNotFoundError:
        raise ScheduleError(f"torch CSV {str(path)!r} not found; give an existing file (csv:PATH)") from None
    except IsADirectoryError:
        raise ScheduleError(f"torch CSV {str(path)!r} is a directory; give a file (csv:PATH)") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ScheduleError(f"torch CSV {str(path)!r} is not a text CSV file: {exc}") from None


def _parse_cell(path: Path, rank: int, col: int, text: str) -> Action | None:
    """One cell: an Action, or None for an empty or skipped cell."""
    cell = text.strip()
    if not cell or _SKIPPED_RE.match(cell):
        return None
    where = f"torch CSV {str(path)!r}, row {rank + 1} (rank {rank}), cell {col + 1} {cell!r}"
    try:
        action = Action.parse(cell)
    except ScheduleError as exc:
        raise ScheduleError(f"{where}: {exc}; an empty cell and {'/'.join(TORCH_SKIPPED_KINDS)} are skipped") from None
    if action.kind not in _TORCH_KINDS:
        raise ScheduleError(f"{where}: {action.kind.value} is not a pipeline action torch's CSV holds; {_VALID_CELLS}")
    return action


def _parse_file(path: Path) -> list[list[Action]]:
    rows = _read_rows(path)
    if not rows:
        raise ScheduleError(f"torch CSV {str(path)!r} is empty; expected one row of actions per rank")
    programs = []
    for rank, row in enumerate(rows):
        actions = [a for col, cell in enumerate(row) if (a := _parse_cell(path, rank, col, cell)) is not None]
        if not actions:
            raise ScheduleError(
                f"torch CSV {str(path)!r}, row {rank + 1} (rank {rank}): no actions; every row is one "
                f"rank's program (row i = rank i), remove blank lines"
            )
        programs.append(actions)
    return programs


def _microbatches_in(programs: Sequence[Sequence[Action]]) -> int:
    return 1 + max((p.microbatch for prog in programs for a in prog for p in a.parts() if p.microbatch is not None),
                   default=-1)


def _check_against(path: Path, programs: list[list[Action]], pp: int | None, microbatches: int | None) -> int:
    """The file's microbatch count, after checking the file against the flags given."""
    if pp is not None and pp != len(programs):
        raise ScheduleError(f"torch CSV {str(path)!r} has {len(programs)} rows (ranks) but pp={pp} was given; "
                            f"use pp={len(programs)} or leave it out")
    found = _microbatches_in(programs)
    if microbatches is not None and microbatches != found:
        raise ScheduleError(f"torch CSV {str(path)!r} runs microbatches 0..{found - 1} ({found}) but "
                            f"microbatches={microbatches} was given; use {found} or leave it out")
    return found


def _compute_schedule(path: Path, programs: list[list[Action]], name: str | None, m: int) -> Schedule:
    compute = [[a for a in prog if a.is_compute] for prog in programs]
    try:
        s = Schedule.from_programs(compute, name=name or f"csv:{path}", num_microbatches=m)
    except ScheduleError as exc:
        raise ScheduleError(f"torch CSV {str(path)!r}: {exc}") from None
    return replace(s, params={"pp": s.num_ranks, "microbatches": m, "chunks": s.chunks, "source": str(path)})


def read_torch_csv(
    path: str | os.PathLike, *, name: str | None = None, pp: int | None = None, microbatches: int | None = None
) -> Schedule:
    """The compute-only view of a torch CSV (compute-only or compute+comms) as a Schedule.

    Row i is rank i; placement comes from which rank runs each stage;
    SEND/RECV cells, empty cells and TORCH_SKIPPED_KINDS are dropped. ``pp`` and
    ``microbatches``, if given, must agree with the file. Malformed files raise
    ScheduleError naming the file, row (rank) and cell. The schedule is named
    ``csv:<path>`` unless ``name`` is given; it is not validated here.
    """
    p = Path(path)
    programs = _parse_file(p)
    return _compute_schedule(p, programs, name, _check_against(p, programs, pp, microbatches))


def read_torch_csv_graph(
    path: str | os.PathLike, *, name: str | None = None, pp: int | None = None, microbatches: int | None = None
) -> TaskGraph:
    """A torch CSV as a TaskGraph, keeping the file's own SEND/RECV placement.

    A file with no SEND/RECV cells at all is compute-only and is lowered with
    :func:`schedules.lower`, as torch lowers ``format="compute_only"``. Unmatched
    or misplaced communication raises ScheduleError; deadlocks are found by
    :func:`schedules.validate`.
    """
    p = Path(path)
    programs = _parse_file(p)
    schedule = _compute_schedule(p, programs, name, _check_against(p, programs, pp, microbatches))
    if not any(a.is_comm for prog in programs for a in prog):
        return lower(schedule)
    return graph_from_programs(schedule, programs)


# ---------------------------------------------------------------- references


def _split_ref(ref: str) -> tuple[str, str]:
    for prefix in ("torch:", "csv:"):
        if ref.startswith(prefix):
            rest = ref[len(prefix):]
            if not rest:
                what = "a class name, e.g. torch:ZBVZeroBubble" if prefix == "torch:" else "a file, e.g. csv:run.csv"
                raise ScheduleError(f"schedule {ref!r}: {prefix} needs {what}")
            return prefix[:-1], rest
    return "name", ref


def _need(ref: str, **values: int | None) -> None:
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise ScheduleError(f"schedule {ref!r} needs {' and '.join(missing)}; only csv: files carry their own")


def _check_chunks(ref: str, schedule: Schedule, chunks: int | None) -> None:
    if chunks is not None and chunks != schedule.chunks:
        raise ScheduleError(f"schedule {ref!r} has {schedule.chunks} stage(s) per rank "
                            f"({schedule.num_stages} stages on {schedule.num_ranks} ranks) but chunks={chunks} "
                            f"was given; use {schedule.chunks} or leave it out")


def load_schedule(
    ref: str, *, pp: int | None = None, microbatches: int | None = None, chunks: int | None = None, **options: Any
) -> Schedule:
    """Resolve ``ref``: a registered name, ``torch:<ClassName>`` or ``csv:<PATH>``.

    Registered names and torch classes need ``pp`` and ``microbatches``; a csv:
    file carries its own, and any given must agree with it. ``options`` (e.g.
    pass times for adaptive schedules) go to :func:`schedules.build`.
    """
    kind, rest = _split_ref(ref)
    if kind == "csv":
        schedule = read_torch_csv(rest, pp=pp, microbatches=microbatches)
        _check_chunks(ref, schedule, chunks)
        return schedule
    _need(ref, pp=pp, microbatches=microbatches)
    if kind == "torch":
        return from_torch(rest, pp, microbatches, chunks)
    try:
        return build(rest, pp=pp, microbatches=microbatches, chunks=chunks, **options)
    except ScheduleError as exc:
        if rest in names():
            raise
        raise ScheduleError(f"{exc}; or torch:<ClassName>, csv:<FILE>") from None


def load_graph(
    ref: str, *, pp: int | None = None, microbatches: int | None = None, chunks: int | None = None, **options: Any
) -> TaskGraph:
    """Like :func:`load_schedule`, lowered; a csv: file keeps its own SEND/RECV if it has any."""
    kind, rest = _split_ref(ref)
    if kind != "csv":
        return lower(load_schedule(ref, pp=pp, microbatches=microbatches, chunks=chunks, **options))
    graph = read_torch_csv_graph(rest, pp=pp, microbatches=microbatches)
    _check_chunks(ref, graph.schedule, chunks)
    return graph
