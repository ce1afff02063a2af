"""zb-auto against the zero-bubble paper's Table 5 (ZB-2p, memory limit 2p M_B).

Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024: Table 9 gives the
profiled pass times (ms) of every configuration; Table 5 the bubble rate
(cost - m (T_F + T_B + T_W)) / cost, cost the largest span of a stage, of the
schedules those times give. Our simulator reproduces the paper's 1F1B, ZB-H1
and ZB-H2 columns of the p=8 rows from these times to all four printed digits
(tests/test_zb_table5.py), so the model is the paper's.

The last column is the exact refinement's status (optimal, feasible, no solution, timed out, seed optimal;
:mod:`schedules.zb_auto`), ", kept" when its schedule beat the heuristic's. The rows live in
:mod:`schedules.zb_paper`.

Usage: python experiments/zb_table5.py [--time-limit S] [--pp P ...]   (one line per configuration; --pp: only
those rows)
"""

from __future__ import annotations

import argparse
import time

from schedules.zb_paper import TABLE5, zb2p, zb2p_refined


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--pp", type=int, nargs="*", help="only the rows with these p (default: all)")
    args = ap.parse_args()
    print(f"{'model':>6} {'p':>3} {'m':>4}  {'heuristic':>9}  {'zb-auto':>8}  {'paper':>6}  {'diff pp':>7}  seconds  refinement")
    for model, p, m, tf, tb, tw, tc, paper in TABLE5:
        if args.pp and p not in args.pp:
            continue
        heur = zb2p(p, m, tf, tb, tw, tc, 0)
        t0 = time.perf_counter()
        ours, status, kept = zb2p_refined(p, m, tf, tb, tw, tc, args.time_limit)
        secs = time.perf_counter() - t0
        print(f"{model:>6} {p:>3} {m:>4}  {heur:9.2%}  {ours:8.2%}  {paper:6.2%}  {100 * (ours - paper):+7.2f}  "
              f"{secs:7.1f}  {status}{', kept' if kept else ''}", flush=True)


if __name__ == "__main__":
    main()
