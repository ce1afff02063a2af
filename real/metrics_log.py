"""Training metrics where users look for them: TensorBoard event files and a JSON Lines file of the same.

:class:`MetricsLog` writes, into one folder, the event files TensorBoard reads
(through ``torch.utils.tensorboard.SummaryWriter``; the ``metrics`` extra installs
tensorboard) and ``metrics.jsonl``: one JSON object per logged step,
``{"run": ID, "step": S, "tag": value, ...}``, with the same tags and values. ``run`` is the
run's id (:func:`real.checkpoint.run_id`): a second run with the same folder appends its own lines,
which its id tells apart. ``metrics.jsonl`` is appended to, never replaced, and never when it
is one of the run's inputs (:func:`common.outputs.open_append`). Tags:

* ``loss``, ``step_time_s``, ``tokens_per_s``, ``lr``: every step of a run;
* ``memory/rank{R}/{what}``: per rank, at the step whose memory was measured;
* any other scalar a caller logs (the validation grid: ``error/...``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from common.outputs import PathMap, check_append_file, open_append
from schedules import ConfigError
from schedules.util import check_output_dir

__all__ = ["JSONL_NAME", "MetricsLog", "check_log_dir", "log_rows", "metrics_file"]

log = logging.getLogger(__name__)

JSONL_NAME = "metrics.jsonl"


def check_log_dir(path: str | Path) -> Path:
    """The folder for ``--log-dir``, checked (and tensorboard importable) before anything runs."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ConfigError("log_dir writes TensorBoard event files and needs tensorboard: "
                          "pip install -e '.[metrics]'", field="log_dir") from None
    folder = check_output_dir(path, "log directory")
    check_append_file(metrics_file(folder), "metrics file")
    return folder


def metrics_file(log_dir: str | Path) -> Path:
    """The JSON Lines file a log folder holds (an output of its own: no input may be it)."""
    return Path(log_dir) / JSONL_NAME


class MetricsLog:
    """Scalars per step into TensorBoard event files and ``metrics.jsonl`` in ``log_dir``, each line with ``run``.

    ``inputs``: the files the run reads; ``metrics.jsonl`` is never one of them. ``run``: the run's id
    (default :func:`real.checkpoint.run_id`).
    """

    def __init__(self, log_dir: str | Path, inputs: PathMap | None = None, run: str | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        from real.checkpoint import run_id

        self.dir = check_log_dir(log_dir)
        self.run = run if run is not None else run_id()
        self.jsonl = open_append(metrics_file(self.dir), "metrics file", inputs)
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def log(self, step: int, values: Mapping[str, float | int | None]) -> None:
        """One step's scalars (None values are left out)."""
        kept = {k: float(v) for k, v in values.items() if v is not None}
        for tag, value in kept.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.jsonl.write(json.dumps({"run": self.run, "step": step, **kept}) + "\n")
        self.jsonl.flush()

    def close(self) -> None:
        self.writer.close()
        self.jsonl.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def log_rows(log_dir: str | Path, rows: list[Mapping[str, object]], summary: Mapping[str, float | None]) -> Path:
    """A table of results (the validation grid's rows, plan_check's candidates) as steps 0..n-1: each row's
    numeric fields under ``row/``; then ``summary`` at step n. Returns the folder."""
    out = MetricsLog(log_dir)
    try:
        for i, row in enumerate(rows):
            out.log(i, {f"row/{k}": v for k, v in row.items()
                        if isinstance(v, int | float) and not isinstance(v, bool) and v == v})
        out.log(len(rows), {k: v for k, v in summary.items() if v is None or v == v})
    finally:
        out.close()
    return out.dir
