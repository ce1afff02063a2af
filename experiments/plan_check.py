"""Is the planner's ranking right? Plan for this machine, run the top 5 and bottom 3 for real, compare.

    python experiments/plan_check.py                 # the full check (the lead runs it on a quiet machine)
    python experiments/plan_check.py --smoke         # a short smoke run: 2 schedules, m 2 and 4, 2 rounds, 2 steps
    python experiments/plan_check.py --json          # exactly one JSON object
    python experiments/plan_check.py --markdown docs/results/plan_check.md   # the results page too

The plan (world size 2, gloo, the validation's CPU GPT model, microbatch size
``--microbatch-size``): pp x dp = 2 x 1 with every schedule the runtime has
(default chunks) and 1 x 2 (gpipe and 1f1b, i.e. accumulate-then-backward and
interleaved backward, under ddp), microbatches 2..16 where the schedule takes
them. Candidates are ranked by predicted samples per second (the microbatch
size is fixed, so the batch grows with m: one profile serves every candidate).

Costs by the calibration protocol (:mod:`analysis.validation.calibration`, docs/validation-protocol.md):
``real.profile`` once (every stage count the plan needs; the pair's own profile for dp=2), then
:func:`sim.costs.calibrated.from_trace` on the traces of one calibration run (``--calibrate-from``,
default 1f1b at m=8). A row of that configuration is marked in-sample.

Then the planner's top 5 and bottom 3 run for real, interleaved in rounds
(:func:`real.measure.measure_interleaved`: median over rounds of each round's
median step, p10-p90 of the round medians as the spread, disturbed runs
repeated). Reported: Kendall tau_b of predicted against measured throughput
(pairs whose spreads overlap count as ties; "undefined" when every pair ties,
which does not meet the goal) and how far the predicted best is from the
measured best. Goal: tau_b >= 0.8, within 5%.

Exit status: 0 judged (goal met or not); 3 too noisy to judge (the measurement's own noise above
``--noise-limit``, default 5%, or not measurable with one round); 1 a run failed; 2 bad input.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
import time
from pathlib import Path

from analysis.cli.common import OneLineParser, guarded
from analysis.cli.progress import run_progress
from analysis.cli.scripts import add_grid_args, check_grid_args, profile_guard, report_results
from analysis.cli.train import add_model_args, model_from_args
from analysis.results_page import table as markdown_table
from analysis.validation.calibration import (
    Calibration,
    dp_graph,
    predict,
)
from analysis.validation.scores import (
    GOAL_GAP,
    GOAL_TAU,
    decomposition,
    format_tau,
    half_difference,
    noise_verdict,
    score_plan,
    verdict_line,
)
from real import ModelConfig
from real.profile.protocol import MODEL_SHAPE, dp_buckets, dp_config, pipeline_config, profile_machine

DP_SCHEDULES = ("gpipe", "1f1b")


def _args(argv: list[str] | None = None):
    p = OneLineParser(prog="python experiments/plan_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a short run: 1f1b and zb-h1, m 2 and 4, 2 rounds of 2 steps")
    p.add_argument("--schedules", help="comma-separated (default: every schedule the runtime has)")
    p.add_argument("--microbatches", default="2,4,6,8,10,12,14,16", help="comma-separated (default 2..16 by 2)")
    p.add_argument("--calibrate-from", default="1f1b:8", metavar="SCHEDULE:M", help="default 1f1b:8")
    add_model_args(p, ModelConfig(**MODEL_SHAPE))
    p.add_argument("--out", default="out/plan_check")
    add_grid_args(p, timeout=1800.0)
    a = p.parse_args(argv)
    check_grid_args(p, a, calibrate_with_m=True)
    if a.smoke:
        a.schedules, a.microbatches = a.schedules or "1f1b,zb-h1", "2,4"
        a.calibrate_from, a.rounds, a.steps, a.profile_reps = "1f1b:4", 2, 2, 3
    _check(p, a)
    return a


def _check(p: OneLineParser, a) -> None:
    """Bad input: one line, exit 2, before anything runs."""
    try:
        a.ms = [int(x) for x in a.microbatches.split(",") if x]
        cal_s, cal_m = a.calibrate_from.split(":")
        a.cal = (cal_s, 2, 1, int(cal_m))
    except ValueError:
        p.error(f"--microbatches {a.microbatches!r} / --calibrate-from {a.calibrate_from!r}: give integers, "
                "e.g. --microbatches 2,4,8 --calibrate-from 1f1b:8")
    a.candidates = candidates(a.schedules.split(",") if a.schedules else None, a.ms)
    if a.cal not in a.candidates:
        p.error(f"--calibrate-from {a.calibrate_from} is not a candidate of the plan; give a pp=2 schedule:m of it")


def candidates(schedules: list[str] | None, ms: list[int]) -> list[tuple[str, int, int, int]]:
    """(schedule, pp, dp, m) of the plan."""
    from schedules import names, spec
    from sim.plan.space import shape_ok

    scheds = [s for s in (schedules or names()) if s and not spec(s).adaptive]
    out = [(s, 2, 1, m) for s in scheds for m in ms if shape_ok(s, 2, m, spec(s).default_chunks)]
    out += [(s, 1, 2, m) for s in DP_SCHEDULES for m in ms]
    return out


def _graph(model: ModelConfig, schedule: str, pp: int, dp: int, m: int):
    from schedules import build, lower, validate

    if dp == 1:
        return validate(lower(build(schedule, pp=2, microbatches=m)))
    return dp_graph(schedule, "ddp", m, dp_buckets(model))


def _run_config(model: ModelConfig, mbs: int, schedule: str, pp: int, dp: int, m: int):
    return pipeline_config(model, schedule, m, mbs) if dp == 1 else dp_config(model, schedule, m, mbs, "ddp")


def check(a) -> dict:
    from real.measure import measure_interleaved

    load_before = os.getloadavg()
    t0 = time.monotonic()
    model, mbs = model_from_args(a), a.microbatch_size
    out = Path(a.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    graphs = {c: _graph(model, *c) for c in a.candidates}
    stages = sorted({g.schedule.num_stages for c, g in graphs.items() if c[2] == 1})
    guard = profile_guard(a)
    profile = Path(a.costs) if a.costs else profile_machine(model, mbs, stages, a.profile_reps, out / "profile.json",
                                                            **guard)
    dp_profile = profile_machine(model, mbs, [1], a.profile_reps, out / "profile-dp2.json", dp=2, **guard)
    calibration = measure_interleaved([_run_config(model, mbs, *a.cal)], rounds=1, steps=a.steps, warmup=a.warmup,
                                      trace_dir=str(out / "traces" / "calibration"), attempts=a.attempts,
                                      max_foreign=a.max_foreign, max_slow=a.max_slow or None, timeout=a.timeout,
                                      on_run=run_progress("calibration run"))[0]
    cal = Calibration.of(profile, calibration.traces, dp_profile)

    def costs_for(c: tuple):
        return cal.pipeline(graphs[c].schedule.num_stages) if c[2] == 1 else cal.data_parallel()

    samples = {c: c[2] * c[3] * mbs for c in a.candidates}
    predicted = {c: samples[c] / predict(graphs[c], costs_for(c)) for c in a.candidates}  # samples per second
    ranked = sorted(a.candidates, key=lambda c: (-predicted[c], c))
    chosen = ranked[:5] + [c for c in ranked[-3:] if c not in ranked[:5]]
    print(f"planned {len(a.candidates)} candidates ({time.monotonic() - t0:.0f} s); measuring the top 5 and "
          f"bottom 3 x {a.rounds} rounds", file=sys.stderr)
    measured = measure_interleaved([_run_config(model, mbs, *c) for c in chosen], rounds=a.rounds, steps=a.steps,
                                   warmup=a.warmup, attempts=a.attempts, max_foreign=a.max_foreign,
                                   max_slow=a.max_slow or None, timeout=a.timeout, on_run=run_progress("plan_check runs"))
    rows = [plan_row(c, r, samples[c], predicted[c], ranked.index(c) + 1, c == a.cal)
            for c, r in zip(chosen, measured, strict=True)]
    summary = score_plan(rows)
    verdict = noise_verdict(decomposition(rows)["noise"], load_before, os.getloadavg(), a.noise_limit,
                            max(r["foreign_cores"] for r in rows))
    return {"candidates": len(a.candidates), **summary, "noise_verdict": verdict,
            "calibrated_from": {"schedule": a.cal[0], "microbatches": a.cal[3], **cal.describe()},
            "seconds": time.monotonic() - t0,
            "command": "python experiments/plan_check.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])}


def plan_row(c: tuple[str, int, int, int], r, samples: int, predicted: float, rank: int, in_sample: bool) -> dict:
    """One measured candidate; ``r`` a :class:`real.measure.Measured`."""
    lo, hi = r.spread
    return {"schedule": c[0], "pp": c[1], "dp": c[2], "microbatches": c[3],
            "kind": "pipeline" if c[2] == 1 else "data-parallel", "in_sample": in_sample,
            "predicted_rank": rank, "predicted_samples_per_s": predicted,
            "measured_samples_per_s": samples / r.step_time, "measured_step_time": r.step_time,
            "measured_spread": [samples / hi, samples / lo], "foreign_cores": max(r.foreign_cores),
            "half_difference": half_difference(r.round_medians, r.step_time)}


def sections(s: dict) -> list[str]:
    """The results as Markdown blocks: the rows, the verdict on the goal, the noise verdict."""
    table = markdown_table(
        ["predicted rank", "schedule", "pp x dp", "m", "kind", "sample", "predicted samples/s",
         "measured samples/s (p10-p90)"],
        [(x["predicted_rank"], x["schedule"], f"{x['pp']} x {x['dp']}", x["microbatches"], x["kind"],
          "in" if x["in_sample"] else "out", f"{x['predicted_samples_per_s']:.1f}",
          f"{x['measured_samples_per_s']:.1f} ({x['measured_spread'][0]:.1f}-{x['measured_spread'][1]:.1f})")
         for x in s["rows"]])
    line = (f"Kendall tau_b {format_tau(s['kendall_tau_b'])}; the predicted best is {s['predicted_best_gap']:.1%} "
            f"below the measured best; goal (tau_b >= {GOAL_TAU}, within {GOAL_GAP:.0%}) "
            f"{'met' if s['goal_met'] else 'NOT met'}"
            + (" (tau_b undefined: every pair tied)" if math.isnan(s["kendall_tau_b"]) else "") + ".")
    noise = s["noise_verdict"]["noise"]
    noise_line = (f"Measurement noise (expected |error| of a perfect prediction, from two halves of each row's "
                  f"rounds): {'undefined' if math.isnan(noise) else f'{noise:.1%}'}.")
    return [verdict_line(s["noise_verdict"]), table, line, noise_line, _warnings(s), f"{s['seconds']:.0f} s."]


def _warnings(s: dict) -> str:
    warned = s["calibrated_from"]["warnings"]
    return ("Guesses in the cost models (each names its field; docs/validation-protocol.md):\n\n"
            + "\n".join(f"- {w}" for w in warned)) if warned else "No guesses in the cost models (no warnings)."


@guarded
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    a = _args(argv)
    try:
        summary = check(a)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return report_results(a, summary, json_name="plan_check.json", title="The planner's ranking against real runs",
                          sections=sections(summary), rows=summary["rows"],
                          scores={"plan/kendall_tau_b": summary["kendall_tau_b"],
                                  "plan/predicted_best_gap": summary["predicted_best_gap"],
                                  "plan/noise": summary["noise_verdict"]["noise"]})


if __name__ == "__main__":
    raise SystemExit(main())
