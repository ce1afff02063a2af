"""``schedlab compare``, ``schedlab report`` and ``schedlab perfetto``: schedules side by side, reports, traces."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from analysis.cli.common import (
    OneLineParser,
    add_cost_args,
    add_import_arg,
    check_cost_flags,
    errors_to_exit,
    fail,
    file_safe,
    given,
    guarded,
    is_all,
    name_list,
    print_json,
    refuse,
    schedule_source,
    uniform_costs,
)
from analysis.cli.simulate import COMM_KEYS, add_comm_args, comm_overrides
from analysis.cli.time_to_loss import add_time_to_loss_args, time_to_loss_main
from common.outputs import Output, check_paths, write_files_into
from schedules import ScheduleError, import_schedules
from schedules.registry import lookup

__all__ = ["compare_main", "perfetto_main", "report_main"]


@guarded
def compare_main(argv: Sequence[str] | None = None, prog: str = "schedlab compare") -> int:
    p = OneLineParser(prog=prog, description="Simulate schedules at one shape; print a comparison table and write timelines.")
    p.add_argument("--schedules", default="all", metavar="A,B,...",
                   help="comma-separated names, your own FILE.py:NAME, csv:FILE or torch:CLASS, or 'all' (default: "
                   "every registered schedule that takes this shape)")
    add_import_arg(p)
    p.add_argument("--pp", type=int, default=4, metavar="P", help="pipeline ranks (default 4)")
    p.add_argument("--microbatches", type=int, default=8, metavar="M", help="microbatches (default 8)")
    p.add_argument("--chunks", type=int, default=2, metavar="V", help="stages per rank for multi-chunk schedules (default 2)")
    add_cost_args(p)
    p.add_argument("--out", default="out", metavar="DIR", help="where the PNGs and the CSV table go (default out/)")
    p.add_argument("--json", action="store_true", help="print the table as one JSON object")
    g = p.add_argument_group("physical units (with --model and --cluster: a seconds/bytes table, no timelines)")
    g.add_argument("--model", metavar="NAME", help="transformer preset, e.g. gpt-6.2b")
    g.add_argument("--cluster", metavar="NAME[:NODES]", help="cluster preset, e.g. dgx-h100:2")
    g.add_argument("--dp", type=int, help="data-parallel replicas (default 1)")
    g.add_argument("--dp-mode", metavar="MODE", help="none, sync, ddp, zero1, zero2, zero3, ps, decentralized, "
                   "local-sgd (default none)")
    g.add_argument("--microbatch-size", type=int, metavar="B", help="sequences per microbatch (default 1)")
    g.add_argument("--tp", type=int, help="tensor-parallel ranks per pipeline rank, inside a node (default 1)")
    g.add_argument("--sp", action="store_true", default=None, help="sequence parallelism in the tensor-parallel group")
    g.add_argument("--recompute", metavar="MODE", help="activation recomputation: none (default), selective, full")
    add_comm_args(g)
    d = p.add_argument_group("data-parallel modes (with --model, --cluster and one schedule: step time and memory "
                             "per rank under each mode)")
    d.add_argument("--dp-modes", metavar="A,B,...", help="modes to compare: none, sync, ddp, zero1, zero2, zero3 "
                   "(fsdp), ps; needs --dp 2 or more")
    d.add_argument("--measured", metavar="FILE.json", help="real runs to set beside the predictions: the JSON "
                   "'schedlab run --json' prints (one object, a list, or {\"runs\": [...]})")
    d.add_argument("--state-bytes", type=_state_bytes, metavar="W,G,O",
                   help="bytes per parameter of weights, gradients, optimizer state (default 2,2,12: "
                        "mixed-precision Adam; the runtime's fp32 AdamW is 4,4,8)")
    add_time_to_loss_args(p)
    args = p.parse_args(argv)
    with errors_to_exit(p):  # a user's module registers its schedules before any name is looked up
        import_schedules(args.imports)
    check_cost_flags(args)
    if args.time_to_loss is not None:
        return time_to_loss_main(args, p, prog)
    refuse(given(args, "curve", "smooth"), "without --time-to-loss L")
    chosen = name_list(args.schedules)
    if args.dp_modes is None:
        refuse(given(args, "measured", "state_bytes"), "without --dp-modes")
    else:
        from analysis.dp_compare import parse_dp_modes

        with errors_to_exit(p):  # a misspelt mode before anything else is checked or built
            parse_dp_modes(name_list(args.dp_modes, []))
    if args.model or args.cluster:
        return _units_compare(args, chosen, p, prog)
    refuse(given(args, "dp", "dp_mode", "microbatch_size", "tp", "sp", "recompute", "dp_modes", *COMM_KEYS),
           "without physical units: add --model and --cluster")
    from analysis.compare import comparison_table, format_comparison
    from analysis.timeline import plot_timeline, plot_timelines
    from sim.plan.sweep import applicable, simulate_many

    skipped: dict[str, str] = {}
    if is_all(args.schedules):  # every schedule that takes the shape; the others are listed, not fatal
        chosen, skipped = applicable(chosen, pp=args.pp, microbatches=args.microbatches, chunks=args.chunks)
    with errors_to_exit(p):
        from schedules import spec

        for name in chosen:  # an unknown name is the error to report, before the file names made from it
            spec(name)
        out = Path(args.out)
        names = ("timelines.png", "comparison.csv", *(f"timeline-{_canonical(s)}.png" for s in chosen))
        check_paths({"--out": Output(out, "output folder", "folder"),  # a directory or fifo of a file's name too
                     **{f"--out {name}": Output(out / name, "output file") for name in names}}, _inputs(args, chosen))
        results = simulate_many(chosen, pp=args.pp, microbatches=args.microbatches, chunks=args.chunks,
                                costs=uniform_costs(args), profile=args.costs, costs_profile=args.costs_profile)
        table = comparison_table(results)

        def fill(stage: Path) -> None:  # every file first into a temporary folder: all of them, or none
            if results:
                plot_timelines([r.trace for r in results], stage / "timelines.png")
            for r in results:
                plot_timeline(r.trace, stage / f"timeline-{file_safe(r.schedule)}.png")
            table.to_csv(stage / "comparison.csv", index=False)

        order = ["timelines.png"] * bool(results) + [f"timeline-{file_safe(r.schedule)}.png" for r in results] + ["comparison.csv"]
        written = sorted(write_files_into(out, fill, "output folder"), key=lambda q: order.index(q.name))
    if args.json:
        print_json({"schedules": json.loads(table.to_json(orient="records")), "skipped": skipped,
                    "files": [str(w) for w in written]})
        return 0
    print(format_comparison(table))
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print(f"\nwrote {len(written)} files under {out}/: timelines.png (all schedules, one time axis), "
          "timeline-<schedule>.png, comparison.csv")
    return 0


def _inputs(args, chosen: list[str]) -> dict[str, str | None]:
    """The files a comparison reads (cost files, schedule files): none of its outputs may be one."""
    return {"--costs": args.costs, "--costs-profile": args.costs_profile,
            **{f"--schedules {name}": schedule_source(name) for name in chosen}}


def _canonical(name: str) -> str:
    """The name a schedule's files are called by: a registered name in its own case, any other reference made
    safe for a file name (csv:/path/f.csv, dir/file.py:NAME)."""
    found = lookup(name)
    return found.name if found is not None else file_safe(name)


def _units_compare(args, chosen: list[str], parser: OneLineParser, prog: str) -> int:
    from analysis.compare import format_units_comparison
    from sim.costs.cluster import cluster_preset
    from sim.costs.parallel import ParallelConfig
    from sim.costs.transformer import model_preset
    from sim.costs.transformer_costs import TransformerCosts
    from sim.plan.sweep import units_comparison

    if not (args.model and args.cluster):
        fail(f"{prog}: physical units need both --model and --cluster (see --help)")
    if args.costs:
        fail(f"{prog}: --costs (a profiled cost file) does not combine with --model/--cluster")
    refuse(given(args, "tf", "tb", "tw", "tcomm", "mw", "pair_overlap"),
           "in physical units (--model/--cluster): the pass times come from the model and the cluster")
    if args.dp_modes is not None:
        refuse(given(args, "dp_mode"), "with --dp-modes: the modes compared are --dp-modes")
        if given(args, "staleness", "trainer_speeds"):  # async-ps's own settings (analysis.dp_compare._mode_costs)
            if "async-ps" not in name_list(args.dp_modes, []):
                refuse(given(args, "staleness", "trainer_speeds"), "unless --dp-modes has async-ps")
            args.dp_mode = "async-ps"
    args.dp, args.dp_mode, args.microbatch_size = args.dp or 1, args.dp_mode or "none", args.microbatch_size or 1
    args.tp, args.sp, args.recompute = args.tp or 1, bool(args.sp), args.recompute or "none"
    with errors_to_exit(parser):
        costs = TransformerCosts(model=model_preset(args.model), cluster=cluster_preset(args.cluster),
                                 parallel=ParallelConfig(pp=args.pp, dp=args.dp, tp=args.tp, sp=args.sp,
                                                         dp_mode=args.dp_mode, **comm_overrides(args)),
                                 microbatch_size=args.microbatch_size, recompute=args.recompute)
        if args.dp_modes is not None:
            return _dp_compare(args, chosen, costs, prog)
        rows = units_comparison(chosen, chunks=args.chunks, microbatches=args.microbatches, costs=costs)
    if args.json:
        print_json({"schedules": rows})
        return 0
    first = rows[0]["costs"] if rows else {}
    eff = first.get("efficiency", 0)
    eff = f"{eff:g}" if isinstance(eff, int | float) else f"{eff} (GPU operation model)"
    tp = f" tp={args.tp}{' +sp' if args.sp else ''} recompute={args.recompute}" if args.tp > 1 or args.recompute != "none" else ""
    codec = f" grad-compression={args.grad_compression}" if args.grad_compression not in (None, "none") else ""
    print(f"\n{args.model} on {args.cluster}: pp={args.pp} dp={args.dp}{tp} dp-mode={args.dp_mode}{codec} "
          f"microbatches={args.microbatches} x {args.microbatch_size} seq, efficiency {eff}")
    print(format_units_comparison(rows))
    return 0


def _state_bytes(text: str):
    """``4,4,8`` -> StateBytes(weight=4, grad=4, optimizer=8); an argparse type."""
    import argparse

    from analysis.dp_compare import StateBytes

    try:
        w, g, o = (float(x) for x in text.split(","))
        return StateBytes(weight=w, grad=g, optimizer=o)
    except ValueError:  # a non-number, or StateBytes' ConfigError
        raise argparse.ArgumentTypeError(f"invalid value {text[:80]!r}: give three numbers >= 0 separated by commas "
                                         "(weights, gradients, optimizer state), e.g. 2,2,12") from None


def _dp_compare(args, chosen: list[str], costs, prog: str) -> int:
    """One schedule under each of --dp-modes: the table, and dp_modes.png/.csv/.json in --out."""
    from analysis.dp_compare import format_dp_modes, load_measured, parse_dp_modes, plot_dp_modes, predict_dp_modes
    from schedules import spec

    if is_all(args.schedules) or len(chosen) != 1:
        fail(f"{prog}: --dp-modes compares the modes on one schedule; give --schedules NAME (e.g. 1f1b), "
             f"got {args.schedules[:80]!r}")
    modes = parse_dp_modes(name_list(args.dp_modes, []))
    if args.dp < 2 and any(m != "none" for m in modes):
        fail(f"{prog}: --dp-modes {','.join(modes)}: the modes differ only between replicas; give --dp 2 or more, "
             f"got --dp {args.dp}")
    name = spec(chosen[0]).name
    out = Path(args.out)
    files = ("dp_modes.png", "dp_modes.csv", "dp_modes.json")
    check_paths({"--out": Output(out, "output folder", "folder"),
                 **{f"--out {f}": Output(out / f, "output file") for f in files}},
                {**_inputs(args, chosen), "--measured": args.measured})
    measured = load_measured(args.measured) if args.measured is not None else None
    rows = predict_dp_modes(modes, schedule=name, microbatches=args.microbatches, costs=costs,
                            chunks=args.chunks if spec(name).takes_chunks else None, state=args.state_bytes,
                            measured=measured)
    data = {"model": args.model, "cluster": args.cluster, "schedule": name, "pp": args.pp, "dp": args.dp,
            "tp": args.tp, "microbatches": args.microbatches, "microbatch_size": args.microbatch_size,
            "measured": args.measured, "dp_modes": [r.to_dict() for r in rows]}

    def fill(stage: Path) -> None:
        import pandas as pd

        plot_dp_modes(rows, stage / "dp_modes.png")
        flat = [{"mode": r.mode, "rank": r.rank, "step_time": r.step_time, "measured_step_time": r.measured_step_time,
                 **{c: r.memory[c] for c in r.memory}, "total": r.total,
                 **{f"measured_{c}": None if r.measured is None else r.measured[c] for c in r.memory},
                 "measured_total": r.measured_total} for r in rows]
        pd.DataFrame(flat).to_csv(stage / "dp_modes.csv", index=False)
        (stage / "dp_modes.json").write_text(json.dumps(data, indent=1) + "\n")

    written = sorted(write_files_into(out, fill, "output folder"), key=lambda q: files.index(q.name))
    if args.json:
        print_json({**data, "files": [str(w) for w in written]})
        return 0
    print(f"\n{args.model} on {args.cluster}: {name} pp={args.pp} dp={args.dp} microbatches={args.microbatches} "
          f"x {args.microbatch_size} seq" + (f", measured: {args.measured}" if args.measured else ""))
    print(format_dp_modes(rows))
    print(f"\nwrote {len(written)} files under {out}/: dp_modes.png (step time and memory per rank per mode), "
          "dp_modes.csv, dp_modes.json (schedlab report --dp-compare)")
    return 0


@guarded
def report_main(argv: Sequence[str] | None = None, prog: str = "schedlab report") -> int:
    p = OneLineParser(prog=prog, description="Simulate the schedules, compare them, and write a report with figures.")
    p.add_argument("--out", default="out/report", metavar="DIR", help="report folder (default out/report)")
    p.add_argument("--schedules", default="all", metavar="A,B,...",
                   help="comma-separated names, your own FILE.py:NAME, csv:FILE or torch:CLASS, or 'all' (default)")
    add_import_arg(p)
    p.add_argument("--pp", type=int, default=4, metavar="P")
    p.add_argument("--microbatches", type=int, default=8, metavar="M")
    p.add_argument("--chunks", type=int, default=2, metavar="V", help="stages per rank for multi-chunk schedules")
    p.add_argument("--real", nargs="*", default=[], metavar="TRACE", help="real runs' traces to set against predictions")
    p.add_argument("--validation", metavar="FILE.json",
                   help="experiments/validate_sim.py's JSON: adds predicted-against-measured and its mechanisms")
    p.add_argument("--dp-compare", metavar="FILE.json",
                   help="the dp_modes.json 'schedlab compare --dp-modes' writes: adds the data-parallel section")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_cost_args(p)
    args = p.parse_args(argv)
    with errors_to_exit(p):
        import_schedules(args.imports)
    check_cost_flags(args)
    from analysis.report import is_report_folder, write_report
    from analysis.validation.scores import load_validation
    from sim.plan.sweep import SweepConfig, run_sweep

    chosen = () if is_all(args.schedules) else tuple(name_list(args.schedules))
    progress = None
    if not args.no_progress and sys.stderr.isatty():
        from tqdm import tqdm

        def progress(jobs):
            return tqdm(jobs, desc="bubble sweep", unit="sim", leave=False)

    with errors_to_exit(p):
        inputs = {**{f"--real #{i + 1}": t for i, t in enumerate(args.real)}, "--validation": args.validation, "--costs": args.costs,
                  "--costs-profile": args.costs_profile, "--dp-compare": args.dp_compare}
        check_paths({"--out": Output(args.out, "report folder", "replaced", replaced=is_report_folder)}, inputs)
        cfg = SweepConfig(pp=args.pp, microbatches=args.microbatches, chunks=args.chunks, schedules=chosen,
                          costs=uniform_costs(args), real_traces=tuple(Path(t) for t in args.real),
                          profile=Path(args.costs) if args.costs else None,
                          costs_profile=Path(args.costs_profile) if args.costs_profile else None)
        validation = load_validation(args.validation) if args.validation else None
        dp_rows = _load_dp_compare(args.dp_compare) if args.dp_compare else None
        path = write_report(args.out, run_sweep(cfg, progress), validation, dp_modes=dp_rows)
    print(f"wrote report: {path}")
    return 0


def _load_dp_compare(path: str) -> list:
    from analysis.dp_compare import rows_from_json

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ScheduleError(f"--dp-compare {path[:80]!r}: cannot be read ({exc.strerror or exc})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScheduleError(f"--dp-compare {path[:80]!r}: not JSON ({exc})") from None
    return rows_from_json(data)


@guarded
def perfetto_main(argv: Sequence[str] | None = None, prog: str = "schedlab perfetto") -> int:
    p = OneLineParser(prog=prog, description="Convert a schedlab trace to Chrome/Perfetto JSON.")
    p.add_argument("trace", metavar="TRACE", help="a trace written by --trace (.csv or .parquet)")
    p.add_argument("out", nargs="?", default=None, metavar="OUT.json", help="default: TRACE with .perfetto.json")
    args = p.parse_args(argv)
    from analysis.perfetto import write_chrome_trace
    from schedules.trace import read_trace

    src = Path(args.trace)
    out = Path(args.out) if args.out else src.with_suffix(".perfetto.json")
    with errors_to_exit(p):
        if not src.is_file():
            raise ScheduleError(f"trace file {str(src)!r} not found")
        check_paths({"OUT.json": Output(out, "chrome trace file", suffixes=(".json",))}, {"TRACE": src})
        path = write_chrome_trace(read_trace(src), out)
    print(f"wrote {path} (open it in the Perfetto UI or chrome://tracing)")
    return 0
