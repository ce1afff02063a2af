"""The data-parallel rows of the validation grid, taken apart: self-calibrated costs and the replay.

A data-parallel run's trace (``dp`` > 1) holds, beside its passes, the
optimizer step and every bucket's collectives. Two of the grid's error parts
come from it (:func:`analysis.validation.calibration.dp_row` uses both):

* **self-calibrated** (:func:`dp_self_costs`): the configuration predicted
  from its own runs. The passes' in-run times are the measured ones with the
  stretch of concurrent communication taken out: a pass that ran ``d`` with
  its rank's collectives in service for ``o`` of it did ``d - o (1 - 1/c)`` of
  work, ``c`` the profile's ``comm_slowdown`` (the inverse of
  :mod:`sim.slowdown`), so the simulator, which stretches them again, is not
  given the stretch twice; the waits of zero2/zero3's bounded reduce-scatters
  (:func:`blocked_spans`) are taken out too, as the simulator adds them
  (``max_inflight``). The optimizer step likewise (ps: the server's measured
  update, its ``{s}OPTIM`` rows, :func:`sim.replay.server_update_times`). Each collective takes its
  op's mean service time in the traces (:func:`collective_times`; an op the
  traces lack keeps the profile's alpha/beta; decentralized SGD's exchanges set
  the p2p message time; ps and async-ps keep the profile's: their push and
  pull rows are no service times, sim.costs.profiled times them as messages; a ps
  trace's step overhead is also taken less those pulls, which end in the step
  after its traced span), and ``c`` comes from the pair's profile. The per-task gap is read
  only where none of the rank's collectives ended in it (:func:`task_gaps`: a
  wait for a collective, before an OPTIM or a zero3 pass, is the simulator's
  to model; with no such gap, as in zero3, the profile's ``task_overhead``); the step overhead is the step's wall time less the whole span, collectives
  and optimizer included.
* **replay** (:func:`dp_replay_error`): each traced step simulated with its own
  task and collective times (:func:`sim.replay.replay`), when the trace's
  collectives are the graph's one for one.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from sim.costs.profiled import ProfiledCosts

__all__ = ["blocked_spans", "collective_times", "dp_replay_error", "dp_self_costs", "task_gaps", "unslowed_passes"]

_KINDS = ("F", "B", "I", "W", "OPTIM")


def _overlap(start: float, end: float, spans: list[tuple[float, float]]) -> float:
    """Seconds of [start, end] covered by the union of ``spans`` (sorted by start)."""
    covered, reach = 0.0, start
    for s, e in spans:
        lo, hi = max(s, reach), min(e, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered


def blocked_spans(part: pd.DataFrame, limit: int) -> dict[int, list[tuple[float, float]]]:
    """Rank -> the intervals of one step in which more than ``limit`` of its gradient reduce-scatters were issued
    and not done: the zero2/zero3 runtime's compute waits then (sim.slowdown's ``max_inflight``)."""
    if limit <= 0 or part.attrs.get("dp_mode") not in ("zero2", "zero3", "fsdp"):
        return {}
    rs = part[(part["stream"] == "collective") & (part["kind"] == "REDUCE_SCATTER")]
    out: dict[int, list[tuple[float, float]]] = {}
    for rank, rows in rs.groupby("rank"):
        events = sorted([(float(e), -1) for e in rows["end"]] + [(float(s), 1) for s in rows["start"]])
        count, since = 0, 0.0
        for t, step in events:
            if count <= limit < count + step:
                since = t
            elif count > limit >= count + step and t > since:
                out.setdefault(int(rank), []).append((since, t))
            count += step
    return out


def collective_spans(part: pd.DataFrame) -> dict[int, list[tuple[float, float]]]:
    """Rank -> the (start, end) of its collectives in service in one step's trace, in order
    (:func:`sim.replay.collective_service`)."""
    from sim.replay import collective_service

    spans: dict[int, list[tuple[float, float]]] = {}
    for rank, _a, _k, s, e in collective_service(part):
        spans.setdefault(rank, []).append((s, e))
    for v in spans.values():
        v.sort()
    return spans


def unslowed_passes(frames: Sequence[pd.DataFrame], factor: float, limit: int = 0) -> dict[str, list[float]]:
    """Kind -> every stage-0 pass's work: its time less the waits of :func:`blocked_spans` (``limit``), and with
    the stretch of its rank's collectives in service the rest of the time taken out."""
    from schedules.trace import trace_steps

    out: dict[str, list[float]] = {k: [] for k in _KINDS}
    for df in frames:
        for part in trace_steps(df).values():
            spans = collective_spans(part)
            blocked = blocked_spans(part, limit)
            comp = part[(part["stream"] == "compute") & part["kind"].isin(_KINDS)]
            for rank, kind, s, e in zip(comp["rank"], comp["kind"], comp["start"], comp["end"], strict=True):
                b = _overlap(float(s), float(e), blocked.get(int(rank), []))
                o = max(_overlap(float(s), float(e), spans.get(int(rank), [])) - b, 0.0)
                out[str(kind)].append(float(e - s) - b - o * (1 - 1 / factor))
    return out


def _gaps_calibration(frames: Sequence[pd.DataFrame]) -> Any:
    """trace_calibration of the compute rows alone, the OPTIM rows dropped: the last gradient pass's wait for its
    collectives is then no gap (it is the rank's last row)."""
    from sim.costs.calibrated import trace_calibration

    kept = []
    for df in frames:
        part = df[(df["stream"] != "collective") & (df["kind"] != "OPTIM")].reset_index(drop=True)
        part.attrs.update(df.attrs)
        kept.append(part)
    return trace_calibration(kept)


def task_gaps(frames: Sequence[pd.DataFrame]) -> list[float]:
    """Every gap between a rank's consecutive compute rows in which none of its collectives ended: a gap in which
    one ended may hold a wait for it (zero3's gathers before a pass, every mode's collectives before OPTIM),
    which is the simulator's to model, not the executor's cost per task."""
    from schedules.trace import trace_steps

    out = []
    for df in frames:
        for part in trace_steps(df).values():
            ends: dict[int, list[float]] = {}
            coll = part[part["stream"] == "collective"]
            for rank, end in zip(coll["rank"], coll["end"], strict=True):
                ends.setdefault(int(rank), []).append(float(end))
            comp = part[part["stream"] == "compute"].sort_values(["rank", "start"])
            rows = list(zip(comp["rank"].astype(int), comp["start"], comp["end"], strict=True))
            for (rank, _s, end), (nrank, nstart, _e) in itertools.pairwise(rows):
                if rank == nrank and not any(end < e <= nstart for e in ends.get(rank, ())):
                    out.append(max(float(nstart - end), 0.0))
    return out


def _step_overhead(frames: Sequence[pd.DataFrame], task_overhead: float) -> float:
    from schedules.trace import trace_steps, work_span

    over = [float(df.attrs["step_times"][str(step)]) - work_span(part)
            for df in frames for step, part in trace_steps(df).items() if str(step) in df.attrs["step_times"]]
    return max(statistics.median(over) - task_overhead, 0.0) if over else 0.0


_OPS = (("REDUCE_SCATTER", "reduce_scatter"), ("ALL_GATHER", "all_gather"), ("ALLREDUCE", "all_reduce"),
        ("EXCHANGE", "exchange"))  # exchange: decentralized SGD's parameter swap with a peer, a p2p message


def collective_times(frames: Sequence[pd.DataFrame]) -> dict[str, list[float]]:
    """Op (all_reduce, reduce_scatter, all_gather, exchange) -> every collective's service time in the traces
    (:func:`sim.replay.collective_service`: from the later of its issue and its rank's previous collective's end)."""
    from schedules.trace import trace_steps
    from sim.replay import collective_service

    out: dict[str, list[float]] = {}
    for df in frames:
        for part in trace_steps(df).values():
            for _r, action, _k, s, e in collective_service(part):
                op = next((name for key, name in _OPS if key in action), None)
                if op is not None:
                    out.setdefault(op, []).append(e - s)
    return out


def dp_self_costs(frames: Sequence[pd.DataFrame], dp_profile: str | Path, max_inflight: int = 0,
                  comm_slowdown: float | None = None) -> ProfiledCosts:
    """A pp=1 data-parallel configuration's costs from its own traces and the pair's profile (module doc);
    ``max_inflight``: the runtime's bound on zero2/zero3's reduce-scatters in flight; ``comm_slowdown``: the
    factor, if not the profile's (:func:`analysis.validation.dp_transfer.fitted_slowdown`)."""
    from sim.costs.calibrated import _trimmed_mean
    from sim.costs.cost_file import load_profile
    from sim.costs.profiled import HOOKED_MODES, PS_MODES
    from sim.replay import server_update_times

    own = replace(load_profile(dp_profile, 1), max_inflight=max_inflight)
    if any(df.attrs.get("dp_mode") in HOOKED_MODES for df in frames):  # its passes ran the reduce-scatter hook:
        own = replace(own, reduce_hook_ns_per_byte=0.0)  # their traced times hold it already
    if any(df.attrs.get("dp_mode") == "local-sgd" for df in frames):  # its ALLREDUCE rows span torch's whole
        own = replace(own, param_copy=replace(own.param_copy, local_sgd=0.0))  # average_parameters, copies included
    if comm_slowdown is not None:
        own = replace(own, comm_slowdown=comm_slowdown)
    work = unslowed_passes(frames, own.comm_slowdown, max_inflight)
    fit = _gaps_calibration(frames)
    gaps = task_gaps(frames)
    overhead = _trimmed_mean(gaps) if gaps else own.task_overhead  # none clean (zero3): the profiler's
    times = {k.lower(): _trimmed_mean(v) for k, v in work.items() if v}
    if updates := server_update_times(frames):  # ps: the trainers step nothing; the server's measured update
        times["optim"] = times["server_update"] = _trimmed_mean(updates)  # (sim.replay.server_update_times)
    stage = replace(own.stages[0], **times)
    served = {op: _trimmed_mean(v) for op, v in collective_times(frames).items() if v}
    if all(df.attrs.get("dp_mode") in PS_MODES for df in frames):  # a push row ends at the trainer's wait after
        served = {}  # its last pass, a pull row is zero-length: no service time; the profile's messages time them
    if "exchange" in served:  # decentralized: each exchange a p2p message of one bucket, as long as measured
        own = replace(own, p2p_alpha=served.pop("exchange"), p2p_beta=math.inf)
    colls = tuple((op, served[op], math.inf) if op in served else (op, a, b) for op, a, b in own.collectives)
    colls += tuple((op, t, math.inf) for op, t in served.items() if op not in {c[0] for c in own.collectives})
    own = replace(own, stages=(stage,), task_overhead=overhead, send_cpu=fit.send_cpu, collectives=colls)
    step_overhead = _step_overhead(frames, overhead)
    if all(df.attrs.get("dp_mode") == "ps" for df in frames):  # the pulls end in the step after its traced span
        step_overhead = max(step_overhead - _pulls(frames, own), 0.0)  # (zero-length rows); the simulator adds them
    return replace(own, step_overhead=step_overhead)


def _pulls(frames: Sequence[pd.DataFrame], costs: ProfiledCosts) -> float:
    """ps: the seconds the simulator gives one trainer's pulls of a step, one message per bucket after another
    (:meth:`sim.costs.profiled.ProfiledCosts.bucket_message_time` of each traced pull's bytes; the first trainer's first
    traced step). A ps trace records them zero-length: posted at the last pass's end, waited for when already in."""
    rows = frames[0][frames[0]["kind"] == "ALL_GATHER"]
    if rows.empty:
        return 0.0
    rows = rows[(rows["rank"] == rows["rank"].min()) & (rows["step"] == rows["step"].min())]
    return sum(costs.bucket_message_time(float(n)) for n in rows["bytes"])


def dp_replay_error(frames: Sequence[pd.DataFrame], dp_profile: str | Path) -> tuple[float | None, float | None]:
    """Median replay error and p90 |replay error| over every traced step; (None, None) when the traces'
    collectives are not their graph's one for one (a zero3 trace recorded before its gathers carried their
    microbatch)."""
    from sim.costs.calibrated import from_trace
    from sim.costs.cost_file import load_profile
    from sim.replay import dp_replayable, replay

    steps: list[float] = []
    for df in frames:
        if not dp_replayable(df):  # each step on its own graph (local-sgd's averaging and local steps)
            return None, None
        fit = _gaps_calibration([df])
        base = replace(from_trace(df, calibration=fit), collectives=load_profile(dp_profile, 1).collectives)
        steps += [x.error for x in replay(df, base)]
    if not steps:
        return None, None
    return statistics.median(steps), sorted(abs(e) for e in steps)[int(0.9 * (len(steps) - 1))]
