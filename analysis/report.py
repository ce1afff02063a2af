"""A self-contained report (Markdown + PNG figures) comparing schedules, and predictions with measurements.

    schedlab report --out out/report [--pp 4 --microbatches 8 --chunks 2] [--real t1.csv ...]

    >>> from sim.plan.sweep import SweepConfig, run_sweep
    >>> write_report("out/report", run_sweep(SweepConfig(pp=4, microbatches=8)))  # doctest: +SKIP

The simulations come from :func:`sim.plan.sweep.run_sweep`; this module only reads them.

Sections: the comparison table at one shape, a recommendation, bubble ratio
against the number of microbatches (with the closed forms where they exist),
memory against throughput (the Pareto view), recomputation's time against
memory, timelines, and, when real traces are given, prediction against
measurement with side-by-side timelines; with ``dp_modes``, the data-parallel
modes' step time and memory per rank (:mod:`analysis.dp_compare`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.compare import comparison_table
from analysis.theory import bubble_ratio as closed_form_bubble
from analysis.timeline import plot_timeline, plot_timelines
from analysis.validation.scores import compare_pair, format_tau, plot_validation, validation_summary, verdict_line
from common.outputs import check_output_dir, replace_folder
from schedules.trace import write_trace

if TYPE_CHECKING:
    import pandas as pd

    from analysis.dp_compare import DPModeRow
    from sim.plan.sweep import RecomputePoint, Sweep, SweepConfig

__all__ = ["check_report_dir", "is_report_folder", "plot_recompute_tradeoff", "write_report"]


def _savefig(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, format="png")  # into the staging folder: write_report moves it in
    return path


def _with_closed_forms(sweep: Sweep) -> dict[str, list[tuple[int, float, float | None]]]:
    """(m, simulated bubble ratio, closed form or None) per schedule."""
    c = sweep.config.costs
    out: dict[str, list[tuple[int, float, float | None]]] = {}
    for name, rows in sweep.bubbles.items():
        out[name] = [(m, ratio, closed_form_bubble(name, sweep.config.pp, m, v, c.tf, c.tb, c.tw) if c.tcomm == 0 else None)
                     for m, v, ratio in rows]
    return out


def _label_grid(axes: Any, used: int, xlabel: str, ylabel: str) -> None:
    """A grid of small plots: blank the unused panels, one x label and one y label for the whole grid."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    fig = axes.flat[0].figure
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)


def _plot_bubbles(sweep: dict[str, list[tuple[int, float, float | None]]], cfg: SweepConfig, path: Path) -> Path:
    """One small panel per schedule on shared axes: simulated dots, closed-form line where one exists."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    shown = [n for n, rows in sweep.items() if rows]
    cols = min(5, max(1, len(shown)))
    nrows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(max(2.6 * cols, 8.5), 2.3 * nrows + 0.6), sharex=True,
                             sharey=True, squeeze=False)
    for ax, name in zip(axes.flat, shown, strict=False):
        rows = sweep[name]
        ax.plot([r[0] for r in rows], [r[1] for r in rows], "o", color="#3a78c9", ms=3.5, label="simulated")
        closed = [(r[0], r[2]) for r in rows if r[2] is not None]
        if closed:
            ax.plot([x for x, _ in closed], [y for _, y in closed], "-", color="#d1495b", lw=1, label="closed form")
        ax.set_title(name, fontsize=9)
        ax.set_xscale("log", base=2)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.grid(alpha=0.3)
    _label_grid(axes, len(shown), "microbatches per step m (count)", "bubble ratio (%)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8, frameon=False, ncol=2)
    fig.suptitle(f"bubble ratio against microbatches at p={cfg.pp}: simulated (uniform costs) and the closed form",
                 fontsize=10, x=0.01, ha="left")
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

    from analysis.figures import place_labels, place_legend

    fig, ax = plt.subplots(figsize=(8, 5))
    rows = list(table.itertuples(index=False))
    for r in rows:
        on = r.schedule in front
        ax.scatter(r.peak_act_max, r.throughput, s=50 if on else 25, color="#d1495b" if on else "#3a78c9", zorder=3)
    pts = sorted((r.peak_act_max, r.throughput) for r in rows if r.schedule in front)
    if len(pts) > 1:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "--", color="#d1495b", lw=1, label="Pareto front")
    ax.set_xlabel("peak activations on the busiest rank (M_B)")
    ax.set_ylabel("throughput (microbatches/unit)")
    ax.set_title("simulated, uniform costs: memory against throughput (up and left is better)", fontsize=10,
                 loc="left")
    ax.grid(alpha=0.3)
    ax.margins(0.12)
    fig.tight_layout()
    if len(pts) > 1:
        place_legend(ax, fontsize=8)
    # schedules at one point share one label
    place_labels(ax, [r.peak_act_max for r in rows], [r.throughput for r in rows], [r.schedule for r in rows])
    _savefig(fig, path)
    plt.close(fig)
    return path


_PLACEMENT_STYLE = {"none": ("o", "#3a78c9"), "full": ("s", "#d1495b"), "bubbles": ("^", "#3fa34d")}


def plot_recompute_tradeoff(points: Sequence[RecomputePoint], path: Path) -> Path:
    """One panel per schedule: step time against peak activations for each placement of the R's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.figures import place_labels

    shown = list(dict.fromkeys(pt.schedule for pt in points))
    cols = min(4, len(shown))
    nrows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(max(2.8 * cols, 8.5), 2.4 * nrows + 1.0), squeeze=False)
    for ax, name in zip(axes.flat, shown, strict=False):
        mine = [pt for pt in points if pt.schedule == name]
        curve = sorted(mine, key=lambda pt: (pt.peak_activations, -pt.makespan))  # the trade-off, left to right
        ax.plot([pt.peak_activations for pt in curve], [pt.makespan for pt in curve], "-", color="#bbbbbb", lw=0.8)
        for pt in mine:
            marker, color = _PLACEMENT_STYLE[pt.placement]
            ax.plot(pt.peak_activations, pt.makespan, marker, color=color, ms=6, label=pt.placement)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.margins(0.3)
    _label_grid(axes, len(shown), "peak activations of the busiest rank (M_B)", "step time (unit)")
    handles = {}
    for ax in axes.flat:
        for line in ax.lines[1:]:
            handles.setdefault(line.get_label(), line)
    fig.legend(list(handles.values()), list(handles), loc="upper right", fontsize=8, frameon=False, ncol=3)
    fig.suptitle("recomputation, simulated with uniform costs:\nstep time against peak memory (down and left is "
                 "better)", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))  # half an inch for the two-line title
    for ax, name in zip(axes.flat, shown, strict=False):  # the layout is final: now the labels
        mine = [pt for pt in points if pt.schedule == name]
        place_labels(ax, [pt.peak_activations for pt in mine], [pt.makespan for pt in mine],
                     [pt.label for pt in mine], fontsize=7)
    _savefig(fig, path)
    plt.close(fig)
    return path


def _recompute_section(sweep: Sweep, out: Path) -> list[str]:
    """Per schedule: step and peak with no recomputation, R before every backward, R's moved into the bubbles."""
    points = sweep.recompute
    if not points:
        return []
    plot_recompute_tradeoff(points, out / "recompute-tradeoff.png")
    labels = list(dict.fromkeys(pt.label for pt in points))
    by = {(pt.schedule, pt.label): pt for pt in points}
    rows = [(name, *(f"{by[(name, lab)].makespan:.4g} / {by[(name, lab)].peak_activations:.3g}" for lab in labels))
            for name in dict.fromkeys(pt.schedule for pt in points)]
    return ["## Recomputation: time against memory", "",
            "An R re-runs a forward right before the backward that needs it (`full`): the forward keeps only its "
            "input, so a rank holds about one microbatch's activations, for a forward more per microbatch. "
            "`bubbles@L` starts from `full` and moves each R into idle time before its backward (after Mario, "
            "PPoPP 2025) while every rank stays within L M_B. Cells: step / peak M_B of the busiest rank.", "",
            _markdown_table(["schedule", *labels], rows), "",
            "![recomputation trade-off](recompute-tradeoff.png)", ""]


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


def _real_section(sweep: Sweep, out: Path) -> list[str]:
    """Prediction against measurement for each real trace (simulated at its own shape and costs)."""
    if not sweep.predictions:
        return []
    from analysis.perfetto import write_chrome_trace

    profile = sweep.config.profile
    rows, figures = [], []
    for path, real, predicted in sweep.predictions:
        rows.append(compare_pair(predicted, real))
        stem, name = path.stem, str(real.attrs.get("schedule"))
        # Profiled predictions are in seconds like the measurement: one time axis shows the error directly.
        plot_timelines([predicted, real], out / f"sim-vs-real-{stem}.png", same_axis=profile is not None)
        write_chrome_trace(real, out / f"{stem}.perfetto.json")
        figures += [f"![{name}: simulated (top) and measured (bottom)](sim-vs-real-{stem}.png)", ""]
    if profile is not None:
        return _against_section(sweep.config, figures)
    summary = validation_summary(rows)
    where = ("Predicted with the uniform costs above (unit-free), so only the shape and the bubble compare; "
             "pass `--costs RUN.csv --costs-profile PROFILE.json` (a calibration run's trace and the machine's "
             "profile) for predictions in seconds, made as the validation grid makes them.")
    table = _markdown_table(
        ["schedule", "predicted span", "measured span (traced step)", "error", "predicted bubble", "measured bubble"],
        [(r["schedule"], f"{r['predicted_step_time']:.4g}", f"{r['measured_step_time']:.4g}", f"{r['error']:+.1%}",
          f"{r['predicted_bubble']:.1%}", f"{r['measured_bubble']:.1%}") for r in rows],
    )
    return ["## Prediction against measurement", "", where, "", table, "",
            f"Mean absolute error {summary['mean_abs_error']:.1%}, worst {summary['max_abs_error']:.1%}, "
            f"ranking agreement (Kendall tau) {format_tau(summary['kendall_tau'])}.", "", *figures]


def _against_section(cfg: SweepConfig, figures: list[str]) -> list[str]:
    """Real runs in seconds, predicted as the validation grid predicts (:mod:`analysis.validation.traces`): the
    noise verdict first, the errors only when the runs could judge them, and each rank's peak activations."""
    from analysis.validation.traces import format_rows, predict_traces

    if cfg.calibrated:
        res = predict_traces(cfg.real_traces, cfg.costs_profile, [cfg.profile])
        where = (f"Predicted as the validation grid predicts (docs/validation-protocol.md): calibrated from the run "
                 f"`{cfg.profile}` (an in-sample row: its own steps fitted the model) and the profile "
                 f"`{cfg.costs_profile}`; the step time is the runtime's (rank 0's wall time of a traced step), "
                 "the median over the traced steps, spread p10-p90.")
    else:
        res = predict_traces(cfg.real_traces, cfg.profile)
        where = (f"Predicted from the profile `{cfg.profile}` alone (the validation grid's second source, which "
                 "scores worse than a calibration run: docs/results/validation.md); give a calibration run's trace "
                 "as `--costs RUN.csv --costs-profile PROFILE.json` to predict as the grid does.")
    v, scores = res["noise_verdict"], res["scores"]
    if scores is not None:
        held = scores["out_of_sample"]
        summary = (f"Held-out rows ({len(held)}): mean |error| {_pct(scores['mean_abs_error'])}, worst "
                   f"{_pct(scores['max_abs_error'])}, Kendall tau_b {format_tau(scores['kendall_tau_b'])} "
                   f"(overlapping spreads tie); the profile alone: mean |error| "
                   f"{_pct(scores['profile_mean_abs_error'])}.")
    elif v["verdict"] == "too noisy to judge":
        summary = ("Errors not reported: the runs were too noisy to judge an error of "
                   f"{v['limit']:.0%}, so any error here would be the measurement's as much as the model's. "
                   "Measure on a quiet machine, or trace more steps.")
    else:
        summary = ("Errors not reported: no run traced two steps or more, so nothing says how far the "
                   "measurement itself wanders; trace more steps (`schedlab run --trace-steps N`).")
    table = _markdown_table(["schedule", "m", "sample", "predicted ms", "measured ms", "p10-p90 ms", "error"],
                            format_rows(res))
    return ["## Prediction against measurement", "", verdict_line(v), "", where, "", table, "", summary, "",
            *_memory_table(res["memory"]), *figures]


def _pct(x: float) -> str:
    return "undefined" if x != x else f"{x:.1%}"


def _memory_table(memory: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each run's measured peak activation memory per rank (the runtime's, ``attrs["memory"]``) beside the
    simulated peak of the same rank."""
    def mib(x: Any) -> str:
        return "-" if x is None else f"{x / 2**20:.3g}"

    def mb(x: Any) -> str:
        return "-" if x is None else f"{x:.3g}"

    rows = [(name, m["rank"], mib(m["measured_peak_activation_bytes"]), mb(m["measured_peak_activations_mb"]),
             mb(m["simulated_peak_activations_mb"])) for name, ranks in memory.items() for m in ranks]
    return ["Peak activation memory per rank: measured by the runtime (autograd's saved tensors) and simulated, "
            "in M_B (one microbatch's activations for the rank's layers); '-': the trace records none.", "",
            _markdown_table(["run", "rank", "measured MiB", "measured M_B", "simulated M_B"], rows), ""]


def write_report(out: str | os.PathLike, sweep: Sweep, validation: dict[str, Any] | None = None, *,
                 dp_modes: Sequence[DPModeRow] | None = None) -> Path:
    """Plot what ``sweep`` simulated and write ``out/report.md``; returns its path.

    The report is written into a fresh folder beside ``out`` and swapped in
    whole (:func:`common.outputs.replace_folder`): a failure leaves the
    previous report as it was, and no file of a previous report remains. ``dp_modes``: the rows of a
    data-parallel comparison (:mod:`analysis.dp_compare`), a section of their own. An
    existing ``out`` must be empty or hold only what a report writes
    (:func:`is_report_folder`); anything else is refused, never removed.
    """
    final = check_report_dir(out)
    replace_folder(final, lambda stage: _write_report(stage, sweep, validation, dp_modes=dp_modes), "report folder")
    return final / "report.md"


_REPORT_FILES = ("report.md",)
_REPORT_SUFFIXES = (".png", ".perfetto.json")


def is_report_folder(folder: Path) -> bool:
    """Whether ``folder`` holds only what a report writes: report.md, PNG figures, Perfetto JSON, traces/*.csv."""
    for item in folder.iterdir():
        if item.is_dir() and not item.is_symlink() and item.name == "traces":
            if not all(t.is_file() and t.suffix == ".csv" for t in item.iterdir()):
                return False
        elif not (item.is_file() and (item.name in _REPORT_FILES or item.name.endswith(_REPORT_SUFFIXES))):
            return False
    return True


def check_report_dir(out: str | os.PathLike) -> Path:
    """Check a report folder before any work (the folder is replaced as a whole when the report is written)."""
    return check_output_dir(out, "report folder", replaced=is_report_folder)


def _validation_section(data: dict[str, Any] | None, out: Path) -> list[str]:
    """Predicted against measured (experiments/validate_sim.py): the plot, the table, the mechanisms."""
    if data is None:
        return []
    plot_validation(data, out / "validation.png")
    rows = data["schedules"]
    md = ["## The simulator against real runs", "",
          f"Calibrated from {data.get('calibrated_from', {}).get('schedule', '?')} "
          f"(m={data.get('calibrated_from', {}).get('microbatches', '?')}); measured step time = median over "
          "rounds of each round's median, spread = p10-p90 of the round medians.", "",
          "![predicted against measured](validation.png)", "",
          _markdown_table(["schedule", "m", "predicted ms", "measured ms", "spread ms", "error", "profile error",
                           "replay error"],
                          [(r["schedule"], r["microbatches"], f"{r['predicted_step_time'] * 1e3:.1f}",
                            f"{r['measured_step_time'] * 1e3:.1f}",
                            f"{r['measured_spread'][0] * 1e3:.1f}-{r['measured_spread'][1] * 1e3:.1f}",
                            f"{r['error']:+.1%}",
                            f"{r['profile_error']:+.1%}" if r.get("profile_error") is not None else "-",
                            f"{r['replay_error']:+.1%}" if r.get("replay_error") is not None else "-")
                           for r in rows]), ""]
    mech = data.get("mechanisms")
    if mech:
        md += ["Mean |error| with every mechanism, and with each switched off in turn:", "",
               _markdown_table(["model", "mean abs error"], [(k, "-" if v is None else f"{v:.1%}") for k, v in mech.items()]), ""]
    parts = data.get("decomposition")
    if parts:
        md += ["Mean |error| of the pipeline rows taken apart: replay (each traced step with its own task times), "
               "self-calibrated (each configuration from its own runs), transferred (from the calibration run), "
               "and the noise of the measurement itself (the expected |error| of a perfect prediction, from two "
               "halves of each measurement):", "",
               _markdown_table(["part", "mean abs error"], [(k, "-" if v is None else f"{v:.1%}") for k, v in parts.items()]), ""]
    return md


def _write_report(out: Path, sweep: Sweep, validation: dict[str, Any] | None = None, *,
                  dp_modes: Sequence[DPModeRow] | None = None) -> None:
    from analysis.dp_compare import dp_section

    cfg, results = sweep.config, sweep.results
    table = comparison_table(results)
    front = _pareto(table)
    plot_timelines([r.trace for r in results], out / "timelines.png")
    _plot_bubbles(_with_closed_forms(sweep), cfg, out / "bubble-vs-microbatches.png")
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
        *_recompute_section(sweep, out),
        "## Timelines",
        "",
        "![all schedules on one time axis](timelines.png)",
        "",
        *_real_section(sweep, out),
        *_validation_section(validation, out),
        *(dp_section(dp_modes, out) if dp_modes else []),
        "Per-task traces of every simulated schedule are in `traces/` (CSV, the shared trace format).",
        "",
    ]
    for r in results:
        plot_timeline(r.trace, out / f"timeline-{r.schedule}.png")
    (out / "report.md").write_text("\n".join(md))
