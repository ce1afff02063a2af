"""Predict published training runs with the simulator: per row the published figure, its source, the settings
(assumed ones marked), the prediction and its error; fit and held-out rows summarised apart.

    python experiments/published.py --suite megatron-2022            # Korthikanti et al. 2022 (A100)
    python experiments/published.py --suite all --json                # exactly one JSON object
    python experiments/published.py --suite all --markdown docs/results/published.md
    python experiments/published.py --fit                             # refit the A100 GEMM curve
    python experiments/published.py --suite all --breakdown --markdown docs/results/published_breakdown.md

The data and the scoring live in sim.published; this script only parses flags.
"""

from __future__ import annotations

import argparse
import json
import sys

from analysis.cli.common import OneLineParser, errors_to_exit
from analysis.cli.progress import Progress
from analysis.results_page import check_page, write_page
from sim.costs.devices import DEVICE_MODELS
from sim.published import (
    FIT_EVALUATIONS,
    SUITES,
    breakdown,
    breakdown_markdown,
    fit_gemm_efficiency,
    memory_rows,
    score,
    suite_runs,
    summarize,
)
from sim.published.report import markdown, text


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = OneLineParser(prog="python experiments/published.py", description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="megatron-2022", choices=(*SUITES, "all"), help="which table (default megatron-2022)")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--markdown", metavar="FILE.md", help="also write the tables as Markdown (machine, date, command)")
    ap.add_argument("--fit", action="store_true", help="refit the A100 GEMM curve on the rows marked fit")
    ap.add_argument("--breakdown", action="store_true",
                    help="where each row's error lies instead of the scores: the step taken apart, each mechanism's share")
    args = ap.parse_args(argv)
    if args.markdown:
        with errors_to_exit(ap):
            check_page(args.markdown)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.fit:
        e = fit_gemm_efficiency(progress=Progress(FIT_EVALUATIONS, "fit", every=2.0).advance)
        print(f"peak_fraction={e.peak_fraction} half_flops={e.half_flops:.3g} ({e.source})")
        return 0
    if args.breakdown:
        page = breakdown_markdown(breakdown(suite_runs(args.suite)))
        if args.markdown:
            write_page(args.markdown, "Published training runs: where the error lies", page,
                       argv=None if argv is None else ["experiments/published.py", *argv])
        print(page)
        return 0
    rows = score(suite_runs(args.suite))
    memory = memory_rows() if args.suite in ("megatron-2022", "all") else []
    if args.markdown:
        write_page(args.markdown, "Published training runs: predicted against published", markdown(rows, memory),
                   argv=None if argv is None else ["experiments/published.py", *argv])
    if args.json:
        a100 = DEVICE_MODELS["A100"].gemm
        print(json.dumps({"suite": args.suite, "rows": rows, "summary": summarize(rows), "activation_memory": memory,
                          "calibration": {"device": "A100", "peak_fraction": a100.peak_fraction,
                                          "half_flops": a100.half_flops, "source": a100.source}}))
        return 0
    print(text(rows, memory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
