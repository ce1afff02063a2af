"""``schedlab compare --time-to-loss L --curve MODE=FILE ...``: steps, step time and time to a loss per mode."""

from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit, fail, given, is_all, name_list, print_json, refuse
from common.outputs import Output, check_paths, write_files_into
from schedules import ConfigError

__all__ = ["add_time_to_loss_args", "time_to_loss_main"]

FIGURE, TABLE = "time-to-loss.png", "time-to-loss.csv"


def add_time_to_loss_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("time to a target loss (with --model and --cluster; docs/dp-modes.md)")
    g.add_argument("--time-to-loss", type=float, metavar="L",
                   help="per --curve: steps until the loss is <= L, the simulated step time, their product")
    g.add_argument("--curve", action="append", metavar="MODE=FILE",
                   help="a mode's measured losses: MODE ddp, local-sgd:K, decentralized:ring|random...; FILE a "
                   "metrics.jsonl (train --log-dir) or a step,loss CSV; repeat per mode")
    g.add_argument("--smooth", type=int, metavar="W",
                   help="with --time-to-loss: compare the trailing mean of W losses with L (default 1: raw losses)")


def time_to_loss_main(args: argparse.Namespace, parser: OneLineParser, prog: str) -> int:
    from analysis.time_to_loss import LossCurve, format_table, parse_mode, read_curve, time_to_loss_rows

    if not (args.model and args.cluster):
        fail(f"{prog}: --time-to-loss simulates each mode's step: give --model and --cluster")
    if not args.curve:
        fail(f"{prog}: --time-to-loss needs at least one --curve MODE=FILE (e.g. --curve ddp=run/metrics.jsonl)")
    refuse(given(args, "dp_mode", "sync_every", "peer_selection"), "with --time-to-loss (each --curve names its mode "
           "and option, e.g. local-sgd:4)")
    schedules = ["1f1b"] if is_all(args.schedules) else name_list(args.schedules)
    if len(schedules) != 1:
        fail(f"{prog}: --time-to-loss simulates one schedule, got --schedules {args.schedules}; name one")
    with errors_to_exit(parser):
        items = []
        for item in args.curve:
            label, sep, path = item.partition("=")
            if not sep or not path:
                raise ConfigError(f"--curve {item!r} must be MODE=FILE, e.g. ddp=run/metrics.jsonl", field="curve")
            items.append((label, path))
        out = Path(args.out)
        check_paths({"--out": Output(out, "output folder", "folder"),
                     **{f"--out {name}": Output(out / name, "output file") for name in (FIGURE, TABLE)}},
                    {f"--curve {label}": path for label, path in items})
        curves = []
        for label, path in items:
            spec = parse_mode(label)
            if any(c.spec.label == spec.label for c in curves):
                raise ConfigError(f"--curve names mode {spec.label} twice ({label!r}); give one curve per mode",
                                  field="curve")
            curves.append(LossCurve(spec, *read_curve(path), path))
        times = _step_times(args, schedules[0], [c.spec for c in curves])
        rows = time_to_loss_rows(curves, times, args.time_to_loss, 1 if args.smooth is None else args.smooth)
        title = f"{args.model} on {args.cluster}, dp={args.dp or 1}, {schedules[0]}"
        written = write_files_into(out, lambda stage: _fill(stage, curves, times, rows, title, args.time_to_loss),
                                   "output folder")
    if args.json:
        print_json({"target": args.time_to_loss, "modes": rows, "files": [str(w) for w in sorted(written)]})
        return 0
    print(format_table(rows, args.time_to_loss))
    print(f"\nwrote {out / FIGURE} (loss against simulated time) and {out / TABLE}")
    return 0


def _fill(stage: Path, curves, times, rows, title: str, target: float) -> None:
    from analysis.time_to_loss import plot_loss_vs_time

    plot_loss_vs_time(curves, times, target, stage / FIGURE, measured="the runs of the curve files",
                      simulated=title)
    with (stage / TABLE).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _step_times(args: argparse.Namespace, schedule: str, specs) -> dict[str, float]:
    """Seconds per step of each mode on the cluster (local-sgd amortized over K)."""
    from analysis.cli.simulate import comm_overrides
    from sim.costs.cluster import cluster_preset
    from sim.costs.parallel import ParallelConfig
    from sim.costs.transformer import model_preset
    from sim.costs.transformer_costs import TransformerCosts
    from sim.plan.comm_modes import mode_step_time
    from sim.plan.study import Study

    base = TransformerCosts(model=model_preset(args.model), cluster=cluster_preset(args.cluster),
                            parallel=ParallelConfig(pp=args.pp, dp=args.dp or 1, tp=args.tp or 1),
                            microbatch_size=args.microbatch_size or 1)
    overrides = comm_overrides(args)
    out = {}
    for spec in specs:
        mine = {k: v for k, v in overrides.items()  # --staleness and --trainer-speeds: the async-ps curve's
                if spec.mode == "async-ps" or k not in ("staleness", "trainer_speeds")}
        costs = replace(base, parallel=replace(base.parallel, **mine, **spec.parallel_keys()))
        study = Study(schedule=schedule, microbatches=args.microbatches, costs=costs)
        out[spec.label] = mode_step_time(study).per_step
    return out
