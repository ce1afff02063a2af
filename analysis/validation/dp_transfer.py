"""The data-parallel rows' calibration from one data-parallel run, and their step taken apart.

Carrying a pipeline run's calibration (pp 2: two ranks, each half the model,
idle in the bubble) over to the data-parallel rows (pp 1, dp 2: two ranks, each
the whole model all the time, gloo's threads beside them on the same cores)
under-predicted every one of them, all with the same sign (docs/validation-protocol.md).
:func:`step_parts` shows where: taken apart on the saved traces of a quiet run's
grid, the ddp row's 14.5 ms shortfall lay in its backward passes (4.1 ms: they
run slower in the data-parallel run than the pipeline run's in-run/profiled
ratio makes them), in the time no pass ran (6.4 ms: the ranks' skew and the
all-reduces after the last pass), in the step's overhead (1.5 ms) and its
optimizer step (0.9 ms); the forward passes matched.

**The step taken apart** (:data:`PARTS`; the same for a measured step and a
simulated one, and they add up to the step's wall time exactly). Per step, with
``busy_r`` a rank's forward, backward and optimizer time (each pass as long as it
ran, stretched by what overlapped it):

* ``forward``, ``backward`` (B, I, W), ``optimizer``: the ranks' mean;
* ``skew``: the most busy rank's busy time less the ranks' mean (the step waits
  for the slowest replica; the simulator runs one replica, so a simulated step's
  skew is :mod:`analysis.validation.dp_skew`'s model of it);
* ``exposed``: the step's span less the most busy rank's busy time (waits for
  collectives, per-task gaps, gathers on demand);
* ``overhead``: the step's wall time less its span.

**The calibration** (:func:`dp_run_costs`, :func:`mode_costs`): one data-parallel
run (validate_sim's: ddp at the grid's middle microbatch count; in-sample, scored
apart) gives the machine's costs while both ranks compute the whole model with
gloo's threads beside them: every pass's work with the stretch of concurrent
communication taken out (:func:`analysis.validation.dp_calibration.dp_self_costs`), its
optimizer step, its per-task and per-step overheads and its all-reduces' service
time, which every gradient reduction (zero's reduce-scatters too) takes; the
all-gathers keep the data-parallel profile's alpha/beta. Four mechanisms
complete it:

* **communication slowed by concurrent compute** (:func:`fitted_stall`,
  :mod:`sim.slowdown`'s ``comm_stall``): the all-reduces' time alone is that of
  those served after every pass (:func:`idle_service`), and while their rank
  computes they are served that many times slower (5.2 on the quiet run's ddp
  traces: gloo's threads get little of two cores that both run passes);

* **compute slowed by concurrent communication, as the run measured it**
  (:func:`fitted_slowdown`): its backward passes that no collective overlapped
  against those that one did, through :mod:`sim.slowdown`'s closed form. The
  profile's factor (a chain of all-reduces beside passes timed alone) was lower
  than what the runs' own passes show (1.34 against 1.53 on the quiet run's ddp
  traces; 1.55-1.88 on its zero1 and codec rows), so every pass unslowed with it
  kept part of the stretch;
* **the slowest replica**: the skew between the two replicas, a fraction of the
  busy time measured in the run, added to the step (:mod:`analysis.validation.dp_skew`, not
  here: it is not a cost of a task). :func:`straggler` (the busier rank's pass time
  over the mean) scaled every pass before and is still reported;
* **a sharded optimizer**: zero1, zero2 and zero3 step 1/dp of the parameters
  (``real.dp.zero``), as :class:`sim.costs.transformer_costs.TransformerCosts` charges them.

Nothing is fitted per mode: every other row (the other modes, and every mode at
the other microbatch count) is held out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from schedules import TaskGraph
    from sim.costs.profiled import ProfiledCosts
    from sim.engine import SimResult

__all__ = ["PARTS", "SHARDED_OPTIMIZER", "ZERO3_MODES", "describe_fit", "dp_run_costs", "fitted_slowdown",
           "fitted_stall", "idle_service", "measured_parts", "mode_costs", "pass_overlaps", "predicted_parts",
           "step_parts", "straggler", "wholly_after", "zero3_costs"]

PARTS = ("forward", "backward", "optimizer", "skew", "exposed", "overhead")
SHARDED_OPTIMIZER = ("zero1", "zero2", "zero3", "fsdp")  # step 1/dp of the parameters (real.dp.zero)
_BACKWARD = ("B", "I", "W")
# Collectives gloo runs at once per process group: its worker threads (torch 2.13's default, read on this machine
# from a gloo group's backend: options._threads == 2).
GLOO_THREADS = 2


def step_parts(rows: Iterable[tuple[int, str, float]], span: float, wall: float) -> dict[str, float]:
    """One step taken apart (module doc). ``rows``: (rank, kind, seconds) of its compute tasks; ``span``: its
    programs' span; ``wall``: its wall time. The parts add up to ``wall``."""
    per: dict[int, dict[str, float]] = {}
    for rank, kind, d in rows:
        part = "forward" if kind == "F" else "backward" if kind in _BACKWARD else "optimizer" if kind == "OPTIM" else ""
        if part:
            mine = per.setdefault(rank, {"forward": 0.0, "backward": 0.0, "optimizer": 0.0})
            mine[part] += d
    if not per:
        return {"forward": 0.0, "backward": 0.0, "optimizer": 0.0, "skew": 0.0, "exposed": span,
                "overhead": wall - span}
    out = {k: statistics.fmean(p[k] for p in per.values()) for k in ("forward", "backward", "optimizer")}
    most = max(sum(p.values()) for p in per.values())
    out["skew"] = most - sum(out.values())
    out["exposed"] = span - most
    out["overhead"] = wall - span
    return out


def _mean_parts(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.fmean(p[k] for p in parts) for k in PARTS}


def measured_parts(frames: Sequence[pd.DataFrame]) -> dict[str, float]:
    """The mean over every traced step (those with a wall time) of :func:`step_parts`, and ``step``, their sum:
    the mean traced step (local-sgd's plain and averaging steps both in it, as amortized)."""
    from schedules.trace import trace_steps, work_span

    parts = []
    for df in frames:
        walls = df.attrs.get("step_times") or {}
        for step, part in trace_steps(df).items():
            if str(step) not in walls:
                continue
            comp = part[part["stream"] == "compute"]
            rows = zip(comp["rank"].astype(int), comp["kind"].astype(str), comp["end"] - comp["start"], strict=True)
            parts.append(step_parts(rows, work_span(part), float(walls[str(step)])))
    if not parts:
        raise ValueError("the traces have no step with a wall time (attrs step_times); trace whole steps")
    out = _mean_parts(parts)
    return {**out, "step": sum(out.values())}


def _simulated(result: SimResult, costs: ProfiledCosts) -> dict[str, float]:
    from schedules import Stream
    from sim.costs.profiled import step_time

    graph = result.graph
    rows = [(t.rank, t.action.kind.value, result.end[t.id] - result.start[t.id])
            for t in graph.tasks if t.stream is Stream.COMPUTE]
    return step_parts(rows, result.makespan, step_time(result, costs))


def predicted_parts(mode: str, graph: TaskGraph, costs: ProfiledCosts, dp_profile: str | Path | None,
                    sync_every: int = 1, *, measured_collectives: bool = False, skew: float = 0.0,
                    shapes: Sequence[tuple[int, ...]] = ()) -> dict[str, float]:
    """The simulated step of ``mode``'s row taken apart, as :func:`analysis.validation.dp_modes.predict_mode` predicts it
    (a codec's costs, PowerSGD's hooks in the backward; the ``skew`` fraction of the busy time as the skew
    where the step waits for the slower replica, :mod:`analysis.validation.dp_skew`; local-sgd amortized over
    ``sync_every``): ``step`` is their sum, its prediction."""
    from analysis.validation.dp_modes import local_graph, simulate_mode, split_mode
    from analysis.validation.dp_skew import waits_each_step
    from sim import simulate

    res, used, hooks = simulate_mode(mode, graph, costs, dp_profile, measured_collectives=measured_collectives,
                                     shapes=shapes)
    out = _with_skew(_simulated(res, used), skew if waits_each_step(mode) else 0.0)
    out["backward"] += hooks
    if split_mode(mode)[0] == "local-sgd":
        plain = simulate(local_graph(graph), used, check=False)
        local = _with_skew(_simulated(plain, used), skew if waits_each_step(mode, False) else 0.0)
        out = {k: ((sync_every - 1) * local[k] + out[k]) / sync_every for k in PARTS}
    return {**out, "step": sum(out[k] for k in PARTS)}


def _with_skew(parts: dict[str, float], skew: float) -> dict[str, float]:
    """A simulated step's parts (its skew 0: one replica) with ``skew`` x its busy time as the skew."""
    return {**parts, "skew": skew * (parts["forward"] + parts["backward"] + parts["optimizer"])}


def straggler(frames: Sequence[pd.DataFrame]) -> float:
    """The mean over traced steps of the most busy rank's pass time (F, B, I, W) over the ranks' mean: how much
    longer than an average replica the replica each step waits for computes (1.0: one rank, or none)."""
    from schedules.trace import trace_steps

    ratios = []
    for df in frames:
        for part in trace_steps(df).values():
            comp = part[(part["stream"] == "compute") & part["kind"].isin(("F", *_BACKWARD))]
            busy = (comp["end"] - comp["start"]).groupby(comp["rank"]).sum()
            if len(busy) > 1 and busy.mean() > 0:
                ratios.append(float(busy.max() / busy.mean()))
    return statistics.fmean(ratios) if ratios else 1.0


def pass_overlaps(frames: Sequence[pd.DataFrame], kinds: Sequence[str] = _BACKWARD) -> list[tuple[float, float]]:
    """(duration, seconds of it during which a collective of its rank was in service) of every pass of
    ``kinds`` in the traces (service as :func:`sim.replay.collective_service` has it)."""
    from analysis.validation.dp_calibration import _overlap, collective_spans
    from schedules.trace import trace_steps

    out = []
    for df in frames:
        for part in trace_steps(df).values():
            spans = collective_spans(part)
            comp = part[(part["stream"] == "compute") & part["kind"].isin(kinds)]
            for rank, s, e in zip(comp["rank"], comp["start"], comp["end"], strict=True):
                out.append((float(e - s), _overlap(float(s), float(e), spans.get(int(rank), []))))
    return out


def fitted_slowdown(frames: Sequence[pd.DataFrame]) -> float | None:
    """Compute slowed by concurrent communication, as the run measured it: with w the trimmed mean of the
    backward passes that no collective of their rank overlapped, and each overlapped one of d overlapped for o,
    sum(d - w) = (1 - 1/c) sum(o) (:mod:`sim.slowdown`'s closed form). None without both kinds of pass, or
    when the overlapped ones did not run longer (c <= 1) or longer than the closed form allows."""
    from sim.costs.calibrated import _trimmed_mean

    seen = pass_overlaps(frames)
    clean = [d for d, o in seen if o == 0.0]
    over = [(d, o) for d, o in seen if o > 0.0]
    if not clean or not over:
        return None
    w = _trimmed_mean(clean)
    share = sum(d - w for d, _ in over) / sum(o for _, o in over)
    return 1 / (1 - share) if 0.0 < share < 1.0 else None


def _passes_end(part: pd.DataFrame) -> float:
    comp = part[(part["stream"] == "compute") & part["kind"].isin(("F", *_BACKWARD))]
    return float(comp["end"].max())


def idle_service(frames: Sequence[pd.DataFrame], threads: int = GLOO_THREADS) -> list[float]:
    """The service times of the collectives served wholly after every rank's last pass of their step
    (:func:`sim.replay.collective_service`): a collective's time with no compute beside it. Only those that
    cannot have been in progress before the passes ended (:func:`wholly_after`): gloo runs up to ``threads`` of
    a rank's collectives at once, so one issued during the passes may have done part of its work then, on a
    second thread beside the collective the trace serves it after."""
    from schedules.trace import trace_steps
    from sim.replay import collective_service

    out = []
    for df in frames:
        for part in trace_steps(df).values():
            idle = _passes_end(part)
            coll = part[part["stream"] == "collective"]
            issued = {}  # (rank, action) -> issue times in collective_service's order (by end, then issue)
            for rank, action, start, _end in sorted(zip(coll["rank"].astype(int), coll["action"].astype(str),
                                                       coll["start"], coll["end"], strict=True),
                                                   key=lambda r: (r[0], r[3], r[2])):
                issued.setdefault((rank, action), []).append(float(start))
            served: dict[int, list[tuple[float, float, float]]] = {}
            for rank, action, k, s, e in collective_service(part):
                served.setdefault(rank, []).append((issued[(rank, action)][k], s, e))
            for mine in served.values():
                out += [e - s for _i, s, e in wholly_after(mine, idle, threads)]
    return out


def wholly_after(served: Sequence[tuple[float, float, float]], idle: float,
                 threads: int = GLOO_THREADS) -> list[tuple[float, float, float]]:
    """Of one rank's collectives in service order, (issue, begin, end) each (``begin`` as
    :func:`sim.replay.collective_service` has it), those served wholly after ``idle``: begun at or after it,
    and either issued at or after it or with the collective ``threads`` before it ended at or after it (a
    backend running ``threads`` collectives at once may start one as soon as the one ``threads`` before it
    ends, so one with that collective ended before ``idle`` may have been in progress before it)."""
    return [(i, s, e) for j, (i, s, e) in enumerate(served)
            if s >= idle and (i >= idle or (j >= threads and served[j - threads][2] >= idle))]


def fitted_stall(frames: Sequence[pd.DataFrame], service: float) -> float | None:
    """How much slower a collective is served while its rank computes (:mod:`sim.slowdown`'s ``comm_stall``), as
    the run measured it. Per step and rank, with t0 the later rank's first collective issue and tc the end of
    the step's last pass: of the rank's n collectives (each ``service`` long alone), those in service after tc
    did what they were in service then, so those in service between t0 and tc did n ``service`` less that;
    summed over steps and ranks, the time in service between t0 and tc over that work. None if that work is
    none, or no less than the time (nothing stalled)."""
    from analysis.validation.dp_calibration import _overlap
    from schedules.trace import trace_steps
    from sim.replay import collective_service

    window = work = 0.0
    for df in frames:
        for part in trace_steps(df).values():
            coll = part[part["stream"] == "collective"]
            if coll.empty:
                continue
            t0, tc = float(coll.groupby("rank")["start"].min().max()), _passes_end(part)
            spans: dict[int, list[tuple[float, float]]] = {}
            for rank, _a, _k, s, e in collective_service(part):
                spans.setdefault(rank, []).append((s, e))
            for mine in spans.values():
                mine.sort()
                after = _overlap(tc, max(e for _, e in mine), mine) if max(e for _, e in mine) > tc else 0.0
                window += _overlap(t0, tc, mine) if tc > t0 else 0.0
                work += len(mine) * service - after
    return window / work if 0.0 < work < window * (1 - 1e-9) else None


def dp_run_costs(frames: Sequence[pd.DataFrame], dp_profile: str | Path, max_inflight: int = 0) -> ProfiledCosts:
    """The data-parallel rows' costs from one data-parallel run's traces (module doc): its own costs
    (:func:`analysis.validation.dp_calibration.dp_self_costs`) at its own :func:`fitted_slowdown` (the profile's where
    that is None), the passes of the mean replica (the skew is :mod:`analysis.validation.dp_skew`'s); the gradient
    reductions (all-reduce and
    reduce-scatter) take the all-reduces' time alone (:func:`idle_service`) and the run's
    :func:`fitted_stall`, or, where either cannot be measured, the all-reduces' mean service time."""
    from analysis.validation.dp_calibration import dp_self_costs

    own = dp_self_costs(frames, dp_profile, max_inflight, fitted_slowdown(frames))
    reduce = next(((a, b) for op, a, b in own.collectives if op == "all_reduce"), None)
    idle = idle_service(frames)
    if idle and reduce:
        from sim.costs.calibrated import _trimmed_mean

        alone = _trimmed_mean(idle)
        g = fitted_stall(frames, alone)
        if g is not None:
            own = replace(own, comm_stall=g)
            reduce = (alone, float("inf"))
    colls = tuple((op, *reduce) if op in ("all_reduce", "reduce_scatter") and reduce else (op, a, b)
                  for op, a, b in own.collectives)
    return replace(own, collectives=colls)


def mode_costs(costs: ProfiledCosts, mode: str, dp: int, calibrated_mode: str = "ddp") -> ProfiledCosts:
    """``costs`` of a run of ``calibrated_mode`` for a row of ``mode`` (``MODE+CODEC``: the mode): the optimizer
    step over dp when ``mode`` shards it and the calibration run did not (and times dp the other way)."""
    from analysis.validation.dp_modes import split_mode

    sharded, was = split_mode(mode)[0] in SHARDED_OPTIMIZER, split_mode(calibrated_mode)[0] in SHARDED_OPTIMIZER
    if sharded == was:
        return costs
    scale = 1 / dp if sharded else dp
    return replace(costs, stages=tuple(replace(s, optim=s.optim * scale) for s in costs.stages))


ZERO3_MODES = ("zero3", "fsdp")  # the modes whose passes read gathered parameters (real.dp.zero)


def zero3_costs(costs: ProfiledCosts, section: Mapping[str, Any] | None) -> ProfiledCosts:
    """``costs`` for a zero3 row, from the data-parallel profile's ``zero3`` section (:mod:`real.profile.zero3`):
    each gather one bucket's share of the measured burst (every bucket gathered at once, as the runtime launches
    them; the all-gather fit's alpha, from two sizes, was 0-0.75 ms across profiles), and the passes the factor
    measured right after a gather (F; B for B, I and W). Unchanged without the section (an older profile)."""
    if not section:
        return costs
    fb = section["factor"]
    stages = tuple(replace(st, f=st.f * fb["F"], b=st.b * fb["B"], i=st.i * fb["B"], w=st.w * fb["B"])
                   for st in costs.stages)
    gather = section["burst"]["median"] / section["buckets"]
    colls = tuple((op, gather, float("inf")) if op == "all_gather" else (op, a, b) for op, a, b in costs.collectives)
    return replace(costs, stages=stages, collectives=colls)


def describe_fit(costs: ProfiledCosts, straggler_factor: float, skew: float = 0.0) -> dict[str, Any]:
    """What the data-parallel calibration took from its run (for the JSON): the pass and optimizer times, the
    overheads, the straggler factor (reported, no longer applied), the skew fraction and the collectives."""
    st = costs.stages[0]
    return {"f": st.f, "b": st.b, "optim": st.optim, "server_update": st.server_update,
            "task_overhead": costs.task_overhead,
            "step_overhead": costs.step_overhead, "straggler": straggler_factor, "skew": skew,
            "comm_slowdown": costs.comm_slowdown,
            "comm_stall": costs.comm_stall, "reduce_hook_ns_per_byte": costs.reduce_hook_ns_per_byte,
            "collectives": {op: {"alpha": a, "beta": None if b == float("inf") else b} for op, a, b in costs.collectives}}
