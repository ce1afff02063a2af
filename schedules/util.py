"""Small helpers with no schedule knowledge: a paused collector, text files read with one clear error.

The output-path policy (checked early, written whole) lives in :mod:`common.outputs`; its three most used
functions are re-exported here.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from common.errors import ScheduleError
from common.outputs import atomic_write, check_output_dir, check_output_file  # the output policy's home

__all__ = ["atomic_write", "check_output_dir", "check_output_file", "paused_gc", "percentile", "read_text_file"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for an allocation-heavy pass.

    Building or simulating a graph allocates millions of small acyclic objects;
    each full collection would walk all of them. Reference counting still
    frees everything; the collector resumes after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_text_file(path: Path, where: str, what: str) -> str:
    """A text file's contents, UTF-8 with or without a byte-order mark; binary data raises one ScheduleError.

    ``where`` names the file in the message, ``what`` says what the file should be (e.g. "a trace is a CSV file").
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScheduleError(f"{where} cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ScheduleError(f"{where}, line {line}: not UTF-8 text (byte {raw[exc.start]:#04x}): binary data? "
                            f"{what}") from None
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise ScheduleError(f"{where}, line {line}: a NUL byte (binary data); {what}")
    return text


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 1]) of a non-empty sequence: the spread of measured step times
    (real.measure, analysis.validation.dp_modes)."""
    ordered = sorted(xs)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
