"""Where a DualPipe F+B pair's all-to-all overlap pays: MoE layers on DGX H100s, by expert-parallel placement.

For each model (sim.costs.moe presets) and ep (the experts over ep GPUs: 8 in one node, then over 2, 8 and 32
nodes, tp 1), one microbatch of one sequence: a layer's attention and MoE-MLP seconds (forward, backward), one
all-to-all, and a pair of one forward and one backward over 4 MoE layers run one after the other, on two streams
(sim.costs.moe.two_stream_time), its compute alone and its communication alone. The overlap pays while the pair's
all-to-alls fit under its compute; past that the pair is communication-bound and the two streams save only the
compute they hide.

Then whole steps: DeepSeek-V3 on 64 DGX H100 nodes (pp 8 x dp 64, zero1, full recomputation, 32 microbatches),
by schedule (1F1B, interleaved 1F1B with 2 chunks, Megatron-Core's combined 1F1B with 2 chunks (its EP A2A overlap:
interleaved 1F1B's steady-state F and B as overlapped pairs), ZB-V, DualPipe-V) and expert placement (ep 8 in a node; ep 64
over 8 nodes with the plain all-to-all and with DeepEP's dispatch): step time and tokens/s from the simulator.

Usage: python experiments/moe_overlap.py [--layers 4] [--markdown docs/results/moe_overlap.md] [--plot FILE.png]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit, positive_int
from analysis.results_page import check_page, table, write_page
from schedules import Kind
from sim.costs.cluster import cluster_preset
from sim.costs.moe import two_stream_time
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.study import Study, run_study

CASES = (("mixtral-8x7b", 8, 1), ("deepseek-v3", 8, 1), ("deepseek-v3", 16, 2), ("deepseek-v3", 64, 8),
         ("deepseek-v3", 256, 32))


def pair(model, cluster, ep: int, layers: int) -> tuple[TransformerCosts, dict[str, float]]:
    """A stage of ``layers`` MoE layers between two others (no embedding, no head) and its F+B pair, as the
    simulator times a DualPipe pair (TransformerCosts.segments, sim.costs.moe.two_stream_time): one after the
    other, on two streams, its compute alone and its all-to-alls alone (seconds)."""
    costs = TransformerCosts(model=model, cluster=cluster, parallel=ParallelConfig(pp=1, dp=ep, ep=ep),
                             layers_per_stage=(model.layers - 2 * layers, layers, layers))
    f, b = costs.segments(Kind.F, 1, 3), costs.segments(Kind.B, 1, 3)
    compute = sum(x.seconds for x in (*f, *b) if not x.comm)
    comm = sum(x.seconds for x in (*f, *b) if x.comm)
    return costs, {"sequential": compute + comm, "overlapped": two_stream_time([f, b]), "compute": compute,
                   "comm": comm}


def rows(layers: int) -> list[dict]:
    out = []
    for name, ep, nodes in CASES:
        costs, p = pair(model_preset(name), cluster_preset(f"dgx-h100:{nodes}"), ep, layers)
        hidden = (p["sequential"] - p["overlapped"]) / p["comm"] if p["comm"] else 0.0
        out.append({"model": name, "ep": ep, "nodes": nodes,
                    "attention_f_ms": 1e3 * costs.moe_costs("attention").forward(),
                    "experts_f_ms": 1e3 * costs.moe_costs("experts").forward(), "a2a_ms": 1e3 * costs.all_to_all_time(),
                    "sequential_ms": 1e3 * p["sequential"], "overlapped_ms": 1e3 * p["overlapped"],
                    "compute_ms": 1e3 * p["compute"], "comm_ms": 1e3 * p["comm"], "hidden": hidden})
    return out


SCHEDULES = (("1f1b", None), ("interleaved-1f1b", 2), ("combined-1f1b", 2), ("zb-v", None), ("dualpipe-v", None))
PLACEMENTS = ((8, "alltoall"), (64, "alltoall"), (64, "deepep"))


def steps() -> list[dict]:
    """Whole steps of DeepSeek-V3 by schedule and expert placement (module docstring)."""
    out = []
    for ep, dispatcher in PLACEMENTS:
        costs = TransformerCosts(model=model_preset("deepseek-v3"), cluster=cluster_preset("dgx-h100:64"),
                                 parallel=ParallelConfig(pp=8, dp=64, ep=ep, dp_mode="zero1"), recompute="full",
                                 moe_dispatcher=dispatcher)
        for name, chunks in SCHEDULES:
            r = run_study(Study(schedule=name, microbatches=32, costs=costs, chunks=chunks))
            out.append({"schedule": name + (f" v{chunks}" if chunks else ""), "ep": ep, "dispatcher": dispatcher,
                        "step_s": r.step_time, "tokens_per_s": r.tokens_per_step / r.step_time})
    return out


STEP_HEAD = ["schedule", "ep 8 (alltoall) step s", "ep 64 (alltoall) step s", "ep 64 (deepep) step s",
             "tokens/s, ep 8"]


def _step_cells(points: list[dict]) -> list[list[str]]:
    rows = []
    for name in dict.fromkeys(p["schedule"] for p in points):
        mine = [p for p in points if p["schedule"] == name]
        rows.append([name, *(f"{p['step_s']:.2f}" for p in mine), f"{mine[0]['tokens_per_s']:,.0f}"])
    return rows


HEAD = ["model", "ep (nodes)", "attention F ms", "experts F ms", "all-to-all ms", "pair sequential ms",
        "pair overlapped ms", "pair compute ms", "pair comm ms", "comm hidden"]


def _cells(r: dict) -> list[str]:
    return [r["model"], f"{r['ep']} ({r['nodes']})", f"{r['attention_f_ms']:.2f}", f"{r['experts_f_ms']:.2f}",
            f"{r['a2a_ms']:.2f}", f"{r['sequential_ms']:.1f}", f"{r['overlapped_ms']:.1f}", f"{r['compute_ms']:.1f}",
            f"{r['comm_ms']:.1f}", f"{100 * r['hidden']:.0f}%"]


def plot(points: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = [f"{r['model']}\nep {r['ep']} ({r['nodes']} node{'s' if r['nodes'] > 1 else ''})" for r in points]
    x = range(len(points))
    ax.bar([i - 0.27 for i in x], [r["sequential_ms"] for r in points], 0.27, label="one after the other")
    ax.bar(list(x), [r["overlapped_ms"] for r in points], 0.27, label="two streams (DualPipe pair)")
    ax.bar([i + 0.27 for i in x], [r["compute_ms"] for r in points], 0.27, label="compute alone")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("F+B pair, 4 MoE layers (ms)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    ap = OneLineParser(prog="python experiments/moe_overlap.py", description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=positive_int, default=4, help="MoE layers in the pair's stage (default 4)")
    ap.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/moe_overlap.md)")
    ap.add_argument("--plot", metavar="FILE.png", help="also draw the pair times")
    args = ap.parse_args()
    if args.plot:
        from analysis.timeline import check_figure_path

        with errors_to_exit(ap):
            check_figure_path(args.plot)
    if args.markdown:
        with errors_to_exit(ap):
            check_page(args.markdown)
    points = rows(args.layers)
    print("  ".join(HEAD))
    for r in points:
        print("  ".join(_cells(r)))
    whole = steps()
    print("  ".join(STEP_HEAD))
    for row in _step_cells(whole):
        print("  ".join(row))
    png = plot(points, Path(args.plot)) if args.plot else None
    if png:
        print(f"wrote {png}")
    if args.markdown:
        figure = ""
        if png is not None:
            rel = os.path.relpath(Path(png).resolve(), Path(args.markdown).resolve().parent)
            figure = f"\n![F+B pair times by expert-parallel placement]({rel})\n"
        body = (f"{__doc__.split(chr(10) + chr(10))[1]}\n\nPair of {args.layers} MoE layers, DGX H100 device model "
                "(sim.costs.devices), all-to-all at NCCL's achieved NVLink and NIC rates (sim.costs.cluster).\n\n"
                f"{table(HEAD, [_cells(r) for r in points])}\n{figure}\n"
                f"{__doc__.split(chr(10) + chr(10))[2]}\n\n{table(STEP_HEAD, _step_cells(whole))}\n")
        print(f"wrote {write_page(args.markdown, 'MoE: where the all-to-all overlap pays', body)}", file=sys.stderr)


if __name__ == "__main__":
    main()
