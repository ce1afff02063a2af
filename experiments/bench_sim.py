"""Simulator speed: tasks per second, and how the time grows with the number of tasks.

    python experiments/bench_sim.py [--json] [--reps 3] [--skip-million]

Prints, per case, the lowered graph's size, the median wall time of
lower()+validate() and of simulate() over repetitions, and tasks per second of
simulate() (the figure the design targets: >= 300k tasks/s). The scaling rows
run 1F1B at p=32 with m doubling: a linear simulator keeps tasks/s flat.
Costs: t_f=1.1, t_b=1.7, t_w=0.3, t_comm=0.013, so ranks fall out of lockstep
and few tasks share an end time (the harder case for the event queue).
"""

from __future__ import annotations

import json
import platform
import statistics
import time

from analysis.cli.common import OneLineParser, positive_int
from schedules import build, lower, validate
from sim import UniformCosts, simulate

COSTS = UniformCosts(tf=1.1, tb=1.7, tw=0.3, tcomm=0.013)


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
    args = ap.parse_args()
    cases = [("1f1b", 32, 256, None), ("interleaved-1f1b", 32, 256, 2)]
    cases += [("1f1b", 32, m, None) for m in (64, 128, 512, 1024)]
    if not args.skip_million:
        cases.append(("1f1b", 64, 2560, None))  # 972,800 tasks
    rows = [measure(n, p, m, v, 1 if m >= 2560 else args.reps) for n, p, m, v in cases]
    if args.json:
        print(json.dumps({"machine": platform.platform(), "python": platform.python_version(), "rows": rows}))
        return
    print(f"{'schedule':<18}{'p':>4}{'m':>6}{'v':>3}{'tasks':>10}{'lower+validate s':>18}{'simulate s':>12}{'tasks/s':>11}")
    for r in rows:
        print(f"{r['schedule']:<18}{r['pp']:>4}{r['microbatches']:>6}{r['chunks']:>3}{r['tasks']:>10,}"
              f"{r['lower_validate_s']:>18.2f}{r['simulate_s']:>12.3f}{r['tasks_per_s']:>11,.0f}")


if __name__ == "__main__":
    main()
