"""Repeated validation grids side by side: which data-parallel rows hold a bound on every run, and where the
rest lies in those that do not.

A goal such as "every data-parallel row within 10%" must hold on repeated runs, not on one favourable one.
:func:`repeat_rows` takes the ``validation.json`` of several runs of ``experiments/validate_sim.py`` (the
same code, one after the other) and gives, per data-parallel row (schedule label and microbatch count), its
signed error on each run, whether it is within the bound on all of them, and, for the run where it is worst,
the part of the step (``parts``: forward, backward, optimizer, skew, exposed, overhead; measured against
predicted, :func:`analysis.validation.dp_transfer.step_parts`) whose gap is largest: where the rest lies.
``experiments/grid_runs.py`` writes the page.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "PARTS", "RepeatRow", "repeat_rows", "run_summary"]

PARTS = ("forward", "backward", "optimizer", "skew", "exposed", "overhead")


@dataclass(frozen=True)
class RepeatRow:
    """One data-parallel row over the runs (errors signed, as fractions; None where a run lacks the row)."""

    schedule: str
    microbatches: int
    in_sample: bool
    errors: tuple[float | None, ...]
    within: bool  # every run has the row and each |error| <= the bound
    worst_run: int  # index of the run with the largest |error|
    part: str  # the part with the largest |measured - predicted| in the worst run ("" without parts)
    part_measured: float  # seconds
    part_predicted: float

    @property
    def mean_abs(self) -> float:
        return statistics.fmean(abs(e) for e in self.errors if e is not None)


KINDS = ("data-parallel", "pipeline")


def _rows_of(run: Mapping[str, Any], kind: str) -> dict[tuple[str, int], Mapping[str, Any]]:
    return {(r["schedule"], int(r["microbatches"])): r for r in run.get("schedules", [])
            if r.get("kind", "pipeline") == kind and r.get("error") is not None}


def repeat_rows(runs: Sequence[Mapping[str, Any]], bound: float, kind: str = "data-parallel") -> list[RepeatRow]:
    """Every row of ``kind`` (data-parallel or pipeline) found in any of ``runs`` (validation JSONs), in the first
    run's order, then the rest's. Raises ValueError (one line) when fewer than two runs are given or no run has
    such a row."""
    if len(runs) < 2:
        raise ValueError(f"{len(runs)} run(s): compare at least 2 runs of the grid")
    if kind not in KINDS:
        raise ValueError(f"unknown row kind {kind!r}; valid: {', '.join(KINDS)}")
    tables = [_rows_of(run, kind) for run in runs]
    keys = list(dict.fromkeys(k for table in tables for k in table))
    if not keys:
        raise ValueError(f"no run has a {kind} row: give runs of the grid that measured its {kind} rows")
    out = []
    for key in keys:
        rows = [table.get(key) for table in tables]
        errors = tuple(None if r is None else float(r["error"]) for r in rows)
        worst = max((i for i, e in enumerate(errors) if e is not None), key=lambda i: abs(errors[i]))
        part, measured, predicted = _largest_gap(rows[worst])
        out.append(RepeatRow(key[0], key[1], any(bool(r and r.get("in_sample")) for r in rows), errors,
                             all(e is not None and abs(e) <= bound for e in errors), worst, part, measured,
                             predicted))
    return out


def _largest_gap(row: Mapping[str, Any]) -> tuple[str, float, float]:
    parts = row.get("parts") or {}
    measured, predicted = parts.get("measured") or {}, parts.get("predicted") or {}
    gaps = [(abs(measured[p] - predicted[p]), p) for p in PARTS if p in measured and p in predicted]
    if not gaps:
        return "", 0.0, 0.0
    _, part = max(gaps)
    return part, float(measured[part]), float(predicted[part])


def run_summary(run: Mapping[str, Any]) -> dict[str, Any]:
    """One run's noise verdict, noise, and mean |error| of its out-of-sample pipeline and data-parallel rows."""
    noise = run.get("noise_verdict") or {}
    by_kind: dict[str, list[float]] = {}
    for r in run.get("schedules", []):
        if r.get("error") is not None and not r.get("in_sample"):
            by_kind.setdefault(r.get("kind", "pipeline"), []).append(abs(float(r["error"])))
    return {"verdict": noise.get("verdict"), "noise": noise.get("noise"), "command": run.get("command"),
            **{kind: (statistics.fmean(v), len(v)) for kind, v in by_kind.items()}}
