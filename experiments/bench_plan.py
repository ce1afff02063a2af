"""Planner and lowering speed: candidates planned per second, and lower+validate tasks per second.

    python experiments/bench_plan.py [--workers 2] [--json] [--skip-405b] [--check] [--exact]
                                     [--markdown docs/results/bench_plan.md]

Plan cases (``sim.plan.search.plan``, all cores unless --workers): Llama 3 405B on 64
and on 1,024 DGX H100 nodes (global batch 2048 x 8192 tokens, the flagship
questions) and GPT 1.5B on one node (batch 64). Goal: each flagship question in
at most 60 s on 2 cores. ``--check`` simulates every configuration the search
simulated (its finalists) again, whole, and says whether that top five is the
plan's; the plans extend long steps from their steady phase as ``schedlab plan`` does
(:mod:`sim.plan.extrapolate`), ``--exact`` simulates every finalist whole.

Lowering: lower()+validate() of large graphs, the fast paths against the
checked paths (the same code with the fast paths switched off, in the same
run), median of --reps. Goal: >= 300,000 tasks/s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from unittest import mock

from analysis.cli.common import OneLineParser, errors_to_exit, positive_int
from analysis.results_page import check_page, table, write_page
from schedules import build, check, lower, validate
from schedules.lower import _GraphBuilder
from sim.costs.cluster import cluster_preset
from sim.costs.transformer import model_preset
from sim.plan.against import simulate_layout
from sim.plan.search import plan
from sim.plan.space import PlanSpace

# The flagship questions (docs/planner.md): Llama 3 405B on 64 and on 1,024 DGX H100 nodes; and a small one.
PLANS = [("llama3-405b", "dgx-h100:64", 2048, 8192), ("llama3-405b", "dgx-h100:1024", 2048, 8192),
         ("gpt-1.5b", "dgx-h100:1", 64, 1024)]
GRAPHS = [("1f1b", 32, 256, 1), ("interleaved-1f1b", 32, 256, 2), ("zb-v", 16, 256, 2), ("dualpipe-v", 16, 256, 2)]


def bench_plan(name: str, cluster: str, batch: int, seq: int, workers: int | None, extrapolate: bool = True,
               check: bool = False) -> dict:
    """One question planned (wall time); with ``check``, every configuration the search simulated (its finalists)
    simulated again whole and ranked, and that top five set against the plan's."""
    space = PlanSpace(model=dataclasses.replace(model_preset(name), seq_len=seq), cluster=cluster_preset(cluster),
                      global_batch=batch)
    t0 = time.perf_counter()
    r = plan(space, top=5, workers=workers, extrapolate=extrapolate)
    wall = time.perf_counter() - t0
    best = r.top[0]
    row = {"model": name, "cluster": cluster, "global_batch": batch, "seq_len": seq, "candidates": r.candidates,
           "feasible": r.feasible, "simulated": r.simulated, "seconds": wall, "candidates_per_s": r.candidates / wall,
           "best": best.config.label(), "best_step_time": best.step_time, "best_mfu": best.mfu,
           "extrapolated": sum(1 for e in r.entries if e.extrapolated_from), "top5_agrees": None}
    if check:
        whole = sorted((simulate_layout(e.config, space).step_time, e.config.label(), e.step_time)
                       for e in r.entries if e.peak_memory_bytes <= space.capacity)
        row["top5_agrees"] = [label for _, label, _ in whole[:5]] == [e.config.label() for e in r.top[:5]]
        # the plan's step against the whole simulation's, over every finalist (extended ones are not exact)
        row["worst_step_error"] = max(abs(p - w) / w for w, _, p in whole)
    return row


def _lower_validate(sched) -> int:
    return len(validate(lower(sched)))


def bench_lower(name: str, pp: int, m: int, v: int, reps: int) -> dict:
    sched = build(name, pp=pp, microbatches=m, chunks=v)
    fast, slow = [], []
    for _ in range(reps):  # alternate, so a passing load hits both alike
        t0 = time.perf_counter()
        n = _lower_validate(sched)
        fast.append(time.perf_counter() - t0)
        with mock.patch.object(check, "_valid_fast", lambda s: False), \
             mock.patch.object(_GraphBuilder, "_build_fast", lambda self: None):
            t0 = time.perf_counter()
            _lower_validate(sched)
            slow.append(time.perf_counter() - t0)
    f, s = statistics.median(fast), statistics.median(slow)
    return {"schedule": name, "pp": pp, "microbatches": m, "chunks": v, "tasks": n, "fast_s": f, "checked_s": s,
            "fast_tasks_per_s": n / f, "checked_tasks_per_s": n / s, "speedup": s / f}


def main() -> None:
    ap = OneLineParser(prog="python experiments/bench_plan.py", description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=positive_int, default=None)
    ap.add_argument("--reps", type=positive_int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-405b", action="store_true")
    ap.add_argument("--exact", action="store_true", help="simulate every finalist's whole step (schedlab plan --exact)")
    ap.add_argument("--check", action="store_true",
                    help="simulate every configuration the plan simulated again, whole, and compare the top five")
    ap.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/bench_plan.md)")
    args = ap.parse_args()
    if args.markdown:
        with errors_to_exit():
            check_page(args.markdown)
    lowering = [bench_lower(*g, args.reps) for g in GRAPHS]
    plans = [bench_plan(*p, args.workers, not args.exact, args.check) for p in PLANS
             if not (args.skip_405b and p[0] == "llama3-405b")]
    if args.markdown:
        print(f"wrote {write_page(args.markdown, 'Planner and lowering speed', _page(lowering, plans, args))}",
              file=sys.stderr)
    if args.json:
        print(json.dumps({"machine": platform.platform(), "python": platform.python_version(), "lowering": lowering,
                          "plans": plans}))
        return
    print(f"{'schedule':<18}{'p':>4}{'m':>5}{'v':>3}{'tasks':>9}{'fast tasks/s':>14}{'checked tasks/s':>17}{'speedup':>9}")
    for r in lowering:
        print(f"{r['schedule']:<18}{r['pp']:>4}{r['microbatches']:>5}{r['chunks']:>3}{r['tasks']:>9,}"
              f"{r['fast_tasks_per_s']:>14,.0f}{r['checked_tasks_per_s']:>17,.0f}{r['speedup']:>9.2f}")
    print()
    for r in plans:
        print(f"{r['model']} on {r['cluster']} (batch {r['global_batch']} x {r['seq_len']}): {r['candidates']:,} "
              f"candidates, {r['feasible']:,} fit, {r['simulated']} simulated in {r['seconds']:.1f} s "
              f"({r['candidates_per_s']:,.0f} candidates/s); best {r['best']}: {r['best_step_time']:.3f} s, "
              f"MFU {r['best_mfu']:.1%}; top 5 against whole simulations: {_agrees(r)}")


def _agrees(r: dict) -> str:
    if r["top5_agrees"] is None:
        return "not checked"
    return (f"{'the same' if r['top5_agrees'] else 'DIFFERENT'} (steps within {r['worst_step_error']:.2%} of the "
            "whole simulations)")


def _page(lowering: list[dict], plans: list[dict], args: argparse.Namespace) -> str:
    low = [[r["schedule"], r["pp"], r["microbatches"], r["chunks"], f"{r['tasks']:,}", f"{r['fast_tasks_per_s']:,.0f}",
            f"{r['checked_tasks_per_s']:,.0f}", f"{r['speedup']:.2f}"] for r in lowering]
    pl = [[f"{r['model']} on {r['cluster']}, batch {r['global_batch']} x {r['seq_len']}", f"{r['candidates']:,}",
           f"{r['feasible']:,}", r["simulated"], f"{r['seconds']:.1f}", f"{r['candidates_per_s']:,.0f}",
           f"{r['best']}: {r['best_step_time']:.3f} s, MFU {r['best_mfu']:.1%}", _agrees(r)] for r in plans]
    reduced = (" **A reduced run**: the Llama 3 405B case is left out (`--skip-405b`); the full page comes from the "
               "same command without that flag.") if args.skip_405b else ""
    workers = args.workers if args.workers is not None else "all cores"
    return f"""\
**Planning** (`sim.plan.search.plan`, top 5, workers: {workers}{", --exact" if args.exact else ", long steps extended from their steady phase"}). Goal:
each Llama 3 405B question in at most 60 s on 2 cores. "top 5 (--check)": every configuration the search
simulated, simulated again whole and ranked, against the plan's top five, and the largest difference of a
finalist's planned step from its whole simulation.{reduced}

{table(["case", "candidates", "fit in memory", "simulated", "seconds", "candidates/s", "best", "top 5 (--check)"], pl)}

**Lowering and validation** (`lower()` + `validate()`), median of {args.reps} repetitions: the fast paths
against the same code with them switched off (the checked paths), alternating in one run. Goal: at least
300,000 tasks/s. Timings move with the machine's load (see the load average above): compare figures taken
in one run.

{table(["schedule", "p", "m", "v", "tasks", "fast paths (tasks/s)", "checked paths (tasks/s)", "speedup"], low)}
"""


if __name__ == "__main__":
    main()
