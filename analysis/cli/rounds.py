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
from real.rounds.worker import SPEC_KEYS, check_spec, run_rounds
from schedules import SchedlabError
from schedules.util import atomic_write

__all__ = ["main"]


USAGE = "torchrun --nproc-per-node N -m real.rounds SPEC.json"


def main(argv: Sequence[str] | None = None) -> int:
    die_with_launcher()
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        print(f"usage: {USAGE}\n\nRuns the measurement protocol's configurations in interleaved rounds in one "
              "process group.\nSPEC.json (real.measure.measure_interleaved writes it) is a JSON object of the keys "
              + ", ".join(SPEC_KEYS) + "; see real.rounds.worker.")
        return 0
    if len(args) != 1 or args[0].startswith("-"):
        fail(f"usage: {USAGE}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    where = f"SPEC {str(args[0])!r}"
    try:
        spec = json.loads(Path(args[0]).read_bytes().decode("utf-8"))
    except OSError as exc:
        fail(f"{where} cannot be read ({exc.strerror or exc})")
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        fail(f"{where} is not JSON ({'nested too deeply' if isinstance(exc, RecursionError) else exc})")
    try:
        spec = check_spec(spec, where)
        result = run_rounds(spec)
    except SchedlabError as exc:
        fail(str(exc))
    if result is not None:
        atomic_write(Path(spec["result"]), lambda tmp: tmp.write_text(json.dumps(result)), "result file")
    return 0
