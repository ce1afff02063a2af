"""Replay: simulate each step of a real trace with that step's own measured task durations.

The replay error (predicted span against the measured span of the same step)
isolates the simulator's dependency and communication model from its cost
estimates: every compute task occupies its rank exactly as long as it did,
from its start to the rank's next compute task or receive wait (so the
posting of its messages and the executor's gap are its own), and what remains
is how tasks wait for each other and for messages. A message the receiver
waited for takes what it took, from the later of the wait and the producer's
end to its arrival; one that arrived before the wait costs the calibrated
latency (:func:`sim.costs.calibrated.from_trace`).

A data-parallel trace (``dp`` > 1) replays on the graph of its mode (buckets
per stage as the trace has them), each collective taking its measured
service time: from the later of its issue and its rank's previous collective's
end, to its end (a rank's collectives are served one at a time). Its compute
times are the measured ones, already slowed by any collective in flight, so
the replay's ``comm_slowdown`` is 1.0 (and its ``max_inflight`` 0: the waits
for zero2/zero3's reduce-scatters are in the measured times too). zero3's
graph is the runtime's (``one_buffer``: a stage's gathers land in its one flat
buffer, :mod:`real.dp.zero`), whose traced gathers and reduce-scatters carry the
microbatch of the pass they serve, so they are the graph's one for one. A
trace whose collectives are not the graph's one for one (a trace recorded
before that) has no data-parallel replay (:func:`dp_replayable`). local-sgd's
steps are two graphs: a step with collective rows is an averaging one (its
parameters all-reduced after OPTIM), the others are local (OPTIM only); each
step replays on its own (:func:`graph_of` with the step), against the first
replica's span: the replicas are not in lockstep (one that ends a local step
early starts the next early), and a wait for another replica's averaging is in
the first one's all-reduce service time. A ps trace's server rows (``{s}OPTIM``
on a server's rank, collective stream: :mod:`real.dp.ps`) time the graph's server
updates: each stage's the longest over the servers.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from common.errors import CostFileError
from schedules import Kind, Stream, TaskGraph, build, lower, spec
from schedules.dp.modes import server_update
from sim.costs.calibrated import _frames, from_trace, occupancy, trace_calibration
from sim.costs.profiled import ProfiledCosts
from sim.engine import simulate

__all__ = ["ReplayStep", "collective_service", "dp_replayable", "graph_of", "replay", "server_update_times", "server_updates",
           "trace_graph"]


@dataclass(frozen=True)
class ReplayStep:
    step: int
    predicted_span: float
    measured_span: float

    @property
    def error(self) -> float:
        return (self.predicted_span - self.measured_span) / self.measured_span


def trace_graph(attrs: dict[str, Any]) -> TaskGraph:
    """The task graph a real trace ran, rebuilt from its attrs (schedule, params)."""
    name, params = str(attrs.get("schedule")), dict(attrs.get("params", {}))
    try:
        pp, m = int(params["pp"]), int(params["microbatches"])
    except (KeyError, TypeError, ValueError):
        raise CostFileError(f"trace of {name!r} does not record its pp and microbatches (params={params!r})") from None
    graph = lower(build(name, pp=pp, microbatches=m, chunks=int(params.get("chunks") or spec(name).default_chunks)))
    if int(attrs.get("dp", 1) or 1) == 1:
        return graph
    from schedules.dp.modes import add_data_parallel

    mode = str(attrs.get("dp_mode"))
    return add_data_parallel(graph, mode, _trace_buckets(attrs, graph.schedule.num_stages),
                             one_buffer=mode in ("zero3", "fsdp"), averaging=bool(attrs.get("_averaging", True)))


def graph_of(df: Any, part: Any = None) -> TaskGraph:
    """The task graph a real trace (a DataFrame) ran: :func:`trace_graph`, a data-parallel one with the trace's
    buckets per stage; with ``part`` (one of its steps), local-sgd's graph of that step (averaging if the step
    has collective rows)."""
    if int(df.attrs.get("dp", 1) or 1) == 1:
        return trace_graph(df.attrs)
    extra: dict[str, Any] = {"_buckets": _buckets_of(df)}
    if part is not None and df.attrs.get("dp_mode") == "local-sgd":
        extra["_averaging"] = bool((part["stream"] == "collective").any())
    return trace_graph({**df.attrs, **extra})


def _steps(df: Any) -> list[tuple[Any, Any]]:
    return list(df.groupby("step")) if "step" in df.columns else [(0, df)]


_BUCKET = re.compile(r"_b(\d+)$")


def _trace_buckets(attrs: dict[str, Any], num_stages: int) -> list[int]:
    """Buckets per stage of a data-parallel trace: 1 + the highest bucket index of the stage's collectives."""
    counts = attrs.get("_buckets")
    if counts is None:
        raise CostFileError("a data-parallel trace needs its buckets; replay() reads them from its rows")
    return [counts.get(s, 1) for s in range(num_stages)]


def _buckets_of(df: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    coll = df[df["stream"] == "collective"]
    for stage, action in zip(coll["stage"], coll["action"], strict=True):
        m = _BUCKET.search(str(action))
        if m:
            out[int(stage)] = max(out.get(int(stage), 1), int(m.group(1)) + 1)
    return out


def collective_service(part: Any) -> list[tuple[int, str, int, float, float]]:
    """One step's collectives as served: (rank, action, occurrence, start, end), start the later of the issue and
    the end of the rank's previous collective (a rank's collectives are served one at a time), in end order.
    A zero3 gather issued inside a compute row of its rank came from that task's end (``real.dp.zero``'s
    ``after_task`` runs before the row's end is stamped), as the graph has it: it is served from the row's end."""
    out = []
    coll = part[part["stream"] == "collective"]
    seen: dict[tuple[int, str], int] = {}
    free: dict[int, float] = {}
    rows = _compute_rows(part) if part.attrs.get("dp_mode") in ("zero3", "fsdp") else {}
    for rank, action, start, end in sorted(zip(coll["rank"].astype(int), coll["action"].astype(str), coll["start"],
                                               coll["end"], strict=True), key=lambda r: (r[0], r[3], r[2])):
        k = seen[(rank, action)] = seen.get((rank, action), -1) + 1
        if "ALL_GATHER" in action:
            start = next((e for s, e in rows.get(rank, ()) if s < start < e), start)
        begin = max(float(start), free.get(rank, float(start)))
        out.append((rank, action, k, min(begin, float(end)), float(end)))
        free[rank] = max(free.get(rank, float(end)), float(end))
    return out


def _compute_rows(part: Any) -> dict[int, list[tuple[float, float]]]:
    comp = part[part["stream"] == "compute"]
    out: dict[int, list[tuple[float, float]]] = {}
    for rank, start, end in zip(comp["rank"].astype(int), comp["start"], comp["end"], strict=True):
        out.setdefault(rank, []).append((float(start), float(end)))
    return out


def _service(part: Any) -> dict[tuple[int, str, int], float]:
    """(rank, action, occurrence) -> a collective's service time in one step (see the module doc)."""
    return {(r, a, k): e - s for r, a, k, s, e in collective_service(part)}


def server_updates(part: Any, trainers: int) -> dict[int, float]:
    """ps: stage -> the servers' update of it in one step (the longest of the servers' ``{s}OPTIM`` rows, ranks
    from ``trainers`` = pp x dp on)."""
    rows = part[(part["stream"] == "collective") & (part["kind"] == "OPTIM") & (part["rank"] >= trainers)]
    out: dict[int, float] = {}
    for stage, start, end in zip(rows["stage"].astype(int), rows["start"], rows["end"], strict=True):
        out[stage] = max(out.get(stage, 0.0), float(end - start))
    return out


def server_update_times(frames: Any) -> list[float]:
    """ps: every traced step's server update of stage 0 in the traces (DataFrames; :func:`server_updates`);
    empty for the other modes."""
    from schedules.trace import trace_steps

    return [t for df in frames for part in trace_steps(df).values()
            for s, t in server_updates(part, _trainers(df)).items() if s == 0]


def _trainers(df: Any) -> int:
    return int(df.attrs["params"]["pp"]) * int(df.attrs.get("dp", 1) or 1)


def dp_replayable(df: Any, graph: TaskGraph | None = None) -> bool:
    """True if each step's collectives of the first replica (trace ranks below pp) are the graph's (None: that
    step's own, :func:`graph_of`), one for one, and every server update of the graph (ps) has its rows."""
    def counts(pairs) -> dict[tuple[int, str], int]:
        out: dict[tuple[int, str], int] = {}
        for key in pairs:
            out[key] = out.get(key, 0) + 1
        return out

    for _, part in _steps(df):
        g = graph if graph is not None else graph_of(df, part)
        mine = counts((t.rank, str(t.action)) for t in g.tasks if t.stream is Stream.COLLECTIVE
                      and not server_update(t))
        coll = part[(part["stream"] == "collective") & (part["rank"] < g.num_ranks)]
        if counts(zip(coll["rank"].astype(int), coll["action"].astype(str), strict=True)) != mine:
            return False
        updates = {t.action.stage for t in g.tasks if server_update(t)}
        if not updates <= server_updates(part, _trainers(df)).keys():
            return False
    return True


def _before_optim(part: Any, measured: dict[tuple[int, str], float], overhead: float) -> None:
    """A compute task followed by an OPTIM held its rank, in the trace, until its collectives were in too; that
    wait is the replay's to simulate, so the task keeps its body and one task overhead."""
    comp = part[part["stream"] == "compute"].sort_values(["rank", "start"])
    rows = list(zip(comp["rank"], comp["action"], comp["kind"], comp["start"], comp["end"], strict=True))
    for (rank, action, _k, start, end), nxt in itertools.pairwise(rows):
        if nxt[0] == rank and nxt[2] == "OPTIM":
            measured[(int(rank), str(action))] = float(end - start) + overhead


class _StepCosts:
    """Each compute task: its occupancy in one step; messages: the calibrated latency."""

    comm_slowdown = 1.0  # measured compute times are already slowed by what overlapped them
    max_inflight = 0  # and hold the runtime's waits for its reduce-scatters in flight
    comm_stall = 1.0  # and collectives' times already hold what the compute beside them cost

    def __init__(self, base: ProfiledCosts, measured: dict[tuple[int, str], float],
                 service: dict[tuple[int, str, int], float] | None = None,
                 servers: dict[int, float] | None = None) -> None:
        self.base, self.measured, self.service = base, measured, service or {}
        self.servers = servers or {}  # ps: stage -> the servers' measured update
        self.dp = service is not None  # a data-parallel step: its OPTIM measured too (a local-sgd step has no collective)

    def durations(self, graph: TaskGraph) -> list[float]:
        out = [0.0 if self.dp and t.stream is Stream.COLLECTIVE else self.base.duration(t, graph)
               for t in graph.tasks]
        seen: dict[tuple[int, str], int] = {}
        for t in graph.tasks:
            if server_update(t):
                out[t.id] = self.servers[t.action.stage]
            elif t.stream is Stream.COLLECTIVE and self.dp:
                key = (t.rank, str(t.action))
                k = seen[key] = seen.get(key, -1) + 1
                out[t.id] = self.service[(*key, k)]
            elif t.action.kind in (Kind.SEND_F, Kind.SEND_B):
                out[t.id] = self.measured.get((t.rank, str(t.action)), out[t.id])
            elif t.stream is Stream.COMPUTE and (t.action.kind is not Kind.OPTIM or self.dp):
                key = (t.rank, str(t.action))
                if key not in self.measured:
                    raise CostFileError(f"the trace has no {t.action} on rank {t.rank}; it is not a run of "
                                        f"{graph.schedule.name!r} with these parameters")
                out[t.id] = self.measured[key]
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


def replay(trace: Any, costs: ProfiledCosts | None = None) -> list[ReplayStep]:
    """One :class:`ReplayStep` per traced step of one real trace (path or DataFrame)."""
    from schedules.trace import trace_steps, work_span

    (df,) = _frames(trace)
    dp = int(df.attrs.get("dp", 1) or 1)
    graph = graph_of(df)
    costs = costs or from_trace(df, calibration=trace_calibration(df))
    if dp > 1 and not dp_replayable(df):
        raise CostFileError(f"the trace's collectives are not those of the {df.attrs.get('dp_mode')!r} graph one for "
                            "one; it has no replay")
    out = []
    for step, part in trace_steps(df).items():
        measured = occupancy(part, int(df.attrs["params"]["pp"]))
        if dp > 1:
            _before_optim(part, measured, costs.task_overhead)
        step_costs = _StepCosts(costs, measured, _service(part) if dp > 1 else None,
                                server_updates(part, _trainers(df)))
        own = graph_of(df, part) if df.attrs.get("dp_mode") == "local-sgd" else graph
        result = simulate(own, step_costs, check=False)
        if own is not graph:  # local-sgd: the replicas are not in lockstep (a local step's skew carries into the
            part = part[part["rank"] < own.num_ranks]  # next), so the span is the first replica's, as simulated
        out.append(ReplayStep(step, result.makespan, work_span(part)))
    return out
