"""Where each published row's remaining error lies: the predicted step taken apart, and what each mechanism moved.

For every scored row: the predicted step, the busiest rank's compute, its exposed communication and the rest
of the step (pipeline bubble and waits), as shares of the step; the time per step the prediction lacks (or has
too much of) to match the published figure (``missing_s``: the step the figure implies less the predicted one);
and the row's error again with the stack's costs left out (``stack none``) and with the alpha-beta collectives
in place of NCCL's choice (``collective hierarchical``), so that each mechanism's share of the error shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from sim.plan.study import exposed_comm, run_study
from sim.published.runs import PublishedRun
from sim.published.score import metric_of, study_of

__all__ = ["breakdown", "breakdown_markdown"]


def _error(run: PublishedRun, **change: Any) -> float:
    study = study_of(run)
    parallel = {k: v for k, v in change.items() if k == "collective"}
    costs = {k: v for k, v in change.items() if k != "collective"}
    c = dataclasses.replace(study.costs, parallel=dataclasses.replace(study.costs.parallel, **parallel), **costs)
    return metric_of(run, run_study(dataclasses.replace(study, costs=c))) / run.published - 1


def breakdown(runs: Iterable[PublishedRun]) -> list[dict[str, Any]]:
    """One dict per scored row (module docstring)."""
    out = []
    for run in runs:
        if not run.scored:
            continue
        res = run_study(study_of(run))
        step, sim = res.step_time, res.sim
        busiest = max(sim.ranks, key=lambda r: r.busy)
        exposed = exposed_comm(sim)[busiest.rank]
        error = metric_of(run, res) / run.published - 1
        implied = run.published if run.metric == "step_s" else step * (1 + error)
        out.append({
            "suite": run.suite, "name": run.name, "stack": run.run_stack, "error": error, "step_s": step,
            "compute_share": busiest.busy / step, "exposed_share": exposed / step,
            "idle_share": 1 - (busiest.busy + exposed) / step, "missing_s": implied - step,
            "error_stack_none": error if run.run_stack == "none" else _error(run, stack="none"),
            "error_alpha_beta": _error(run, collective="hierarchical"),
        })
    return out


def breakdown_markdown(rows: list[dict[str, Any]]) -> str:
    """One table per suite."""
    parts = ["Per row: the predicted step's parts on its busiest rank, the time per step the prediction lacks to "
             "match the figure (negative: too much), and the error with the stack's costs left out and with "
             "alpha-beta collectives instead of NCCL's choice (sim.published.breakdown).", ""]
    for suite in dict.fromkeys(r["suite"] for r in rows):
        sel = [r for r in rows if r["suite"] == suite]
        parts += [f"## {suite} (stack {sel[0]['stack']})", "",
                  "| row | error | step s | compute | exposed comm | idle | missing s/step | error, stack none | "
                  "error, alpha-beta collectives |", "|---|" + "---:|" * 8]
        parts += [f"| {r['name']} | {r['error']:+.1%} | {r['step_s']:.3f} | {r['compute_share']:.1%} | "
                  f"{r['exposed_share']:.1%} | {r['idle_share']:.1%} | {r['missing_s']:+.3f} "
                  f"({r['missing_s'] / r['step_s']:+.1%}) | {r['error_stack_none']:+.1%} | "
                  f"{r['error_alpha_beta']:+.1%} |" for r in sel]
        parts.append("")
    return "\n".join(parts)
