"""Figures computed from a trace alone, so simulated and measured traces are read alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from schedules.trace import median_step

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["measured_peaks", "summarize"]


def summarize(trace: pd.DataFrame) -> dict[str, Any]:
    """Makespan, bubble ratio and per-rank busy time, first start and last end.

    Bubble ratio = 1 - (sum of compute-busy time over ranks) / (ranks x makespan),
    where ranks counts every rank in the trace but a ps run's servers (their only rows are
    their updates, ``{s}OPTIM`` on the collective stream) and the makespan runs from the
    first task's start to the last task's end. The per-rank figures let other
    published definitions be computed from the same result. A trace of several
    steps is summarized by its step of median wall time (:func:`schedules.trace.median_step`).
    """
    trace = median_step(trace)
    if len(trace) == 0:
        return {"makespan": 0.0, "bubble_ratio": 0.0, "ranks": []}
    t0, t1 = float(trace["start"].min()), float(trace["end"].max())
    makespan = t1 - t0
    compute = trace[trace["stream"] == "compute"]
    server = (trace["stream"] == "collective") & (trace["kind"] == "OPTIM")  # a ps server's update (real.dp.ps)
    ranks = sorted(int(r) for r in trace[~server]["rank"].unique())  # the simulator's ps: updates on trainers
    per_rank = []
    for r in ranks:
        c = compute[compute["rank"] == r]
        per_rank.append({
            "rank": r,
            "busy": float((c["end"] - c["start"]).sum()),
            "first_start": float(c["start"].min()) if len(c) else t0,
            "last_end": float(c["end"].max()) if len(c) else t0,
        })
    busy = sum(x["busy"] for x in per_rank)
    ratio = 1.0 - busy / (len(ranks) * makespan) if makespan > 0 else 0.0
    return {"makespan": makespan, "bubble_ratio": ratio, "ranks": per_rank}


def measured_peaks(trace: pd.DataFrame) -> list[float]:
    """Per pipeline rank, a real trace's measured peak activations in M_B, the unit of the simulator's
    ``peak_activations``: ``attrs["memory"]``'s ``peak_activations_mb`` of data-parallel replica 0 (the bytes the
    runtime's ActivationMeter saw held at the peak over one microbatch's bytes through the rank's stages).
    [] for a trace that has no measured memory (a simulated one)."""
    rows = [m for m in trace.attrs.get("memory") or () if "peak_activations_mb" in m and m.get("dp_rank", 0) == 0]
    return [float(m["peak_activations_mb"]) for m in sorted(rows, key=lambda m: m["pp_rank"])]
