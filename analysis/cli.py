"""The ``schedlab`` command: one entry point over the sim and analysis CLIs.

    schedlab simulate --schedule 1f1b --pp 4 --microbatches 8 [--json] [--plot F.png]
    schedlab compare  --pp 4 --microbatches 8 --chunks 2 --out out/
    schedlab run      --schedule 1f1b --pp 2 --microbatches 8 [--dp 2] [--trace F.csv] [--json]
    schedlab report   --out out/report [--pp 4 --microbatches 8 --chunks 2] [--real TRACE.csv ...]
    schedlab perfetto TRACE.csv [OUT.json]
    schedlab list
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from schedules import ScheduleError, names
from sim.cli import OneLineParser, add_cost_args, costs_from_args, fail

__all__ = ["compare_main", "main"]

_USAGE = """usage: schedlab COMMAND [flags]

commands:
  simulate   simulate one schedule (same flags as python -m sim)
  compare    simulate several schedules side by side; table + timeline PNGs
  run        train for real on torch.distributed (same flags as python -m real;
             starts torchrun with --nproc-per-node, default pp x dp)
  report     write a Markdown report with figures (and sim vs real if --real traces)
  perfetto   convert a trace (CSV/Parquet) to Chrome/Perfetto JSON
  list       list the registered schedules

schedlab COMMAND --help shows a command's flags."""


def compare_main(argv: Sequence[str] | None = None, prog: str = "schedlab compare") -> int:
    p = OneLineParser(prog=prog, description="Simulate schedules at one shape; print a comparison table and write timelines.")
    p.add_argument("--schedules", default="all", metavar="A,B,...", help="comma-separated names, or 'all' (default)")
    p.add_argument("--pp", type=int, default=4, metavar="P", help="pipeline ranks (default 4)")
    p.add_argument("--microbatches", type=int, default=8, metavar="M", help="microbatches (default 8)")
    p.add_argument("--chunks", type=int, default=2, metavar="V", help="stages per rank for multi-chunk schedules (default 2)")
    add_cost_args(p)
    p.add_argument("--out", default="out", metavar="DIR", help="where the PNGs and the CSV table go (default out/)")
    p.add_argument("--json", action="store_true", help="print the table as one JSON object")
    g = p.add_argument_group("real units (with --model and --cluster: a seconds/bytes table, no timelines)")
    g.add_argument("--model", metavar="NAME", help="transformer preset, e.g. gpt-6.2b")
    g.add_argument("--cluster", metavar="NAME[:NODES]", help="cluster preset, e.g. dgx-h100:2")
    g.add_argument("--dp", type=int, default=1, help="data-parallel replicas (default 1)")
    g.add_argument("--dp-mode", default="none", metavar="MODE", help="none, sync, ddp, zero1, zero2, zero3, ps")
    g.add_argument("--microbatch-size", type=int, default=1, metavar="B", help="sequences per microbatch (default 1)")
    args = p.parse_args(argv)
    if args.costs:
        fail(f"{prog}: --costs (a profiled cost file) applies to simulate and report, not to compare")
    if args.model or args.cluster:
        return _real_compare(args, prog)
    from analysis.compare import comparison_table, format_comparison, simulate_many
    from analysis.timeline import plot_timeline, plot_timelines

    chosen = names(by_family=True) if args.schedules == "all" else [s.strip() for s in args.schedules.split(",") if s.strip()]
    try:
        results = simulate_many(chosen, pp=args.pp, microbatches=args.microbatches, chunks=args.chunks, costs=costs_from_args(args))
    except ScheduleError as exc:
        fail(str(exc))
    table = comparison_table(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = [plot_timelines([r.trace for r in results], out / "timelines.png")]
    written += [plot_timeline(r.trace, out / f"timeline-{r.schedule}.png") for r in results]
    table.to_csv(out / "comparison.csv", index=False)
    written.append(out / "comparison.csv")
    if args.json:
        print(json.dumps({"schedules": json.loads(table.to_json(orient="records")), "files": [str(w) for w in written]}))
    else:
        print(format_comparison(table))
        print(f"\nwrote {len(written)} files under {out}/: timelines.png (all schedules, one time axis), "
              "timeline-<schedule>.png, comparison.csv")
    return 0


def _real_compare(args, prog: str) -> int:
    from analysis.compare import format_real_comparison, real_comparison
    from sim.cluster import cluster_preset
    from sim.parallel import ParallelConfig
    from sim.transformer import model_preset

    if not (args.model and args.cluster):
        fail(f"{prog}: real units need both --model and --cluster (see --help)")
    chosen = names(by_family=True) if args.schedules == "all" else [s.strip() for s in args.schedules.split(",") if s.strip()]
    try:
        rows = real_comparison(chosen, chunks=args.chunks, model=model_preset(args.model),
                               cluster=cluster_preset(args.cluster), microbatches=args.microbatches,
                               microbatch_size=args.microbatch_size,
                               parallel=ParallelConfig(pp=args.pp, dp=args.dp, dp_mode=args.dp_mode))
    except ScheduleError as exc:
        fail(str(exc))
    if args.json:
        print(json.dumps({"schedules": rows}))
        return 0
    first = rows[0]["costs"] if rows else {}
    print(f"\n{args.model} on {args.cluster}: pp={args.pp} dp={args.dp} dp-mode={args.dp_mode} "
          f"microbatches={args.microbatches} x {args.microbatch_size} seq, efficiency {first.get('efficiency', 0):g}")
    print(format_real_comparison(rows))
    return 0


def report_main(argv: Sequence[str] | None = None, prog: str = "schedlab report") -> int:
    p = OneLineParser(prog=prog, description="Simulate the schedules, compare them, and write a report with figures.")
    p.add_argument("--out", default="out/report", metavar="DIR", help="report folder (default out/report)")
    p.add_argument("--schedules", default="all", metavar="A,B,...", help="comma-separated names, or 'all' (default)")
    p.add_argument("--pp", type=int, default=4, metavar="P")
    p.add_argument("--microbatches", type=int, default=8, metavar="M")
    p.add_argument("--chunks", type=int, default=2, metavar="V", help="stages per rank for multi-chunk schedules")
    p.add_argument("--real", nargs="*", default=[], metavar="TRACE", help="real runs' traces to set against predictions")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cost_args(p)
    args = p.parse_args(argv)
    from analysis.report import ReportConfig, write_report

    chosen = () if args.schedules == "all" else tuple(s.strip() for s in args.schedules.split(",") if s.strip())
    try:
        cfg = ReportConfig(pp=args.pp, microbatches=args.microbatches, chunks=args.chunks, schedules=chosen,
                           costs=costs_from_args(args), real_traces=tuple(Path(t) for t in args.real),
                           profile=Path(args.costs) if args.costs else None,
                           progress=not args.no_progress and sys.stderr.isatty())
        path = write_report(args.out, cfg)
    except ScheduleError as exc:
        fail(str(exc))
    print(f"wrote report: {path}")
    return 0


def perfetto_main(argv: Sequence[str] | None = None, prog: str = "schedlab perfetto") -> int:
    p = OneLineParser(prog=prog, description="Convert a schedlab trace to Chrome/Perfetto JSON.")
    p.add_argument("trace", metavar="TRACE", help="a trace written by --trace (.csv or .parquet)")
    p.add_argument("out", nargs="?", default=None, metavar="OUT.json", help="default: TRACE with .perfetto.json")
    args = p.parse_args(argv)
    from analysis.perfetto import write_chrome_trace
    from schedules.trace import read_trace

    src = Path(args.trace)
    out = Path(args.out) if args.out else src.with_suffix(".perfetto.json")
    try:
        if not src.is_file():
            raise ScheduleError(f"trace file {str(src)!r} not found")
        path = write_chrome_trace(read_trace(src), out)
    except ScheduleError as exc:
        fail(str(exc))
    print(f"wrote {path} (open it in the Perfetto UI or chrome://tracing)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "simulate":
        from sim.cli import main as sim_main

        return sim_main(rest, prog="schedlab simulate")
    if cmd == "compare":
        return compare_main(rest)
    if cmd == "run":
        from real.cli import launch_main

        return launch_main(rest)
    if cmd == "report":
        return report_main(rest)
    if cmd == "perfetto":
        return perfetto_main(rest)
    if cmd == "list":
        from sim.cli import main as sim_main

        return sim_main(["--list"], prog="schedlab list")
    fail(f"schedlab: unknown command {cmd!r}; valid: simulate, compare, run, report, perfetto, list (see schedlab --help)")
