"""How close is the simulator to the real runtime? Calibrate from one real run, predict the grid, compare.

    python experiments/validate_sim.py                   # the default grid (about 10 min on 2 cores)
    python experiments/validate_sim.py --quick           # 5 schedules x microbatches 4, 16 (about 4 min)
    python experiments/validate_sim.py --json            # exactly one JSON object

The protocol, on 2 CPU ranks with gloo:

1. ``python -m real.profile`` measures the passes of every stage count the grid
   needs (2 and 4 stages at pp=2), once; and, for the data-parallel pair (pp=1,
   dp=2, ddp against sync with 1 MiB buckets), the whole model and the
   collectives over both ranks.
2. Every configuration of the grid runs for real, interleaved in rounds
   (A B C ... A B C ..., ``--rounds``, default 5) inside one process group
   (:func:`real.measure.measure_interleaved`), ``--steps`` measured steps each
   (default 10), every one traced. A run disturbed by other processes is
   repeated. Measured step time = the median over rounds of each round's
   median; spread = p10-p90 of the round medians.
3. The simulator is calibrated from the traces of one configuration
   (``--calibrate-from``, default 1f1b at the grid's middle microbatch count)
   with :func:`sim.profiled.from_trace`, and predicts every configuration
   (other stage counts and the I/W passes scaled from the profile by the
   trace's in-run/profiled ratio). The profile alone is the second
   calibration source, reported beside it. The data-parallel pair is
   predicted from its own profile, its passes scaled by the same ratios.
4. Replay: each traced step of each pipeline configuration is simulated with
   its own task durations (:func:`sim.replay.replay`); replay error = the
   median over steps of (predicted span - measured span) / measured span.
5. The mechanisms the CPU testbed adds (``send_cpu``, ``task_overhead``,
   ``step_overhead``) are each switched off in turn to show what each
   contributes to the error (``mechanisms``).

error = (predicted - measured) / measured. Kendall tau_b counts as ties the
pairs whose p10-p90 spreads overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from analysis.cli.common import OneLineParser, guarded, schedule_list
from analysis.cli.scripts import add_grid_args, check_grid_args
from analysis.cli.train import add_model_args, model_argv, model_from_args
from real import ModelConfig
from schedules.outputs import atomic_write

MODEL = ModelConfig(kind="gpt", layers=6, dim=128, heads=4, vocab=256, seq=64)  # the validation's default model
QUICK = (("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"), (4, 16))
DEFAULT_M = (4, 8, 16)


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog="python experiments/validate_sim.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v at m = 4, 16")
    p.add_argument("--schedules", help="comma-separated pipeline schedules (default: every one the runtime has)")
    p.add_argument("--microbatches", help="comma-separated counts (default 4,8,16; --quick 4,16)")
    p.add_argument("--no-dp", action="store_true", help="leave out the pp=1, dp=2 ddp/sync pair")
    p.add_argument("--calibrate-from", default="1f1b", metavar="SCHEDULE", help="default 1f1b")
    add_model_args(p, MODEL)
    p.add_argument("--out", default="out/validate", help="profile, traces and result go here (default out/validate)")
    add_grid_args(p)
    a = p.parse_args(argv)
    check_grid_args(p, a, calibrate_with_m=False)
    if schedule_list(a.calibrate_from)[0] not in _grid(a)[0]:
        p.error(f"argument --calibrate-from: {a.calibrate_from!r} is not in the grid {_grid(a)[0]}")
    return a


def _grid(a: argparse.Namespace) -> tuple[list[str], list[int]]:
    from schedules import names

    scheds, ms = (list(QUICK[0]), list(QUICK[1])) if a.quick else (list(names()), list(DEFAULT_M))
    if a.schedules:
        scheds = [s for s in a.schedules.split(",") if s]
    if a.microbatches:
        ms = [int(x) for x in a.microbatches.split(",") if x]
    return scheds, ms


def _profile(a: argparse.Namespace, out: Path, stages: str, dp: int = 1) -> Path:
    from real.launch import torchrun

    path = out / ("profile.json" if dp == 1 else f"profile-dp{dp}.json")
    flags = ["-m", "real.profile", *model_argv(model_from_args(a)), "--microbatch-size", str(a.microbatch_size),
             "--stages", stages, "--reps", str(a.profile_reps), "--out", str(path)]
    if dp > 1:
        flags += ["--dp", str(dp), "--pp", "1"]
    done = torchrun(2, flags, timeout=600, capture=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or "").strip().splitlines()[-12:])
        raise SystemExit(f"error: the profile failed (exit {done.returncode}):\n{tail}")
    return path


BUCKET_MB = 1.0  # the data-parallel pair's gradient buckets: several per model, so ddp has something to overlap


def _config(a: argparse.Namespace, schedule: str, m: int, *, dp_mode: str | None = None):
    from real import RunConfig

    if dp_mode is None:
        return RunConfig.of(schedule=schedule, pp=2, microbatches=m, batch_size=a.microbatch_size * m,
                            model=model_from_args(a), optimizer="adamw", backend="gloo")
    return RunConfig.of(schedule=schedule, pp=1, dp=2, microbatches=m, batch_size=a.microbatch_size * m * 2,
                        model=model_from_args(a), optimizer="adamw", backend="gloo", dp_mode=dp_mode,
                        bucket_mb=BUCKET_MB)


def _dp_graph(a: argparse.Namespace, mode: str, m: int):
    """The simulator's data-parallel graph of the pair, with as many buckets as the runtime makes."""
    from real.dp import make_buckets
    from real.models import build_model
    from schedules import build, lower, validate
    from schedules.dp import add_data_parallel

    params = list(build_model(model_from_args(a), 0).parameters())
    buckets = len(make_buckets(params, BUCKET_MB * 2**20))
    return validate(add_data_parallel(lower(build("gpipe", pp=1, microbatches=m)), mode, [buckets]))


def _predict(graph, costs) -> float:
    from sim import simulate
    from sim.profiled import step_time

    return step_time(simulate(graph, costs, check=False), costs)


def validate_all(a: argparse.Namespace) -> dict:
    from analysis.validation import decomposition, half_difference, kendall_tau
    from real.measure import measure_interleaved
    from schedules import Kind, load_graph, validate
    from schedules.trace import read_trace
    from sim.profiled import from_trace, load_profile, trace_fit
    from sim.replay import replay

    t_start = time.monotonic()
    scheds, ms = _grid(a)
    if a.calibrate_from not in scheds:
        raise SystemExit(f"error: --calibrate-from {a.calibrate_from!r} is not in the grid {scheds}")
    out = Path(a.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    pp_cfgs = [(s, m, _config(a, s, m)) for m in ms for s in scheds]
    dp_cfgs = [] if a.no_dp else [(f"dp2-{mode}", ms[0], _config(a, "gpipe", ms[0], dp_mode=mode))
                                  for mode in ("ddp", "sync")]
    graphs = {(s, m): validate(load_graph(s, pp=2, microbatches=m)) for s, m, _ in pp_cfgs}
    graphs.update({(s, m): _dp_graph(a, s[4:], m) for s, m, _ in dp_cfgs})
    stage_counts = sorted({graphs[(s, m)].schedule.num_stages for s, m, _ in pp_cfgs})
    profile = Path(a.costs) if a.costs else _profile(a, out, ",".join(map(str, stage_counts)))
    dp_profile = _profile(a, out, "1", dp=2) if dp_cfgs else None
    everything = pp_cfgs + dp_cfgs
    print(f"profiled ({time.monotonic() - t_start:.0f} s); measuring {len(everything)} configurations "
          f"x {a.rounds} rounds", file=sys.stderr)
    measured = measure_interleaved([c for _, _, c in everything], rounds=a.rounds, steps=a.steps, warmup=a.warmup,
                                   trace_dir=str(out / "traces"), attempts=a.attempts, max_foreign=a.max_foreign,
                                   timeout=a.timeout)
    by_key = {(s, m): r for (s, m, _), r in zip(everything, measured, strict=True)}
    cal_m = ms[len(ms) // 2]
    cal_traces = list(by_key[(a.calibrate_from, cal_m)].traces)
    fit = trace_fit(cal_traces)

    def trace_costs(n: int, **off: float):
        c = from_trace(cal_traces, profile, num_stages=n, fit=fit)
        return replace(c, **off) if off else c

    ablations = {"send_cpu": {"send_cpu": 0.0}, "task_overhead": {"task_overhead": 0.0},
                 "step_overhead": {"step_overhead": 0.0}}
    def dp_costs(**off: float):
        """The data-parallel pair's profile, each pass scaled by the calibration trace's in-run/profiled ratio."""
        base, own = load_profile(profile, fit.num_stages), load_profile(dp_profile, 1)
        scaled = from_trace(cal_traces, profile, num_stages=fit.num_stages, fit=fit)
        ratio = {k: sum(scaled.stages[s].of(k) for s in range(fit.num_stages))
                 / sum(base.stages[s].of(k) for s in range(fit.num_stages)) for k in (Kind.F, Kind.B)}
        st = own.stages[0]
        c = replace(own, stages=(replace(st, f=st.f * ratio[Kind.F], b=st.b * ratio[Kind.B]),),
                    send_cpu=fit.send_cpu, task_overhead=fit.task_overhead)
        return replace(c, **off) if off else c

    rows = []
    for (s, m), r in by_key.items():
        row = {"schedule": s, "microbatches": m, "measured_step_time": r.step_time,
               "measured_spread": list(r.spread), "round_medians": list(r.round_medians),
               "foreign_cores": max(r.foreign_cores),
               "half_difference": half_difference(r.round_medians, r.step_time)}
        g = graphs[(s, m)]
        if s.startswith("dp2-"):
            row["predicted_step_time"] = _predict(g, dp_costs())
            row["profile_predicted_step_time"] = _predict(g, load_profile(dp_profile, 1))
            row["without"] = {k: _predict(g, dp_costs(**v)) for k, v in ablations.items()}
            row["replay_error"] = None
            meas = row["measured_step_time"]
            row["error"] = (row["predicted_step_time"] - meas) / meas
            row["profile_error"] = (row["profile_predicted_step_time"] - meas) / meas
            rows.append(row)
            continue
        n = g.schedule.num_stages
        row["predicted_step_time"] = _predict(g, trace_costs(n))
        row["profile_predicted_step_time"] = _predict(g, load_profile(profile, n))
        row["without"] = {k: _predict(g, trace_costs(n, **v)) for k, v in ablations.items()}
        frames = [read_trace(t) for t in r.traces]  # read once: its own calibration and every step's replay
        own = from_trace(frames, profile, num_stages=n)  # this configuration's own pass times
        row["self_error"] = (_predict(g, own) - r.step_time) / r.step_time
        steps = [x.error for df in frames for x in replay(df, from_trace(df, fit=trace_fit(df)))]
        row["replay_error"] = statistics.median(steps)
        row["replay_abs_p90"] = sorted(abs(e) for e in steps)[int(0.9 * (len(steps) - 1))]
        meas = row["measured_step_time"]
        row["error"] = (row["predicted_step_time"] - meas) / meas
        row["profile_error"] = (row["profile_predicted_step_time"] - meas) / meas
        rows.append(row)

    def mean_abs(key: str, subset=rows) -> float:
        return statistics.fmean(abs(x[key]) for x in subset)

    pipe_rows = rows
    mechanisms = {"all": mean_abs("error", pipe_rows)}
    for k in ablations:
        mechanisms[f"without {k}"] = statistics.fmean(
            abs(x["without"][k] - x["measured_step_time"]) / x["measured_step_time"] for x in pipe_rows)
    return {
        "schedules": rows,
        "mean_abs_error": mean_abs("error"),
        "max_abs_error": max(abs(x["error"]) for x in rows),
        "kendall_tau_b": kendall_tau([x["predicted_step_time"] for x in rows], [x["measured_step_time"] for x in rows],
                                     [tuple(x["measured_spread"]) for x in rows]),
        "profile_mean_abs_error": mean_abs("profile_error"),
        "profile_kendall_tau_b": kendall_tau([x["profile_predicted_step_time"] for x in rows],
                                             [x["measured_step_time"] for x in rows],
                                             [tuple(x["measured_spread"]) for x in rows]),
        "max_abs_replay_error": max(abs(x["replay_error"]) for x in pipe_rows if x["replay_error"] is not None),
        "mechanisms": mechanisms,
        "decomposition": decomposition(rows),
        "calibrated_from": {"schedule": a.calibrate_from, "microbatches": cal_m, "traces": cal_traces,
                            "fit": {k: v for k, v in vars(fit).items() if k != "passes"},
                            "passes": {f"{s}{k}": v for (s, k), v in fit.passes.items()}},
        "grid": {"schedules": scheds, "microbatches": ms, "pp": 2, "dp_pair": [x[0] for x in dp_cfgs],
                 "microbatch_size": a.microbatch_size, "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
                 "model": model_from_args(a).to_dict()},
        "profile": str(profile),
        "seconds": time.monotonic() - t_start,
        "command": "python experiments/validate_sim.py " + " ".join(sys.argv[1:]),
        "load_average_end": os.getloadavg()[0],
    }


def _table(summary: dict) -> str:
    lines = [f"{'schedule':<18} {'m':>3} {'predicted ms':>12} {'measured ms':>12} {'spread ms':>15} {'error':>7} "
             f"{'profile err':>11} {'replay':>7}"]
    for r in summary["schedules"]:
        lo, hi = r["measured_spread"]
        rep = f"{r['replay_error']:>+7.1%}" if r["replay_error"] is not None else f"{'-':>7}"
        lines.append(f"{r['schedule']:<18} {r['microbatches']:>3} {r['predicted_step_time'] * 1e3:>12.1f} "
                     f"{r['measured_step_time'] * 1e3:>12.1f} {lo * 1e3:>7.1f}-{hi * 1e3:<7.1f} {r['error']:>+7.1%} "
                     f"{r['profile_error']:>+11.1%} {rep}")
    lines.append(f"calibrated from a trace: mean |error| {summary['mean_abs_error']:.1%}, worst "
                 f"{summary['max_abs_error']:.1%}, Kendall tau_b {summary['kendall_tau_b']:.2f}; worst |replay| "
                 f"{summary['max_abs_replay_error']:.1%}")
    lines.append(f"from the profile alone: mean |error| {summary['profile_mean_abs_error']:.1%}, Kendall tau_b "
                 f"{summary['profile_kendall_tau_b']:.2f}")
    lines.append("mean |error| of the pipeline rows: " + ", ".join(f"{k} {v:.1%}" for k, v in summary["mechanisms"].items()))
    lines.append("mean |error| taken apart: " + ", ".join(f"{k} {v:.1%}" for k, v in summary["decomposition"].items()))
    lines.append(f"{summary['seconds']:.0f} s")
    return "\n".join(lines)


@guarded
def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    summary = validate_all(a)
    atomic_write(Path(a.out) / "validation.json", lambda tmp: tmp.write_text(json.dumps(summary, indent=1)),
                 "validation result")
    print(json.dumps(summary) if a.json else _table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
