"""Real runs' traces predicted the way the validation grid predicts: one calibration run, a profile, the noise verdict.

``schedlab report --costs RUN.csv --costs-profile PROFILE.json --real A.csv B.csv`` and
:func:`analysis.compare.compare` call :func:`predict_traces`: each trace file is one measurement
(:class:`TracedRun`, every traced step a round of one step), its rows are the grid's own
(:func:`analysis.validation.calibration.grid_rows` from a :class:`~analysis.validation.calibration.Calibration`
of the calibration run), scored by :func:`analysis.validation.scores.score_grid` and judged by
:func:`analysis.validation.scores.noise_verdict`. With a cost file and no calibration run, each row is predicted
from the profile alone (the grid's ``profile_predicted_step_time``). When the runs were too noisy to judge, the
scores are withheld (``scores`` None) and :func:`format_rows` writes "too noisy" where the errors would be.

Beside each row: the run's measured peak activation memory per rank (the trace's ``attrs["memory"]``, written by
the runtime) and the simulated peak of the same rank.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.validation.calibration import Calibration, grid_rows, predict
from analysis.validation.scores import NOISE_LIMIT, half_difference, noise_verdict, score_grid
from common.errors import ConfigError
from schedules.trace import read_trace
from schedules.util import percentile
from sim import simulate
from sim.plan.sweep import trace_graph

if TYPE_CHECKING:
    import pandas as pd

    from schedules import TaskGraph

__all__ = ["TracedRun", "format_rows", "memory_rows", "predict_traces", "traced_run"]


@dataclass(frozen=True)
class TracedRun:
    """One trace file as the grid's rows read a measurement (the fields of ``real.measure.Measured`` they use):
    each traced step is a round of one step, so ``step_time`` is the median traced step, ``spread`` the p10-p90
    of the traced steps and ``round_medians`` the traced steps in order (their two halves give the noise)."""

    step_time: float
    spread: tuple[float, float]
    round_medians: tuple[float, ...]
    traces: tuple[str, ...]
    foreign_cores: tuple[float, ...] = (math.nan,)  # a trace does not record the other processes' cores


def _step_times(df: pd.DataFrame, where: str) -> list[float]:
    """The wall time of each traced step in step order (``attrs["step_times"]``, rank 0's), else each step's span."""
    walls = df.attrs.get("step_times") or {}
    if walls:
        return [float(v) for _, v in sorted(walls.items(), key=lambda kv: int(kv[0]))]
    if "step" not in df.columns:
        return [float(df["end"].max() - df["start"].min())]
    spans = df.groupby("step")[["start", "end"]].agg({"start": "min", "end": "max"})
    if spans.empty:
        raise ConfigError(f"{where} has no traced step", field="real")
    return [float(e - s) for s, e in zip(spans["start"], spans["end"], strict=True)]


def traced_run(path: str | Path, trace: pd.DataFrame | None = None) -> TracedRun:
    """The measurement of one real run's trace file (``trace``: the file already read)."""
    df = read_trace(path) if trace is None else trace
    steps = _step_times(df, f"trace {str(path)!r}")
    return TracedRun(statistics.median(steps), (percentile(steps, 0.1), percentile(steps, 0.9)), tuple(steps),
                     (str(path),))


def _real(path: str | Path) -> pd.DataFrame:
    df = read_trace(path)
    if df.attrs.get("source") != "real":
        raise ConfigError(f"trace {str(path)!r} is not a real run's trace (attrs source={df.attrs.get('source')!r})",
                          field="real")
    if int(df.attrs.get("dp", 1) or 1) != 1:
        raise ConfigError(f"trace {str(path)!r} ran dp={df.attrs['dp']}; traces are predicted as pipeline runs "
                          "(dp=1); experiments/validate_sim.py predicts data-parallel ones", field="real")
    return df


def _keys(frames: Mapping[str, pd.DataFrame]) -> dict[str, tuple[str, int]]:
    """A grid key (label, microbatches) per trace path; a label the schedule's name, with the file's stem where two
    traces ran the same configuration."""
    plain = {p: (str(df.attrs.get("schedule")), int(df.attrs.get("params", {}).get("microbatches", 0)))
             for p, df in frames.items()}
    seen = list(plain.values())
    return {p: (f"{k[0]} ({Path(p).stem})", k[1]) if seen.count(k) > 1 else k for p, k in plain.items()}


def memory_rows(trace: pd.DataFrame, graph: TaskGraph, costs: Any) -> list[dict[str, Any]]:
    """Per pipeline rank: the run's measured peak activation memory (``attrs["memory"]``: bytes and M_B) beside the
    simulated peak (M_B, :class:`sim.RankStats`) of the same rank; no memory recorded: simulated only."""
    sim_peaks = {r.rank: r.peak_activations for r in simulate(graph, costs, check=False).ranks}
    measured = {int(m.get("pp_rank", m.get("rank", -1))): m for m in trace.attrs.get("memory") or []
                if isinstance(m, Mapping)}
    return [{"rank": rank, "measured_peak_activation_bytes": measured.get(rank, {}).get("peak_activation_bytes"),
             "measured_peak_activations_mb": measured.get(rank, {}).get("peak_activations_mb"),
             "simulated_peak_activations_mb": peak} for rank, peak in sorted(sim_peaks.items())]


def _profile_row(key: tuple[str, int], r: TracedRun, graph: TaskGraph, profile: Path) -> dict[str, Any]:
    """A row predicted from the profile alone: the grid's ``profile_predicted_step_time``, as the headline."""
    from sim.costs.cost_file import load_profile

    predicted = predict(graph, load_profile(profile, graph.schedule.num_stages))
    error = (predicted - r.step_time) / r.step_time
    return {"schedule": key[0], "microbatches": key[1], "kind": "pipeline", "in_sample": False,
            "measured_step_time": r.step_time, "measured_spread": list(r.spread),
            "round_medians": list(r.round_medians), "half_difference": half_difference(r.round_medians, r.step_time),
            "predicted_step_time": predicted, "profile_predicted_step_time": predicted, "error": error,
            "profile_error": error}


def predict_traces(traces: Sequence[str | Path], profile: str | Path, calibration: Sequence[str | Path] = (),
                   limit: float = NOISE_LIMIT) -> dict[str, Any]:
    """Predict each real run's trace (``traces``) from ``calibration`` (one run's trace files, the grid's calibration
    run, an in-sample row of its own) and ``profile`` (real.profile's cost file); without ``calibration``, from the
    profile alone. Returns ``rows`` (the grid's, in order: the calibration run first), ``scores``
    (:func:`score_grid`; None when the runs were too noisy to judge), ``noise_verdict`` (:func:`noise_verdict`
    on :func:`~analysis.validation.scores.decomposition`'s noise; a trace records no load average),
    ``predictor`` ("calibrated" or "profile alone") and ``memory`` (label -> :func:`memory_rows`)."""
    profile = Path(profile)
    calibration = [str(c) for c in calibration]
    paths = list(dict.fromkeys([*calibration[:1], *(str(t) for t in traces)]))
    if not paths:
        raise ConfigError("no trace to predict: give the real runs' traces", field="real")
    frames = {p: _real(p) for p in paths}
    keys = _keys(frames)
    measured = {keys[p]: traced_run(p, frames[p]) for p in paths}
    graphs = {keys[p]: trace_graph(frames[p].attrs) for p in paths}
    if calibration:
        cal = Calibration.of(profile, calibration)
        rows = grid_rows(measured, graphs, cal, keys[calibration[0]])
        costs = {k: cal.pipeline(g.schedule.num_stages) for k, g in graphs.items()}
    else:
        from sim.costs.cost_file import load_profile

        rows = [_profile_row(k, measured[k], graphs[k], profile) for k in measured]
        costs = {k: load_profile(profile, g.schedule.num_stages) for k, g in graphs.items()}
    scores = score_grid(rows)
    verdict = noise_verdict(scores["decomposition"]["noise"], (), (), limit)
    return {"rows": rows, "scores": scores if verdict["judged"] else None, "noise_verdict": verdict,
            "predictor": "calibrated" if calibration else "profile alone",
            "calibrated_from": calibration, "profile": str(profile),
            "memory": {keys[p][0]: memory_rows(frames[p], graphs[keys[p]], costs[keys[p]]) for p in paths}}


def format_rows(result: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Table cells per row: schedule, m, sample, predicted ms, measured ms, p10-p90 ms, error ("too noisy" or
    "noise undefined" where the runs could not judge it: :func:`noise_verdict`)."""
    v = result["noise_verdict"]
    unjudged = "too noisy" if v["verdict"] == "too noisy to judge" else "noise undefined"
    out = []
    for r in result["rows"]:
        lo, hi = r["measured_spread"]
        error = f"{r['error']:+.1%}" if v["judged"] else unjudged
        out.append((str(r["schedule"]), str(r["microbatches"]), "in-sample" if r["in_sample"] else "held out",
                    f"{r['predicted_step_time'] * 1e3:.2f}", f"{r['measured_step_time'] * 1e3:.2f}",
                    f"{lo * 1e3:.2f}-{hi * 1e3:.2f}", error))
    return out
