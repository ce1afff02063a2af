"""CP-SAT against HiGHS for zb-auto's exact refinement, on rows of the zero-bubble paper's Table 5.

The same problem three ways, from the same heuristic seed, at the same time
limit: CP-SAT (:func:`schedules.library.zb_exact.refine`, 8 workers, the seed as a
hint: what zb-auto uses), HiGHS through ``scipy.optimize.milp`` (no starting
solution) and HiGHS through highspy (the seed as its first incumbent), both on
:mod:`schedules.library.zb_milp`'s big-M formulation. Printed per row and solver: the
bubble rate (the paper's definition) of what came back (the seed's if nothing
better), and the wall time. Needs the ``milp`` extra (scipy, highspy).

Usage: python experiments/zb_solvers.py [--time-limit 10] [--rows 0 1 3 6] [--markdown docs/results/zb_solvers.md]
(row numbers of sim.published.zero_bubble.TABLE5)
"""

from __future__ import annotations

import argparse
import sys
import time

from analysis.cli.common import OneLineParser, errors_to_exit, nonnegative_float, nonnegative_int
from analysis.results_page import check_page, table, write_page
from schedules import build
from schedules.library.zb_exact import refine
from schedules.library.zb_milp import refine_milp
from schedules.timing import evaluate
from sim.published.zero_bubble import TABLE5

SOLVERS = {
    "cp-sat": lambda seed, t, limit, secs: refine(seed, *t, 0.0, limit, secs),
    "highs (scipy)": lambda seed, t, limit, secs: refine_milp(seed, *t, 0.0, limit, secs, solver="scipy"),
    "highs (highspy, seeded)": lambda seed, t, limit, secs: refine_milp(seed, *t, 0.0, limit, secs,
                                                                      solver="highspy"),
}


def main() -> None:
    ap = OneLineParser(prog="python experiments/zb_solvers.py", description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=nonnegative_float, default=10.0)
    ap.add_argument("--rows", type=nonnegative_int, nargs="*", default=[0, 1, 3, 6], choices=range(len(TABLE5)),
                    metavar="ROW", help=f"rows of the table, 0..{len(TABLE5) - 1}")
    ap.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/zb_solvers.md)")
    args = ap.parse_args()
    if args.markdown:
        with errors_to_exit():
            check_page(args.markdown)
    cells = []
    print(f"{'model':>6} {'p':>3} {'m':>4}  {'seed':>6}  {'solver':<24} {'bubble':>7}  {'paper':>6}  seconds")
    for row in args.rows:
        model, p, m, tf, tb, tw, tc, paper = TABLE5[row]
        t, limit = (tf, tb, tw, tc), 2.0 * p
        seed = build("zb-auto", pp=p, microbatches=m, tf=tf, tb=tb, tw=tw, tcomm=tc, mw=0.0, mem_limit=limit,
                     time_limit=0)  # the paper's accounting (an I frees its microbatch), as the solvers take it
        base = evaluate(seed, *t).span_bubble
        for name, solve in SOLVERS.items():
            t0 = time.perf_counter()
            out = solve(seed, t, limit, args.time_limit)
            secs = time.perf_counter() - t0
            got = base
            if out is not None:
                e = evaluate(out, *t, 0.0)
                if max(e.peaks) <= limit + 1e-9 and e.makespan <= evaluate(seed, *t).makespan * (1 + 1e-12):
                    got = min(base, e.span_bubble)
            found = "" if out is not None else "  (no solution)"
            print(f"{model:>6} {p:>3} {m:>4}  {base:6.2%}  {name:<24} {got:7.2%}  {paper:6.2%}  {secs:6.1f}{found}",
                  flush=True)
            cells.append([f"{model}, {p}, {m}", f"{base:.2%}", name, f"{got:.2%}" + (" (seed)" if got == base else ""),
                          "no" if out is None else "yes", f"{paper:.2%}", f"{secs:.1f}"])
    if args.markdown:
        print(f"wrote {write_page(args.markdown, 'CP-SAT against HiGHS for zb-auto', _page(cells, args))}",
              file=sys.stderr)


def _page(cells: list[list[str]], args: argparse.Namespace) -> str:
    return f"""\
zb-auto's exact refinement (minimise the largest span at no larger makespan, memory limit 2p M_B) on rows of
the zero-bubble paper's Table 5, three ways from the same heuristic seed at a {args.time_limit:g} s limit: CP-SAT
(`schedules.library.zb_exact.refine`, the seed as a hint: what zb-auto uses), HiGHS through `scipy.optimize.milp` (no
starting solution) and HiGHS through highspy (the seed as its first incumbent), both on `schedules/library/zb_milp.py`'s
big-M MILP. "bubble" is the paper's rate (1 - busy / largest span) of what came back, the seed's if nothing
better ("(seed)"); "solution" says whether the solver returned a schedule at all.

{table(["model, p, m", "seed", "solver", "bubble", "solution", "paper ZB-2p", "seconds"], cells,
       right=[False, True, False, True, False, True, True])}
"""


if __name__ == "__main__":
    main()
