"""``python -m sim`` / ``schedlab simulate``: simulate one schedule with uniform costs, or in real units.

With ``--model``/``--cluster``/``--config`` the schedule runs on a cluster in
seconds and bytes, with data parallelism (``--dp``, ``--dp-mode``): see :mod:`sim.study`.

The CLI only parses flags into the same objects a script would build and
calls the same functions: load_graph (build or import, lower) -> validate ->
simulate. ``--schedule`` takes a registered name, ``torch:<ClassName>`` (torch's
own order, needs torch) or ``csv:<FILE>`` (a torch CSV; pp and microbatches
come from the file).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from schedules import ScheduleError, load_graph, lower, names, spec, validate, write_torch_csv
from schedules.interop import check_csv_path
from sim.cluster import CLUSTER_PRESETS
from sim.costs import UniformCosts
from sim.engine import SimResult, simulate
from sim.transformer import MODEL_PRESETS

__all__ = ["OneLineParser", "add_cost_args", "add_schedule_args", "fail", "main"]


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line with exit status 2, no usage dump."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (see --help)")


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def add_schedule_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--schedule", required=required, metavar="NAME",
                   help="a schedule name (" + ", ".join(names()) + "), torch:CLASS for torch.distributed.pipelining's "
                   "own order (e.g. torch:ZBVZeroBubble; needs torch), or csv:FILE for a torch CSV schedule "
                   "(one row per rank; its SEND/RECV, if any, are kept)")
    p.add_argument("--pp", type=int, required=required, metavar="P", help="pipeline ranks (csv: from the file)")
    p.add_argument("--microbatches", type=int, required=required, metavar="M",
                   help="microbatches per step (csv: from the file)")
    p.add_argument("--chunks", type=int, default=None, metavar="V", help="stages per rank (multi-chunk schedules; default 2)")


def add_cost_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("uniform costs (time per microbatch through one rank's whole share)")
    g.add_argument("--tf", type=float, default=1.0, help="forward (default 1)")
    g.add_argument("--tb", type=float, default=1.0, help="input-gradient backward; B costs tb+tw (default 1)")
    g.add_argument("--tw", type=float, default=1.0, help="weight-gradient backward (default 1)")
    g.add_argument("--tcomm", type=float, default=0.0, help="delay of each cross-rank message (default 0)")
    g.add_argument("--mw", type=float, default=0.0, help="fraction of M_B that W still holds after I (default 0)")
    g.add_argument("--pair-overlap", type=float, default=0.0, metavar="H",
                   help="fraction of the shorter pass hidden in an overlapped F+B pair (DualPipe); 0 = sum (default)")
    g.add_argument("--costs", metavar="PROFILE.json",
                   help="profiled costs in seconds from python -m real.profile (replaces the uniform costs)")


def costs_from_args(args: argparse.Namespace) -> UniformCosts:
    return UniformCosts(tf=args.tf, tb=args.tb, tw=args.tw, tcomm=args.tcomm, mw=args.mw, pair_overlap=args.pair_overlap)


def schedule_options(args: argparse.Namespace) -> dict:
    """What an adaptive schedule (zb-auto) reads: the pass times and --mem-limit; nothing for the others."""
    options: dict = {}
    if args.schedule in names() and spec(args.schedule).adaptive:
        options = {"tf": args.tf, "tb": args.tb, "tw": args.tw, "tcomm": args.tcomm, "mw": args.mw}
    if getattr(args, "mem_limit", None) is not None:
        if args.schedule not in names():
            raise ScheduleError(f"--mem-limit applies only to registered adaptive schedules, not to {args.schedule!r}")
        options["mem_limit"] = args.mem_limit
    return options


def _parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Simulate a pipeline schedule and report bubble, step time and activation memory.")
    add_schedule_args(p, required=False)
    p.add_argument("--mem-limit", type=float, default=None, metavar="M_B",
                   help="activation memory limit per rank in M_B, for zb-auto (default pp)")
    add_cost_args(p)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object instead of a table")
    p.add_argument("--trace", metavar="FILE", help="write the per-task trace (.csv or .parquet)")
    p.add_argument("--plot", metavar="FILE", help="write a Gantt chart (.png, .svg or .pdf)")
    p.add_argument("--export-csv", metavar="FILE",
                   help="write the schedule as a torch CSV, compute actions only (torch's _load_csv format "
                   "'compute_only')")
    p.add_argument("--export-csv-comms", metavar="FILE",
                   help="write the schedule as a torch CSV with the SEND/RECV simulated here (torch's _load_csv "
                   "format 'compute_comms')")
    p.add_argument("--list", action="store_true", help="list the registered schedules and exit")
    add_real_args(p)
    return p


def add_real_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("real units (any of --model, --cluster, --config switches to seconds and bytes)")
    g.add_argument("--model", metavar="NAME", help="transformer preset: " + ", ".join(MODEL_PRESETS))
    g.add_argument("--cluster", metavar="NAME[:NODES][+psK]", help="cluster preset: " + ", ".join(CLUSTER_PRESETS))
    g.add_argument("--config", metavar="FILE.toml", help="tables [model], [cluster], [parallel], [run]; flags override")
    g.add_argument("--dp", type=int, default=None, help="data-parallel replicas (default 1)")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel divisor (default 1)")
    g.add_argument("--dp-mode", default=None, metavar="MODE", help="none, sync, ddp, zero1, zero2, zero3 (fsdp), ps")
    g.add_argument("--microbatch-size", type=int, default=None, metavar="B", help="sequences per microbatch (default 1)")
    g.add_argument("--bucket-mb", type=float, default=None, metavar="MIB", help="gradient bucket size (default 25)")
    g.add_argument("--collective", default=None, metavar="ALG", help="auto, ring, tree, hierarchical (default auto)")
    g.add_argument("--order", default=None, metavar="ORDER", help="rank order dp-inner (default) or pp-inner")
    g.add_argument("--efficiency", type=float, default=None, help="fraction of dense peak the matmuls reach (default 0.6)")


def _real_overrides(args: argparse.Namespace) -> dict[str, dict]:
    """The flags given, as TOML tables (None = not given, so the file's value stays)."""
    tables: dict[str, dict] = {"model": {}, "cluster": {}, "parallel": {}, "run": {}}
    if args.model:
        tables["model"] = {"preset": args.model}
    if args.cluster:
        tables["cluster"] = {"preset": args.cluster}
    for table, keys in (("parallel", ("pp", "dp", "tp", "dp_mode", "bucket_mb", "collective", "order")),
                        ("run", ("schedule", "microbatches", "microbatch_size", "chunks", "efficiency"))):
        tables[table].update({k: getattr(args, k) for k in keys if getattr(args, k) is not None})
    if args.pair_overlap:
        tables["run"]["pair_overlap"] = args.pair_overlap
    return {k: v for k, v in tables.items() if v}


def real_main(args: argparse.Namespace) -> int:
    """The real-units path: a Study from --config and flags, simulated, printed."""
    from sim.study import load_study, run_study

    try:
        from analysis.timeline import check_figure_path
        from schedules.trace import check_trace_path

        trace_path = check_trace_path(args.trace) if args.trace else None
        plot_path = check_figure_path(args.plot) if args.plot else None
        exports = {comms: check_csv_path(path) for comms, path in ((False, args.export_csv), (True, args.export_csv_comms))
                   if path}
        if args.mem_limit is not None:
            raise ScheduleError("--mem-limit is a unit-cost (M_B) option; in real units the memory is reported in bytes")
        study = load_study(args.config, _real_overrides(args))
        result = run_study(study)
    except ScheduleError as exc:
        fail(str(exc))
    if trace_path is not None:
        from schedules.trace import write_trace

        write_trace(result.sim.trace, trace_path)
    if plot_path is not None:
        from analysis.timeline import plot_timeline

        plot_timeline(result.sim.trace, plot_path)
    pipeline = result.sim.graph.schedule  # the pipeline schedule under the data-parallel tasks
    for comms, path in exports.items():
        write_torch_csv(lower(pipeline) if comms else pipeline, path, comms=comms)
    print(json.dumps(result.to_dict()) if args.json else result.format())
    if not args.json:
        for what, path in (("trace", trace_path), ("timeline", plot_path), *((f"torch CSV{' +comms' * c}", p) for c, p in exports.items())):
            if path is not None:
                print(f"wrote {what}: {path}")
    return 0


def _profiled_step_time(result: SimResult, costs: object) -> float | None:
    from sim.profiled import ProfiledCosts, step_time

    return step_time(result, costs) if isinstance(costs, ProfiledCosts) else None


def format_table(result: SimResult) -> str:
    """A readable summary: the schedule's shape, then one line per rank."""
    d = result.to_dict()
    lines = [
        f"schedule {d['schedule']}: pp={d['pp']} microbatches={d['microbatches']} chunks={d['chunks']} "
        f"({d['stages']} stages)",
        "costs: " + " ".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}"
                             for k, v in d["costs"].items() if k != "model"),
        f"makespan {d['makespan']:.6g}   bubble ratio {d['bubble_ratio']:.4f}   "
        f"peak activations {d['peak_activations']:.4g} M_B",
        "",
        f"{'rank':>4}  {'busy':>10}  {'idle':>10}  {'first_start':>11}  {'last_end':>10}  {'peak_act(M_B)':>13}",
    ]
    for r in d["ranks"]:
        idle = d["makespan"] - r["busy"]
        lines.append(
            f"{r['rank']:>4}  {r['busy']:>10.6g}  {idle:>10.6g}  {r['first_start']:>11.6g}  "
            f"{r['last_end']:>10.6g}  {r['peak_activations']:>13.4g}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = "python -m sim") -> int:
    args = _parser(prog).parse_args(argv)
    if args.list:
        for n in names():
            sp = spec(n)
            print(f"{n:<18} {'v>=2 chunks' if sp.multi_chunk else '1 stage/rank':<13} {sp.summary}")
        return 0
    if args.model or args.cluster or args.config:
        if args.costs:
            fail(f"{prog}: --costs (a profiled cost file) does not combine with --model/--cluster/--config")
        return real_main(args)
    needed = ("schedule",) if (args.schedule or "").startswith("csv:") else ("schedule", "pp", "microbatches")
    missing = [f"--{f}" for f in needed if getattr(args, f) is None]
    if missing:
        fail(f"{prog}: the following arguments are required: {', '.join(missing)} (see --help)")
    try:
        from analysis.timeline import check_figure_path
        from schedules.trace import check_trace_path

        # Every input is checked before anything runs or is written.
        plot_path = check_figure_path(args.plot) if args.plot else None
        trace_path = check_trace_path(args.trace) if args.trace else None
        exports = {comms: check_csv_path(path) for comms, path in ((False, args.export_csv), (True, args.export_csv_comms))
                   if path}
        costs = costs_from_args(args)
        graph = validate(load_graph(args.schedule, pp=args.pp, microbatches=args.microbatches, chunks=args.chunks,
                                    **schedule_options(args)))
        if args.costs:
            from sim.profiled import load_profile

            costs = load_profile(args.costs, graph.schedule.num_stages)
    except ScheduleError as exc:
        fail(str(exc))
    result = simulate(graph, costs, check=False)
    step = _profiled_step_time(result, costs)
    if trace_path is not None:
        from schedules.trace import write_trace

        write_trace(result.trace, trace_path)
    if plot_path is not None:
        from analysis.timeline import plot_timeline

        plot_timeline(result.trace, plot_path)
    for comms, path in exports.items():
        write_torch_csv(graph, path, comms=comms)
    if args.json:
        print(json.dumps(result.to_dict() if step is None else {**result.to_dict(), "step_time": step}))
    else:
        print(format_table(result))
        if step is not None:
            print(f"step time {step:.6g} s (makespan + optimizer steps + step overhead, as the runtime measures it)")
        for what, path in (("trace", trace_path), ("timeline", plot_path)):
            if path is not None:
                print(f"wrote {what}: {path}")
        for comms, path in exports.items():
            print(f"wrote torch CSV ({'compute+comms' if comms else 'compute only'}): {path}")
    return 0
