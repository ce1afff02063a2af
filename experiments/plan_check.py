"""Is the planner's ranking right? Plan for this machine, run the top 5 and bottom 3 for real, compare.

    python experiments/plan_check.py                 # the full check (the lead runs it on a quiet machine)
    python experiments/plan_check.py --smoke         # a short smoke run: 2 schedules, m 2 and 4, 1 round, 2 steps
    python experiments/plan_check.py --json          # exactly one JSON object

The plan (world size 2, gloo, the validation's CPU GPT model, microbatch size
``--microbatch-size``): pp x dp = 2 x 1 with every schedule the runtime has
(default chunks) and 1 x 2 (gpipe and 1f1b, i.e. accumulate-then-backward and
interleaved backward, under ddp), microbatches 2..16 where the schedule takes
them. Candidates are ranked by predicted samples per second (the microbatch
size is fixed, so the batch grows with m: one profile serves every candidate).

Costs, as ``experiments/validate_sim.py`` calibrates them: ``real.profile``
once (every stage count the plan needs; the pair's own profile for dp=2), then
:func:`sim.profiled.from_trace` on the traces of one calibration run
(``--calibrate-from``, default 1f1b at m=8), measured with the protocol.

Then the planner's top 5 and bottom 3 run for real, interleaved in rounds
(:func:`real.measure.measure_interleaved`: median over rounds of each round's
median step, p10-p90 of the round medians as the spread, disturbed runs
repeated). Reported: Kendall tau_b of predicted against measured throughput
(pairs whose spreads overlap count as ties) and how far the predicted best is
from the measured best. Goal: tau_b >= 0.8, within 5%.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import validate_sim as vs

from analysis.cli.common import OneLineParser, guarded
from analysis.cli.scripts import add_grid_args, check_grid_args
from analysis.cli.train import add_model_args, model_from_args
from schedules.outputs import atomic_write

DP_SCHEDULES = ("gpipe", "1f1b")


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog="python experiments/plan_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="a short run: 1f1b and zb-h1, m 2 and 4, 1 round of 2 steps")
    p.add_argument("--schedules", help="comma-separated (default: every schedule the runtime has)")
    p.add_argument("--microbatches", default="2,4,6,8,10,12,14,16", help="comma-separated (default 2..16 by 2)")
    p.add_argument("--calibrate-from", default="1f1b:8", metavar="SCHEDULE:M", help="default 1f1b:8")
    add_model_args(p, vs.MODEL)
    p.add_argument("--out", default="out/plan_check")
    add_grid_args(p, timeout=1800.0)
    a = p.parse_args(argv)
    check_grid_args(p, a, calibrate_with_m=True)
    if a.smoke:
        a.schedules, a.microbatches = a.schedules or "1f1b,zb-h1", "2,4"
        a.calibrate_from, a.rounds, a.steps, a.profile_reps = "1f1b:4", 1, 2, 3
    return a


def _candidates(a: argparse.Namespace) -> list[tuple[str, int, int, int]]:
    """(schedule, pp, dp, m) of the plan."""
    from schedules import names, spec
    from sim.plan_space import shape_ok

    scheds = [s for s in (a.schedules.split(",") if a.schedules else names()) if s and not spec(s).adaptive]
    ms = [int(x) for x in a.microbatches.split(",") if x]
    out = [(s, 2, 1, m) for s in scheds for m in ms if shape_ok(s, 2, m, spec(s).default_chunks)]
    out += [(s, 1, 2, m) for s in DP_SCHEDULES for m in ms]
    return out


def _run_config(a: argparse.Namespace, schedule: str, pp: int, dp: int, m: int):
    from real import RunConfig

    if dp == 1:
        return vs._config(a, schedule, m)
    return RunConfig.of(schedule=schedule, pp=1, dp=2, microbatches=m, batch_size=a.microbatch_size * m * 2,
                        model=model_from_args(a), optimizer="adamw", backend="gloo", dp_mode="ddp",
                        bucket_mb=vs.BUCKET_MB)


def _graph(a: argparse.Namespace, schedule: str, pp: int, dp: int, m: int):
    from real.dp import make_buckets
    from real.models import build_model
    from schedules import build, lower, validate
    from schedules.dp import add_data_parallel

    if dp == 1:
        return validate(lower(build(schedule, pp=2, microbatches=m)))
    params = list(build_model(model_from_args(a), 0).parameters())
    buckets = len(make_buckets(params, vs.BUCKET_MB * 2**20))
    return validate(add_data_parallel(lower(build(schedule, pp=1, microbatches=m)), "ddp", [buckets]))


def check(a: argparse.Namespace) -> dict:
    from analysis.validation import kendall_tau
    from real.measure import measure_interleaved
    from schedules import Kind
    from sim.profiled import from_trace, load_profile, trace_fit

    t0 = time.monotonic()
    out = Path(a.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    cands = _candidates(a)
    graphs = {c: _graph(a, *c) for c in cands}
    stages = sorted({g.schedule.num_stages for c, g in graphs.items() if c[2] == 1})
    profile = Path(a.costs) if a.costs else vs._profile(a, out, ",".join(map(str, stages)))
    dp_profile = vs._profile(a, out, "1", dp=2)
    cal_s, cal_m = a.calibrate_from.split(":")
    cal = (cal_s, 2, 1, int(cal_m))
    if cal not in graphs:
        raise SystemExit(f"error: --calibrate-from {a.calibrate_from} is not a candidate of the plan")
    calibration = measure_interleaved([_run_config(a, *cal)], rounds=1, steps=a.steps, warmup=a.warmup,
                                      trace_dir=str(out / "traces" / "calibration"), attempts=a.attempts,
                                      max_foreign=a.max_foreign, timeout=a.timeout)[0]
    traces = list(calibration.traces)
    fit = trace_fit(traces)

    def costs_for(c: tuple) -> object:
        g = graphs[c]
        if c[2] == 1:
            return from_trace(traces, profile, num_stages=g.schedule.num_stages, fit=fit)
        base = load_profile(profile, fit.num_stages)
        scaled = from_trace(traces, profile, num_stages=fit.num_stages, fit=fit)
        ratio = {k: sum(scaled.stages[s].of(k) for s in range(fit.num_stages))
                 / sum(base.stages[s].of(k) for s in range(fit.num_stages)) for k in (Kind.F, Kind.B)}
        own = load_profile(dp_profile, 1)
        st = own.stages[0]
        return replace(own, stages=(replace(st, f=st.f * ratio[Kind.F], b=st.b * ratio[Kind.B]),),
                       send_cpu=fit.send_cpu, task_overhead=fit.task_overhead)

    samples = {c: c[2] * c[3] * a.microbatch_size for c in cands}
    predicted = {c: samples[c] / vs._predict(graphs[c], costs_for(c)) for c in cands}  # samples per second
    ranked = sorted(cands, key=lambda c: (-predicted[c], c))
    chosen = ranked[:5] + [c for c in ranked[-3:] if c not in ranked[:5]]
    print(f"planned {len(cands)} candidates ({time.monotonic() - t0:.0f} s); measuring the top 5 and bottom 3 "
          f"x {a.rounds} rounds", file=sys.stderr)
    measured = measure_interleaved([_run_config(a, *c) for c in chosen], rounds=a.rounds, steps=a.steps,
                                   warmup=a.warmup, attempts=a.attempts, max_foreign=a.max_foreign, timeout=a.timeout)
    rows = []
    for c, r in zip(chosen, measured, strict=True):
        lo, hi = r.spread
        rows.append({"schedule": c[0], "pp": c[1], "dp": c[2], "microbatches": c[3],
                     "predicted_rank": ranked.index(c) + 1, "predicted_samples_per_s": predicted[c],
                     "measured_samples_per_s": samples[c] / r.step_time, "measured_step_time": r.step_time,
                     "measured_spread": [samples[c] / hi, samples[c] / lo]})
    tau = kendall_tau([x["predicted_samples_per_s"] for x in rows], [x["measured_samples_per_s"] for x in rows],
                      [tuple(x["measured_spread"]) for x in rows])
    best_measured = max(x["measured_samples_per_s"] for x in rows)
    gap = (best_measured - rows[0]["measured_samples_per_s"]) / best_measured
    return {"candidates": len(cands), "rows": rows, "kendall_tau_b": tau, "predicted_best_gap": gap,
            "goal_met": tau >= 0.8 and gap <= 0.05, "calibrated_from": a.calibrate_from,
            "seconds": time.monotonic() - t0}


def _table(s: dict) -> str:
    lines = ["| predicted rank | schedule | pp x dp | m | predicted samples/s | measured samples/s (p10-p90) |",
             "|---|---|---|---|---|---|"]
    for x in s["rows"]:
        lo, hi = x["measured_spread"]
        lines.append(f"| {x['predicted_rank']} | {x['schedule']} | {x['pp']} x {x['dp']} | {x['microbatches']} | "
                     f"{x['predicted_samples_per_s']:.1f} | {x['measured_samples_per_s']:.1f} ({lo:.1f}-{hi:.1f}) |")
    lines.append(f"\nKendall tau_b {s['kendall_tau_b']:.2f}; the predicted best is {s['predicted_best_gap']:.1%} "
                 f"below the measured best; goal (tau_b >= 0.8, within 5%) {'met' if s['goal_met'] else 'NOT met'}")
    return "\n".join(lines)


@guarded
def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    summary = check(a)
    atomic_write(Path(a.out, "plan_check.json"), lambda tmp: tmp.write_text(json.dumps(summary, indent=1)),
                 "plan check result")
    print(json.dumps(summary) if a.json else _table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
