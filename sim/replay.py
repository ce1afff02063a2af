"""Replay: simulate each step of a real trace with that step's own measured task durations.

The replay error (predicted span against the measured span of the same step)
isolates the simulator's dependency and communication model from its cost
estimates: every compute task occupies its rank exactly as long as it did,
from its start to the rank's next compute task or receive wait (so the
posting of its messages and the executor's gap are its own), and what remains
is how tasks wait for each other and for messages. A message the receiver
waited for takes what it took, from the later of the wait and the producer's
end to its arrival; one that arrived before the wait costs the calibrated
latency (:func:`sim.profiled.from_trace`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schedules import Kind, Stream, TaskGraph, build, lower, spec
from schedules.errors import CostFileError
from sim.engine import simulate
from sim.profiled import ProfiledCosts, _frames, from_trace, occupancy, trace_calibration

__all__ = ["ReplayStep", "replay", "trace_graph"]


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
    return lower(build(name, pp=pp, microbatches=m, chunks=int(params.get("chunks") or spec(name).default_chunks)))


class _StepCosts:
    """Each compute task: its occupancy in one step; messages: the calibrated latency."""

    def __init__(self, base: ProfiledCosts, measured: dict[tuple[int, str], float]) -> None:
        self.base, self.measured = base, measured

    def durations(self, graph: TaskGraph) -> list[float]:
        out = [self.base.duration(t, graph) for t in graph.tasks]
        for t in graph.tasks:
            if t.action.kind in (Kind.SEND_F, Kind.SEND_B):
                out[t.id] = self.measured.get((t.rank, str(t.action)), out[t.id])
            elif t.stream is Stream.COMPUTE and t.action.kind is not Kind.OPTIM:
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
    graph = trace_graph(df.attrs)
    costs = costs or from_trace(df, calibration=trace_calibration(df))
    if df.attrs.get("dp", 1) != 1:
        raise CostFileError("replay takes a pipeline-only trace (dp = 1)")
    out = []
    for step, part in trace_steps(df).items():
        result = simulate(graph, _StepCosts(costs, occupancy(part, int(df.attrs["params"]["pp"]))), check=False)
        out.append(ReplayStep(step, result.makespan, work_span(part)))
    return out
