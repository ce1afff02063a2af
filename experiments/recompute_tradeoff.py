"""Recomputation: step time against peak activations, per schedule (uniform costs, tf=tb=tw=1).

Rows: no recomputation; R right before every backward (``--recompute full``); the recompute-in-the-bubbles
pass (after Mario, PPoPP 2025) at memory limits of 1, 2 and 3 M_B.

Usage: python experiments/recompute_tradeoff.py [--pp 4] [--microbatches 8]
"""

from __future__ import annotations

import argparse

from schedules import build, lower
from schedules.recompute import recompute_full, recompute_in_bubbles
from sim import UniformCosts, simulate

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2), ("v-half", 2),
             ("v-min", 2), ("dualpipe-v", 2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    args = ap.parse_args()
    costs = UniformCosts()
    print(f"{'schedule':<18} {'none':>11} {'full':>11} {'bubbles@1':>11} {'bubbles@2':>11} {'bubbles@3':>11}"
          "   (makespan/peak M_B)")
    for name, v in SCHEDULES:
        try:
            base = build(name, pp=args.pp, microbatches=args.microbatches, chunks=v)
        except Exception as exc:  # a shape this schedule does not take
            print(f"{name:<18} skipped: {exc}")
            continue
        cells = []
        for s in (base, recompute_full(base), *(recompute_in_bubbles(base, limit) for limit in (1.0, 2.0, 3.0))):
            r = simulate(lower(s), costs)
            cells.append(f"{r.makespan:g}/{r.peak_activations:g}")
        print(f"{name:<18} " + " ".join(f"{c:>11}" for c in cells))


if __name__ == "__main__":
    main()
