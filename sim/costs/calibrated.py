"""Calibration from a real run's trace: the profiled cost model built from what a run measured.

:func:`from_trace` builds the same model from a real run's trace instead of
a profile: the (5%-trimmed) mean in-run duration of each pass of each stage over every
traced step, the message latency from the moment the receiver waits, the gaps
that give ``task_overhead`` and ``send_cpu``, and ``step_overhead`` = step
time - the programs' span. A pass the trace lacks (I and W in a 1F1B trace),
or another stage count (interleaved from 1F1B), comes from a profile: when
each target stage lies inside one traced stage (4 stages from a run of 2),
that stage's in-run time is shared in the profile's proportions, so only the
profile's ratios count (it times every partition round-robin at one moment);
otherwise the profile is scaled by the trace's in-run/profiled ratio of each
pass kind.

:func:`load_costs` takes either: a cost file or a trace.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import CostFileError
from schedules import Kind
from sim.costs.cost_file import load_profile, warn_once
from sim.costs.profiled import ProfiledCosts, StageCosts

__all__ = ["TraceCalibration", "from_trace", "load_costs", "occupancy", "trace_calibration"]


_SENDER = {"RECV_F": ("SEND_F", -1), "RECV_B": ("SEND_B", 1)}


def occupancy(part: Any, pp: int = 1) -> dict[tuple[int, str], float]:
    """(rank, action) -> seconds of one step: each compute task held its rank from its start to the start of
    the rank's next compute task or receive wait (its own end for the last); each message the receiver waited
    for, from the later of the wait and the end of its producer's occupancy to its arrival."""
    out: dict[tuple[int, str], float] = {}
    ready: dict[tuple[int, str, int, int], tuple[int, str, float]] = {}  # send (pipeline, kind, stage, mb)
    recvs = []
    for rank, mine in part.sort_values(["start", "end"]).groupby("rank", sort=False):
        rows = list(zip(mine["stream"], mine["action"], mine["start"], mine["end"], mine["kind"], mine["stage"],
                        mine["microbatch"], strict=True))
        held = [r for r in rows if r[0] != "send"]
        for k, (stream, action, start, end, *_rest) in enumerate(held):
            if stream == "compute":
                nxt = held[k + 1][2] if k + 1 < len(held) else end
                out[(int(rank), str(action))] = float(max(nxt, end) - start)
        for stream, action, start, _end, kind, stage, mb in rows:
            if stream == "send":  # its producer's occupancy ends at the rank's next held row after the post
                after = [r[2] for r in held if r[2] >= start]
                ready[(int(rank) // pp, str(kind), int(stage), int(mb))] = (int(rank), str(action),
                                                                             after[0] if after else start)
            elif stream == "recv" and kind in _SENDER:
                recvs.append((int(rank), kind, int(stage), int(mb), start, _end))
    for rank, kind, stage, mb, start, end in recvs:
        send_kind, d = _SENDER[kind]
        key = (rank // pp, send_kind, stage + d, mb)
        if key in ready and end > start:  # the receiver waited for it
            src, action, t = ready[key]
            out[(src, action)] = float(max(end - max(start, t), 0.0))
    return out


@dataclass(frozen=True)
class TraceCalibration:
    """What :func:`trace_calibration` measures in real traces (seconds): the calibration's raw figures."""

    num_stages: int
    passes: dict[tuple[int, str], float]  # (stage, kind) -> trimmed-mean in-run duration
    latency: float | None  # median message latency: from the later of the receiver's wait and the post's end to
    # arrival; None when no receive waited for its message (nothing in the trace times one)
    task_overhead: float  # median gap after a compute task's body that posts no message (to the rank's next task)
    send_cpu: float  # median extra gap after one that posts a message (gloo copies it on the caller's thread)
    step_overhead: float  # median of step wall time - the programs' span (less one task overhead: see below)
    activation_bytes: float
    steps: int
    layers: tuple[int, ...] = ()  # layers per stage of the traced run (attrs layers_per_stage)


def _frames(trace: Any) -> list[Any]:
    import pandas as pd

    from schedules.trace import read_trace

    items = trace if isinstance(trace, list | tuple) else [trace]
    if not items:
        raise CostFileError("calibration needs at least one real trace")
    frames = [t if isinstance(t, pd.DataFrame) else read_trace(t) for t in items]
    for t, df in zip(items, frames, strict=True):
        where = f"trace {str(t)!r}" if not isinstance(t, pd.DataFrame) else "trace"
        if df.attrs.get("source") != "real":
            raise CostFileError(f"{where} is not a real run's trace (source {df.attrs.get('source')!r}); "
                                "calibrate from the trace file of a real run (schedlab run)")
        if not df.attrs.get("step_times"):
            raise CostFileError(f"{where} has no step_times; record it again with this version of schedlab run")
    layouts = {(str(df.attrs.get("schedule")), json.dumps(df.attrs.get("params"), sort_keys=True),
                json.dumps(df.attrs.get("model"), sort_keys=True), df.attrs.get("microbatch_size")) for df in frames}
    if len(layouts) > 1:
        raise CostFileError(f"the traces to calibrate from ran {len(layouts)} different configurations "
                            f"({', '.join(sorted(s for s, *_ in layouts))}); calibrate from runs of one "
                            "schedule, shape, model and microbatch size")
    return frames


TRIM = 0.05  # the fraction of samples left out at each end of a task time's mean


def _trimmed_mean(xs: list[float]) -> float:
    """The mean with the lowest and highest ``TRIM`` of the samples left out.

    A step is a sum of many task times along its critical path, and the median
    of such a sum lies near the sum of their means, not of their medians (the
    times are skewed to the right: a task is never faster than its work, often
    slower); the trim keeps one descheduled task from weighing on it.
    """
    xs = sorted(xs)
    k = int(len(xs) * TRIM)
    return statistics.fmean(xs[k:len(xs) - k] if len(xs) > 2 * k else xs)


def trace_calibration(trace: Any) -> TraceCalibration:
    """The calibration's figures from one or more real traces (paths or DataFrames) of one stage layout."""
    import statistics

    from schedules.trace import trace_steps, work_span

    frames = _frames(trace)
    passes: dict[tuple[int, str], list[float]] = {}
    latency, gaps, post_gaps, overheads = [], [], [], []
    num_stages, nbytes, steps = 0, [], 0
    for df in frames:
        pp = int(df.attrs.get("params", {}).get("pp", 1))
        walls = {int(k): float(v) for k, v in df.attrs["step_times"].items()}
        for step, part in trace_steps(df).items():
            steps += 1
            rows = part.sort_values(["rank", "start", "end"]).to_dict("records")
            num_stages = max(num_stages, 1 + max(r["stage"] for r in rows))
            if step in walls:
                overheads.append(walls[step] - work_span(part))
            held = occupancy(part, pp)
            for r in rows:
                if r["stream"] == "send" and (r["rank"], r["action"]) in held:
                    latency.append(held[(r["rank"], r["action"])])
                    nbytes.append(r["bytes"])
            by_rank: dict[int, list[dict[str, Any]]] = {}
            for r in rows:
                by_rank.setdefault(r["rank"], []).append(r)
                if r["stream"] == "compute" and r["kind"] in ("F", "B", "I", "W"):
                    passes.setdefault((r["stage"], r["kind"]), []).append(r["end"] - r["start"])
            for mine in by_rank.values():  # rows in start order: what follows each compute task's body
                last_held = max((k for k, r in enumerate(mine) if r["stream"] != "send"), default=-1)
                for k, (c, n) in enumerate(itertools.pairwise(mine)):
                    if c["stream"] != "compute" or k >= last_held or (c["rank"], c["action"]) not in held:
                        continue  # the rank's last task: nothing after it shows where its occupancy ends
                    gap = held[(c["rank"], c["action"])] - (c["end"] - c["start"])  # its occupancy less its body
                    (post_gaps if n["stream"] == "send" else gaps).append(gap)
    med = statistics.median
    task_overhead = _trimmed_mean(gaps) if gaps else 0.0
    return TraceCalibration(
        num_stages=num_stages,
        passes={k: _trimmed_mean(v) for k, v in sorted(passes.items())},
        latency=max(med(latency), 0.0) if latency else None,
        task_overhead=max(task_overhead, 0.0),
        send_cpu=max(_trimmed_mean(post_gaps) - task_overhead, 0.0) if post_gaps else 0.0,
        # the simulated span ends after the last task's overhead, the recorded one at its body's end
        step_overhead=max(float(med(overheads)) - max(task_overhead, 0.0), 0.0) if overheads else 0.0,
        activation_bytes=med(nbytes) if nbytes else 0.0,
        steps=steps,
        layers=tuple(int(x) for x in frames[0].attrs.get("layers_per_stage") or ()),
    )


def from_trace(trace: Any, profile: str | Path | None = None, *, num_stages: int | None = None,
               calibration: TraceCalibration | None = None) -> ProfiledCosts:
    """A cost model calibrated from real traces (see the module doc), for ``num_stages`` stages.

    ``trace``: a path or DataFrame, or a list of them (every traced step of
    every one counts). Passes the trace lacks, or a stage count other than the
    trace's, come from ``profile`` (a cost file of real.profile): shared in its
    proportions where the target partition refines the traced one, else scaled
    per pass kind by the trace's in-run/profiled ratio on the trace's own stages.

    What nothing measured is never a silent 0: a pass kind with no time on some
    stage is listed in ``missing`` (a graph that runs it is refused), and a
    trace in which no receive waited for its message times no message: the
    profile's p2p fit is used, or without one ``p2p_measured`` is False (a
    graph that sends is refused). Each such guess is a line of ``warnings``,
    naming the field, and is logged.
    """
    fit = calibration or trace_calibration(trace)
    n = num_stages or fit.num_stages
    source = ", ".join(str(t) for t in (trace if isinstance(trace, list | tuple) else [trace])
                       if not hasattr(t, "attrs"))[:200]
    target = load_profile(profile, n) if profile is not None else None
    if profile is None:
        if n != fit.num_stages:
            raise CostFileError(f"the trace runs {fit.num_stages} stages, the schedule {n}; give a profile "
                                f"(real.profile, stages={n}) to scale, or calibrate from a run of {n} stages")
        stages = tuple(StageCosts(**{k.lower(): fit.passes.get((s, k), 0.0) for k in _KINDS}) for s in range(n))
        lacking = [(s, k) for s in range(n) for k in _KINDS if (s, k) not in fit.passes]
    elif (groups := _refinement(fit, profile, n)) is not None:
        stages, lacking = _refined(fit, target, groups)
    else:
        stages, lacking = _scaled(fit, profile, target, n), []
    missing = tuple(k for k in _KINDS if any(k == kind for _, kind in lacking))
    warnings = list(target.warnings) if target is not None else []
    if lacking:
        warnings.append(f"stages[].{'/'.join(k.lower() for k in missing)}: no time for "
                        f"{', '.join(f'stage {s} {k}' for s, k in lacking)} in the trace"
                        f"{'' if profile is None else ' nor in its share of the profile'}; a graph that runs "
                        f"{'/'.join(missing)} passes is refused (calibrate from a run that has them, or give a "
                        "profile)")
    p2p = _trace_p2p(fit, target, warnings)
    for w in warnings[len(target.warnings) if target is not None else 0:]:
        warn_once(f"calibration from {source or 'a trace'}: {w}")
    return ProfiledCosts(
        stages=stages, activation_bytes=p2p["activation_bytes"], p2p_alpha=p2p["alpha"], p2p_beta=p2p["beta"],
        p2p_measured=p2p["measured"], task_overhead=fit.task_overhead, step_overhead=fit.step_overhead,
        send_cpu=fit.send_cpu, collectives=target.collectives if target is not None else (),
        source=source or "trace", missing=missing, warnings=tuple(warnings),
        comm_slowdown=target.comm_slowdown if target is not None else 1.0)


_KINDS = ("F", "B", "I", "W")


def _scaled(fit: TraceCalibration, profile: str | Path, target: ProfiledCosts, n: int) -> tuple[StageCosts, ...]:
    """The profile's n stages, each pass kind scaled by the trace's in-run/profiled ratio of that kind (over
    the traced stages that have it); a kind the trace lacks scales as its backward (I, W) or forward."""
    base = load_profile(profile, fit.num_stages)
    ratio = {}
    for k in _KINDS:
        have = [s for s in range(fit.num_stages) if (s, k) in fit.passes]
        prof = sum(base.stages[s].of(Kind(k)) for s in have)
        if have:
            ratio[k] = sum(fit.passes[(s, k)] for s in have) / prof if prof else 1.0
    for k in _KINDS:
        ratio.setdefault(k, ratio.get("B", ratio.get("F", 1.0)))
    same = n == fit.num_stages
    return tuple(
        StageCosts(**{k.lower(): fit.passes[(s, k)] if same and (s, k) in fit.passes
                      else target.stages[s].of(Kind(k)) * ratio[k] for k in _KINDS},
                   optim=0.0, param_bytes=target.stages[s].param_bytes)
        for s in range(n))


def _trace_p2p(fit: TraceCalibration, target: ProfiledCosts | None, warnings: list[str]) -> dict[str, Any]:
    """The message timing: the trace's latency; else the profile's p2p fit; else none (messages refused)."""
    if fit.latency is not None:
        return {"alpha": fit.latency, "beta": math.inf, "measured": True, "activation_bytes": fit.activation_bytes}
    why = "p2p_alpha: no receive in the trace waited for its message, so the trace times no message"
    if target is not None and target.p2p_measured:
        warnings.append(f"{why}; the profile's p2p fit is used (alpha {target.p2p_alpha:.3g} s)")
        return {"alpha": target.p2p_alpha, "beta": target.p2p_beta, "measured": True,
                "activation_bytes": target.activation_bytes}
    warnings.append(f"{why}; a graph that sends messages is refused (give a profile with p2p, real.profile)")
    return {"alpha": 0.0, "beta": math.inf, "measured": False, "activation_bytes": fit.activation_bytes}


def _profile_layers(profile: str | Path, n: int) -> list[tuple[int, int]] | None:
    """The layer range [first, stop) of each stage of the profile's n-stage partition (None: not recorded)."""
    try:
        parts = json.loads(Path(profile).read_text())["partitions"]
        rows = next(q["stages"] for q in parts if q.get("num_stages") == n)
        by_stage = {int(r["stage"]): (int(r["layers"][0]), int(r["layers"][1])) for r in rows}
        return [by_stage[s] for s in range(n)]
    except (OSError, ValueError, KeyError, TypeError, IndexError, StopIteration):
        return None


def _refinement(fit: TraceCalibration, profile: str | Path, n: int) -> list[int] | None:
    """For each of the n target stages, the traced stage that holds all its layers; None unless every target
    stage lies within one traced stage (4 stages from a run of 2, or the same partition)."""
    target = _profile_layers(profile, n)
    if target is None or len(fit.layers) != fit.num_stages:
        return None
    bounds = list(itertools.accumulate(fit.layers, initial=0))
    owner = []
    for first, stop in target:
        t = next((t for t in range(fit.num_stages) if bounds[t] <= first and stop <= bounds[t + 1]), None)
        if t is None or stop <= first:
            return None
        owner.append(t)
    return owner


def _refined(fit: TraceCalibration, target: ProfiledCosts, owner: list[int]
             ) -> tuple[tuple[StageCosts, ...], list[tuple[int, str]]]:
    """Each traced stage's in-run time shared among the target stages inside it as the profile shares it
    (measured round-robin at one moment, so the profile's own speed cancels). A kind the trace lacks takes
    its profiled share of the trace's backward: I and W from B (1F1B), B from I + W (zero-bubble). Also
    returns the (target stage, kind) pairs with nothing to take a time from (their time is 0: refused)."""
    def of(s: int, *kinds: str) -> float:
        return sum(target.stages[s].of(Kind(k)) for k in kinds)

    out, lacking = [], []
    for s, t in enumerate(owner):
        group = [x for x, o in enumerate(owner) if o == t]
        costs = {}
        for k in _KINDS:
            if (t, k) in fit.passes:
                src, base = fit.passes[(t, k)], (k,)
            elif k in ("I", "W") and (t, "B") in fit.passes:
                src, base = fit.passes[(t, "B")], ("B",)
            elif k == "B" and (t, "I") in fit.passes and (t, "W") in fit.passes:
                src, base = fit.passes[(t, "I")] + fit.passes[(t, "W")], ("I", "W")
            else:
                src, base = 0.0, (k,)
                lacking.append((s, k))
            whole = sum(of(x, *base) for x in group)
            costs[k.lower()] = src * of(s, k) / whole if whole else src / len(group)
        out.append(StageCosts(**costs, optim=0.0, param_bytes=target.stages[s].param_bytes))
    return tuple(out), lacking


def load_costs(source: str | Path, num_stages: int | None = None, profile: str | Path | None = None) -> ProfiledCosts:
    """A cost file (JSON, :func:`load_profile`) or a real trace (.csv/.parquet, :func:`from_trace`, scaled to
    other stage counts with ``profile``)."""
    if Path(source).suffix in (".csv", ".parquet"):
        return from_trace(source, profile, num_stages=num_stages)
    if profile is not None:
        raise CostFileError(f"a profile to scale with goes with a trace; {str(source)!r} is a cost file already")
    return load_profile(source, num_stages)
