"""zero2/zero3's per-bucket reduce-scatter hook as a cost: measured by the profiler (real.profile.hook), loaded
and validated (sim.costs.profiled), charged bucket bytes x ns per byte to the pass that runs it, per microbatch."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from schedules import CostFileError, Kind, build, lower, validate
from schedules.dp.modes import add_data_parallel
from sim import simulate
from sim.costs.cost_file import load_profile
from sim.costs.profiled import PROFILE_SCHEMA, ProfiledCosts, StageCosts, step_time

# One stage of 3 MB in 3 buckets of 1 MB; collectives of 0.2 ms, far shorter than a third of a backward, so each
# bucket's reduce-scatter ends before the next is ready and only the last one's time follows the last pass.
NS = 0.5  # ns per gradient byte: 0.5 ms per 1 MB bucket
HOOK = 1e6 * NS * 1e-9
COLL = 1e-4 + 1e6 / 1e10
COSTS = ProfiledCosts(stages=(StageCosts(f=0.01, b=0.02, i=0.012, w=0.011, optim=0.003, param_bytes=3e6),),
                      step_overhead=0.001,
                      collectives=tuple((op, 1e-4, 1e10) for op in ("all_reduce", "reduce_scatter", "all_gather")))


def _graph(mode: str, schedule: str = "gpipe", m: int = 4):
    return validate(add_data_parallel(lower(build(schedule, pp=1, microbatches=m)), mode, [3]))


def _step(graph, costs: ProfiledCosts) -> float:
    return step_time(simulate(graph, costs), costs)


@pytest.mark.parametrize("m", [1, 4, 8])
def test_zero2_step_grows_by_microbatches_x_buckets_x_bytes_x_ns(m):
    graph = _graph("zero2", m=m)
    hooked = replace(COSTS, reduce_hook_ns_per_byte=NS)
    # m forwards, m backwards each with its 3 hooks, the last bucket's reduce-scatter, the optimizer step,
    # zero2's 3 all-gathers one after another, the step's overhead
    assert _step(graph, hooked) == pytest.approx(m * 0.01 + m * (0.02 + 3 * HOOK) + COLL + 0.003 + 3 * COLL + 0.001,
                                                 rel=1e-12)
    assert _step(graph, hooked) - _step(graph, COSTS) == pytest.approx(m * 3 * 1e6 * NS * 1e-9, rel=1e-9)


def test_the_hook_lands_on_the_pass_that_completes_the_bucket():
    """zero3 with split backwards (zb-h1): on every W (its reduce-scatters' anchor), 3 hooks each; no other task."""
    graph = _graph("zero3", "zb-h1", 3)
    plain, hooked = COSTS.durations(graph), replace(COSTS, reduce_hook_ns_per_byte=NS).durations(graph)
    grown = {str(graph.tasks[i].action): h - p for i, (p, h) in enumerate(zip(plain, hooked, strict=True)) if h != p}
    assert grown == pytest.approx({"0W0": 3 * HOOK, "0W1": 3 * HOOK, "0W2": 3 * HOOK}, rel=1e-12)
    assert all(graph.tasks[i].action.kind is Kind.W for i, _ in graph.plan.ready.values())
    fsdp = _graph("fsdp", "zb-h1", 3)
    assert replace(COSTS, reduce_hook_ns_per_byte=NS).durations(fsdp) == hooked


@pytest.mark.parametrize("mode", ["sync", "ddp", "zero1", "ps", "none"])
def test_modes_without_the_per_microbatch_copy_are_not_charged(mode):
    """ddp and zero1 accumulate into the flat buffer and launch once a step (real.dp.sync): no copy to charge, so their
    predictions do not move; neither do sync's, ps's (real.dp.ps pushes its own way) or none's."""
    graph = _graph(mode)
    assert replace(COSTS, reduce_hook_ns_per_byte=NS).durations(graph) == COSTS.durations(graph)


def _profile(**extra) -> dict:
    return {"schema": PROFILE_SCHEMA, "partitions": [{"num_stages": 1, "stages": [
        {"stage": 0, "layers": [0, 2], "param_bytes": 3e6, "F": 0.01, "B": 0.02, "I": 0.012, "W": 0.011}]}], **extra}


def test_profile_field_loads_and_bad_values_are_one_line_errors(tmp_path):
    path = tmp_path / "p.json"
    for section, want in (({"ns_per_byte": 0.37, "bucket_bytes": [1000]}, 0.37), (None, 0.0), ({"ns_per_byte": 0}, 0.0)):
        path.write_text(json.dumps(_profile(reduce_hook=section)))
        assert load_profile(path).reduce_hook_ns_per_byte == want
    path.write_text(json.dumps(_profile()))
    assert load_profile(path).reduce_hook_ns_per_byte == 0.0  # a profile from before the field: not charged
    for bad, shown in (("x", "'x'"), (-1, "-1"), (True, "True"), ({}, "None")):
        path.write_text(json.dumps(_profile(reduce_hook={"ns_per_byte": bad} if bad != {} else bad)))
        with pytest.raises(CostFileError) as err:
            load_profile(path)
        assert str(err.value) == (f"cost file {str(path)!r}: reduce_hook.ns_per_byte must be a finite number of "
                                  f"nanoseconds per gradient byte >= 0 (0: the reduce-scatter hook is not charged), "
                                  f"got {shown}")
    with pytest.raises(CostFileError, match=r"^profiled costs: reduce_hook_ns_per_byte must be a finite number .* got inf$"):
        replace(COSTS, reduce_hook_ns_per_byte=float("inf"))
