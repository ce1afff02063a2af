"""``torchrun --nproc-per-node N -m real.rounds SPEC.json``: the measurement protocol's worker (:mod:`real.rounds`).

:func:`real.measure.measure_interleaved` writes SPEC.json and starts this; rank 0 writes the result file it names.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from analysis.cli.common import fail
from real.launch import die_with_launcher
from real.rounds.worker import run_rounds
from schedules import ConfigError
from schedules.util import atomic_write

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    die_with_launcher()
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        fail("usage: torchrun --nproc-per-node N -m real.rounds SPEC.json")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    spec = json.loads(Path(args[0]).read_text())
    try:
        result = run_rounds(spec)
    except ConfigError as exc:
        fail(str(exc))
    if result is not None:
        atomic_write(Path(spec["result"]), lambda tmp: tmp.write_text(json.dumps(result)), "result file")
    return 0
