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

__all__ = ["GOAL_GAP", "GOAL_TAU", "NOISE_LIMIT", "TOO_NOISY_EXIT", "compare_pair", "decomposition",
           "describe_verdict", "exit_status", "format_tau", "half_difference", "kendall_tau", "kind_durations",
           "load_validation", "noise_verdict", "plan_goal", "plot_validation", "score_grid", "score_plan",
           "validation_summary", "verdict_line"]

NOISE_LIMIT = 0.05  # the error a validation grid is meant to judge: above this noise it cannot judge it
TOO_NOISY_EXIT = 3  # the exit status of a script whose measurement was too noisy to judge
GOAL_TAU, GOAL_GAP = 0.8, 0.05  # plan_check's goal: tau_b >= 0.8, the predicted best within 5% of the measured best


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

    NaN when tau-b is undefined: fewer than two items, or every pair tied in
    xs or every pair tied in ys (its denominator is 0); :func:`format_tau`
    writes it as "undefined", and no goal counts it as met.
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
    return (conc - disc) / denom if denom else float("nan")


def format_tau(tau: float) -> str:
    """tau-b to 2 decimals, or "undefined" (NaN: see :func:`kendall_tau`)."""
    return "undefined" if math.isnan(tau) else f"{tau:.2f}"


def validation_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean absolute relative error of step time, worst case, and ranking agreement."""
    errors = [abs(r["error"]) for r in rows]
    return {
        "schedules": [{k: r[k] for k in ("schedule", "predicted_step_time", "measured_step_time", "error")} for r in rows],
        "mean_abs_error": statistics.fmean(errors) if errors else float("nan"),
        "max_abs_error": max(errors, default=float("nan")),
        "kendall_tau": kendall_tau([r["predicted_step_time"] for r in rows], [r["measured_step_time"] for r in rows]),
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


def decomposition(rows: Sequence[dict[str, Any]], kind: str = "pipeline") -> dict[str, float]:
    """Mean |error| of the out-of-sample rows of ``kind`` (pipeline or data-parallel, not ``in_sample``), taken
    apart (replay and self-calibrated over the rows that have a ``replay_error``, a ``self_error``):

    - ``replay``: each traced step simulated with its own task times (the dependency and message model);
    - ``self_calibrated`` (``self_error``): each configuration predicted from its own runs' pass times, the
      model without transfer between schedules;
    - ``transferred`` (``error``): predicted from the calibration run;
    - ``noise``: the expected |error| of a perfect prediction, from every row's ``half_difference`` (all rows:
      it is the measurement's): for normal noise the halves differ by twice the full median's error, so it is
      mean |half difference| / 2.
    """
    pipe = [r for r in rows if _kind(r) == kind and not r.get("in_sample")]
    replayed = [r for r in pipe if r.get("replay_error") is not None]
    selfed = [r for r in pipe if r.get("self_error") is not None]
    halves = [abs(r["half_difference"]) for r in rows if not math.isnan(r.get("half_difference", math.nan))]
    mean = statistics.fmean
    nan = float("nan")
    return {"replay": mean(abs(r["replay_error"]) for r in replayed) if replayed else nan,
            "self_calibrated": mean(abs(r["self_error"]) for r in selfed) if selfed else nan,
            "transferred": mean(abs(r["error"]) for r in pipe) if pipe else nan,
            "noise": mean(halves) / 2 if halves else nan}


def _kind(row: dict[str, Any]) -> str:
    """A row's kind; a row of an older file without one: pipeline if it has a replay, else data-parallel."""
    return row.get("kind") or ("pipeline" if row.get("replay_error") is not None else "data-parallel")


def _scores(rows: Sequence[dict[str, Any]], predicted: str = "predicted_step_time",
            error: str = "error") -> dict[str, Any]:
    """Rows, mean and worst |error|, Kendall tau_b (overlapping p10-p90 spreads are ties); NaN for no rows."""
    errors = [abs(r[error]) for r in rows]
    return {"rows": [f"{r['schedule']} m={r['microbatches']}" for r in rows],
            "mean_abs_error": statistics.fmean(errors) if errors else float("nan"),
            "max_abs_error": max(errors, default=float("nan")),
            "kendall_tau_b": kendall_tau([r[predicted] for r in rows], [r["measured_step_time"] for r in rows],
                                         [tuple(r["measured_spread"]) for r in rows])}


def score_grid(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A validation grid's scores (rows of :func:`analysis.validation.calibration.grid_rows`).

    The headline (``mean_abs_error``, ``max_abs_error``, ``kendall_tau_b``, and the profile-alone
    ``profile_*``) is over the out-of-sample rows: every row but the calibration configuration, whose own
    traces fitted the model (scored apart, ``in_sample``). ``by_kind`` splits the out-of-sample rows into
    pipeline and data-parallel; ``mechanisms`` (each testbed mechanism switched off in turn) and
    :func:`decomposition` are over the out-of-sample pipeline rows, ``dp_mechanisms`` (comm_slowdown too) and
    ``dp_decomposition`` over the data-parallel ones.
    """
    out = [r for r in rows if not r.get("in_sample")]
    pipe = [r for r in out if r["kind"] == "pipeline"]
    head, prof = _scores(out), _scores(out, "profile_predicted_step_time", "profile_error")
    replays = [abs(r["replay_error"]) for r in rows if r.get("replay_error") is not None]
    return {
        "mean_abs_error": head["mean_abs_error"], "max_abs_error": head["max_abs_error"],
        "kendall_tau_b": head["kendall_tau_b"], "out_of_sample": head["rows"],
        "profile_mean_abs_error": prof["mean_abs_error"], "profile_kendall_tau_b": prof["kendall_tau_b"],
        "by_kind": {kind: _scores([r for r in out if r["kind"] == kind]) for kind in ("pipeline", "data-parallel")},
        "in_sample": _scores([r for r in rows if r.get("in_sample")]),
        "max_abs_replay_error": max(replays, default=float("nan")),
        "mechanisms": _mechanisms(pipe),
        "decomposition": decomposition(rows),
        "dp_mechanisms": _mechanisms([r for r in out if r["kind"] == "data-parallel"]),
        "dp_decomposition": {**decomposition(rows, "data-parallel"), **_from_pipeline(out)},
    }


def _from_pipeline(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``from_pipeline``: the mean |error| of the out-of-sample data-parallel rows predicted with the pipeline
    run's calibration carried over (``pipeline_error``), where the rows have it (analysis.validation.dp_transfer)."""
    old = [abs(r["pipeline_error"]) for r in rows if r["kind"] == "data-parallel" and "pipeline_error" in r]
    return {"from_pipeline": statistics.fmean(old)} if old else {}


def _mechanisms(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean |error| of ``rows``, and with each mechanism of their ``without`` switched off in turn."""
    out = {"all": statistics.fmean(abs(r["error"]) for r in rows) if rows else float("nan")}
    for k in (rows[0].get("without") or {}) if rows else ():
        out[f"without {k}"] = statistics.fmean(
            abs(r["without"][k] - r["measured_step_time"]) / r["measured_step_time"] for r in rows)
    return out


def noise_verdict(noise: float, load_before: Sequence[float], load_after: Sequence[float],
                  limit: float = NOISE_LIMIT, foreign_cores: float = float("nan")) -> dict[str, Any]:
    """Can the measurement judge an error of ``limit``? ``noise``: the expected |error| of a perfect prediction
    (:func:`decomposition`'s ``noise``); the load (``os.getloadavg()`` before and after) and the most cores
    other processes used during a run are recorded beside it.

    ``verdict``: "judged" (noise <= limit); "too noisy to judge" (noise > limit: an error of the size the grid
    is meant to judge would be the measurement's as much as the model's); "noise undefined" (NaN: fewer than
    2 rounds, so no two halves to compare). ``judged`` is True only for the first.
    """
    if math.isnan(noise):
        verdict = "noise undefined"
    else:
        verdict = "too noisy to judge" if noise > limit else "judged"
    return {"verdict": verdict, "judged": verdict == "judged", "noise": noise, "limit": limit,
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
            "cores": os.cpu_count(), "max_foreign_cores": foreign_cores}


def exit_status(verdict: dict[str, Any]) -> int:
    """0 when the measurement could judge, :data:`TOO_NOISY_EXIT` when it could not (:func:`noise_verdict`)."""
    return 0 if verdict["judged"] else TOO_NOISY_EXIT


def plan_goal(tau: float, gap: float) -> dict[str, Any]:
    """plan_check's goal: tau_b >= :data:`GOAL_TAU` and the predicted best within :data:`GOAL_GAP` of the
    measured best. An undefined tau_b (NaN: every pair tied) does not meet it: ``tau_b`` says "undefined"."""
    tau_ok = not math.isnan(tau) and tau >= GOAL_TAU
    return {"tau_b": "undefined" if math.isnan(tau) else tau_ok, "gap": gap <= GOAL_GAP, "met": tau_ok and gap <= GOAL_GAP}


def score_plan(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """plan_check's rows, best predicted first: Kendall tau_b of predicted against measured samples/s
    (overlapping p10-p90 spreads are ties), the predicted best's gap below the measured best, the goal."""
    tau = kendall_tau([x["predicted_samples_per_s"] for x in rows], [x["measured_samples_per_s"] for x in rows],
                      [tuple(x["measured_spread"]) for x in rows])
    best_measured = max(x["measured_samples_per_s"] for x in rows)
    gap = (best_measured - rows[0]["measured_samples_per_s"]) / best_measured
    goal = plan_goal(tau, gap)
    return {"rows": list(rows), "kendall_tau_b": tau, "predicted_best_gap": gap, "goal": goal, "goal_met": goal["met"]}


def verdict_line(v: dict[str, Any]) -> str:
    """The verdict as the first line of a results page (bold Markdown), with what it means for what follows."""
    tail = "" if v["judged"] else " The errors below are the measurement's as much as the model's."
    return f"**Noise verdict: {describe_verdict(v)}.**{tail}"


def describe_verdict(v: dict[str, Any]) -> str:
    """One line: the verdict, the noise against the limit, the load."""
    noise = "undefined" if math.isnan(v["noise"]) else f"{v['noise']:.1%}"
    head = f"{v['verdict']}: measured noise {noise} (limit {v['limit']:.1%})"
    if not v["load_before"] and not v["load_after"]:  # traces of runs made elsewhere (analysis.validation.traces)
        return f"{head}, from the two halves of each run's traced steps; the runs' load was not recorded"
    foreign = v["max_foreign_cores"]
    return (f"{head}; load average (1, 5, 15 min) "
            f"{', '.join(f'{x:.2f}' for x in v['load_before'])} before, "
            f"{', '.join(f'{x:.2f}' for x in v['load_after'])} after, on {v['cores']} cores; other processes "
            f"used up to {'an unrecorded number of' if math.isnan(foreign) else f'{foreign:.2f}'} cores during a run")


_ROW_KEYS = ("schedule", "microbatches", "predicted_step_time", "measured_step_time", "error", "measured_spread")


def load_validation(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON that ``experiments/validate_sim.py --json`` writes; ConfigError (one line) if it is not one."""
    import json

    from common.errors import ConfigError
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

    from analysis.figures import place_legend
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
    tau, mean = data.get("kendall_tau_b"), data.get("mean_abs_error")  # None: undefined (JSON has no NaN)
    ax.set_title("simulated (predicted) against measured step time\n"
                 f"mean |error| {'-' if mean is None else f'{mean:.1%}'}"
                 + f", Kendall tau_b {format_tau(math.nan if tau is None else tau)} (dashed: +-5%)", fontsize=10)
    fig.tight_layout()
    place_legend(ax, fontsize=8)
    out = atomic_write(Path(path), lambda tmp: fig.savefig(tmp, format="png", dpi=110), "validation plot")
    plt.close(fig)
    return out
