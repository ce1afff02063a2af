"""The planner's steady-phase extrapolation against the whole step simulated (sim.plan.extrapolate)."""

from __future__ import annotations

import itertools

import pytest

from schedules import spec
from sim.costs.cluster import cluster_preset
from sim.costs.transformer import TransformerConfig
from sim.engine import simulate
from sim.plan.bounds import Bounds
from sim.plan.extrapolate import TOLERANCE, StepFigures, extend, short_sizes
from sim.plan.search import plan
from sim.plan.space import PlanConfig, PlanSpace
from sim.plan.study import Study, StudyResult, build_graph

# 10 layers: uneven stages at pp 4 (3, 3, 2, 2) and at pp 4 x v 2; the embedding and the head on the end stages
MODEL = TransformerConfig(name="plan-tiny", layers=10, hidden=512, heads=8, vocab=4096, seq_len=256)
SPACE = PlanSpace(model=MODEL, cluster=cluster_preset("dgx-h100:1"), global_batch=8)


def _figures(c: PlanConfig) -> StepFigures:
    costs = Bounds(SPACE).costs(c)
    study = Study(schedule=c.schedule, microbatches=c.microbatches, costs=costs, chunks=c.chunks)
    return StepFigures.of(StudyResult(study, simulate(build_graph(study), costs, check=False)))


NAMES = ["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "interleaved-zb", "looped-bfs", "zb-v", "v-half", "v-min",
         "dualpipe-v"]
CASES = [(2, 21, "zero2"), (4, 48, "zero1"), (4, 44, "zero2")]
# The cases whose two periods agree (the others are simulated whole): every family extends somewhere
NOT_STEADY = {("v-half", 2, "zero2"), ("zb-h2", 4, "zero1"), ("zb-v", 4, "zero1"), ("v-half", 4, "zero1"),
              ("zb-h2", 4, "zero2"), ("zb-v", 4, "zero2"), ("v-half", 4, "zero2")}


def test_extended_figures_against_the_whole_step():
    """Every schedule family, on shared links with compute slowed while communicating (the H100's fair model), dp 2
    (zero1: a tail after the last pass; zero2: a reduce-scatter every microbatch). Where the two periods agree,
    (:data:`TOLERANCE` of the step's increment per period), the extended step, makespan and exposed communication
    are within TOLERANCE of the whole step (most to rounding, the worst 3.5e-5: not exact, hence ``--exact``), the
    busy time within TOLERANCE of its own (the worst 2.2e-4)."""
    steady, worst = set(), 0.0
    for (pp, m, mode), name in itertools.product(CASES, NAMES):
        v = spec(name).default_chunks if not spec(name).multi_chunk or spec(name).fixed_chunks else 2
        c = PlanConfig(1, pp, 8 // pp, name, v, 1, m - m % pp if name.startswith("interleaved") else m, mode,
                       "none", False)
        sizes = short_sizes(c)
        assert sizes is not None and sizes[0] == 2 * pp + (c.microbatches - 2 * pp) % pp
        got = extend(c, sizes, tuple(_figures(c._replace(microbatches=k)) for k in sizes))
        if got is None:
            continue
        steady.add((name, pp, mode))
        whole = _figures(c)
        for i, (x, y) in enumerate(zip(got.values(), whole.values(), strict=True)):
            if i != 2:
                worst = max(worst, abs(x - y) / whole.step)
        assert got.busy == pytest.approx(whole.busy, rel=TOLERANCE)
    assert steady == {(n, pp, mode) for (pp, _, mode), n in itertools.product(CASES, NAMES)} - NOT_STEADY
    assert 1e-12 < worst < TOLERANCE / 10


def test_short_steps_are_whole_when_too_few_microbatches_or_no_pipeline():
    assert short_sizes(PlanConfig(1, 4, 2, "1f1b", 1, 1, 27, "zero1", "none", False)) is None  # 2 pp + 5 pp > 27
    assert short_sizes(PlanConfig(1, 4, 2, "1f1b", 1, 1, 28, "zero1", "none", False)) == (8, 12, 16)
    assert short_sizes(PlanConfig(1, 4, 2, "1f1b", 1, 1, 30, "zero1", "none", False)) == (10, 14, 18)
    assert short_sizes(PlanConfig(1, 1, 8, "1f1b", 1, 1, 64, "ddp", "none", False)) is None


def test_a_step_that_is_not_steady_is_not_extended():
    c = PlanConfig(1, 4, 2, "zb-h1", 1, 1, 48, "zero1", "none", False)
    a, b, d = (_figures(c._replace(microbatches=k)) for k in short_sizes(c))
    period = d.step - b.step
    bent = StepFigures(d.step + 2 * TOLERANCE * period, d.makespan, d.busy, d.exposed, d.ranks)
    assert extend(c, short_sizes(c), (a, b, bent)) is None
    near = StepFigures(d.step + TOLERANCE * period / 2, d.makespan + TOLERANCE * period / 2, d.busy, d.exposed, d.ranks)
    assert extend(c, short_sizes(c), (a, b, near)) is not None
    assert extend(c, short_sizes(c), (a, b, d)) is not None


def test_the_plan_is_the_same_extrapolated_or_whole():
    space = PlanSpace(model=MODEL, cluster=cluster_preset("dgx-h100:1"), global_batch=160, tp=(1,), pp=(2, 4),
                      microbatch_sizes=(1,), recompute=("none",), dp_modes=("zero1", "zero2"), chunks=(2,),
                      schedules=("1f1b", "interleaved-zb", "zb-v"))
    fast = plan(space, top=4, workers=1, extrapolate=True)
    whole = plan(space, top=4, workers=1)
    assert [e.config for e in fast.top] == [e.config for e in whole.top]
    assert any(e.extrapolated_from for e in fast.top) and not any(e.extrapolated_from for e in whole.top)
    for e, w in zip(fast.top, whole.top, strict=True):
        assert e.step_time == pytest.approx(w.step_time, rel=TOLERANCE)
        assert e.peak_memory_bytes == pytest.approx(w.peak_memory_bytes, rel=1e-12)
        assert e.exposed_comm == pytest.approx(w.exposed_comm, abs=TOLERANCE * w.step_time)
