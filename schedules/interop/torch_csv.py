"""torch.distributed.pipelining's schedule CSV: write it, and read it as torch's loader does.

:func:`write_torch_csv` / :func:`read_torch_csv` / :func:`read_torch_csv_graph`
write and read the CSV that ``_PipelineScheduleRuntime._load_csv`` loads: one
row per rank (row i is rank i), one action per cell in torch's notation,
compute-only or compute plus SEND/RECV. No torch is needed.

Facts about torch (2.13.0) this module relies on, from
``torch/distributed/pipelining/schedules.py``:

* ``_load_csv`` reads the file with ``csv.reader``; the row index is the rank
  and every cell goes through ``_Action.from_str``, which strips it and maps
  an empty cell to ``None`` (skipped).
* ``_add_reduce_grad`` and ``_add_unshard_reshard`` add ``REDUCE_GRAD``,
  ``UNSHARD`` and ``RESHARD`` actions (data-parallel gradient reduction and FSDP
  bookkeeping). The single-stage classes put ``REDUCE_GRAD`` into their
  ``pipeline_order`` and ``_dump_csv(format="compute_comms")`` writes all three.
  They are no pipeline work, have no counterpart in a :class:`Schedule`, and
  are skipped by the readers here (:data:`TORCH_SKIPPED_KINDS`).

One extension: a recomputation ``2R0`` (:mod:`schedules.library.recompute`) is written
and read back like any compute action. torch has no such action; its loader
refuses a file that holds one.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from common.errors import ScheduleError, quote
from schedules.graph import TaskGraph
from schedules.ir import Action, Kind, Schedule
from schedules.lower import graph_from_programs, lower
from schedules.util import atomic_write, check_output_file, read_text_file

__all__ = [
    "TORCH_SKIPPED_KINDS",
    "check_csv_path",
    "read_torch_csv",
    "read_torch_csv_graph",
    "torch_csv_text",
    "write_torch_csv",
]

#: torch action kinds that are not pipeline work; the CSV readers skip them.
TORCH_SKIPPED_KINDS = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
SKIPPED_CELL = re.compile(r"^\d+(?:" + "|".join(TORCH_SKIPPED_KINDS) + r")\d*$")
# Kinds torch's CSV loader understands (its _ComputationType, less the skipped ones), and schedlab's R.
_TORCH_KINDS = frozenset({Kind.F, Kind.I, Kind.W, Kind.B, Kind.R, Kind.OVERLAP_F_B,
                          Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
_VALID_CELLS = (
    "valid cells: <stage><kind><microbatch> with kind F, I, W, B, R (schedlab's recompute), SEND_F, RECV_F, "
    "SEND_B or RECV_B "
    "(e.g. '2F0', '1I3', '0SEND_F1'), '(<action>;<action>)OVERLAP_F_B', an empty cell, or "
    + "/".join(TORCH_SKIPPED_KINDS) + " (skipped)"
)


# ---------------------------------------------------------------- writing


def check_csv_path(path: str | os.PathLike) -> Path:
    """Reject a CSV output name :func:`write_torch_csv` cannot write, before any work is done."""
    return check_output_file(path, "torch CSV file", (".csv",))


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
    return atomic_write(p, lambda tmp: tmp.write_text(text, encoding="utf-8", newline=""), "torch CSV file")


# ---------------------------------------------------------------- reading


def _read_rows(path: Path) -> list[list[str]]:
    """The file's rows of cells; UTF-8 with or without a byte-order mark (as Excel writes it)."""
    where = f"torch CSV {str(path)!r}"
    if not path.exists():
        raise ScheduleError(f"{where} not found; give an existing file (csv:PATH)")
    if path.is_dir():
        raise ScheduleError(f"{where} is a directory; give a file (csv:PATH)")
    text = read_text_file(path, where, "a torch CSV is text, one row of actions per rank")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return list(reader)
    except csv.Error as exc:
        raise ScheduleError(f"{where}, line {reader.line_num}: not CSV ({exc})") from None


def _parse_cell(path: Path, rank: int, col: int, text: str) -> Action | None:
    """One cell: an Action, or None for an empty or skipped cell."""
    cell = text.strip()
    if not cell or SKIPPED_CELL.match(cell):
        return None
    where = f"torch CSV {str(path)!r}, row {rank + 1} (rank {rank}), cell {col + 1} {quote(cell)}"
    try:
        action = Action.parse(cell)
    except ScheduleError as exc:
        detail = str(exc).replace(repr(cell), quote(cell))  # the cell, cut to a readable length
        raise ScheduleError(f"{where}: {detail}; an empty cell and {'/'.join(TORCH_SKIPPED_KINDS)} are skipped") from None
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
