"""decentralized's and local-sgd's parameter copies as costs: loaded and validated (sim.costs.profiled, sim.costs.param_copy),
charged where real.dp.peer_sync does them: the flatten on the rank's first pass, the averaging back on the OPTIM,
local-sgd's copies on each bucket's all-reduce."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from schedules import CostFileError, Kind, build, lower, validate
from schedules.dp.modes import add_data_parallel
from sim import simulate
from sim.costs.cost_file import load_profile
from sim.costs.param_copy import ParamCopy
from sim.costs.profiled import PROFILE_SCHEMA, ProfiledCosts, StageCosts, step_time

# One stage of 3 MB in 3 buckets of 1 MB; exchanges and collectives of 0.2 ms each, far shorter than a forward
FLAT, AVG, LOCAL = 0.2, 0.3, 0.4  # ns per parameter byte
COPY = ParamCopy(flatten=FLAT, average=AVG, local_sgd=LOCAL)
MSG = 1e-4 + 1e6 / 1e10
COSTS = ProfiledCosts(stages=(StageCosts(f=0.01, b=0.02, i=0.012, w=0.011, optim=0.003, param_bytes=3e6),),
                      step_overhead=0.001, p2p_alpha=1e-4, p2p_beta=1e10,
                      collectives=tuple((op, 1e-4, 1e10) for op in ("all_reduce", "reduce_scatter", "all_gather")))


def _graph(mode: str, schedule: str = "gpipe", m: int = 4, pp: int = 1, buckets=(3,), **kw):
    return validate(add_data_parallel(lower(build(schedule, pp=pp, microbatches=m)), mode, list(buckets), **kw))


def _step(graph, costs: ProfiledCosts) -> float:
    return step_time(simulate(graph, costs), costs)


@pytest.mark.parametrize("m", [1, 4, 8])
def test_decentralized_step_grows_by_flatten_and_average_of_the_stage_bytes(m):
    graph = _graph("decentralized", m=m)
    copied = replace(COSTS, param_copy=COPY)
    # the flatten, m forwards and backwards (the exchanges end during the first), the averaging, the OPTIM, overhead
    assert _step(graph, copied) == pytest.approx(3e6 * FLAT * 1e-9 + m * 0.03 + 3e6 * AVG * 1e-9 + 0.003 + 0.001,
                                                 rel=1e-12)
    assert _step(graph, copied) - _step(graph, COSTS) == pytest.approx(3e6 * (FLAT + AVG) * 1e-9, rel=1e-9)


def test_decentralized_copies_land_on_each_ranks_first_pass_and_its_optim():
    """pp 2 (1F1B), stages of 3 MB and 1 MB: each rank's first forward runs its own stage's flatten longer, each
    stage's OPTIM its averaging; no other task changes."""
    two = replace(COSTS, stages=(COSTS.stages[0], replace(COSTS.stages[0], param_bytes=1e6)))
    graph = _graph("decentralized", "1f1b", m=4, pp=2, buckets=(3, 1), peers=2)
    plain, copied = two.durations(graph), replace(two, param_copy=COPY).durations(graph)
    grown = {(graph.tasks[i].action.kind, graph.tasks[i].action.stage, graph.tasks[i].action.microbatch): c - p
             for i, (p, c) in enumerate(zip(plain, copied, strict=True)) if c != p}
    assert grown == pytest.approx({(Kind.F, 0, 0): 3e6 * FLAT * 1e-9, (Kind.F, 1, 0): 1e6 * FLAT * 1e-9,
                                   (Kind.OPTIM, 0, None): 3e6 * AVG * 1e-9, (Kind.OPTIM, 1, None): 1e6 * AVG * 1e-9},
                                  rel=1e-12)


@pytest.mark.parametrize("m", [1, 4])
def test_local_sgd_averaging_step_adds_the_copies_to_each_buckets_allreduce(m):
    graph = _graph("local-sgd", m=m)
    copied = replace(COSTS, param_copy=COPY)
    # m forwards and backwards, the OPTIM, then the 3 buckets averaged one after another, the step's overhead
    assert _step(graph, copied) == pytest.approx(m * 0.03 + 0.003 + 3 * (MSG + 1e6 * LOCAL * 1e-9) + 0.001,
                                                 rel=1e-12)
    grown = [c - p for p, c in zip(COSTS.durations(graph), copied.durations(graph), strict=True) if c != p]
    assert grown == pytest.approx([1e6 * LOCAL * 1e-9] * 3, rel=1e-12)
    assert all(graph.tasks[i].action.kind is Kind.ALLREDUCE
               for i, (p, c) in enumerate(zip(COSTS.durations(graph), copied.durations(graph), strict=True)) if c != p)
    local = _graph("local-sgd", m=m, averaging=False)  # a local step copies nothing
    assert copied.durations(local) == COSTS.durations(local)


@pytest.mark.parametrize("mode", ["ddp", "zero2", "sync", "ps", "none"])
def test_other_modes_are_not_charged(mode):
    graph = _graph(mode)
    assert replace(COSTS, param_copy=COPY).durations(graph) == COSTS.durations(graph)


def _profile(**extra) -> dict:
    return {"schema": PROFILE_SCHEMA, "partitions": [{"num_stages": 1, "stages": [
        {"stage": 0, "layers": [0, 2], "param_bytes": 3e6, "F": 0.01, "B": 0.02, "I": 0.012, "W": 0.011}]}], **extra}


def test_profile_section_loads_old_profiles_charge_nothing_and_bad_values_are_one_line_errors(tmp_path):
    path = tmp_path / "p.json"
    section = {"flatten_ns_per_byte": FLAT, "average_ns_per_byte": AVG, "local_sgd_ns_per_byte": LOCAL,
               "bucket_bytes": [1000]}
    for given, want in ((section, COPY), (None, ParamCopy()), ({"flatten_ns_per_byte": 1}, ParamCopy(flatten=1.0))):
        path.write_text(json.dumps(_profile(param_copy=given)))
        assert load_profile(path).param_copy == want
    path.write_text(json.dumps(_profile(p2p={"alpha": 1e-4, "beta": 1e10},
                                        collectives={"all_reduce": {"alpha": 1e-4, "beta": 1e10}})))
    old = load_profile(path)  # a profile from before the field: nothing charged, the predictions of before
    assert old.param_copy == ParamCopy()
    assert _step(_graph("decentralized"), old) == pytest.approx(4 * 0.03, rel=1e-12)  # no OPTIM time in the file
    assert _step(_graph("local-sgd"), old) == pytest.approx(4 * 0.03 + 3 * MSG, rel=1e-12)
    for bad, shown in (("x", "'x'"), (-1, "-1"), (True, "True"), (float("inf"), "inf")):
        path.write_text(json.dumps(_profile(param_copy={**section, "average_ns_per_byte": bad})))
        with pytest.raises(CostFileError) as err:
            load_profile(path)
        assert str(err.value) == (f"cost file {str(path)!r}: param_copy.average_ns_per_byte must be a finite number "
                                  f"of nanoseconds per parameter byte >= 0 (0: that copy is not charged), got {shown}")
    path.write_text(json.dumps(_profile(param_copy=[1])))
    with pytest.raises(CostFileError) as err:
        load_profile(path)
    assert str(err.value) == (f"cost file {str(path)!r}: param_copy must be an object of flatten_ns_per_byte, "
                              f"average_ns_per_byte, local_sgd_ns_per_byte or null, got [1]")
    with pytest.raises(CostFileError, match=r"^profiled costs: param_copy.local_sgd must be .* got -1.0$"):
        ParamCopy(local_sgd=-1.0)
