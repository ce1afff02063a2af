"""``python -m sim`` / ``schedlab simulate``: simulate one schedule with uniform costs, or in physical units.

With ``--model``/``--cluster``/``--config`` the schedule runs on a cluster in
seconds and bytes, with data parallelism (``--dp``, ``--dp-mode``): see :mod:`sim.plan.study`.

The flags are parsed into the same objects a script would build, and the
same functions run: load_graph (build or import, lower) -> validate ->
simulate. ``--schedule`` takes a registered name, ``torch:<ClassName>`` (torch's
own order, needs torch) or ``csv:<FILE>`` (a torch CSV; pp and microbatches
come from the file).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from analysis.cli.common import (
    OneLineParser,
    add_cost_args,
    add_schedule_args,
    check_cost_flags,
    errors_to_exit,
    fail,
    given,
    guarded,
    print_json,
    refuse,
    schedule_options,
    schedule_source,
    uniform_costs,
)
from analysis.timeline import check_figure_path, plot_timeline
from common.errors import find_name
from common.outputs import Output, check_paths
from schedules import import_schedules, load_graph, lower, names, spec, validate, write_torch_csv
from schedules.interop.torch_csv import check_csv_path
from schedules.library.recompute import RECOMPUTE_PLACEMENTS, place_recompute
from schedules.trace import check_trace_path, write_trace
from sim import SimResult, simulate
from sim.costs.cluster import CLUSTER_PRESETS
from sim.costs.transformer import MODEL_PRESETS

__all__ = ["add_units_args", "format_table", "main", "units_overrides"]


def _parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Simulate a pipeline schedule and report bubble, step time and activation memory.")
    add_schedule_args(p, required=False)
    p.add_argument("--mem-limit", type=_number_or_size, default=None, metavar="LIMIT",
                   help="zb-auto's memory limit: with unit costs activations per rank in M_B (default pp); in "
                   "physical units (--model/--cluster) bytes per device, e.g. 60GB, 56GiB or 6e10, of which the "
                   "model states are taken first")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="seconds zb-auto's exact refinement may search after its heuristic (default 10; 0: the "
                   "heuristic alone, reproducible bit for bit)")
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
    add_units_args(p)
    return p


def _number_or_size(text: str) -> float | str:
    """--mem-limit: a number (M_B with unit costs, bytes in physical units), else the text of a size with a unit
    (60GB), which the physical-units path parses (sim.plan.budget.parse_bytes) and the unit-cost path refuses."""
    try:
        return float(text)
    except ValueError:
        return text


def add_units_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("physical units (any of --model, --cluster, --config switches to seconds and bytes)")
    g.add_argument("--model", metavar="NAME", help="transformer preset: " + ", ".join(MODEL_PRESETS))
    g.add_argument("--cluster", metavar="NAME[:NODES][+psK]", help="cluster preset: " + ", ".join(CLUSTER_PRESETS))
    g.add_argument("--config", metavar="FILE.toml", help="tables [model], [cluster], [parallel], [run]; flags override")
    g.add_argument("--dp", type=int, default=None, help="data-parallel replicas (default 1)")
    g.add_argument("--tp", type=int, default=None, help="tensor-parallel divisor (default 1)")
    g.add_argument("--cp", type=int, default=None,
                   help="context parallelism: the sequence split over CP ranks, ring attention (default 1)")
    g.add_argument("--ep", type=int, default=None,
                   help="expert parallelism: a MoE model's routed experts over EP of the dp x cp ranks (default 1)")
    g.add_argument("--dp-mode", default=None, metavar="MODE", help="none, sync, ddp, zero1, zero2, zero3 (fsdp), ps, async-ps")
    g.add_argument("--microbatch-size", type=int, default=None, metavar="B", help="sequences per microbatch (default 1)")
    g.add_argument("--bucket-mb", type=float, default=None, metavar="MIB", help="gradient bucket size (default 25)")
    g.add_argument("--collective", default=None, metavar="ALG", help="auto, ring, tree, hierarchical (default auto)")
    g.add_argument("--order", default=None, metavar="ORDER", help="rank order dp-inner (default) or pp-inner")
    add_comm_args(g)
    g.add_argument("--efficiency", type=float, default=None,
                   help="fraction of dense peak the matmuls reach, a constant that overrides the device's calibrated "
                   "efficiency model (default: calibrated where the device has one, else 0.6)")
    g.add_argument("--sp", action="store_true", default=None,
                   help="sequence parallelism in the tensor-parallel group (Korthikanti et al. 2022)")
    g.add_argument("--recompute", default=None, metavar="MODE",
                   help="activation recomputation: none (default), selective (attention core), full (whole layers), "
                   "selective-op (torchtitan: matmul outputs but every second one kept), layer:N (every N-th layer "
                   "in full); "
                   "without physical units, full puts an R (a recomputed forward) right before every backward "
                   "and bubbles moves each R into idle time before it (within --recompute-limit)")
    g.add_argument("--recompute-limit", type=float, default=None, metavar="M",
                   help="without physical units, with --recompute bubbles: activation memory per rank in M_B")
    g.add_argument("--seq-len", type=int, default=None, metavar="S", help="sequence length (default: the model's)")
    g.add_argument("--attention", default=None, metavar="KIND",
                   help="flash (a fused kernel, no s x s activations) or unfused (default: the model preset's)")
    g.add_argument("--reduce-dtype", default=None, metavar="DTYPE",
                   help="gradient reductions in bf16 (default) or fp32 (torchtitan's default: twice the bytes)")
    g.add_argument("--elementwise", default=None, metavar="KIND",
                   help="fused (default) or eager: the bytes of norms, rotary and activation as PyTorch eager runs them")
    g.add_argument("--tp-overlap", action="store_true", default=None,
                   help="sequence-parallel collectives hidden behind their GEMMs (Megatron --tp-comm-overlap; needs --sp)")
    g.add_argument("--contention", type=float, default=None, metavar="X",
                   help="compute runs 1 + X times longer while its rank communicates (default: the device model's, "
                   "0.189 on the A100, H100 and H200; 0: none; link model fair only)")
    g.add_argument("--stack", default=None, metavar="NAME",
                   help="the training stack that runs the step: none (default: asynchronous sends, no host costs), "
                   "megatron, deepspeed or torchtitan (their p2p semantics, kernel launches, optimizer sync; "
                   "docs/simulator.md)")
    g.add_argument("--moe-dispatcher", default=None, metavar="D",
                   help="a MoE model's token dispatch: alltoall (every token-expert pair to its rank, default) or deepep "
                   "(once per remote node over the NIC, then NVLink)")
    g.add_argument("--post-validation", action="store_true", default=None,
                   help="the optimizer step goes ahead of the global gradient norm (zero-bubble's post-validation; "
                   "stacks megatron and torchtitan)")
    g.add_argument("--dtype", default=None, metavar="DTYPE",
                   help="bf16 (default) or fp8: the weight GEMMs at the device's FP8 peak (H100, H200)")


def add_comm_args(g: argparse._ArgumentGroup) -> None:
    """The links, FSDP and embedding all-reduce options (docs/links.md); each lands in [parallel]."""
    g.add_argument("--link-model", default=None, metavar="MODEL",
                   help="transfers on one port: fair (default; they share its bandwidth, max-min fair) or fcfs "
                   "(one at a time, first come first served, the model before fair sharing)")
    g.add_argument("--fsdp-reshard-after-forward", default=None, choices=("on", "off"),
                   help="dp-mode fsdp: on (default) frees a forward's gathered parameters, off keeps them for "
                   "the backward (no second all-gather, more memory)")
    g.add_argument("--fsdp-prefetch", type=int, default=None, metavar="K",
                   help="dp-mode fsdp: issue a pass's all-gathers K passes ahead (default 1; 0: on demand)")
    g.add_argument("--embedding-allreduce", default=None, choices=("auto", "on", "off"),
                   help="all-reduce the tied word embedding's gradient between the first and the last stage "
                   "(auto, the default: when the model ties its embeddings and pp > 1, as Megatron-LM)")
    g.add_argument("--grad-compression", default=None, metavar="CODEC",
                   help="codec of the gradient collectives: none (default), fp16, bf16, int8, powersgd:R "
                   "(sync/ddp); their bytes shrink as docs/compression.md says")
    g.add_argument("--codec-ns-per-param", type=float, default=None, metavar="NS",
                   help="with --grad-compression: the codec's compress+decompress time per gradient element "
                   "(default 0; python -m real.profile measures it, in its cost file's codecs section)")
    g.add_argument("--peer-selection", default=None, choices=("ring", "random"),
                   help="dp-mode decentralized: exchange with both ring neighbours (ring, the default) or one peer")
    g.add_argument("--sync-every", type=int, default=None, metavar="K",
                   help="dp-mode local-sgd: the parameters are averaged once every K steps (default 1)")
    g.add_argument("--overlap-param-gather", action="store_true", default=None,
                   help="dp-mode zero1/zero2: the updated parameters' all-gather runs under the next step's forward "
                   "(Megatron-LM --overlap-param-gather)")
    g.add_argument("--staleness", type=int, default=None, metavar="S",
                   help="dp-mode async-ps: the steps a trainer may run ahead of the slowest (default 0)")
    g.add_argument("--trainer-speeds", type=_speeds, default=None, metavar="V,V,...",
                   help="dp-mode async-ps: each replica's compute speed, one per replica (1: the device's, 2: twice "
                   "as fast; default all 1); the trainers run many steps under --staleness (sim.costs.async_ps)")


COMM_KEYS = ("link_model", "fsdp_reshard_after_forward", "fsdp_prefetch", "embedding_allreduce", "grad_compression",
             "codec_ns_per_param", "peer_selection", "sync_every", "overlap_param_gather", "staleness", "trainer_speeds")


def _speeds(text: str) -> list[float]:
    """--trainer-speeds: comma-separated numbers (their count and sign are the config's to check)."""
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated numbers, e.g. 1,1.5") from None


def comm_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The links and overlap flags given, as [parallel] keys (on/off as true/false)."""
    out = {k: getattr(args, k) for k in COMM_KEYS if getattr(args, k) is not None}
    if "fsdp_reshard_after_forward" in out:
        out["fsdp_reshard_after_forward"] = out["fsdp_reshard_after_forward"] == "on"
    return out


def units_overrides(args: argparse.Namespace) -> dict[str, dict]:
    """The flags given, as TOML tables (None = not given, so the file's value stays)."""
    tables: dict[str, dict] = {"model": {}, "cluster": {}, "parallel": {}, "run": {}}
    if args.model:
        tables["model"] = {"preset": args.model}
    if args.seq_len is not None:
        tables["model"]["seq_len"] = args.seq_len
    if args.attention is not None:
        tables["model"]["attention"] = args.attention
    if args.cluster:
        tables["cluster"] = {"preset": args.cluster}
    for table, keys in (("parallel", ("pp", "dp", "tp", "cp", "ep", "dp_mode", "bucket_mb", "collective", "order", "sp")),
                        ("run", ("schedule", "microbatches", "microbatch_size", "chunks", "efficiency", "recompute",
                                 "dtype", "reduce_dtype", "elementwise", "tp_overlap", "contention", "stack",
                                 "post_validation", "moe_dispatcher"))):
        tables[table].update({k: getattr(args, k) for k in keys if getattr(args, k) is not None})
    if args.pair_overlap is not None:
        tables["run"]["pair_overlap"] = args.pair_overlap
    for key in ("mem_limit", "time_limit"):  # zb-auto's: bytes per device (sim.plan.budget), seconds of search
        if getattr(args, key, None) is not None:
            tables["run"][key] = getattr(args, key)
    tables["parallel"].update(comm_overrides(args))
    return {k: v for k, v in tables.items() if v}


def _outputs(args: argparse.Namespace) -> tuple:
    """Every output path checked before anything runs: (trace, plot, {comms: csv path})."""
    trace_path = check_trace_path(args.trace) if args.trace else None
    plot_path = check_figure_path(args.plot) if args.plot else None
    exports = {comms: check_csv_path(path) for comms, path in ((False, args.export_csv), (True, args.export_csv_comms))
               if path}
    whats = {"--trace": "trace file", "--plot": "figure file", "--export-csv": "torch CSV file",
             "--export-csv-comms": "torch CSV file"}
    given_ = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in whats}
    check_paths({flag: Output(path, whats[flag]) if path else None for flag, path in given_.items()},
                {"--schedule": schedule_source(args.schedule), "--costs": getattr(args, "costs", None),
                 "--costs-profile": getattr(args, "costs_profile", None), "--config": args.config})
    return trace_path, plot_path, exports


def _write_outputs(trace, trace_path, plot_path) -> None:
    if trace_path is not None:
        write_trace(trace, trace_path)
    if plot_path is not None:
        plot_timeline(trace, plot_path)


def units_main(args: argparse.Namespace, parser: OneLineParser) -> int:
    """The physical-units path: a Study from --config and flags, simulated, printed."""
    from sim.plan.study import load_study, run_study

    if args.recompute_limit is not None:
        fail("--recompute-limit places R actions under unit costs (M_B); in physical units --recompute is "
             "none, selective or full inside the backward (a schedule with R's can be given as csv:FILE)")
    refuse(given(args, "tf", "tb", "tw", "tcomm", "mw"),
           "in physical units (--model/--cluster/--config): the pass times come from the model and the cluster")
    with errors_to_exit(parser):
        trace_path, plot_path, exports = _outputs(args)
        study = load_study(args.config, units_overrides(args))
        result = run_study(study)
        _write_outputs(result.sim.trace, trace_path, plot_path)
        pipeline = result.sim.graph.schedule  # the pipeline schedule under the data-parallel tasks
        for comms, path in exports.items():
            write_torch_csv(lower(pipeline) if comms else pipeline, path, comms=comms)
    if args.json:
        print_json(result.to_dict())
    else:
        print(result.format())
    if not args.json:
        for what, path in (("trace", trace_path), ("timeline", plot_path), *((f"torch CSV{' +comms' * c}", p) for c, p in exports.items())):
            if path is not None:
                print(f"wrote {what}: {path}")
    return 0


def format_table(result: SimResult) -> str:
    """A readable summary: the schedule's shape, then one line per rank."""
    d = result.to_dict()
    lines = [
        f"schedule {d['schedule']}: pp={d['pp']} microbatches={d['microbatches']} chunks={d['chunks']} "
        f"({d['stages']} stages)",
        "costs: " + " ".join(f"{k}={v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else f"{k}={v}"
                             for k, v in d["costs"].items() if k not in ("model", "warnings")),
        *(f"warning: {w}" for w in d["costs"].get("warnings", [])),  # the cost model's guesses
        f"makespan {d['makespan']:.6g}   bubble ratio {d['bubble_ratio']:.4f}   span bubble {d['span_bubble']:.4%}   "
        f"peak activations {d['peak_activations']:.4g} M_B",
        *([f"exact refinement: {d['refinement']}" + (", its schedule kept" if d["refined"] else ", the seed kept")]
          if "refinement" in d else []),
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


def _list() -> int:
    for n in names():
        sp = spec(n)
        shape = "v>=2 chunks" if sp.multi_chunk else "v>=1 chunks" if sp.any_chunks else "1 stage/rank"
        print(f"{n:<18} {shape:<13} {sp.summary}")
    return 0


UNITS_ONLY = ("dp", "tp", "cp", "ep", "dp_mode", "microbatch_size", "bucket_mb", "collective", "order", "efficiency", "sp",
              "seq_len", "attention", "dtype", "reduce_dtype", "elementwise", "tp_overlap", "contention", "stack",
              "post_validation", "moe_dispatcher", *COMM_KEYS)


@guarded
def main(argv: Sequence[str] | None = None, prog: str = "python -m sim") -> int:
    parser = _parser(prog)
    args = parser.parse_args(argv)
    with errors_to_exit(parser):  # the user's modules register their schedules before any name is looked up
        import_schedules(args.imports)
    if args.list:
        return _list()
    if args.recompute is not None:  # names in any case, as everywhere
        args.recompute = find_name(args.recompute, (*RECOMPUTE_PLACEMENTS, "selective")) or args.recompute
    if args.model or args.cluster or args.config:
        if args.costs:
            fail(f"{prog}: --costs (a profiled cost file) does not combine with --model/--cluster/--config")
        return units_main(args, parser)
    refuse(given(args, *UNITS_ONLY), "without physical units: add --model and --cluster (or --config)")
    check_cost_flags(args)
    if isinstance(args.mem_limit, str):
        fail(f"--mem-limit {args.mem_limit!r}: a size in bytes applies in physical units (--model/--cluster); with "
             "unit costs the limit is activations per rank in M_B, a number such as 6")
    if args.recompute not in (None, *RECOMPUTE_PLACEMENTS):
        fail(f"--recompute {args.recompute!r} without physical units: valid are none, full (an R before every "
             "backward) and bubbles; selective recomputes part of a layer, which needs --model and --cluster")
    needed = ("schedule",) if (args.schedule or "").startswith("csv:") else ("schedule", "pp", "microbatches")
    missing = [f"--{f}" for f in needed if getattr(args, f) is None]
    if missing:
        fail(f"{prog}: the following arguments are required: {', '.join(missing)} (see --help)")
    with errors_to_exit(parser):
        trace_path, plot_path, exports = _outputs(args)  # every input is checked before anything runs or is written
        costs = uniform_costs(args)
        graph = validate(load_graph(args.schedule, pp=args.pp, microbatches=args.microbatches, chunks=args.chunks,
                                    **schedule_options(args)))
        if args.recompute not in (None, "none") or args.recompute_limit is not None:
            c = costs  # the uniform times (a --costs file replaces them below): the pass places R's with them
            graph = validate(lower(place_recompute(graph.schedule, args.recompute or "none", args.recompute_limit,
                                                   (c.tf, c.tb, c.tw, c.tcomm, c.mw))))
        step_time = None
        if args.costs:
            from sim.costs.calibrated import load_costs
            from sim.costs.profiled import step_time

            costs = load_costs(args.costs, graph.schedule.num_stages, args.costs_profile)
        result = simulate(graph, costs, check=False)
        step = step_time(result, costs) if step_time is not None else None
        _write_outputs(result.trace, trace_path, plot_path)
        for comms, path in exports.items():
            write_torch_csv(graph, path, comms=comms)
    if args.json:
        print_json(result.to_dict() if step is None else {**result.to_dict(), "step_time": step})
        return 0
    print(format_table(result))
    if step is not None:
        print(f"step time {step:.6g} s (makespan + optimizer steps + step overhead, as the runtime measures it)")
    for what, path in (("trace", trace_path), ("timeline", plot_path)):
        if path is not None:
            print(f"wrote {what}: {path}")
    for comms, path in exports.items():
        print(f"wrote torch CSV ({'compute+comms' if comms else 'compute only'}): {path}")
    return 0
