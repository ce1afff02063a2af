"""``schedlab plan``: the fastest configuration of a model on a cluster, with exports for torchtitan and Megatron-LM."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from analysis.cli.common import (
    OneLineParser,
    add_import_arg,
    errors_to_exit,
    guarded,
    int_list,
    is_all,
    name_list,
    print_json,
)
from common.outputs import check_output_dir, check_output_file, write_files_into
from schedules import import_schedules

__all__ = ["plan_main"]


def _parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Search tp, pp, dp, ep (MoE), schedule, chunks, microbatches, dp mode, "
                      "recomputation and sequence parallelism for the fastest step; print the top K and export the winner.")
    p.add_argument("--model", required=True, metavar="NAME", help="transformer preset, e.g. llama3-405b")
    p.add_argument("--cluster", required=True, metavar="NAME:NODES", help="cluster preset, e.g. dgx-h100:64")
    p.add_argument("--global-batch", type=int, required=True, metavar="B", help="sequences per step")
    p.add_argument("--seq-len", type=int, metavar="S", help="sequence length (default: the model preset's)")
    p.add_argument("--memory-limit", type=float, metavar="GB", help="memory per device (default: the device's)")
    p.add_argument("--top", type=int, default=5, metavar="K", help="configurations to list (default 5)")
    p.add_argument("--workers", type=int, metavar="N", help="processes (default: every core)")
    p.add_argument("--schedules", default="all", metavar="A,B,...",
                   help="schedules to try (default all): names, or your own as FILE.py:NAME")
    add_import_arg(p)
    p.add_argument("--chunks", type=int_list, default=(2, 3, 4, 8), metavar="V,...",
                   help="stages per rank tried for multi-chunk schedules (default 2,3,4,8)")
    p.add_argument("--microbatch-sizes", type=int_list, metavar="B,...",
                   help="microbatch sizes tried (default: every divisor of the batch per replica)")
    p.add_argument("--dp-modes", default="sync,ddp,zero1,zero2,fsdp", metavar="A,B,...",
                   help="data-parallel modes tried: sync, ddp, zero1, zero2, fsdp (= zero3), ps (needs a cluster with "
                        "parameter servers, e.g. dgx-h100:2+ps2) (default sync,ddp,zero1,zero2,fsdp)")
    p.add_argument("--ep", type=int_list, metavar="E,...",
                   help="expert-parallel degrees tried for a MoE model (default: every divisor of dp that divides "
                        "its experts)")
    p.add_argument("--out", default="out/plan", metavar="DIR",
                   help="where the exports and the Pareto plot go (default out/plan/)")
    p.add_argument("--link-model", default="fair", metavar="MODEL",
                   help="how transfers share a port in the simulations: fair (default) or fcfs (docs/links.md)")
    p.add_argument("--grad-compression", default="none", metavar="CODEC",
                   help="codec of every candidate's gradient collectives: none (default), fp16, bf16, int8, "
                   "powersgd:R (with --dp-modes ddp only); not in the exports (docs/compression.md)")
    p.add_argument("--reduce-dtype", default="bf16", metavar="DTYPE",
                   help="bf16 (default) or fp32: gradients accumulated and reduced in fp32, as Llama 3 405B was "
                        "trained (Dubey et al. 2024, sec. 3.3.2): 4 bytes per gradient in memory and on the wire")
    p.add_argument("--against", metavar="LAYOUT",
                   help="also simulate this layout, written as a row label of the table, e.g. 'tp8+sp pp16 dp64 "
                        "interleaved-1f1b v8 m32x1 zero2 rc-none', and say why #1 beats it and whether it fits")
    p.add_argument("--exact", action="store_true",
                   help="simulate every finalist's whole step (default: a long step is simulated over two periods of "
                        "its steady phase and extended where they agree, within about 0.3%% of the step: sim.plan.extrapolate)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


@guarded
def plan_main(argv: Sequence[str] | None = None, prog: str = "schedlab plan") -> int:
    p = _parser(prog)
    args = p.parse_args(argv)
    from analysis.plan.exports import write_exports
    from analysis.plan.megatron import MEGATRON_COMMIT
    from analysis.plan.report import format_plan, plot_pareto, why_against, why_winner
    from analysis.plan.torchtitan import TORCHTITAN_VERSION
    from sim.costs.cluster import cluster_preset
    from sim.costs.transformer import model_preset
    from sim.plan.against import in_space, parse_layout, simulate_layout
    from sim.plan.search import plan
    from sim.plan.space import PlanSpace

    with errors_to_exit(p):
        import_schedules(args.imports)  # a user's module registers its schedules before the space is checked
        model = model_preset(args.model)
        if args.seq_len is not None:
            model = dataclasses.replace(model, seq_len=args.seq_len)
        space = PlanSpace(
            model=model, cluster=cluster_preset(args.cluster), global_batch=args.global_batch,
            memory_limit=None if args.memory_limit is None else args.memory_limit * 1e9,
            schedules=None if is_all(args.schedules) else tuple(name_list(args.schedules)),
            chunks=tuple(args.chunks), microbatch_sizes=None if args.microbatch_sizes is None else tuple(args.microbatch_sizes),
            dp_modes=tuple(name_list(args.dp_modes, [])), link_model=args.link_model,
            grad_compression=args.grad_compression, reduce_dtype=args.reduce_dtype,
            ep=None if args.ep is None else tuple(args.ep))
        layout = None if args.against is None else parse_layout(args.against, space)
        out = check_output_dir(args.out, "output folder")
        for name in ("schedule.csv", "torchtitan_plan.py", "megatron.sh", "pareto.png"):
            check_output_file(out / name, "output file")  # a directory or fifo of that name: refused before work
        bar = None
        if not args.no_progress and sys.stderr.isatty():  # a bar in a log or a pipe is noise around the one line
            from tqdm import tqdm

            bar = tqdm(total=1, desc="plan", unit="config", file=sys.stderr, leave=False, mininterval=0.5)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.n = done
            bar.refresh()

        try:
            result = plan(space, top=args.top, workers=args.workers, progress=progress if bar is not None else None,
                          extrapolate=not args.exact)
        finally:
            if bar is not None:
                bar.close()
        from sim.plan.study import Study

        win = result.top[0].config  # plan() refuses a question with no configuration
        study = Study(schedule=win.schedule, microbatches=win.microbatches, chunks=win.chunks,
                      costs=_costs(space, win))
        staged: dict[str, Path] = {}

        def fill(stage: Path) -> None:  # the exports and the Pareto plot, all or none
            staged.update(write_exports(win, model, args.global_batch, study, stage, final=out,
                                        reduce_dtype=space.reduce_dtype))
            plot_pareto(result, stage / "pareto.png")

        files = write_files_into(out, fill, "output folder")
        exports = {k: out / v.name for k, v in staged.items()}
        against = None if layout is None else simulate_layout(layout, space)
    if args.json:
        extra = {} if against is None else {"against": {**against.to_dict(), "layout": args.against,
                                                        "fits": against.peak_memory_bytes <= space.capacity,
                                                        "untried": in_space(layout, space)}}
        print_json({**result.to_dict(), **extra, "files": [str(f) for f in files], "exported_schedule": win.pipeline,
                    "export_targets": {"torchtitan": TORCHTITAN_VERSION, "megatron-lm": MEGATRON_COMMIT}})
        return 0
    print(format_plan(result))
    extended = [i for i, e in enumerate(result.top, 1) if e.extrapolated_from]
    if extended:
        print(f"(#{', #'.join(map(str, extended))}: steps extended from two periods of their steady phase, within "
              "about 0.3% of a whole simulation; --exact simulates them whole)")
    print()
    print(why_winner(result))
    if against is not None:
        print()
        print(why_against(result.top[0], against, space.capacity, in_space(layout, space)))
    if result.top[0].same_as:
        print(f"\nexports: #1 is {result.top[0].tie_reason()}")
    print(f"\ntorchtitan {TORCHTITAN_VERSION}: {exports['torchtitan']} (a config module, see docs/exports.md)")
    print(f"Megatron-LM main {MEGATRON_COMMIT[:12]} ({exports['megatron']}):\n{exports['megatron'].read_text()}")
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _costs(space, c):
    from sim.plan.bounds import Bounds

    return Bounds(space).costs(c)
