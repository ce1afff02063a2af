"""Hostile cases of processes, signals and live elasticity: the groups ``procs: *`` of experiments/hostile_inputs.py.

    python experiments/hostile_inputs.py --only "procs: live flags,procs: torchft"

:func:`cases` is the table (the exact one line each refusal prints, before anything starts); the cases that
kill a parent and look for what it left behind, and the signals to ps and async-ps runs, need a process tree
and a clock, so they are tests (tests/test_hostile_procs.py, tests/test_signals.py). The table lives in the
library, as :mod:`analysis.hostile_paths` and :mod:`analysis.hostile_parse` do, so that the experiment and the
tests share it without one script importing another.
"""

from __future__ import annotations

import sys
from pathlib import Path

from analysis.hostile import Case

__all__ = ["cases", "live_flag_cases"]

PY = sys.executable
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
LIVE = [PY, "-m", "analysis", "run", "--elastic", "live", "--steps", "2", *SMALL]
IDLE = ("has no effect with --elastic live (a replica trains in float32 on gloo, without recomputation, "
        "stragglers or a parameter file; a fault is --fail-at-step, of pipeline rank --fail-rank at pp > 1)")
IDLE_MANY = IDLE.replace("has no effect", "have no effect")


def live_flag_cases(d: Path) -> list[tuple[list[str], str]]:
    """(flags after ``schedlab run --elastic live --steps 2`` and the small model, the one line after
    ``error: ``): every flag live mode cannot honour is refused before launch."""
    hl = ["--lighthouse", "http://127.0.0.1:1"]
    return [
        ([*hl, "--save-params", str(d / "p.pt")], f"--save-params {IDLE}"),
        ([*hl, "--dtype", "bfloat16"], f"--dtype bfloat16 {IDLE}"),
        ([*hl, "--recompute", "full"], f"--recompute full {IDLE}"),
        ([*hl, "--slow-rank", "0", "--slow-s", "1"], f"--slow-rank {IDLE}"),
        ([*hl, "--fail-rank", "1"], f"--fail-rank 1 {IDLE}"),
        ([*hl, "--backend", "gloo", "--dtype", "bfloat16"], f"--backend, --dtype bfloat16 {IDLE_MANY}"),
        ([*hl, "--replica-id", "99999999999999999999"],
         "replica_id must be an integer in 0..1048575, got 99999999999999999999 (flag --replica-id)"),
        ([*hl, "--replica-id", "1048576"], "replica_id must be an integer in 0..1048575, got 1048576 (flag --replica-id)"),
        ([*hl, "--quorum-timeout", "0"], "quorum_timeout_s must be in (0, 86400] seconds, got 0.0 (flag --quorum-timeout)"),
        ([*hl, "--min-replicas", "0"], "min_replicas must be an integer >= 1, got 0 (flag --min-replicas)"),
    ]


UNREACHABLE = ("cannot reach the torchft lighthouse at 'http://127.0.0.1:1' (failed to connect to "
               "http://127.0.0.1:1 within timeout of 1s); start torchft_lighthouse there, or give its address "
               "(flag --lighthouse)")


def cases(d: Path) -> list[Case]:
    out = [Case("procs: live flags", tuple(LIVE + flags), "error", None, message) for flags, message in
           live_flag_cases(d)]
    plain = (PY, "-m", "analysis", "run", "--schedule", "gpipe", "--pp", "1", "--microbatches", "1", "--steps", "1")
    out.append(Case("procs: live flags", (*plain, *SMALL, "--quorum-timeout", "5"), "error", None,
                    "--quorum-timeout has no effect without --elastic live"))
    out.append(Case("procs: torchft", (*LIVE, "--lighthouse", "http://127.0.0.1:1", "--timeout", "1"), "error", None,
                    UNREACHABLE))
    return out
