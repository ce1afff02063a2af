"""How close is the simulator to the real runtime? Calibrate from one real run, predict the grid, compare.

    python experiments/validate_sim.py                   # the default grid (about 11 min on 2 cores)
    python experiments/validate_sim.py --quick           # 5 schedules x microbatches 4, 16 (about 4 min)
    python experiments/validate_sim.py --tiny            # gpipe, 1f1b at m=4, 2 rounds of 2 steps: the code path
    python experiments/validate_sim.py --json            # exactly one JSON object
    python experiments/validate_sim.py --markdown docs/results/validation.md   # the results page too

The protocol (docs/validation-protocol.md; the library is :mod:`analysis.validation.calibration`), on 2 CPU
ranks with gloo: profile the machine once (``real.profile``); run every configuration for real,
interleaved in rounds (:func:`real.measure.measure_interleaved`); calibrate the simulator from the
traces of one configuration (``--calibrate-from``, default 1f1b at the grid's middle microbatch
count); predict every configuration; score the grid (:func:`analysis.validation.scores.score_grid`).

The calibration configuration is scored apart (in-sample: its own traces fitted the model); the
headline error and tau_b are over the other rows, the out-of-sample ones. Rows are labelled pipeline
(pp=2) or data-parallel (pp=1, dp=2: one row per mode of ``--dp-modes``, default ddp, sync, zero1,
zero2, zero3, ps, decentralized, local-sgd, ddp+int8, ddp+fp16, ddp+bf16, ddp+powersgd:4 and async-ps:
:mod:`analysis.validation.dp_modes`), and
both kinds are taken apart (replay, self-calibrated, transferred, noise). ps and async-ps run 3 processes (2
trainers and a server), so their rounds run in a process group of their own, after the others.

Exit status: 0 judged; 3 too noisy to judge (the measurement's own noise, the expected |error| of a
perfect prediction, is above ``--noise-limit``, default 5%, or could not be measured with one round);
1 a run or the profile failed; 2 bad input.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
import time
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit, guarded
from analysis.cli.progress import run_progress
from analysis.cli.scripts import add_grid_args, check_grid_args, profile_guard, report_results
from analysis.cli.train import add_model_args, model_from_args
from analysis.results_page import table as markdown_table
from analysis.validation.calibration import (
    Calibration,
    dp_graph,
    grid_rows,
)
from analysis.validation.scores import format_tau, noise_verdict, score_grid, verdict_line
from real import ModelConfig
from real.dp.zero import MAX_INFLIGHT
from real.profile.protocol import (
    GRID_DP_MODES,
    GRID_EXTRA_DP_MODES,
    MODEL_SHAPE,
    dp_buckets,
    dp_config,
    dp_shapes,
    pipeline_config,
    profile_machine,
)

MODEL = ModelConfig(**MODEL_SHAPE)
QUICK = (("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"), (4, 16))
TINY = (("gpipe", "1f1b"), (4,))
DEFAULT_M = (4, 8, 16)


def _args(argv: list[str] | None = None):
    p = OneLineParser(prog="python experiments/validate_sim.py", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v at m = 4, 16")
    p.add_argument("--tiny", action="store_true",
                   help="gpipe and 1f1b at m=4 and the dp rows, 2 rounds of 2 steps, 3 profile reps: checks the "
                        "code path in about two minutes (its figures mean nothing)")
    p.add_argument("--schedules", help="comma-separated pipeline schedules (default: every one the runtime has)")
    p.add_argument("--microbatches", help="comma-separated counts (default 4,8,16; --quick 4,16)")
    p.add_argument("--no-dp", action="store_true", help="leave out the pp=1, dp=2 data-parallel rows")
    p.add_argument("--dp-modes", default=",".join(GRID_DP_MODES), metavar="MODE,MODE",
                   help=f"the data-parallel rows, one per mode (default {','.join(GRID_DP_MODES)}; how "
                        f"{','.join(GRID_EXTRA_DP_MODES)} are scored: docs/validation-protocol.md)")
    p.add_argument("--calibrate-from", default="1f1b", metavar="SCHEDULE", help="default 1f1b")
    add_model_args(p, MODEL)
    p.add_argument("--out", default="out/validate", help="profile, traces and result go here (default out/validate)")
    add_grid_args(p)
    a = p.parse_args(argv)
    if a.tiny:
        a.rounds, a.steps, a.profile_reps = 2, 2, 3
    check_grid_args(p, a, calibrate_with_m=False)
    _check(p, a)
    return a


def _check(p: OneLineParser, a) -> None:
    """Bad input: one line, exit 2, before anything runs."""
    a.grid = _grid(p, a)
    if a.calibrate_from not in a.grid[0]:
        p.error(f"--calibrate-from {a.calibrate_from!r} is not in the grid {','.join(a.grid[0])}; give one of them")
    if a.costs is not None:  # the profile covers every stage count of the grid, or nothing is measured
        from schedules import load_graph
        from sim.costs.cost_file import load_profile

        with errors_to_exit(p):
            counts = sorted({load_graph(s, pp=2, microbatches=m).schedule.num_stages for s in a.grid[0]
                             for m in a.grid[1]})
            for n in counts:
                load_profile(a.costs, n)
    a.dp_modes = [] if a.no_dp else [m for m in a.dp_modes.split(",") if m]
    bad = [m for m in a.dp_modes if m not in GRID_DP_MODES]
    if bad or (not a.no_dp and not a.dp_modes):
        p.error(f"--dp-modes {','.join(bad) or repr('')}: give comma-separated modes of {','.join(GRID_DP_MODES)} "
                "(or --no-dp)")


def _grid(p: OneLineParser, a) -> tuple[list[str], list[int]]:
    from schedules import names
    from schedules.registry import is_user_ref

    scheds, ms = (list(QUICK[0]), list(QUICK[1])) if a.quick else (list(names()), list(DEFAULT_M))
    if a.tiny:
        scheds, ms = list(TINY[0]), list(TINY[1])
    if a.schedules:
        scheds = [s for s in a.schedules.split(",") if s]
    unknown = [s for s in scheds if s not in names() and not is_user_ref(s)]
    if unknown:
        p.error(f"--schedules: unknown {','.join(unknown)}; the runtime has {','.join(names())}, or your own as "
                "FILE.py:NAME")
    if a.microbatches:
        try:
            ms = [int(x) for x in a.microbatches.split(",") if x]
        except ValueError:
            p.error(f"--microbatches {a.microbatches!r}: give comma-separated integers >= 1, e.g. 4,8,16")
    if not ms or min(ms) < 1:
        p.error(f"--microbatches {a.microbatches!r}: give comma-separated integers >= 1, e.g. 4,8,16")
    return scheds, ms


def validate_all(a) -> dict:
    from schedules import load_graph, validate

    load_before = os.getloadavg()
    t_start = time.monotonic()
    scheds, ms = a.grid
    model, mbs = model_from_args(a), a.microbatch_size
    out = Path(a.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    configs = {(s, m): pipeline_config(model, s, m, mbs) for m in ms for s in scheds}
    graphs = {k: validate(load_graph(k[0], pp=2, microbatches=k[1])) for k in configs}
    dp_keys = _dp_keys(a.dp_modes, ms)
    configs.update({k: dp_config(model, "gpipe", k[1], mbs, k[0][4:]) for k in dp_keys})
    graphs.update({k: dp_graph("gpipe", k[0][4:], k[1], dp_buckets(model)) for k in dp_keys})
    stages = sorted({graphs[(s, m)].schedule.num_stages for s in scheds for m in ms})
    guard = profile_guard(a)
    profile = Path(a.costs) if a.costs else profile_machine(model, mbs, stages, a.profile_reps, out / "profile.json",
                                                            **guard)
    dp_profile = (profile_machine(model, mbs, [1], a.profile_reps, out / "profile-dp2.json", dp=2, **guard)
                  if dp_keys else None)
    print(f"profiled ({time.monotonic() - t_start:.0f} s); measuring {len(configs)} configurations "
          f"x {a.rounds} rounds", file=sys.stderr)
    by_key = _measure(configs, a, out)
    cal_key = (a.calibrate_from, ms[len(ms) // 2])
    dp_cal_key = ("dp2-ddp", ms[len(ms) // 2]) if dp_keys else None
    cal = Calibration.of(profile, by_key[cal_key].traces, dp_profile, max_inflight=MAX_INFLIGHT,
                         dp_traces=by_key[dp_cal_key].traces if dp_cal_key else (), dp_shapes=dp_shapes(model))
    if dp_cal_key:  # the data-parallel run's own gap, closed on its per-step overhead (Calibration.closed_on)
        cal = cal.closed_on(graphs[dp_cal_key], by_key[dp_cal_key].step_time)
    rows = grid_rows(by_key, graphs, cal, cal_key, dp_keys, dp_cal_key)
    scores = score_grid(rows)
    verdict = noise_verdict(scores["decomposition"]["noise"], load_before, os.getloadavg(), a.noise_limit,
                            max(r["foreign_cores"] for r in rows))
    return {
        "schedules": rows, **scores, "noise_verdict": verdict,
        "calibrated_from": {"schedule": cal_key[0], "microbatches": cal_key[1], **cal.describe(),
                            "dp_run": list(dp_cal_key) if dp_cal_key else None},
        "grid": {"schedules": scheds, "microbatches": ms, "pp": 2, "dp_pair": sorted({k[0] for k in dp_keys}),
                 "dp_microbatches": sorted({k[1] for k in dp_keys}),
                 "microbatch_size": mbs, "rounds": a.rounds, "steps": a.steps, "warmup": a.warmup,
                 "max_slow": a.max_slow or None,
                 "model": model.to_dict()},
        "profile": str(profile),
        "comm_slowdown": _factor(dp_profile),
        "reduce_hook_ns_per_byte": _hook_ns(dp_profile),
        "seconds": time.monotonic() - t_start,
        "command": _command(),
    }


def _dp_keys(modes: list[str], ms: list[int]) -> list[tuple[str, int]]:
    """The data-parallel rows: every mode at the grid's smallest and middle microbatch counts; ddp at the middle
    one (the data-parallel calibration run, analysis.validation.dp_transfer) whatever the modes."""
    counts = sorted({ms[0], ms[len(ms) // 2]}) if modes else []
    keys = [(f"dp2-{mode}", m) for m in counts for mode in modes]
    mid = ("dp2-ddp", ms[len(ms) // 2])
    return keys if not modes or mid in keys else [*keys, mid]


def _measure(configs: dict, a, out: Path) -> dict:
    """Every configuration measured, one process group per world size (ps: 2 trainers + 1 server, 3 processes;
    its traces under ``traces/world3``), in ``configs``' order."""
    from real.measure import measure_interleaved

    by_key = {}
    for world in sorted({c.world_size for c in configs.values()}):
        keys = [k for k, c in configs.items() if c.world_size == world]
        traces = out / "traces" / ("" if world == 2 else f"world{world}")
        for launch in (1, 2):  # a failed launch is run once more, whole, and said so
            try:
                measured = measure_interleaved([configs[k] for k in keys], rounds=a.rounds, steps=a.steps,
                                               warmup=a.warmup, trace_dir=str(traces), attempts=a.attempts,
                                               max_foreign=a.max_foreign, max_slow=a.max_slow or None,
                                               timeout=a.timeout, on_run=run_progress("grid"))
                break
            except RuntimeError as exc:
                if launch == 2:
                    raise
                # a safety net: the two hangs seen (ranks deciding differently whether to run a config again)
                # are fixed in real.rounds (docs/validation-protocol.md, "A launch that fails")
                print(f"grid: the {world}-process launch failed, running it once more: {exc}", file=sys.stderr)
        by_key.update(zip(keys, measured, strict=True))
    return {k: by_key[k] for k in configs}


def _factor(dp_profile: Path | None) -> float | None:
    from sim.costs.cost_file import load_profile

    return None if dp_profile is None else load_profile(dp_profile, 1).comm_slowdown


def _hook_ns(dp_profile: Path | None) -> float | None:
    from sim.costs.cost_file import load_profile

    return None if dp_profile is None else load_profile(dp_profile, 1).reduce_hook_ns_per_byte


def _command() -> str:
    return "python experiments/validate_sim.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def sections(s: dict) -> list[str]:
    """The results as Markdown blocks: rows, scores, mechanisms, decomposition, the noise verdict."""
    rows = markdown_table(
        ["schedule", "m", "kind", "sample", "predicted ms", "measured ms", "p10-p90 ms", "error", "self-calibrated",
         "profile only", "replay", "from pipeline"],
        [(r["schedule"], r["microbatches"], r["kind"], "in" if r["in_sample"] else "out",
          f"{r['predicted_step_time'] * 1e3:.1f}", f"{r['measured_step_time'] * 1e3:.1f}",
          f"{r['measured_spread'][0] * 1e3:.1f}-{r['measured_spread'][1] * 1e3:.1f}", _pct(r["error"], True),
          _pct(r.get("self_error"), True), _pct(r["profile_error"], True), _pct(r["replay_error"], True),
          _pct(r.get("pipeline_error"), True))
         for r in s["schedules"]])
    kinds = s["by_kind"]
    scores = markdown_table(
        ["rows", "count", "mean abs error", "worst", "Kendall tau_b"],
        [("out-of-sample, calibrated from a trace", len(s["out_of_sample"]), _pct(s["mean_abs_error"]),
          _pct(s["max_abs_error"]), format_tau(s["kendall_tau_b"])),
         *((f"  of which {k}", len(v["rows"]), _pct(v["mean_abs_error"]), _pct(v["max_abs_error"]),
            format_tau(v["kendall_tau_b"])) for k, v in kinds.items()),
         ("out-of-sample, the profile alone", len(s["out_of_sample"]), _pct(s["profile_mean_abs_error"]), "",
          format_tau(s["profile_kendall_tau_b"])),
         ("in-sample: " + ", ".join(s["in_sample"]["rows"]), len(s["in_sample"]["rows"]),
          _pct(s["in_sample"]["mean_abs_error"]), _pct(s["in_sample"]["max_abs_error"]), "")])
    mech = markdown_table(["out-of-sample pipeline rows", "mean abs error"],
                          [(k, _pct(v)) for k, v in s["mechanisms"].items()])
    parts = markdown_table(["out-of-sample pipeline rows, taken apart", "mean abs error"],
                           [(k, _pct(v)) for k, v in s["decomposition"].items()])
    dp = [markdown_table(["out-of-sample data-parallel rows", "mean abs error"],
                         [(k, _pct(v)) for k, v in s["dp_mechanisms"].items()]),
          markdown_table(["out-of-sample data-parallel rows, taken apart", "mean abs error"],
                         [(k, _pct(v)) for k, v in s["dp_decomposition"].items()])] if s["grid"]["dp_pair"] else []
    return [verdict_line(s["noise_verdict"]), rows, scores, f"Worst |replay| error: {_pct(s['max_abs_replay_error'])}.",
            mech, parts, *dp, *_parts_table(s), *_hook_table(s), *_local_sgd_lines(s), *_async_lines(s),
            _slowdown_line(s), *_machine_line(s), _warnings(s),
            f"{s['seconds']:.0f} s."]


def _machine_line(s: dict) -> list[str]:
    """How often the machine itself was slow (real.rounds' probe) and runs were made again (none before the
    probe: a grid written without it)."""
    rows = [r for r in s["schedules"] if "slowdown" in r]
    if not rows:
        return []
    reruns, slow = sum(r.get("reruns", 0) for r in rows), max(r["slowdown"] for r in rows)
    runs = len(rows) * s["grid"]["rounds"]
    return [f"The machine's speed, by a probe timed on each rank before and after every run (real.rounds): "
            f"{reruns} run(s) made again of {runs} kept (other processes' load, or the host slower than its "
            f"fastest by over {_pct(s['grid'].get('max_slow'))}); the slowest kept run's probe: x{slow:.2f}."]


def _parts_table(s: dict) -> list[str]:
    """Each data-parallel row's step taken apart (analysis.validation.dp_transfer.PARTS): measured / predicted (predicted
    from the pipeline run), in ms, the mean traced step."""
    from analysis.validation.dp_transfer import PARTS

    rows = [r for r in s["schedules"] if "parts" in r]
    if not rows:
        return []

    def cell(r: dict, k: str) -> str:
        p = r["parts"]
        return f"{p['measured'][k] * 1e3:.1f} / {p['predicted'][k] * 1e3:.1f} ({p['from_pipeline'][k] * 1e3:.1f})"

    head = "Each data-parallel step taken apart (ms, the mean traced step): measured / predicted (from the pipeline run)"
    return [head + " (docs/validation-protocol.md).",
            markdown_table(["row", "m", "sample", *PARTS, "step"],
                           [(r["schedule"], r["microbatches"], "in" if r["in_sample"] else "out",
                             *(cell(r, k) for k in (*PARTS, "step"))) for r in rows])]


def _hook_table(s: dict) -> list[str]:
    """zero2/zero3's rows taken apart with and without the reduce-scatter hook charged (sim.costs.profiled)."""
    from analysis.validation.dp_transfer import PARTS

    rows = [r for r in s["schedules"] if "without_reduce_hook" in r.get("parts", {})]
    if not rows:
        return []

    def cell(r: dict, k: str) -> str:
        p = r["parts"]
        return f"{p['measured'][k] * 1e3:.1f} / {p['without_reduce_hook'][k] * 1e3:.1f} -> {p['predicted'][k] * 1e3:.1f}"

    head = (f"The reduce-scatter hook of zero2/zero3 (measured by the data-parallel profile: "
            f"{s['reduce_hook_ns_per_byte']:.3f} ns per gradient byte, per bucket per microbatch, on the pass that "
            "completes the bucket), each step taken apart (ms): measured / predicted without the hook -> with it")
    return [head + " (docs/validation-protocol.md).",
            markdown_table(["row", "m", *PARTS, "step"],
                           [(r["schedule"], r["microbatches"], *(cell(r, k) for k in (*PARTS, "step"))) for r in rows])]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _local_sgd_lines(s: dict) -> list[str]:
    """local-sgd's row is scored per step amortized over K (analysis.validation.dp_modes); its two steps apart."""
    return [f"{r['schedule']}: scored on the time per step amortized over K; the plain step predicted "
            f"{_ms(r['predicted_local'])} ms, measured {_ms(r['measured_local'])} ms; the averaging step predicted "
            f"{_ms(r['predicted_averaging'])} ms, measured {_ms(r['measured_averaging'])} ms."
            for r in s["schedules"] if "predicted_local" in r]


def _async_lines(s: dict) -> list[str]:
    """async-ps's row is scored on the time per update (analysis.validation.async_grid)."""
    return [f"{r['schedule']} m={r['microbatches']}: scored on the time per update (dp / the sum of the trainers' "
            f"rates; measured: the trainers' median step), predicted by sim.costs.async_ps's loop over the step at "
            f"staleness {r['staleness']}; its parts' exposed holds what the loop adds to the graph's step; no replay "
            "(the graph's step is one lockstep step, the servers' updates fold pushes of other steps)."
            for r in s["schedules"] if r.get("dp_mode") == "async-ps"]


def _slowdown_line(s: dict) -> str:
    """The measured comm_slowdown the data-parallel rows were predicted with (docs/validation-protocol.md)."""
    factor = s.get("comm_slowdown")
    if factor is None:
        return "No data-parallel profile: compute slowed by concurrent communication not measured."
    line = (f"Compute slowed by concurrent communication (comm_slowdown, measured by the data-parallel profile): "
            f"x{factor:.3f} while a bucket's collective is in flight.")
    run = s["calibrated_from"].get("data_parallel")
    if run:
        line += (f" The data-parallel calibration run ({' m='.join(map(str, s['calibrated_from']['dp_run']))}) measured "
                 f"x{run['comm_slowdown']:.3f}, collectives slowed x{run.get('comm_stall', 1.0):.2f} while their rank "
                 f"computes (comm_stall) and a skew between its replicas of {100 * run.get('skew', 0.0):.1f}% of "
                 f"the busy time (the busier replica's pass time over the mean: x{run['straggler']:.3f}), which "
                 "predict the data-parallel rows (the skew added where the replicas wait for each other: "
                 "analysis.validation.dp_skew).")
    return line


def _warnings(s: dict) -> str:
    warned = s["calibrated_from"]["warnings"]
    return ("Guesses in the cost models (each names its field; docs/validation-protocol.md):\n\n"
            + "\n".join(f"- {w}" for w in warned)) if warned else "No guesses in the cost models (no warnings)."


@guarded
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    a = _args(argv)
    try:
        summary = validate_all(a)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return report_results(a, summary, json_name="validation.json", title="The simulator against real runs",
                          sections=sections(summary), rows=summary["schedules"],
                          scores={"grid/mean_abs_error": summary["mean_abs_error"],
                                  "grid/kendall_tau_b": summary["kendall_tau_b"],
                                  "grid/noise": summary["decomposition"]["noise"]})


if __name__ == "__main__":
    raise SystemExit(main())
