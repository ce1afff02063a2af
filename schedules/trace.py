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

Metadata (``source`` sim/real, ``schedule``, ``params``, ``costs``, ...) lives
in ``DataFrame.attrs``. On disk a trace is CSV whose first line is
``# schedlab-trace {json metadata}``, or Parquet with the metadata in the
file's key-value metadata.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedules.errors import ScheduleError
from schedules.util import atomic_write, check_output_file

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TRACE_COLUMNS", "check_trace_path", "make_trace", "read_trace", "write_trace"]

TRACE_COLUMNS = ("rank", "stream", "action", "kind", "stage", "microbatch", "start", "end", "bytes")
_HEADER = "# schedlab-trace "
_DTYPES = {"rank": "int64", "stage": "int64", "microbatch": "int64", "start": "float64", "end": "float64", "bytes": "float64"}


def make_trace(columns: dict[str, Any], meta: dict[str, Any]) -> pd.DataFrame:
    """A trace DataFrame from column arrays, in the documented column order."""
    import pandas as pd

    missing = [c for c in TRACE_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"trace is missing columns {missing}")
    df = pd.DataFrame({c: columns[c] for c in TRACE_COLUMNS}).astype(_DTYPES)
    df.attrs.update(meta)
    return df


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
                df.to_csv(fh, index=False, columns=list(TRACE_COLUMNS))
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(df[list(TRACE_COLUMNS)], preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"schedlab": meta.encode()})
        pq.write_table(table, tmp)

    return atomic_write(path, write, "trace file")  # nothing half-written under the real name


def read_trace(path: str | os.PathLike) -> pd.DataFrame:
    """Read a trace written by :func:`write_trace` (or a plain CSV with the same columns)."""
    import pandas as pd

    path = Path(path)
    meta: dict[str, Any] = {}
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        raw = (table.schema.metadata or {}).get(b"schedlab")
        meta = json.loads(raw) if raw else {}
        df = table.to_pandas()
    else:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline()
        skip = 0
        if first.startswith(_HEADER):
            meta, skip = json.loads(first[len(_HEADER):]), 1
        df = pd.read_csv(path, skiprows=skip, dtype={"action": str, "kind": str, "stream": str})
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise ScheduleError(f"trace {str(path)!r} lacks columns {missing}; a trace has {list(TRACE_COLUMNS)}")
    df = df[list(TRACE_COLUMNS)].astype(_DTYPES)
    df.attrs.update(meta)
    return df
