"""A self-contained report (Markdown + PNG figures) comparing schedules, and predictions with measurements.

    python -m analysis report --out out/report [--pp 4 --microbatches 8 --chunks 2] [--real t1.csv ...]

Sections: the comparison table at one shape, a recommendation, bubble ratio
against the number of microbatches (with the closed forms where they exist),
memory against throughput (the Pareto view), timelines, and, when real traces
are given, prediction against measurement with side-by-side timelines.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.compare import comparison_table, simulate_many
from analysis.theory import bubble_ratio as closed_form_bubble
from analysis.timeline import plot_timeline, plot_timelines
from analysis.validation import compare_pair, validation_summary
from schedules import ScheduleError, build, lower, names, spec
from schedules.trace import read_trace, write_trace
from sim import SimResult, UniformCosts, simulate

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ReportConfig", "write_report"]


@dataclass(frozen=True, kw_only=True)
class ReportConfig:
    pp: int = 4
    microbatches: int = 8
    chunks: int = 2
    schedules: tuple[str, ...] = ()  # empty: every registered schedule
    costs: UniformCosts = field(default_factory=UniformCosts)
    sweep: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)  # microbatch counts for the bubble curves
    real_traces: tuple[Path, ...] = ()
    profile: Path | None = None  # a cost file (python -m real.profile): predictions for the real traces in seconds
    progress: bool = True

    def __post_init__(self) -> None:
        for name in self.schedules:
            spec(name)  # unknown names fail here, before anything is written
        for path in self.real_traces:
            if not Path(path).is_file():
                raise ScheduleError(f"trace file {str(path)!r} not found")
        if self.profile is not None:
            from sim.profiled import load_profile

            load_profile(self.profile)  # a missing or malformed file fails here, before anything is written


def _savefig(fig, path: Path) -> Path:
    tmp = path.with_name(".tmp-" + path.name)
    fig.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, path)
    return path


def _progress(items: Sequence, enabled: bool, desc: str) -> Iterable:
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="sim", leave=False)


def _sweep(cfg: ReportConfig, chosen: Sequence[str]) -> dict[str, list[tuple[int, float, float | None]]]:
    """(m, simulated bubble ratio, closed form or None) per schedule, for every m the schedule accepts."""
    jobs = [(n, m) for n in chosen for m in cfg.sweep]
    out: dict[str, list[tuple[int, float, float | None]]] = {n: [] for n in chosen}
    c = cfg.costs
    for name, m in _progress(jobs, cfg.progress, "bubble sweep"):
        v = cfg.chunks if spec(name).multi_chunk else 1
        try:
            graph = lower(build(name, pp=cfg.pp, microbatches=m, chunks=v, tf=c.tf, tb=c.tb, tw=c.tw, tcomm=c.tcomm))
        except ScheduleError:
            continue  # a shape this schedule does not take (e.g. m not a multiple of p)
        ratio = simulate(graph, c, check=False).bubble_ratio
        closed = closed_form_bubble(name, cfg.pp, m, graph.schedule.chunks, c.tf, c.tb, c.tw) if c.tcomm == 0 else None
        out[name].append((m, ratio, closed))
    return out


def _plot_bubbles(sweep: dict[str, list[tuple[int, float, float | None]]], cfg: ReportConfig, path: Path) -> Path:
    """One small panel per schedule on shared axes: simulated dots, closed-form line where one exists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [n for n, rows in sweep.items() if rows]
    cols = min(5, max(1, len(shown)))
    nrows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(2.6 * cols, 2.3 * nrows + 0.6), sharex=True, sharey=True,
                             squeeze=False)
    for ax, name in zip(axes.flat, shown, strict=False):
        rows = sweep[name]
        ax.plot([r[0] for r in rows], [r[1] for r in rows], "o", color="#3a78c9", ms=3.5, label="simulated")
        closed = [(r[0], r[2]) for r in rows if r[2] is not None]
        if closed:
            ax.plot([x for x, _ in closed], [y for _, y in closed], "-", color="#d1495b", lw=1, label="closed form")
        ax.set_title(name, fontsize=9)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("microbatches (m)", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("bubble ratio", fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8, frameon=False)
    fig.suptitle(f"bubble ratio against microbatches, p={cfg.pp}", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    _savefig(fig, path)
    plt.close(fig)
    return path


def _pareto(table: pd.DataFrame) -> list[str]:
    """Schedules no other beats on both throughput and peak memory."""
    rows = list(table.itertuples(index=False))
    front = []
    for r in rows:
        dominated = any(
            (o.throughput >= r.throughput and o.peak_act_max <= r.peak_act_max)
            and (o.throughput > r.throughput or o.peak_act_max < r.peak_act_max)
            for o in rows
        )
        if not dominated:
            front.append(r.schedule)
    return front


def _plot_pareto(table: pd.DataFrame, front: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    points: dict[tuple[float, float], list[str]] = {}
    for r in table.itertuples(index=False):
        points.setdefault((round(r.peak_act_max, 9), round(r.throughput, 9)), []).append(r.schedule)
    for (x, y), group in points.items():  # schedules at the same point share one label
        on = any(s in front for s in group)
        ax.scatter(x, y, s=50 if on else 25, color="#d1495b" if on else "#3a78c9", zorder=3)
        ax.annotate(", ".join(group), (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    pts = sorted((r.peak_act_max, r.throughput) for r in table.itertuples(index=False) if r.schedule in front)
    if len(pts) > 1:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "--", color="#d1495b", lw=1, label="Pareto front")
        ax.legend(fontsize=8)
    ax.set_xlabel("peak activations on the busiest rank (M_B)")
    ax.set_ylabel("throughput (microbatches per unit time)")
    ax.set_title("memory vs throughput (up and left is better)", fontsize=10, loc="left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)
    return path


def _markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _recommend(table: pd.DataFrame, front: list[str]) -> str:
    fastest = table.sort_values(["makespan", "peak_act_max"]).iloc[0]
    lean = table.sort_values(["peak_act_max", "makespan"]).iloc[0]
    ties = table[table["makespan"] <= fastest["makespan"] * (1 + 1e-9)]
    lines = [
        f"- **Fastest:** `{fastest['schedule']}`: step {fastest['makespan']:.4g}, bubble {fastest['bubble_ratio']:.1%}, "
        f"peak {fastest['peak_act_max']:.3g} M_B" + (f" (tied with {', '.join(f'`{s}`' for s in ties['schedule'] if s != fastest['schedule'])})" if len(ties) > 1 else "") + ".",
        f"- **Least memory:** `{lean['schedule']}`: peak {lean['peak_act_max']:.3g} M_B at step {lean['makespan']:.4g} "
        f"({lean['makespan'] / fastest['makespan'] - 1:+.1%} against the fastest).",
        "- **Pareto front** (no other schedule is both faster and leaner): " + ", ".join(f"`{s}`" for s in front) + ".",
        "- Pick from the front by the memory you can spend: the leftmost point that fits your activation budget.",
    ]
    return "\n".join(lines)


def _real_section(cfg: ReportConfig, out: Path) -> list[str]:
    """Prediction against measurement for each real trace (simulated here at its own shape and costs)."""
    if not cfg.real_traces:
        return []
    from analysis.perfetto import write_chrome_trace
    from sim.profiled import load_profile

    where = (f"Predicted with the profiled costs of `{cfg.profile}` (seconds, measured on the machine by "
             "`python -m real.profile`); simulated and measured timelines share one time axis. Span: first task "
             "start to last task end of the traced step (the step time the runtime reports adds the optimizer "
             "steps and the loss all-reduce; `experiments/validate_sim.py` compares those)."
             if cfg.profile is not None else
             "Predicted with the uniform costs above (unit-free), so only the shape and the bubble compare; "
             "pass `--costs PROFILE.json` for predictions in seconds.")
    rows, lines = [], ["## Prediction against measurement", "", where, ""]
    for path in cfg.real_traces:
        real = read_trace(path)
        if real.attrs.get("source") != "real":
            raise ScheduleError(f"trace {str(path)!r} is not a real run's trace (attrs source={real.attrs.get('source')!r})")
        params = real.attrs.get("params", {})
        name = str(real.attrs.get("schedule"))
        graph = lower(build(name, pp=int(params["pp"]), microbatches=int(params["microbatches"]),
                            chunks=int(params.get("chunks") or spec(name).default_chunks)))
        costs = cfg.costs if cfg.profile is None else load_profile(cfg.profile, graph.schedule.num_stages)
        predicted = simulate(graph, costs).trace
        row = compare_pair(predicted, real)
        rows.append(row)
        stem = Path(path).stem
        # Profiled predictions are in seconds like the measurement: one time axis shows the error directly.
        plot_timelines([predicted, real], out / f"sim-vs-real-{stem}.png", same_axis=cfg.profile is not None)
        write_chrome_trace(real, out / f"{stem}.perfetto.json")
        lines += [f"![{name}: simulated (top) and measured (bottom)](sim-vs-real-{stem}.png)", ""]
    summary = validation_summary(rows)
    table = _markdown_table(
        ["schedule", "predicted span", "measured span (traced step)", "error", "predicted bubble", "measured bubble"],
        [(r["schedule"], f"{r['predicted_step_time']:.4g}", f"{r['measured_step_time']:.4g}", f"{r['error']:+.1%}",
          f"{r['predicted_bubble']:.1%}", f"{r['measured_bubble']:.1%}") for r in rows],
    )
    return [*lines[:4], table, "",
            f"Mean absolute error {summary['mean_abs_error']:.1%}, worst {summary['max_abs_error']:.1%}, "
            f"ranking agreement (Kendall tau) {summary['kendall_tau']:.2f}.", "", *lines[4:]]


def write_report(out: str | os.PathLike, cfg: ReportConfig) -> Path:
    """Simulate, plot and write ``out/report.md``; returns its path."""
    out = Path(out)
    chosen = list(cfg.schedules) or names(by_family=True)
    results: list[SimResult] = simulate_many(chosen, pp=cfg.pp, microbatches=cfg.microbatches, chunks=cfg.chunks,
                                             costs=cfg.costs)
    out.mkdir(parents=True, exist_ok=True)
    table = comparison_table(results)
    front = _pareto(table)
    sweep = _sweep(cfg, chosen)
    plot_timelines([r.trace for r in results], out / "timelines.png")
    _plot_bubbles(sweep, cfg, out / "bubble-vs-microbatches.png")
    _plot_pareto(table, front, out / "memory-vs-throughput.png")
    for r in results:
        write_trace(r.trace, out / "traces" / f"{r.schedule}.csv")
    c = cfg.costs
    md = [
        f"# Pipeline schedules at p={cfg.pp}, m={cfg.microbatches}, v={cfg.chunks}",
        "",
        f"Uniform costs per microbatch through one rank's share: tf={c.tf:g}, tb={c.tb:g}, tw={c.tw:g}, "
        f"tcomm={c.tcomm:g}, mw={c.mw:g}. Memory in M_B (one microbatch's activations for a rank's layers). "
        "Span idle: the busiest rank's idle time between its own first start and last end.",
        "",
        _markdown_table(
            ["schedule", "v", "step", "bubble", "closed form", "span idle", "peak act max/min", "throughput"],
            [(r.schedule, r.chunks, f"{r.makespan:.4g}", f"{r.bubble_ratio:.1%}",
              "-" if r.bubble_closed_form is None or math.isnan(r.bubble_closed_form) else f"{r.bubble_closed_form:.1%}",
              f"{r.span_idle:.3g}", f"{r.peak_act_max:.3g} / {r.peak_act_min:.3g}", f"{r.throughput:.4g}")
             for r in table.itertuples(index=False)],
        ),
        "",
        "## Which schedule",
        "",
        _recommend(table, front),
        "",
        "## Bubble against microbatches",
        "",
        "![bubble ratio vs microbatches](bubble-vs-microbatches.png)",
        "",
        "## Memory against throughput",
        "",
        "![memory vs throughput](memory-vs-throughput.png)",
        "",
        "## Timelines",
        "",
        "![all schedules on one time axis](timelines.png)",
        "",
        *_real_section(cfg, out),
        "Per-task traces of every simulated schedule are in `traces/` (CSV, the shared trace format).",
        "",
    ]
    for r in results:
        plot_timeline(r.trace, out / f"timeline-{r.schedule}.png")
    path = out / "report.md"
    tmp = out / ".report.md.tmp"
    tmp.write_text("\n".join(md))
    os.replace(tmp, path)
    return path
