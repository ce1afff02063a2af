"""Property tests: every registered schedule, at random shapes and costs, validates and simulates sanely.

Shapes: pp in 1..8, microbatches in 1..24 (multiples of pp where a schedule
needs it), chunks in 2..4 for multi-chunk schedules. Costs: tf, tb, tw in
[0.1, 3], tcomm in [0, 1]. The schedule list is ``schedules.names()``, so a
newly registered schedule is covered without touching this file.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from conftest import MB_MULTIPLE_OF_PP, MB_PER_RANK_AT_LEAST
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schedules
from schedules import Kind, Stream, TaskGraph, lower, validate
from sim import UniformCosts, simulate
from sim.engine import activation_peaks

PROPS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def shapes(draw, name: str) -> tuple[int, int, int]:
    """(pp, microbatches, chunks) valid for schedule ``name``."""
    pp = draw(st.integers(1, 8))
    if name in MB_MULTIPLE_OF_PP:
        m = pp * draw(st.integers(1, max(1, 24 // pp)))
    else:
        m = draw(st.integers(MB_PER_RANK_AT_LEAST.get(name, 0) * pp or 1, 24))
    spec = schedules.spec(name)
    if spec.fixed_chunks is not None:
        chunks = spec.fixed_chunks
    else:
        low = 2 if spec.multi_chunk or (spec.any_chunks and pp > 1) else 1  # combined-1f1b: v >= 2 when pp > 1
        chunks = draw(st.integers(low, 4)) if spec.takes_chunks else 1
    return pp, m, chunks


costs = st.builds(
    UniformCosts,
    tf=st.floats(0.1, 3.0),
    tb=st.floats(0.1, 3.0),
    tw=st.floats(0.1, 3.0),
    tcomm=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
)


def graph_of(name: str, shape: tuple[int, int, int]) -> TaskGraph:
    pp, m, chunks = shape
    return lower(schedules.build(name, pp=pp, microbatches=m, chunks=chunks))


def longest_path(graph: TaskGraph, cost: UniformCosts) -> float:
    """Length of the longest dependency path, by a DP over a topological order (Kahn)."""
    tasks = graph.tasks
    indeg = [len(t.deps) for t in tasks]
    succ: list[list[int]] = [[] for _ in tasks]
    for t in tasks:
        for d in t.deps:
            succ[d].append(t.id)
    order = [t.id for t in tasks if indeg[t.id] == 0]
    for i in order:  # the list grows while we walk it
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                order.append(j)
    assert len(order) == len(tasks), "task graph has a cycle"
    end = [0.0] * len(tasks)
    for i in order:
        t = tasks[i]
        start = max((end[d] for d in t.deps), default=0.0)
        end[i] = start + cost.duration(t, graph)
    return max(end, default=0.0)


def one_microbatch_path(graph: TaskGraph, cost: UniformCosts) -> float:
    """Critical path of one microbatch: all its forwards, all its input gradients, then stage 0's W.

    With full backwards (B) this is sum over stages of (tf+tb+tw)/chunks; each
    cross-rank hop adds tcomm for the activation and tcomm for the gradient.
    """
    sched = graph.schedule
    v = sched.chunks
    kinds = {
        (a.kind, a.stage) for t in graph.tasks if t.action.is_compute for a in t.action.parts() if a.microbatch == 0
    }
    path = 0.0
    for s in range(sched.num_stages):
        path += cost.tf / v
        path += (cost.tb + cost.tw) / v if (Kind.B, s) in kinds else cost.tb / v
    if (Kind.W, 0) in kinds:
        path += cost.tw / v
    s2r = sched.stage_to_rank
    hops = sum(1 for s in range(sched.num_stages - 1) if s2r[s] != s2r[s + 1])
    return path + 2 * cost.tcomm * hops


def per_name(test):
    """Run ``test`` once per registered schedule name."""
    return pytest.mark.parametrize("name", schedules.names())(test)


@per_name
@PROPS
@given(data=st.data(), cost=costs)
def test_validates_and_simulates(name, data, cost):
    """validate() accepts the schedule and simulate() gives every task a finite start <= end."""
    shape = data.draw(shapes(name), label="pp, microbatches, chunks")
    sched = schedules.build(name, pp=shape[0], microbatches=shape[1], chunks=shape[2])
    graph = validate(sched)
    assert len(graph.programs) == shape[0]
    result = simulate(graph, cost)
    assert len(result.start) == len(result.end) == len(graph.tasks)
    for s, e in zip(result.start, result.end, strict=True):
        assert math.isfinite(s) and math.isfinite(e) and 0.0 <= s <= e
    assert len(result.trace) == len(graph.tasks)
    assert activation_peaks(graph, cost) == [r.peak_activations for r in result.ranks]  # the same, not simulated


@per_name
@PROPS
@given(data=st.data())
def test_each_work_runs_once(name, data):
    """Each (stage, microbatch) has exactly one F and exactly one backward (B, or I and W), nothing else."""
    graph = graph_of(name, data.draw(shapes(name), label="pp, microbatches, chunks"))
    sched = graph.schedule
    counts = Counter(
        (a.kind, a.stage, a.microbatch) for t in graph.tasks if t.stream is Stream.COMPUTE for a in t.action.parts()
    )
    for s in range(sched.num_stages):
        for mb in range(sched.num_microbatches):
            assert counts[(Kind.F, s, mb)] == 1, (s, mb)
            b, i, w = counts[(Kind.B, s, mb)], counts[(Kind.I, s, mb)], counts[(Kind.W, s, mb)]
            assert (b, i, w) in ((1, 0, 0), (0, 1, 1)), (s, mb, b, i, w)
    valid = {
        (k, s, mb)
        for k in (Kind.F, Kind.B, Kind.I, Kind.W)
        for s in range(sched.num_stages)
        for mb in range(sched.num_microbatches)
    }
    assert set(counts) <= valid  # no other kinds, stages or microbatches


@per_name
@PROPS
@given(data=st.data(), cost=costs)
def test_makespan_bounds_and_longest_path(name, data, cost):
    """makespan >= max busy, >= one microbatch's critical path, and == the graph's longest path.

    The engine starts every task as soon as its dependencies end, so the
    makespan is exactly the longest path (computed here by an independent DP).
    """
    graph = graph_of(name, data.draw(shapes(name), label="pp, microbatches, chunks"))
    result = simulate(graph, cost)
    span = result.makespan
    tol = 1e-9 * max(1.0, span)
    assert span + tol >= max(r.busy for r in result.ranks)
    assert span + tol >= one_microbatch_path(graph, cost)
    assert span == pytest.approx(longest_path(graph, cost), rel=1e-9)


@per_name
@PROPS
@given(data=st.data(), cost=costs)
def test_trace_compute_is_serial_and_in_program_order(name, data, cost):
    """Per rank, compute rows of the trace follow the program order and never overlap in time."""
    graph = graph_of(name, data.draw(shapes(name), label="pp, microbatches, chunks"))
    trace = simulate(graph, cost).trace
    assert list(trace.columns) == ["rank", "stream", "action", "kind", "stage", "microbatch", "start", "end", "bytes"]
    for rank, prog in enumerate(graph.programs):
        compute_ids = [i for i in prog if graph.tasks[i].stream is Stream.COMPUTE]
        rows = trace[(trace["rank"] == rank) & (trace["stream"] == "compute")]
        assert sorted(rows.index) == sorted(compute_ids)
        ordered = trace.loc[compute_ids]  # trace row i is task i
        assert list(ordered["action"]) == [str(a) for a in graph.schedule.programs[rank]]
        starts, ends = list(ordered["start"]), list(ordered["end"])
        for k in range(1, len(starts)):
            assert starts[k] >= ends[k - 1], (rank, k)
        by_time = rows.sort_values("start", kind="stable")
        assert list(by_time.index) == compute_ids


@per_name
@settings(max_examples=40, deadline=None)
@given(data=st.data(), cost=costs)
def test_simulation_is_deterministic(name, data, cost):
    """Two simulations of the same graph and costs give identical traces."""
    shape = data.draw(shapes(name), label="pp, microbatches, chunks")
    first = simulate(graph_of(name, shape), cost).trace
    second = simulate(graph_of(name, shape), cost).trace
    assert first.equals(second)
    assert first.attrs == second.attrs
