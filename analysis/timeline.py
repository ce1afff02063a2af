"""Gantt charts of traces: one row per rank, one box per compute task.

Works on any trace (simulated or measured): it reads only the documented
columns. Forward, input-gradient, weight-gradient, full-backward and
overlapped passes get distinct colours; later chunks of a rank are drawn
lighter; microbatch numbers sit on the boxes where they fit; idle time is the
grey background showing between boxes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.figures import time_unit
from common.errors import ScheduleError
from schedules.trace import median_step
from schedules.util import atomic_write, check_output_file

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes

__all__ = ["KIND_COLORS", "check_figure_path", "draw_timeline", "plot_timeline", "plot_timelines"]

KIND_COLORS = {
    "F": "#3a78c9",  # forward: blue
    "B": "#3fa34d",  # full backward: green
    "I": "#e8a33d",  # input-gradient backward: amber
    "W": "#9467bd",  # weight-gradient backward: purple
    "R": "#8fb8e8",  # recomputed forward: light blue
    "OVERLAP_F_B": "#d1495b",  # overlapped forward+backward pair: red
}
_KIND_NAMES = {
    "F": "forward (F)",
    "B": "backward (B)",
    "I": "input grad (I)",
    "W": "weight grad (W)",
    "R": "recompute (R)",
    "OVERLAP_F_B": "overlapped F+B",
}
_FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


def check_figure_path(path: str | os.PathLike) -> Path:
    """Reject a figure name matplotlib cannot write, before any work is done."""
    return check_output_file(path, "figure file", _FIGURE_SUFFIXES)


def _lighten(color: str, amount: float) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def draw_timeline(ax: Axes, trace: pd.DataFrame, *, title: str | None = None, xmax: float | None = None) -> None:
    """Draw one trace's compute tasks on ``ax``: rank 0 on top (of several steps, the median one)."""
    trace = median_step(trace)
    compute = trace[trace["stream"] == "compute"]
    ranks = sorted(trace["rank"].unique())
    n_ranks = max(ranks) + 1 if ranks else 1
    stages_per_rank = compute.groupby("rank")["stage"].nunique().max() if len(compute) else 1
    t0 = float(trace["start"].min()) if len(trace) else 0.0
    t1 = float(trace["end"].max()) if len(trace) else 1.0
    span = max(t1 - t0, 1e-12)
    xmax = t1 if xmax is None else xmax
    # A rank's stages in increasing order are its chunks 0, 1, ...; odd chunks are drawn lighter.
    chunk_of = {
        (r, s): i for r, grp in compute.groupby("rank") for i, s in enumerate(sorted(grp["stage"].unique()))
    }
    for r in range(n_ranks):
        ax.broken_barh([(t0, span)], (r - 0.4, 0.8), facecolors="#e6e6e6", edgecolors="none", zorder=0)
    fig_width_px = ax.figure.get_figwidth() * ax.figure.dpi * ax.get_position().width
    px_per_unit = fig_width_px / max(xmax - t0, 1e-12)
    label_size = 7 if len(compute) < 400 else 5
    for row in compute.itertuples(index=False):
        kind = row.kind
        base = KIND_COLORS.get(kind, "#7f7f7f")
        chunk = chunk_of.get((row.rank, row.stage), 0)
        color = _lighten(base, 0.45) if chunk % 2 == 1 else base
        width = row.end - row.start
        ax.broken_barh([(row.start, width)], (row.rank - 0.4, 0.8), facecolors=color, edgecolors="white", linewidth=0.6, zorder=2)
        label = str(row.microbatch) if row.microbatch >= 0 else row.action.split(")")[0].lstrip("(")
        if width * px_per_unit >= 7 * len(label) + 2:
            ax.text(row.start + width / 2, row.rank, label, ha="center", va="center", fontsize=label_size, color="black", zorder=3)
    ax.set_ylim(n_ranks - 0.5, -0.5)
    ax.set_yticks(range(n_ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(n_ranks)], fontsize=8)
    ax.set_xlim(t0, xmax)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_axisbelow(True)
    ax.grid(axis="x", color="#cccccc", linewidth=0.5, zorder=1)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    if stages_per_rank and stages_per_rank > 1:
        ax.text(1.0, 1.01, "lighter: odd chunks", transform=ax.transAxes, ha="right", va="bottom", fontsize=7, color="#555555")


def _legend(fig, kinds: Sequence[str]) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=KIND_COLORS[k], label=_KIND_NAMES[k]) for k in KIND_COLORS if k in kinds]
    handles.append(Patch(facecolor="#e6e6e6", label="idle"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)


def _title(trace: pd.DataFrame) -> str:
    from analysis.metrics import summarize

    s = summarize(trace)
    name = trace.attrs.get("schedule", "trace")
    params = trace.attrs.get("params", {})
    shape = ", ".join(f"{k}={params[k]}" for k in ("pp", "microbatches", "chunks") if k in params)
    source = {"sim": "simulated", "real": "measured"}.get(trace.attrs.get("source", ""), "")
    unit = time_unit(trace)
    return (f"{name} ({shape}){', ' + source if source else ''}: makespan {s['makespan']:.4g} {unit}, "
            f"bubble {s['bubble_ratio']:.1%}")


def plot_timelines(traces: Sequence[pd.DataFrame], path: str | os.PathLike, *, same_axis: bool = True) -> Path:
    """Stack several traces' timelines in one figure (shared time axis by default) and save it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = check_figure_path(path)
    if not traces:
        raise ScheduleError("no traces to plot")
    heights = [max(1, t["rank"].max() + 1) for t in traces]
    fig, axes = plt.subplots(
        len(traces), 1, figsize=(12, 0.9 + sum(0.32 * h + 0.55 for h in heights)),
        gridspec_kw={"height_ratios": [h + 1.5 for h in heights]}, squeeze=False, sharex=same_axis,
    )
    xmax = max(float(t["end"].max()) for t in traces) if same_axis else None
    kinds: set[str] = set()
    for ax, trace in zip(axes[:, 0], traces, strict=True):
        draw_timeline(ax, trace, title=_title(trace), xmax=xmax)
        kinds |= set(trace.loc[trace["stream"] == "compute", "kind"])
    units = [time_unit(t) for t in traces]
    for ax, unit in zip(axes[:, 0], units, strict=True):  # one time axis: the bottom one says its unit
        if ax is axes[-1, 0] or not same_axis:
            ax.set_xlabel(f"time ({unit})", fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _legend(fig, sorted(kinds))
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".").lower()),
                            "figure file")
    finally:
        plt.close(fig)


def plot_timeline(trace: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Save one trace's Gantt chart (PNG, SVG or PDF by suffix)."""
    return plot_timelines([trace], path)
