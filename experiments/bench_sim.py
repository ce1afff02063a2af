"""Simulator speed: tasks per second, how the time grows with the number of tasks, and that it does not grow with dp.

    python experiments/bench_sim.py [--json] [--reps 3] [--skip-million] [--dp 8,...] [--markdown docs/results/bench_sim.md]

Prints, per case, the lowered graph's size, the median wall time of
lower()+validate() and of simulate() over repetitions, and tasks per second of
simulate() (the figure the design targets: >= 300k tasks/s). The scaling rows
run 1F1B at p=32 with m doubling: a linear simulator keeps tasks/s flat.
Costs: t_f=1.1, t_b=1.7, t_w=0.3, t_comm=0.013, so ranks fall out of lockstep
and few tasks share an end time (the harder case for the event queue).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time

from analysis.cli.common import OneLineParser, errors_to_exit, int_list, positive_int
from analysis.results_page import check_page, table, write_page
from schedules import build, lower, validate
from sim import ParallelConfig, Study, TransformerCosts, UniformCosts, cluster_preset, model_preset, simulate
from sim.plan.study import build_graph

COSTS = UniformCosts(tf=1.1, tb=1.7, tw=0.3, tcomm=0.013)
# A fixed layout simulated at growing dp (one replica is simulated; the others only price its collectives): Llama 3
# 405B, tp 8 with sp, pp 16, 16 microbatches of one sequence, 1F1B, on as many DGX H100 nodes as tp x pp x dp takes.
DP_LAYOUT = {"model": "llama3-405b", "tp": 8, "pp": 16, "microbatches": 16, "schedule": "1f1b"}
DP_MODES = (("zero1", "bf16"), ("zero2", "fp32"))
DP_DEGREES = (8, 64, 512, 4096, 8192)


def measure_dp(dp: int, mode: str, reduce_dtype: str, reps: int) -> dict:
    """simulate() of DP_LAYOUT at ``dp`` replicas (graph built and costs made outside the timing)."""
    lay = DP_LAYOUT
    cluster = cluster_preset(f"dgx-h100:{lay['tp'] * lay['pp'] * dp // 8}")
    costs = TransformerCosts(model=model_preset(lay["model"]), cluster=cluster, reduce_dtype=reduce_dtype,
                             parallel=ParallelConfig(pp=lay["pp"], dp=dp, tp=lay["tp"], sp=True, dp_mode=mode))
    graph = build_graph(Study(schedule=lay["schedule"], microbatches=lay["microbatches"], costs=costs))
    graph.successors  # noqa: B018 - built once per graph, part of preparing it
    times = []
    for _ in range(reps):
        fresh = dataclasses.replace(costs)  # nothing the previous repetition learnt (the dp groups) is reused
        t0 = time.perf_counter()
        result = simulate(graph, fresh, check=False)
        times.append(time.perf_counter() - t0)
    return {"dp": dp, "dp_mode": mode, "reduce_dtype": reduce_dtype, "devices": cluster.num_devices,
            "tasks": len(graph), "simulate_s": statistics.median(times), "step_s": max(result.end)}


def measure(name: str, pp: int, m: int, chunks: int | None, reps: int) -> dict:
    t0 = time.perf_counter()
    graph = validate(lower(build(name, pp=pp, microbatches=m, chunks=chunks)))
    t_lower = time.perf_counter() - t0
    graph.successors  # noqa: B018 - built once per graph, part of preparing it
    sim_times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        result = simulate(graph, COSTS, check=False)
        sim_times.append(time.perf_counter() - t0)
    t_sim = statistics.median(sim_times)
    return {
        "schedule": name, "pp": pp, "microbatches": m, "chunks": chunks or 1, "tasks": len(graph),
        "lower_validate_s": t_lower, "simulate_s": t_sim, "tasks_per_s": len(graph) / t_sim,
        "makespan": result.makespan,
    }


def main() -> None:
    ap = OneLineParser(prog="python experiments/bench_sim.py", description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=positive_int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-million", action="store_true", help="leave out the ~1M-task graph")
    ap.add_argument("--dp", type=int_list, default=DP_DEGREES, metavar="D,...",
                    help=f"replicas of the fixed layout timed (default {','.join(map(str, DP_DEGREES))})")
    ap.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/bench_sim.md)")
    args = ap.parse_args()
    if args.markdown:
        with errors_to_exit():
            check_page(args.markdown)
    cases = [("1f1b", 32, 256, None), ("interleaved-1f1b", 32, 256, 2)]
    cases += [("1f1b", 32, m, None) for m in (64, 128, 512, 1024)]
    if not args.skip_million:
        cases.append(("1f1b", 64, 2560, None))  # 972,800 tasks
    rows = [measure(n, p, m, v, 1 if m >= 2560 else args.reps) for n, p, m, v in cases]
    dp_rows = [measure_dp(d, mode, rd, args.reps) for mode, rd in DP_MODES for d in args.dp]
    if args.markdown:
        print(f"wrote {write_page(args.markdown, 'Simulator speed', _page(rows, dp_rows, args))}", file=sys.stderr)
    if args.json:
        print(json.dumps({"machine": platform.platform(), "python": platform.python_version(), "rows": rows,
                          "dp_rows": dp_rows}))
        return
    print(f"{'schedule':<18}{'p':>4}{'m':>6}{'v':>3}{'tasks':>10}{'lower+validate s':>18}{'simulate s':>12}{'tasks/s':>11}")
    for r in rows:
        print(f"{r['schedule']:<18}{r['pp']:>4}{r['microbatches']:>6}{r['chunks']:>3}{r['tasks']:>10,}"
              f"{r['lower_validate_s']:>18.2f}{r['simulate_s']:>12.3f}{r['tasks_per_s']:>11,.0f}")
    print(f"\n{_dp_title()}\n{'dp':>6}{'mode':>7}{'reduce':>8}{'devices':>10}{'tasks':>8}{'simulate s':>12}"
          f"{'vs dp ' + str(args.dp[0]):>10}{'step s':>9}")
    for r in dp_rows:
        print(f"{r['dp']:>6}{r['dp_mode']:>7}{r['reduce_dtype']:>8}{r['devices']:>10,}{r['tasks']:>8,}"
              f"{r['simulate_s']:>12.3f}{_ratio(r, dp_rows):>10.2f}{r['step_s']:>9.3f}")


def _dp_title() -> str:
    lay = DP_LAYOUT
    return (f"{lay['model']}, tp {lay['tp']} + sp, pp {lay['pp']}, {lay['schedule']}, m {lay['microbatches']}x1, "
            "one replica simulated, against dp:")


def _ratio(row: dict, rows: list[dict]) -> float:
    """simulate() time over that of the smallest dp of the same mode."""
    first = next(r for r in rows if (r["dp_mode"], r["reduce_dtype"]) == (row["dp_mode"], row["reduce_dtype"]))
    return row["simulate_s"] / first["simulate_s"]


def _page(rows: list[dict], dp_rows: list[dict], args: argparse.Namespace) -> str:
    dp_cells = [[f"{r['dp']:,}", r["dp_mode"], r["reduce_dtype"], f"{r['devices']:,}", f"{r['tasks']:,}",
                 f"{r['simulate_s']:.3f}", f"{_ratio(r, dp_rows):.2f}", f"{r['step_s']:.3f}"] for r in dp_rows]
    cells = [[r["schedule"], r["pp"], r["microbatches"], r["chunks"], f"{r['tasks']:,}", f"{r['lower_validate_s']:.2f}",
              f"{r['simulate_s']:.3f}", f"{r['tasks_per_s'] / 1000:,.0f}k"] for r in rows]
    reduced = " The ~1M-task row is left out (`--skip-million`)." if args.skip_million else ""
    return f"""\
`simulate()` on graphs already lowered and validated, median of {args.reps} repetitions (one for graphs of
~1M tasks); costs tf=1.1, tb=1.7, tw=0.3, tcomm=0.013, so ranks drift out of lockstep. lower+validate is
timed once and is not part of tasks/s. The design's target: at least 300k tasks/s, flat in the number of
tasks (a linear simulator).{reduced} Timings move with the machine's load (see the load average above):
compare figures taken in one run.

{table(["schedule", "p", "m", "v", "tasks", "lower+validate (s)", "simulate (s)", "tasks/s"], cells)}

**Against dp** ({_dp_title()}): `simulate()` of one lowered graph under the costs of each dp, median of
{args.reps}, the costs made afresh for each repetition. The goal: flat (within 10%) from dp 8 to 8,192; the step
grows with dp (the collectives span more nodes), the work of simulating it should not.

{table(["dp", "dp mode", "reduce", "devices", "tasks", "simulate (s)", f"vs dp {args.dp[0]}", "step (s)"], dp_cells)}
"""


if __name__ == "__main__":
    main()
