"""The validation grid's mixture-of-experts rows: the MoE GPT with expert parallelism, predicted against real runs.

    python experiments/validate_moe.py                       # gpipe, 1f1b, dualpipe-v x m 4, 8 (about 5 min)
    python experiments/validate_moe.py --markdown docs/results/validation-moe.md

The grid's protocol (docs/validation-protocol.md) on the MoE GPT of :data:`MOE_SHAPE` (the grid's GPT with every
MLP a mixture of 4 experts, top-2), on 2 CPU ranks with gloo, pp 1 x dp 2 with ep 2 (each rank holds 2 experts;
ddp averages the dense gradients, the experts' expert-dp group is the rank itself):

1. profile the machine once at dp 2 (``real.profile``, stages 1 and 2: every expert local, no all-to-all);
2. run every row for real, interleaved in rounds (:func:`real.measure.measure_interleaved`);
3. calibrate from the traces of one row (``--calibrate-from``, default gpipe at the middle microbatch count:
   :meth:`analysis.validation.calibration.Calibration.of` with the run as the data-parallel calibration, then
   ``closed_on`` its own step): its in-run passes carry their all-to-alls (dispatch, combine and the counts in F,
   both backwards in B), so the in-run / profiled ratio of each pass kind carries them to the other rows;
4. predict every row: one stage (gpipe, 1f1b) from the calibration's data-parallel costs; DualPipe-V at pp 1 (two
   stages in a V on each rank, overlapped F/B pairs) from the profile's two-stage partition, each pass scaled by
   the calibration's in-run / profiled ratio of its kind, everything else the calibration's; each pass carries
   the calibration run's all-to-all time per MoE layer (its trace's ALL_TO_ALL rows) as communication segments,
   and a pair is timed as the runtime runs it on this testbed, its forward in a thread beside its backward on the
   rank's one core (:func:`sim.costs.moe.threaded_pair_time`, docs/moe.md);
5. score: the calibration row in-sample, the others held out; the noise verdict as the grid's.

Exit status: 0 judged; 3 too noisy to judge; 1 a run or the profile failed; 2 bad input.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

from analysis.cli.common import OneLineParser
from analysis.cli.progress import run_progress
from analysis.cli.scripts import add_grid_args, profile_guard, report_results
from analysis.results_page import table as markdown_table
from analysis.validation.scores import decomposition, half_difference, noise_verdict, verdict_line
from real import ModelConfig, RunConfig
from real.dp.zero import MAX_INFLIGHT
from real.profile.protocol import BUCKET_MB, MODEL_SHAPE, profile_machine

#: The grid's GPT with every MLP a mixture of 4 experts (the dense MLP's shape each), top-2.
MOE_SHAPE = {**MODEL_SHAPE, "moe_experts": 4, "moe_top_k": 2}
EP = 2
SCHEDULES = ("gpipe", "1f1b", "dualpipe-v")
DEFAULT_M = (4, 8)


def _args(argv: list[str] | None = None):
    p = OneLineParser(prog="python experiments/validate_moe.py", description=__doc__.splitlines()[0])
    p.add_argument("--schedules", default=",".join(SCHEDULES), help=f"default {','.join(SCHEDULES)}")
    p.add_argument("--microbatches", default=",".join(map(str, DEFAULT_M)), help="default 4,8")
    p.add_argument("--calibrate-from", default="gpipe", metavar="SCHEDULE",
                   help="a one-stage schedule of the grid (default gpipe)")
    p.add_argument("--out", default="out/validate-moe", help="profile, traces and result (default out/validate-moe)")
    add_grid_args(p, rounds=5)
    a = p.parse_args(argv)
    _check(p, a)
    from schedules import names

    a.schedules = [s for s in a.schedules.split(",") if s]
    bad = [s for s in a.schedules if s not in names()]
    if bad or not a.schedules:
        p.error(f"--schedules: unknown {','.join(bad) or repr('')}; the runtime has {','.join(names())}")
    try:
        a.microbatches = [int(x) for x in a.microbatches.split(",") if x]
    except ValueError:
        a.microbatches = []
    if not a.microbatches or min(a.microbatches) < 1:
        p.error("--microbatches: give comma-separated integers >= 1, e.g. 4,8")
    if a.calibrate_from not in a.schedules or _stages(a.calibrate_from) != 1:
        one = [s for s in a.schedules if _stages(s) == 1]
        p.error(f"--calibrate-from {a.calibrate_from!r}: give a one-stage schedule of the grid: {','.join(one)}")
    return a


def _check(p: OneLineParser, a) -> None:
    """The grid flags this script takes (its model is fixed): one line, exit 2, before anything runs."""
    from analysis.cli.common import errors_to_exit
    from analysis.results_page import check_page
    from common.outputs import check_output_dir

    if a.costs is not None and not Path(a.costs).is_file():
        p.error(f"argument --costs: {a.costs!r} is not a file; give a profile written by python -m real.profile")
    if not 0 < a.noise_limit < 1:
        p.error(f"--noise-limit must be a fraction in (0, 1) (0.05 is 5%), got {a.noise_limit}")
    with errors_to_exit(p):
        check_output_dir(a.out, "output folder")
        if a.markdown is not None:
            check_page(a.markdown)


def _stages(schedule: str, m: int = 4) -> int:
    from schedules import build

    return build(schedule, pp=1, microbatches=m).num_stages


def run_config(model: ModelConfig, schedule: str, m: int, microbatch_size: int) -> RunConfig:
    """pp 1 x dp 2 with ep 2, ddp, buckets of BUCKET_MB: the MoE row of ``schedule`` at ``m`` microbatches."""
    return RunConfig.of(schedule=schedule, pp=1, dp=2, ep=EP, microbatches=m, batch_size=microbatch_size * m * 2,
                        model=model, optimizer="adamw", backend="gloo", dp_mode="ddp", bucket_mb=BUCKET_MB)


def dense_buckets(model: ModelConfig, num_stages: int) -> list[int]:
    """Per stage, the gradient buckets ddp all-reduces over dp: the dense parameters' (the experts' buckets go over
    their expert-dp group, one rank here: nothing to wait for), as :mod:`real.dp.sync` makes them."""
    from real.config import partition
    from real.dp.sync import make_buckets
    from real.models import build_layers
    from real.moe import is_expert_param

    out = []
    for layers in partition(model.num_layers, num_stages):
        named = [(f"{layers.start + i}.{n}", p) for i, layer in enumerate(build_layers(model, 0, layers))
                 for n, p in layer.named_parameters()]
        out.append(len(make_buckets([p for n, p in named if not is_expert_param(n)], BUCKET_MB * 2**20)))
    return out


def graph_of(schedule: str, m: int, buckets: list[int]):
    """The simulator's graph of a row: the schedule at pp 1 with ddp over the dense buckets of each stage."""
    from schedules import build, lower, validate
    from schedules.dp.modes import add_data_parallel

    return validate(add_data_parallel(lower(build(schedule, pp=1, microbatches=m)), "ddp", buckets))


def a2a_per_layer(traces: list[str], moe_layers: int) -> dict[str, float]:
    """Seconds of all-to-all per MoE layer inside an F and inside a B of the run ``traces`` (one stage of
    ``moe_layers`` MoE layers): each pass's ALL_TO_ALL rows on its rank, summed, the median over passes."""
    import statistics

    from schedules.trace import read_trace

    out = {}
    for kind, stream in (("F", "all-to-all-forward"), ("B", "all-to-all-backward")):
        sums = []
        for frame in (read_trace(t) for t in traces):
            talk = frame[frame["stream"] == stream]
            for row in frame[(frame["stream"] == "compute") & (frame["kind"] == kind)].itertuples():
                mine = talk[(talk["rank"] == row.rank) & (talk["start"] >= row.start) & (talk["end"] <= row.end)]
                sums.append(float((mine["end"] - mine["start"]).sum()))
        out[kind] = statistics.median(sums) / moe_layers if sums else 0.0
    return out


def stage_costs(cal, num_stages: int, model: ModelConfig, a2a: dict[str, float]):
    """The calibration's data-parallel costs for ``num_stages`` stages: the profile's partition, each pass scaled
    by the calibration run's in-run / profiled ratio of its kind (I and W by B's where the run has no split
    backward), the dense parameters' bytes per stage; each stage's all-to-all time inside its passes (``a2a``: per
    MoE layer, F and B, the calibration run's) with its MoE layers; the pairs timed as the runtime runs them, in two
    threads (:attr:`sim.costs.profiled.ProfiledCosts.pair_threads`). Everything else (overheads, collectives,
    comm_slowdown, comm_stall) the calibration's."""
    from real.config import partition
    from schedules import Kind
    from sim.costs.cost_file import load_profile

    fit = cal.data_parallel("ddp")
    one, own = load_profile(cal.dp_profile, 1).stages[0], fit.stages[0]
    ratio = {k: own.of(k) / one.of(k) for k in (Kind.F, Kind.B)}
    blocks = [sum(1 for i in r if 0 < i <= model.layers) for r in partition(model.num_layers, num_stages)]
    moe = [{"a2a_f": a2a["F"] * n, "a2a_b": a2a["B"] * n, "moe_layers": n} for n in blocks]
    if num_stages == 1:  # the calibration's own stage, as fitted
        return dataclasses.replace(fit, stages=(dataclasses.replace(own, **moe[0]),), pair_threads=True)
    dense = own.param_bytes / one.param_bytes
    stages = tuple(dataclasses.replace(
        st, f=st.f * ratio[Kind.F], b=st.b * ratio[Kind.B], i=st.i * ratio[Kind.B], w=st.w * ratio[Kind.B],
        optim=own.optim * st.param_bytes / one.param_bytes, param_bytes=st.param_bytes * dense, **x)
        for st, x in zip(load_profile(cal.dp_profile, num_stages).stages, moe, strict=True))
    return dataclasses.replace(fit, stages=stages, pair_threads=True)


def validate_moe(a) -> dict:
    from analysis.validation.calibration import Calibration
    from analysis.validation.dp_modes import predict_mode
    from real.measure import measure_interleaved

    load_before = os.getloadavg()
    t0 = time.monotonic()
    model, mbs = ModelConfig(**MOE_SHAPE), a.microbatch_size
    out = Path(a.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    keys = [(s, m) for m in a.microbatches for s in a.schedules]
    stages = {s: _stages(s) for s in a.schedules}
    profile = Path(a.costs) if a.costs else profile_machine(
        model, mbs, sorted(set(stages.values())), a.profile_reps, out / "profile-moe-dp2.json", dp=2,
        **profile_guard(a))
    print(f"profiled ({time.monotonic() - t0:.0f} s); measuring {len(keys)} configurations x {a.rounds} rounds",
          file=sys.stderr)
    measured = measure_interleaved([run_config(model, s, m, mbs) for s, m in keys], rounds=a.rounds, steps=a.steps,
                                   warmup=a.warmup, trace_dir=str(out / "traces"), attempts=a.attempts,
                                   max_foreign=a.max_foreign, max_slow=a.max_slow or None, timeout=a.timeout,
                                   on_run=run_progress("moe grid"))
    by_key = dict(zip(keys, measured, strict=True))
    cal_key = (a.calibrate_from, a.microbatches[len(a.microbatches) // 2])
    buckets = {n: dense_buckets(model, n) for n in set(stages.values())}
    graphs = {(s, m): graph_of(s, m, buckets[stages[s]]) for s, m in keys}
    cal = Calibration.of(profile, by_key[cal_key].traces, profile, max_inflight=MAX_INFLIGHT,
                         dp_traces=by_key[cal_key].traces)
    cal = cal.closed_on(graphs[cal_key], by_key[cal_key].step_time)
    a2a = a2a_per_layer(list(by_key[cal_key].traces), model.layers)
    costs = {n: stage_costs(cal, n, model, a2a) for n in set(stages.values())}
    rows = []
    for s, m in keys:
        r = by_key[(s, m)]
        pred = predict_mode("ddp", graphs[(s, m)], costs[stages[s]], profile, 1, skew=cal.dp_skew)["step"]
        rows.append({"schedule": s, "microbatches": m, "stages": stages[s], "ep": EP,
                     "pairs": any(t.action.sub_actions for t in graphs[(s, m)].tasks),
                     "in_sample": (s, m) == cal_key, "predicted": pred, "measured": r.step_time,
                     "p10": r.spread[0], "p90": r.spread[1], "error": pred / r.step_time - 1,
                     "foreign_cores": max(r.foreign_cores), "round_medians": list(r.round_medians),
                     "half_difference": half_difference(r.round_medians, r.step_time)})
    held = [abs(r["error"]) for r in rows if not r["in_sample"]]
    noise = decomposition(rows)["noise"]  # the grid's: mean |half difference| / 2 over every row
    verdict = noise_verdict(noise, load_before, os.getloadavg(), a.noise_limit, max(r["foreign_cores"] for r in rows))
    return {"rows": rows, "held_out_mean_abs_error": sum(held) / len(held) if held else None,
            "held_out_max_abs_error": max(held) if held else None, "noise": noise, "noise_verdict": verdict,
            "calibrated_from": {"schedule": cal_key[0], "microbatches": cal_key[1],
                                "a2a_per_layer_s": a2a, "comm_slowdown": costs[1].comm_slowdown if 1 in costs else None,
                                "comm_stall": costs[1].comm_stall if 1 in costs else None},
            "model": model.to_dict(), "ep": EP, "microbatch_size": mbs, "rounds": a.rounds, "steps": a.steps,
            "profile": str(profile), "seconds": time.monotonic() - t0,
            "command": "python experiments/validate_moe.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])}


def sections(s: dict) -> list[str]:
    """The results page (markdown)."""
    rows = [[r["schedule"], r["microbatches"], r["stages"], "yes" if r["pairs"] else "no",
             "in" if r["in_sample"] else "out", f"{r['predicted'] * 1e3:.1f}", f"{r['measured'] * 1e3:.1f}",
             f"{r['p10'] * 1e3:.1f}-{r['p90'] * 1e3:.1f}", f"{r['error']:+.1%}"] for r in s["rows"]]
    mean, worst = s["held_out_mean_abs_error"], s["held_out_max_abs_error"]
    return [
        verdict_line(s["noise_verdict"]), "",
        f"The MoE GPT ({s['model']['layers']} layers, dim {s['model']['dim']}, {s['model']['moe_experts']} experts, "
        f"top-{s['model']['moe_top_k']}) on pp 1 x dp 2 with ep {s['ep']}, ddp, microbatch size "
        f"{s['microbatch_size']}; {s['rounds']} rounds of {s['steps']} steps; calibrated from "
        f"{s['calibrated_from']['schedule']} at m {s['calibrated_from']['microbatches']} (in-sample). DualPipe-V runs "
        "two stages in a V on each rank with overlapped F/B pairs; the others one stage.",
        markdown_table(["schedule", "m", "stages", "pairs", "sample", "predicted ms", "measured ms", "p10-p90 ms",
                        "error"], rows),
        f"Held out: mean |error| {mean:.1%}, worst {worst:.1%}." if mean is not None else "no held-out rows",
    ]


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    a = _args(argv)
    try:
        summary = validate_moe(a)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return report_results(a, summary, json_name="validation-moe.json",
                          title="The simulator against real MoE runs (expert parallelism)",
                          sections=sections(summary), rows=summary["rows"],
                          scores={"moe/mean_abs_error": summary["held_out_mean_abs_error"],
                                  "moe/noise": summary["noise"]})


if __name__ == "__main__":
    raise SystemExit(main())
