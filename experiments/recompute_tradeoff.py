"""Recomputation: step time against peak activations, per schedule (uniform costs, tf=tb=tw=1).

Rows: no recomputation; R right before every backward (``--recompute full``); the recompute-in-the-bubbles
pass (after Mario, PPoPP 2025: drop the R's the limit does not need, move the rest into idle time) at
memory limits of 1, 2 and 3 M_B (:func:`sim.plan.sweep.recompute_tradeoff`, what the report shows).

Usage: python experiments/recompute_tradeoff.py [--pp 4] [--microbatches 8] [--plot docs/recompute-tradeoff.png]
       [--markdown docs/results/recompute_tradeoff.md]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit, positive_int
from analysis.results_page import check_page, table, write_page
from schedules import ScheduleError
from sim.plan.sweep import recompute_tradeoff

SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "v-half", "v-min", "dualpipe-v"]
LIMITS = (1.0, 2.0, 3.0)


def main() -> None:
    ap = OneLineParser(prog="python experiments/recompute_tradeoff.py", description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=positive_int, default=4)
    ap.add_argument("--microbatches", type=positive_int, default=8)
    ap.add_argument("--plot", metavar="FILE.png", help="also draw the trade-off (the report's figure)")
    ap.add_argument("--markdown", metavar="PAGE.md",
                    help="also write the results page (docs/results/recompute_tradeoff.md)")
    args = ap.parse_args()
    if args.plot:
        from analysis.timeline import check_figure_path

        with errors_to_exit(ap):
            check_figure_path(args.plot)
    if args.markdown:
        with errors_to_exit(ap):
            check_page(args.markdown)
    points = []
    for name in SCHEDULES:
        try:
            points += recompute_tradeoff([name], pp=args.pp, microbatches=args.microbatches, limits=LIMITS)
        except ScheduleError as exc:  # a shape this schedule does not take
            print(f"{name:<18} skipped: {exc}")
    labels = list(dict.fromkeys(pt.label for pt in points))
    print(f"{'schedule':<18} " + " ".join(f"{x:>11}" for x in labels) + "   (makespan/peak M_B)")
    for name in dict.fromkeys(pt.schedule for pt in points):
        cells = [f"{pt.makespan:g}/{pt.peak_activations:g}" for pt in points if pt.schedule == name]
        print(f"{name:<18} " + " ".join(f"{c:>11}" for c in cells))
    png = None
    if args.plot:
        from analysis.report import plot_recompute_tradeoff

        png = plot_recompute_tradeoff(points, Path(args.plot))
        print(f"wrote {png}")
    if args.markdown:
        print(f"wrote {write_page(args.markdown, 'Recomputation: step time against memory', _page(points, args, png))}",
              file=sys.stderr)


def _page(points: list, args: argparse.Namespace, png: Path | None) -> str:
    labels = list(dict.fromkeys(pt.label for pt in points))
    names = list(dict.fromkeys(pt.schedule for pt in points))
    cells = [[name, *(f"{pt.makespan:g} / {pt.peak_activations:g}" for pt in points if pt.schedule == name)]
             for name in names]
    figure = ""
    if png is not None:
        rel = os.path.relpath(Path(png).resolve(), Path(args.markdown).resolve().parent)
        figure = f"\n![step time against peak activations: none, full, bubbles at 1, 2, 3 M_B]({rel})\n"
    return f"""\
Uniform costs tf = tb = tw = 1, tcomm = 0, at p={args.pp}, m={args.microbatches} (interleaved schedules at
their default chunks). Each cell is the step (makespan) / the largest peak of activations over ranks (M_B),
counted as the runtime holds them (the default: an activation lives until its W, so an R before an I whose W
is deferred saves nothing until that W). "full": an R right before every backward; "bubbles@L": the recompute-in-the-bubbles pass within L M_B per
rank (drop the R's the limit does not need, move the rest into earlier idle time), as
`sim.plan.sweep.recompute_tradeoff` computes for the report.

{table([f"p={args.pp}, m={args.microbatches}", *labels], cells)}
{figure}"""


if __name__ == "__main__":
    main()
