"""The progress line of long commands: done/total, the elapsed time and an estimate of the time left.

The time left is the mean time per item so far times the items left. It is
command-line code (it prints), with no dependencies: the measuring scripts in
experiments/ and the real runtime's command line use it.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "format_seconds", "run_progress"]


def format_seconds(s: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``."""
    if not math.isfinite(s):
        return "?"
    s = round(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class Progress:
    """``desc done/total  elapsed E  left L`` on stderr; ``left`` = mean time per item x items left.

    ``every``: seconds between two lines (the last item always prints).
    """

    def __init__(self, total: int, desc: str, out: TextIO | None = None,
                 clock: Callable[[], float] = time.perf_counter, every: float = 0.0) -> None:
        self.total, self.desc, self.out, self.clock, self.every = total, desc, out or sys.stderr, clock, every
        self.start = clock()
        self.printed = -math.inf
        self.done = 0

    def left(self) -> float:
        if self.done == 0:
            return math.inf
        return (self.clock() - self.start) / self.done * (self.total - self.done)

    def line(self) -> str:
        elapsed = self.clock() - self.start
        return (f"{self.desc} {self.done}/{self.total}  elapsed {format_seconds(elapsed)}  "
                f"left {format_seconds(self.left())}")

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = self.clock()
        if now - self.printed >= self.every or self.done >= self.total:
            self.printed = now
            print(self.line() + (f"  {note}" if note else ""), file=self.out, flush=True)


def run_progress(desc: str, out: TextIO | None = None) -> Callable[[int, int, str], None]:
    """A callback ``(done, total, label)`` that prints a :class:`Progress` line per finished run (the measurement
    protocol's ``on_run``); the total comes with the first call."""
    state: dict[str, Progress] = {}

    def on_run(done: int, total: int, label: str) -> None:
        bar = state.setdefault("bar", Progress(total, desc, out))
        bar.advance(done - bar.done, note=label)

    return on_run
