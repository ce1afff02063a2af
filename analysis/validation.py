"""Prediction against measurement: step time, bubble, per-kind durations, memory, ranking.

Works on two traces of the same schedule (one ``source`` sim, one real) in
the shared format; nothing here knows how either was produced.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.metrics import summarize
from schedules.trace import median_step

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["compare_pair", "decomposition", "half_difference", "kendall_tau", "kind_durations", "load_validation",
           "plot_validation", "validation_summary"]


def kind_durations(trace: pd.DataFrame) -> dict[str, float]:
    """Median duration per compute kind (F, I, W, B, ...)."""
    compute = trace[trace["stream"] == "compute"]
    return {str(k): float((g["end"] - g["start"]).median()) for k, g in compute.groupby("kind")}


def compare_pair(predicted: pd.DataFrame, measured: pd.DataFrame) -> dict[str, Any]:
    """Step time and bubble ratio predicted vs measured, errors relative to the measurement (signed)."""
    measured = median_step(measured)
    p, m = summarize(predicted), summarize(measured)
    pk, mk = kind_durations(predicted), kind_durations(measured)
    row: dict[str, Any] = {
        "schedule": measured.attrs.get("schedule", predicted.attrs.get("schedule", "?")),
        "predicted_step_time": p["makespan"],
        "measured_step_time": m["makespan"],
        "error": (p["makespan"] - m["makespan"]) / m["makespan"] if m["makespan"] > 0 else float("nan"),
        "abs_error": abs(p["makespan"] - m["makespan"]),
        "predicted_bubble": p["bubble_ratio"],
        "measured_bubble": m["bubble_ratio"],
        "bubble_error": p["bubble_ratio"] - m["bubble_ratio"],
        "kinds": {k: {"predicted": pk.get(k), "measured": mk[k]} for k in mk},
    }
    for key in ("peak_activation_bytes", "peak_memory_bytes"):
        if key in measured.attrs and key in predicted.attrs:
            row[f"predicted_{key}"], row[f"measured_{key}"] = predicted.attrs[key], measured.attrs[key]
    return row


def kendall_tau(xs: Sequence[float], ys: Sequence[float],
                y_spread: Sequence[tuple[float, float]] | None = None, x_rel_tol: float = 1e-9) -> float:
    """Kendall's tau-b between two rankings (ties counted as neither concordant nor discordant).

    ``x_rel_tol``: xs this close (relative) are a tie: two predictions of one
    step time that differ only by rounding (the same times summed in a
    different order) do not order a pair.

    ``y_spread``: an interval (e.g. p10-p90 over rounds) around each y; a pair
    whose intervals overlap is a tie in y (their measured difference lies within
    their combined spread, so the measurement cannot order them).
    """
    n = len(xs)
    if n != len(ys) or (y_spread is not None and len(y_spread) != n):
        raise ValueError(f"kendall_tau needs equal lengths, got {n} and {len(ys)}")
    conc = disc = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if abs(dx) <= x_rel_tol * max(abs(xs[i]), abs(xs[j])):
                dx = 0
            if y_spread is not None and y_spread[i][0] <= y_spread[j][1] and y_spread[j][0] <= y_spread[i][1]:
                dy = 0
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                conc += 1
            else:
                disc += 1
    denom = ((conc + disc + ties_x) * (conc + disc + ties_y)) ** 0.5
    return (conc - disc) / denom if denom else 1.0


def validation_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean absolute relative error of step time, worst case, and ranking agreement."""
    errors = [abs(r["error"]) for r in rows]
    return {
        "schedules": [{k: r[k] for k in ("schedule", "predicted_step_time", "measured_step_time", "error")} for r in rows],
        "mean_abs_error": statistics.fmean(errors) if errors else float("nan"),
        "max_abs_error": max(errors, default=float("nan")),
        "kendall_tau": kendall_tau([r["predicted_step_time"] for r in rows], [r["measured_step_time"] for r in rows])
        if len(rows) > 1 else 1.0,
    }


def half_difference(round_medians: Sequence[float], step_time: float) -> float:
    """(median of the even rounds' medians - that of the odd rounds') / ``step_time``; NaN with under 2 rounds.

    Two independent halves of one measurement: their difference shows how far
    the measurement itself wanders.
    """
    even, odd = round_medians[0::2], round_medians[1::2]
    if not even or not odd:
        return float("nan")
    return (statistics.median(even) - statistics.median(odd)) / step_time


def decomposition(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean |error| of the pipeline rows (those with a ``replay_error``), taken apart:

    - ``replay``: each traced step simulated with its own task times (the dependency and message model);
    - ``self_calibrated`` (``self_error``): each configuration predicted from its own runs' pass times, the
      model without transfer between schedules;
    - ``transferred`` (``error``): predicted from the calibration run;
    - ``noise``: the expected |error| of a perfect prediction, from every row's ``half_difference``: for
      normal noise the halves differ by twice the full median's error, so it is mean |half difference| / 2.
    """
    pipe = [r for r in rows if r.get("replay_error") is not None]
    halves = [abs(r["half_difference"]) for r in rows if not math.isnan(r.get("half_difference", math.nan))]
    mean = statistics.fmean
    nan = float("nan")
    return {"replay": mean(abs(r["replay_error"]) for r in pipe) if pipe else nan,
            "self_calibrated": mean(abs(r["self_error"]) for r in pipe) if pipe else nan,
            "transferred": mean(abs(r["error"]) for r in pipe) if pipe else nan,
            "noise": mean(halves) / 2 if halves else nan}


_ROW_KEYS = ("schedule", "microbatches", "predicted_step_time", "measured_step_time", "error", "measured_spread")


def load_validation(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON that ``experiments/validate_sim.py --json`` writes; ConfigError (one line) if it is not one."""
    import json

    from schedules.errors import ConfigError
    from schedules.util import read_text_file

    where = f"validation file {str(path)!r}"
    if not Path(path).is_file():
        raise ConfigError(f"{where} not found; write one with experiments/validate_sim.py", field="validation")
    try:
        data = json.loads(read_text_file(Path(path), where, "a validation file is JSON"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not JSON: {exc}", field="validation") from None
    rows = data.get("schedules") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{where} has no \"schedules\" list; experiments/validate_sim.py writes one",
                          field="validation")
    for i, r in enumerate(rows):
        lacking = [k for k in _ROW_KEYS if not isinstance(r, dict) or k not in r]
        if lacking:
            raise ConfigError(f"{where}: schedules[{i}] lacks {', '.join(lacking)}", field="validation")
    return data


def plot_validation(data: dict[str, Any], path: str | os.PathLike) -> Path:
    """Predicted against measured step time (ms), measured p10-p90 as error bars, y = x and +-5%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from schedules.util import atomic_write

    rows = data["schedules"]
    fig, ax = plt.subplots(figsize=(7, 6))
    names = sorted({r["schedule"] for r in rows})
    cmap = plt.get_cmap("tab10")
    for k, name in enumerate(names):
        mine = [r for r in rows if r["schedule"] == name]
        x = [r["measured_step_time"] * 1e3 for r in mine]
        y = [r["predicted_step_time"] * 1e3 for r in mine]
        lo = [max(r["measured_step_time"] - r["measured_spread"][0], 0.0) * 1e3 for r in mine]
        hi = [max(r["measured_spread"][1] - r["measured_step_time"], 0.0) * 1e3 for r in mine]
        ax.errorbar(x, y, xerr=[lo, hi], fmt="o", color=cmap(k % 10), label=name, capsize=3)
    top = max(max(r["measured_spread"][1], r["predicted_step_time"]) for r in rows) * 1e3 * 1.05
    ax.plot([0, top], [0, top], color="black", lw=1, label="predicted = measured")
    for f in (0.95, 1.05):
        ax.plot([0, top], [0, top * f], color="gray", lw=0.8, ls="--")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step time (ms; bar: p10-p90 of round medians)")
    ax.set_ylabel("predicted step time (ms)")
    tau = data.get("kendall_tau_b")
    ax.set_title(f"mean |error| {data.get('mean_abs_error', float('nan')):.1%}"
                 + (f", Kendall tau_b {tau:.2f}" if tau is not None else "") + " (dashed: +-5%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=110), "validation plot")
    plt.close(fig)
    return out
