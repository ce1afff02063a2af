"""The flags the measuring scripts in ``experiments/`` share, checked as the CLI checks its own: one line, exit 2.

    p = OneLineParser(prog="python experiments/validate_sim.py", ...)
    add_grid_args(p)
    a = p.parse_args(argv)
    check_grid_args(p, a, calibrate_with_m=False)

:func:`add_grid_args` declares the run-grid flags with their value types;
:func:`check_grid_args` checks what one flag alone cannot: the names in
``--schedules``, ``--calibrate-from`` against the grid, the model flags,
the ``--costs`` file and the ``--out`` folder, before anything runs.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from analysis.cli.common import (
    OneLineParser,
    errors_to_exit,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    positive_int_list,
    schedule_list,
)
from analysis.validation.scores import NOISE_LIMIT
from common.errors import quote

__all__ = ["add_grid_args", "check_grid_args", "profile_guard", "report_results"]


def add_grid_args(p: argparse.ArgumentParser, *, rounds: int = 5, timeout: float = 1200.0) -> None:
    """The typed flags of a measured grid (the model flags come from ``add_model_args``)."""
    p.add_argument("--microbatch-size", type=positive_int, default=2, help="samples per microbatch (default 2)")
    p.add_argument("--rounds", type=positive_int, default=rounds, help=f"interleaved rounds (default {rounds})")
    p.add_argument("--steps", type=positive_int, default=10, help="measured steps per run (default 10)")
    p.add_argument("--warmup", type=nonnegative_int, default=1, help="unmeasured first steps per run (default 1)")
    p.add_argument("--profile-reps", type=positive_int, default=15, help="timed repetitions of the profile (default 15)")
    p.add_argument("--costs", metavar="PROFILE.json", help="use this profile instead of profiling")
    p.add_argument("--timeout", type=positive_float, default=timeout,
                   help=f"seconds for all the real runs (default {timeout:g})")
    p.add_argument("--max-foreign", type=nonnegative_float, default=0.1, metavar="CORES",
                   help="a run counts only if other processes used at most this many cores meanwhile (default 0.1)")
    p.add_argument("--max-slow", type=nonnegative_float, default=0.1, metavar="FRACTION",
                   help="a run counts only if the machine ran at most this much slower than its fastest, by a probe "
                        "timed on each rank before and after it (default 0.1; 0: not checked; real.rounds)")
    p.add_argument("--attempts", type=positive_int, default=3, help="runs of a disturbed configuration (default 3)")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--noise-limit", type=float, default=NOISE_LIMIT, metavar="FRACTION",
                   help=f"too noisy to judge above this measured noise (default {NOISE_LIMIT}: 5%%; exit status 3)")
    p.add_argument("--markdown", metavar="PATH.md", help="also write the results page (docs/results/)")
    p.add_argument("--log-dir", metavar="DIR", help="also write each row's prediction and measurement, and the "
                   "scores, as TensorBoard event files and metrics.jsonl (docs/metrics.md)")


def profile_guard(a: argparse.Namespace) -> dict[str, Any]:
    """The grid flags' guard against a slowed host for :func:`real.profile.protocol.profile_machine` (``max_slow``,
    ``attempts``), as the runs have it (``--max-slow 0``: not checked)."""
    return {"max_slow": a.max_slow or None, "attempts": a.attempts}


def check_grid_args(p: OneLineParser, a: argparse.Namespace, *, calibrate_with_m: bool) -> None:
    """What the types cannot check alone; ``p.error`` (one line, exit 2) on the first bad value."""
    from analysis.cli.train import model_from_args
    from analysis.results_page import check_page
    from common.outputs import check_output_dir
    from real.metrics_log import check_log_dir

    for flag, parse in (("schedules", schedule_list), ("microbatches", positive_int_list)):
        text = getattr(a, flag)
        if text:
            try:
                parse(text)
            except argparse.ArgumentTypeError as exc:
                p.error(f"argument --{flag}: {exc}")
    name, _, m = a.calibrate_from.partition(":")
    try:
        schedule_list(name)
        if calibrate_with_m or m:
            positive_int(m)
    except argparse.ArgumentTypeError:
        form = "SCHEDULE:M, e.g. 1f1b:8" if calibrate_with_m else "a schedule name, e.g. 1f1b"
        p.error(f"argument --calibrate-from: invalid value {quote(a.calibrate_from)}: give {form}")
    if a.costs is not None and not Path(a.costs).is_file():
        p.error(f"argument --costs: {quote(a.costs)} is not a file; give a profile written by python -m real.profile")
    if not 0 < a.noise_limit < 1 or math.isnan(a.noise_limit):
        p.error(f"--noise-limit must be a fraction in (0, 1) (0.05 is 5%), got {a.noise_limit}")
    with errors_to_exit(p):
        model_from_args(a)
        if a.costs is not None:  # a file that is no profile is refused now, not after the measurements
            from sim.costs.cost_file import load_profile

            load_profile(a.costs)
        check_output_dir(a.out, "output folder")
        if a.markdown is not None:
            check_page(a.markdown)
        if a.log_dir is not None:
            check_log_dir(a.log_dir)


def report_results(a: argparse.Namespace, summary: dict, *, json_name: str, title: str, sections: list[str],
                   rows: list[dict], scores: dict[str, float | None]) -> int:
    """A measured grid's outputs: ``OUT/json_name`` (atomic), ``--log-dir`` (each row, then ``scores``),
    ``--markdown`` (the results page), then stdout (one JSON object with ``--json``, else ``sections``).
    Returns the exit status of the noise verdict (0 judged, 3 too noisy or undefined)."""
    import json

    from analysis.cli.common import print_json
    from analysis.results_page import json_ready, write_page
    from analysis.validation.scores import exit_status
    from common.outputs import atomic_write
    from real.metrics_log import log_rows

    atomic_write(Path(a.out) / json_name, lambda tmp: tmp.write_text(json.dumps(json_ready(summary), indent=1)),
                 "result file")
    if a.log_dir:
        log_rows(a.log_dir, rows, scores)
    if a.markdown:
        write_page(a.markdown, title, "\n\n".join(sections))
    if a.json:
        print_json(json_ready(summary))
    else:
        print("\n\n".join(sections))
    return exit_status(summary["noise_verdict"])
