"""Several runs of the validation grid side by side: which data-parallel rows stay within a bound on every run.

    python experiments/grid_runs.py RUN.json RUN.json [RUN.json ...] [--bound 0.10] [--kind pipeline] [--markdown PATH.md]

Each RUN.json is the ``validation.json`` of one ``experiments/validate_sim.py`` run (``--out`` DIR), the runs
taken one after the other on the same code. Prints, per data-parallel row (``--kind pipeline``: per pipeline row), its error on each run, whether it is
within ``--bound`` on all of them, and for the run where it is worst the part of the step whose measured and
predicted times differ most (analysis.validation.grid_runs). ``--markdown`` writes the same as a results page.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from analysis.cli.common import OneLineParser
from analysis.validation.grid_runs import KINDS, repeat_rows, run_summary


def _args(argv: list[str] | None = None):
    p = OneLineParser(prog="python experiments/grid_runs.py", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="RUN.json", help="validate_sim.py's validation.json, one per run")
    p.add_argument("--bound", type=float, default=0.10, help="the bound on |error| (default 0.10)")
    p.add_argument("--markdown", metavar="PATH.md", help="write the table as a results page")
    p.add_argument("--kind", default="data-parallel", choices=KINDS, help="which rows (default data-parallel)")
    a = p.parse_args(argv)
    if not 0 < a.bound < 1:
        p.error(f"--bound {a.bound}: give a fraction between 0 and 1, e.g. 0.10")
    if len(a.runs) < 2:
        p.error(f"{len(a.runs)} run given: compare at least 2 runs of the grid")
    a.data = []
    for path in a.runs:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            p.error(f"{path!r}: not a readable validation JSON ({type(exc).__name__}); give validate_sim.py's "
                    "--out DIR/validation.json")
        if not isinstance(data, dict) or not isinstance(data.get("schedules"), list):
            p.error(f"{path!r}: has no 'schedules' rows; give validate_sim.py's --out DIR/validation.json")
        a.data.append(data)
    return a


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def body(paths: list[str], runs: list[dict], bound: float, kind: str = "data-parallel") -> str:
    rows = repeat_rows(runs, bound, kind)
    lines = ["| run | file | its command | noise verdict | pipeline rows, mean abs error | data-parallel rows, mean abs "
             "error |", "|---:|---|---|---|---:|---:|"]
    for i, (path, run) in enumerate(zip(paths, runs, strict=True), 1):
        s = run_summary(run)
        noise = f"{s['verdict']}, {s['noise'] * 100:.1f}%" if s["noise"] is not None else str(s["verdict"])
        cells = [f"{s[k][0] * 100:.1f}% ({s[k][1]} rows)" if k in s else "-" for k in ("pipeline", "data-parallel")]
        lines.append(f"| {i} | `{Path(path).name}` | `{s['command']}` | {noise} | {cells[0]} | {cells[1]} |")
    head = " | ".join(f"run {i}" for i in range(1, len(runs) + 1))
    lines += ["", f"| row | m | {head} | within {bound * 100:.0f}% on every run | worst run: the part that "
              "differs most, measured / predicted ms |", "|---|---:|" + "---:|" * len(runs) + "---|---|"]
    for r in rows:
        name = f"{r.schedule} (in-sample)" if r.in_sample else r.schedule
        where = (f"run {r.worst_run + 1}: {r.part} {r.part_measured * 1e3:.1f} / {r.part_predicted * 1e3:.1f}"
                 if r.part else "-")
        lines.append(f"| {name} | {r.microbatches} | " + " | ".join(_pct(e) for e in r.errors)
                     + f" | {'yes' if r.within else 'no'} | {where} |")
    held = [r for r in rows if not r.in_sample]
    ok = [r for r in held if r.within]
    lines += ["", f"{len(ok)} of {len(held)} held-out {kind} rows are within {bound * 100:.0f}% on every "
              f"one of the {len(runs)} runs; the rest: "
              + (", ".join(f"{r.schedule} m={r.microbatches}" for r in held if not r.within) or "none") + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    text = body(a.runs, a.data, a.bound, a.kind)
    print(text)
    if a.markdown:
        from analysis.results_page import write_page

        write_page(a.markdown, f"The validation grid's {a.kind} rows over repeated runs", text,
                   argv=["experiments/grid_runs.py", *(argv if argv is not None else sys.argv[1:])])
    return 0


if __name__ == "__main__":
    sys.exit(main())
