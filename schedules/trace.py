"""The trace format shared by the simulator and the real runtime.

A trace is a pandas DataFrame with one row per executed task:

=========== ======= ====================================================
column      dtype   meaning
=========== ======= ====================================================
rank        int     rank that ran the task
stream      str     compute, send, recv or collective
action      str     torch notation, e.g. ``2F0``, ``1SEND_B3``
kind        str     F, I, W, B, OVERLAP_F_B, SEND_F, RECV_F, SEND_B, RECV_B, ...
stage       int     pipeline stage (-1 where none, e.g. an overlapped pair)
microbatch  int     microbatch index (-1 where none)
start       float   seconds (unit-free for the uniform cost model)
end         float   seconds
bytes       float   bytes moved (0 for compute)
=========== ======= ====================================================

A real MoE run with expert parallelism adds rows on streams of their own: an
overlapped pair's forward and backward parts (``pair-forward``,
``pair-backward``, kinds F, B or I, beside the pair's compute row) and each
all-to-all (``all-to-all-forward``, ``all-to-all-backward``, kind
``ALL_TO_ALL``, named by phase: ``1DISPATCH3``, ``2COMBINE_GRAD1``).

A real run's trace may also carry ``step`` (int, the training step), when it
keeps several measured steps; :func:`trace_steps` splits it and
:func:`median_step` picks the step of median wall time (``attrs["step_times"]``).

Metadata (``source`` sim/real, ``schedule``, ``params``, ``costs``, ...) lives
in ``DataFrame.attrs``. On disk a trace is CSV whose first line is
``# schedlab-trace {json metadata}``, or Parquet with the metadata in the
file's key-value metadata.

:func:`read_trace` checks every row: a file that is not text, a header line
that is not JSON, a missing column, a row cut short, a value of the wrong
kind, or a task that ends before it starts is one ScheduleError naming the
file, the line (CSV) or row (Parquet) and the field.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import ScheduleError, quote
from schedules.util import atomic_write, check_output_file, read_text_file

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TRACE_COLUMNS", "check_trace_path", "make_trace", "median_step", "read_trace", "trace_steps", "work_span",
           "write_trace"]

TRACE_COLUMNS = ("rank", "stream", "action", "kind", "stage", "microbatch", "start", "end", "bytes")
_HEADER = "# schedlab-trace "
OPTIONAL_COLUMNS = ("step",)  # a real trace of several steps
_DTYPES = {"step": "int64", "rank": "int64", "stage": "int64", "microbatch": "int64", "start": "float64", "end": "float64", "bytes": "float64"}


def make_trace(columns: dict[str, Any], meta: dict[str, Any]) -> pd.DataFrame:
    """A trace DataFrame from column arrays, in the documented column order."""
    import pandas as pd

    missing = [c for c in TRACE_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"trace is missing columns {missing}")
    names = [*TRACE_COLUMNS, *(c for c in OPTIONAL_COLUMNS if c in columns)]
    df = pd.DataFrame({c: columns[c] for c in names}).astype({c: t for c, t in _DTYPES.items() if c in names})
    df.attrs.update(meta)
    return df


def trace_steps(df: pd.DataFrame) -> dict[int, pd.DataFrame]:
    """The trace's steps in order, each with its own attrs (one step: ``{attrs["step"] or 0: df}``)."""
    if "step" not in df.columns:
        return {int(df.attrs.get("step", 0) or 0): df}
    out = {}
    for step, part in df.groupby("step", sort=True):
        part = part.reset_index(drop=True)
        part.attrs.update(df.attrs)
        part.attrs["step"] = int(step)
        out[int(step)] = part
    return out


def work_span(part: pd.DataFrame) -> float:
    """The programs' span in one step of a trace: from the first row that is not a receive wait to the last end.

    A rank that starts its step early (its previous optimizer step was shorter)
    posts its receives and waits: that wait belongs to no work, and counting it
    would stretch the span by the ranks' skew (largest on a V schedule at
    pp=2, whose rank 0 steps the first and the last stage).
    """
    work = part[part["stream"] != "recv"] if "stream" in part else part
    start = work["start"] if len(work) else part["start"]
    return float(part["end"].max() - start.min())


def median_step(df: pd.DataFrame) -> pd.DataFrame:
    """One step of a multi-step trace, times from its own first start: the step of median wall time
    (``attrs["step_times"]``; the lower median of an even count), else of median span. A one-step trace as is."""
    steps = trace_steps(df)
    if len(steps) == 1:
        return next(iter(steps.values()))
    walls = {int(k): float(v) for k, v in (df.attrs.get("step_times") or {}).items()}
    key = {s: walls.get(s, float(p["end"].max() - p["start"].min())) for s, p in steps.items()}
    order = sorted(steps, key=lambda s: (key[s], s))
    part = steps[order[(len(order) - 1) // 2]].copy()
    t0 = float(part["start"].min())
    part["start"] -= t0
    part["end"] -= t0
    part.attrs.update(steps[order[(len(order) - 1) // 2]].attrs)
    return part


def check_trace_path(path: str | os.PathLike) -> Path:
    """Reject a trace file name that :func:`write_trace` cannot write, before any work is done."""
    return check_output_file(path, "trace file", (".csv", ".parquet"))


def write_trace(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write a trace as CSV (metadata in a header line) or Parquet (by suffix); atomic."""
    path = check_trace_path(path)
    meta = json.dumps(df.attrs, sort_keys=True, default=str)

    def write(tmp: Path) -> None:
        if path.suffix == ".csv":
            with open(tmp, "w", encoding="utf-8", newline="") as fh:
                fh.write(_HEADER + meta + "\n")
                df.to_csv(fh, index=False, columns=_columns_of(df))
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(df[_columns_of(df)], preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"schedlab": meta.encode()})
        pq.write_table(table, tmp)

    return atomic_write(path, write, "trace file")  # nothing half-written under the real name


def _columns_of(df: pd.DataFrame) -> list[str]:
    return [*TRACE_COLUMNS, *(c for c in OPTIONAL_COLUMNS if c in df.columns)]


def read_trace(path: str | os.PathLike) -> pd.DataFrame:
    """Read a trace written by :func:`write_trace` (or a plain CSV with the same columns).

    Raises ScheduleError, one line naming the file, the line (CSV) or row
    (Parquet) and the field, for a file that is not a trace (see the module doc).
    """
    path = Path(path)
    where = f"trace {str(path)!r}"
    if not path.exists():
        raise ScheduleError(f"{where} not found; give an existing .csv or .parquet trace")
    if path.is_dir():
        raise ScheduleError(f"{where} is a directory; give a .csv or .parquet trace file")
    if path.suffix == ".parquet":
        meta, df, locate = _read_parquet(path, where)
    else:
        meta, df, locate = _read_csv(path, where)
    return make_trace(_checked_columns(where, df, locate), meta)


#: ``locate(i)``: where data row i is, e.g. "line 7" or "row 5" (i = -1: the column names), and, for a CSV
#: row, its fields as the file has them.
_Locate = Callable[[int], tuple[str, list[str] | None]]


def _read_csv(path: Path, where: str) -> tuple[dict[str, Any], pd.DataFrame, _Locate]:
    """A CSV trace, as pandas reads it. Line numbers count from the file's first line, the header included."""
    import pandas as pd

    text = read_text_file(path, where, "a trace is a CSV (or .parquet) file")
    meta: dict[str, Any] = {}
    skip = 0
    if text.startswith(_HEADER):
        first = io.StringIO(text, newline="").readline()
        meta, skip = _metadata(first[len(_HEADER):], f"{where}, line 1: the {_HEADER.strip()!r} header"), len(first)
    body, offset = text[skip:], 1 if skip else 0

    def locate(i: int) -> tuple[str, list[str] | None]:
        """Data row i (-1: the column names), counted as pandas counts them: blank lines skipped."""
        reader = csv.reader(io.StringIO(body, newline=""))
        n = -2
        try:
            for row in reader:
                n += bool(row)
                if row and n == i:
                    return f"line {offset + reader.line_num}" + (" (the column names)" if i < 0 else ""), row
        except csv.Error:
            pass
        return f"line {offset + reader.line_num}", None

    try:
        # As before: pandas' C parser, numbers inferred. keep_default_na=False: "NA" or "" in a text column
        # stays text (and is refused below as empty if it is), a gap in a number column is still NaN.
        df = pd.read_csv(io.StringIO(body), dtype=dict.fromkeys(("stream", "action", "kind"), str),
                         keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise ScheduleError(f"{where} has no column names; a trace has a line {','.join(TRACE_COLUMNS)}, then one "
                            "row per task") from None
    except (pd.errors.ParserError, csv.Error, ValueError) as exc:
        raise ScheduleError(_unparsed(where, body, offset, exc)) from None
    return meta, df, locate


def _unparsed(where: str, body: str, offset: int, exc: Exception) -> str:
    """Why pandas could not read the CSV: the first row with more fields than the column names, or bad quoting."""
    reader = csv.reader(io.StringIO(body, newline=""), strict=True)
    width, start = 0, 1  # start: the first line of the row being read (a quoted field can span lines)
    try:
        for row in reader:
            width = width or len(row)
            if len(row) > width:
                return f"{where}, line {offset + reader.line_num}: {len(row)} fields, but the column names are {width}"
            start = reader.line_num + 1
    except csv.Error as err:
        return f"{where}, line {offset + start}: not CSV from this line on ({err}; a quote left open?)"
    return f"{where}: not CSV ({str(exc).splitlines()[0]})"


def _read_parquet(path: Path, where: str) -> tuple[dict[str, Any], pd.DataFrame, _Locate]:
    """A Parquet trace; rows count from 1, the first row of data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        first = re.sub(r"^Could not open Parquet input source '.*?': ", "", first)  # it names the file again
        raise ScheduleError(f"{where} is not a readable Parquet file: {first}") from None
    raw = (table.schema.metadata or {}).get(b"schedlab")
    meta = _metadata(raw.decode("utf-8", "replace"), f"{where}: its 'schedlab' metadata") if raw else {}
    return meta, table.to_pandas(), lambda i: (f"row {i + 1}" if i >= 0 else "its column names", None)


def _metadata(text: str, what: str) -> dict[str, Any]:
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"{what} is not valid JSON ({exc.msg} at character {exc.pos + 1}); "
                            "write it with write_trace or remove that line") from None
    if not isinstance(meta, dict):
        raise ScheduleError(f"{what} must be a JSON object of metadata, got {quote(meta)}")
    return meta


# column -> (an integer?, what a value must be, least value); the other columns are non-empty strings
_NUMBERS: dict[str, tuple[bool, str, float]] = {
    "rank": (True, "an integer >= 0", 0), "stage": (True, "an integer >= -1 (-1: none)", -1),
    "microbatch": (True, "an integer >= -1 (-1: none)", -1),
    "start": (False, "a finite number", -math.inf), "end": (False, "a finite number", -math.inf),
    "bytes": (False, "a finite number >= 0", 0), "step": (True, "an integer >= 0", 0),
}


def _checked_columns(where: str, df: pd.DataFrame, locate: _Locate) -> dict[str, Any]:
    """The trace's columns, every value checked (vectorized); errors name the file, the row and the field."""
    import numpy as np
    import pandas as pd

    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise ScheduleError(f"{where}, {locate(-1)[0]}: lacks columns {missing}; a trace has {list(TRACE_COLUMNS)}")

    names = list(df.columns)

    def fail(c: str, what: str, bad: np.ndarray) -> None:
        i = int(np.argmax(bad))
        at, fields = locate(i)
        if fields is not None and len(fields) < len(names):
            raise ScheduleError(f"{where}, {at}: {len(fields)} of {len(names)} fields, it ends before "
                                f"{', '.join(map(str, names[len(fields):]))}; is the file cut short?")
        value = fields[names.index(c)] if fields is not None else df[c].iloc[i]  # a CSV cell as the file has it
        value = value.item() if isinstance(value, np.generic) else value
        raise ScheduleError(f"{where}, {at}: {c} must be {what}, got {quote(value)}")

    out: dict[str, Any] = {}
    for c in _columns_of(df):
        column = df[c]
        if c not in _NUMBERS:
            if pd.api.types.is_string_dtype(column.dtype) and column.dtype != object:
                empty = (column.isna() | (column.str.strip() == "")).to_numpy()
            else:  # e.g. a Parquet column of numbers
                empty = column.map(lambda v: not isinstance(v, str) or not v.strip()).to_numpy(dtype=bool)
            if empty.any():
                fail(c, "a non-empty string", empty)
            out[c] = column
            continue
        integer, what, least = _NUMBERS[c]
        if column.dtype == bool:  # True is not a rank
            number = pd.Series(np.nan, index=column.index)
        elif pd.api.types.is_numeric_dtype(column.dtype):
            number = column
        else:  # text in a number column (or a gap): what is a number, the rest NaN
            number = pd.to_numeric(column, errors="coerce")
        values = number.to_numpy(dtype=float, na_value=np.nan)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | (values < least)
            if integer:
                bad |= values != np.floor(values)
        if bad.any():
            fail(c, what, bad)
        out[c] = number
    early = out["end"].to_numpy(dtype=float) < out["start"].to_numpy(dtype=float)
    if early.any():
        i = int(np.argmax(early))
        end, start = float(out["end"].iloc[i]), float(out["start"].iloc[i])
        raise ScheduleError(f"{where}, {locate(i)[0]}: end {end!r} is before start {start!r}; "
                            "a task ends at or after its start")
    return out
