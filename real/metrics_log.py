"""Training metrics where users look for them: TensorBoard event files and a JSON Lines file of the same.

:class:`MetricsLog` writes, into one folder, the event files TensorBoard reads
(through ``torch.utils.tensorboard.SummaryWriter``; the ``metrics`` extra installs
tensorboard) and ``metrics.jsonl``: one JSON object per logged step,
``{"step": S, "tag": value, ...}``, with the same tags and values. Tags:

* ``loss``, ``step_time_s``, ``tokens_per_s``, ``lr``: every step of a run;
* ``memory/rank{R}/{what}``: per rank, at the step whose memory was measured;
* any other scalar a caller logs (the validation grid: ``error/...``).

:class:`Progress` is the progress line of long commands: done/total, the
elapsed time and an estimate of the time left (the mean time per item so far
times the items left), on stderr.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

from schedules import ConfigError
from schedules.util import check_output_dir

__all__ = ["JSONL_NAME", "MetricsLog", "Progress", "check_log_dir", "format_seconds"]

log = logging.getLogger(__name__)

JSONL_NAME = "metrics.jsonl"


def check_log_dir(path: str | Path) -> Path:
    """The folder for ``--log-dir``, checked (and tensorboard importable) before anything runs."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ConfigError("--log-dir writes TensorBoard event files and needs tensorboard: "
                          "pip install -e '.[metrics]'", field="log_dir") from None
    return check_output_dir(path, "log directory")


class MetricsLog:
    """Scalars per step into TensorBoard event files and ``metrics.jsonl`` in ``log_dir``."""

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.dir = check_log_dir(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.dir))
        self.jsonl = (self.dir / JSONL_NAME).open("a")

    def log(self, step: int, values: Mapping[str, float | int | None]) -> None:
        """One step's scalars (None values are left out)."""
        kept = {k: float(v) for k, v in values.items() if v is not None}
        for tag, value in kept.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.jsonl.write(json.dumps({"step": step, **kept}) + "\n")
        self.jsonl.flush()

    def close(self) -> None:
        self.writer.close()
        self.jsonl.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    """``desc done/total  elapsed E  left L`` on stderr; ``left`` = mean time per item x items left."""

    def __init__(self, total: int, desc: str, out: TextIO | None = None, clock=time.perf_counter) -> None:
        self.total, self.desc, self.out, self.clock = total, desc, out or sys.stderr, clock
        self.start = clock()
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
        print(self.line() + (f"  {note}" if note else ""), file=self.out, flush=True)
