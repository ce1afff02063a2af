"""Where decentralized and local SGD overtake the exact all-reduce: time to a loss against network bandwidth.

    python experiments/bandwidth_sweep.py --curves out/comm-modes [--markdown docs/results/bandwidth-sweep.md]
        [--figure docs/bandwidth-sweep.png] [--loss-figure docs/time-to-loss.png]

Steps to the target loss: measured, from the curves ``experiments/comm_modes_loss.py`` wrote (one
``metrics.jsonl`` per mode, dp 4 on this machine), the losses smoothed over ``--smooth`` steps. Seconds per step:
simulated, gpt-1.5b on 64 H100s (8 DGX nodes, NVLink inside a node), pp 1, dp 64, 4 microbatches of 4
sequences, 1F1B, with each GPU's inter-node link swept from 1 to 400 Gb/s (its latency as the preset's). Time to
the loss = steps x seconds per step (local-sgd amortized over K, :mod:`sim.plan.comm_modes`). Two exact baselines: ddp
with the simulator's choice of all-reduce (hierarchical here: reduce-scatter in the node, ring across nodes on
1/8 of the bytes, all-gather in the node) and ddp with a flat ring all-reduce. The target loss (default): the
highest of the modes' lowest smoothed losses, so every mode reaches it. Deterministic: no timing is measured.

The statistical side comes from a tiny GPT at dp 4 and the time side from gpt-1.5b at dp 64: the figure shows
how the two combine, and where the crossovers fall for those step ratios, not the step ratios gpt-1.5b itself
would have.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit
from analysis.figures import place_legend
from analysis.results_page import check_page, table, write_page
from analysis.time_to_loss import LossCurve, parse_mode, plot_loss_vs_time, read_curve, smoothed, steps_to_loss
from common.outputs import check_output_file
from schedules import ConfigError
from sim.costs.cluster import Link, cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.comm_modes import mode_step_time
from sim.plan.study import Study

MODEL, CLUSTER, DP, MICROBATCHES, MB_SIZE = "gpt-1.5b", "dgx-h100:8", 64, 4, 4
GBPS = (1, 2, 5, 10, 20, 50, 100, 200, 400)
LOSS_FIGURE_GBPS = 10
# (label in the table, curve, extra ParallelConfig keys)
MODES = (("ddp", "ddp", {}), ("ddp (flat ring)", "ddp", {"collective": "ring"}),
         ("local-sgd:4", "local-sgd:4", {}), ("local-sgd:16", "local-sgd:16", {}),
         ("decentralized:ring", "decentralized:ring", {}), ("decentralized:random", "decentralized:random", {}))


def step_time(label_curve: str, extra: dict, gbps: float) -> float:
    base = cluster_preset(CLUSTER)
    cluster = replace(base, inter=Link(alpha=base.inter.alpha, bandwidth=gbps * 1e9 / 8))
    costs = TransformerCosts(model=model_preset(MODEL), cluster=cluster, microbatch_size=MB_SIZE,
                             parallel=ParallelConfig(pp=1, dp=DP, **parse_mode(label_curve).parallel_keys(), **extra))
    return mode_step_time(Study(schedule="1f1b", microbatches=MICROBATCHES, costs=costs)).per_step


def load_curves(folder: Path) -> dict[str, LossCurve]:
    out = {}
    for _, name, _ in MODES:
        path = folder / name.replace(":", "-") / "metrics.jsonl"
        out[name] = LossCurve(parse_mode(name), *read_curve(path), str(path))
    return out


def plot(times: dict[str, list[float | None]], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, rel) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, ys in times.items():
        pts = [(g, y) for g, y in zip(GBPS, ys, strict=True) if y is not None]
        ax.plot(*zip(*pts, strict=True), marker="o", label=label)
        rel.plot([g for g, _ in pts], [y / times["ddp"][GBPS.index(g)] for g, y in pts], marker="o", label=label)
    for a in (ax, rel):
        a.set_xscale("log")
        a.set_xlabel("inter-node bandwidth per GPU (Gb/s)")
    ax.set_yscale("log")
    ax.set_ylabel(f"simulated time to loss {target:.3f} (s)")
    rel.set_yscale("log")
    rel.axhline(1.0, color="grey", linewidth=0.8)
    rel.set_ylabel("time to loss relative to ddp's (ratio; below 1: faster)")
    fig.suptitle(f"time to loss {target:.3f}: steps measured on a tiny GPT at dp 4 x seconds per step simulated for "
                 f"{MODEL} on {DP} H100s ({CLUSTER})", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    place_legend(rel, fontsize=8, relayout=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    p = OneLineParser(prog="python experiments/bandwidth_sweep.py", description=__doc__.splitlines()[0])
    p.add_argument("--curves", default="out/comm-modes", metavar="DIR", help="comm_modes_loss.py's --out")
    p.add_argument("--target", type=float, metavar="L", help="target loss (default: every mode reaches it)")
    p.add_argument("--smooth", type=int, default=20, metavar="W", help="trailing mean over W steps (default 20)")
    p.add_argument("--markdown", metavar="PAGE.md", help="also write the results page")
    p.add_argument("--figure", default="out/bandwidth-sweep.png", metavar="PNG", help="the sweep's figure")
    p.add_argument("--loss-figure", metavar="PNG", help=f"loss against simulated time at {LOSS_FIGURE_GBPS} Gb/s")
    args = p.parse_args()
    with errors_to_exit(p):
        if args.markdown:
            check_page(args.markdown)
        for flag, path in (("--figure", args.figure), ("--loss-figure", args.loss_figure)):
            if path is not None:
                check_output_file(path, flag, (".png",))
        curves = load_curves(Path(args.curves))
        smooth = {k: smoothed(c.losses, args.smooth) for k, c in curves.items()}
        target = args.target if args.target is not None else max(min(s) for s in smooth.values())
        steps = {k: steps_to_loss(c.steps, smooth[k], target) for k, c in curves.items()}
        if steps["ddp"] is None:
            raise ConfigError(f"ddp's curve never reaches the target loss {target}; give a higher --target",
                              field="target")
    seconds = {label: [step_time(name, extra, g) for g in GBPS] for label, name, extra in MODES}
    times = {label: [None if steps[name] is None else steps[name] * t for t in seconds[label]]
             for label, name, _ in MODES}
    plot(times, Path(args.figure), target)
    if args.loss_figure:
        at = GBPS.index(LOSS_FIGURE_GBPS)
        plot_loss_vs_time([curves[name] for _, name, extra in MODES if not extra],
                          {name: seconds[label][at] for label, name, extra in MODES if not extra}, target,
                          args.loss_figure, measured="a tiny GPT at dp 4 (comm_modes_loss.py, this machine)",
                          simulated=f"{MODEL} on {DP} H100s at {LOSS_FIGURE_GBPS} Gb/s per GPU")
    body = _body(steps, seconds, times, target, args)
    print(body)
    if args.markdown:
        write_page(args.markdown, "Bandwidth sweep: time to a target loss per data-parallel mode", body)


def _body(steps, seconds, times, target: float, args) -> str:
    head = ["mode", "steps to loss", *(f"{g} Gb/s" for g in GBPS)]
    step_rows = [[label, str(steps[name]), *(f"{t:.3f}" for t in seconds[label])] for label, name, _ in MODES]
    ttl_rows = [[label, str(steps[name]), *("not reached" if t is None else f"{t:.1f}" for t in times[label])]
                for label, name, _ in MODES]
    faster = []
    for label, _, _ in MODES[1:]:
        for base in ("ddp", "ddp (flat ring)")[: 1 + (label != "ddp (flat ring)")]:
            wins = [g for g, t, d in zip(GBPS, times[label], times[base], strict=True) if t is not None and t < d]
            faster.append(f"- {label}: faster than {base} at {', '.join(f'{g}' for g in wins) or 'no'} Gb/s "
                          "of those swept")
    return (f"Target loss {target:.4f} (losses smoothed over {args.smooth} steps; curves from `{args.curves}`). "
            f"gpt-1.5b on {CLUSTER} (64 H100s), pp 1, dp {DP}, {MICROBATCHES} microbatches of {MB_SIZE}; the "
            "inter-node link per GPU swept, NVLink inside a node unchanged.\n\n"
            "Simulated seconds per step (local-sgd: amortized over K):\n\n" + table(head, step_rows) +
            "\n\nTime to the target loss (s) = steps x seconds per step:\n\n" + table(head, ttl_rows) +
            "\n\n" + "\n".join(faster) + f"\n\nFigure: `{args.figure}`.")


if __name__ == "__main__":
    main()
