"""Compute slowed by concurrent communication (sim.slowdown): closed forms by hand, and the profile's field."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from schedules import ConfigError, CostFileError, build, lower, validate
from schedules.dp.modes import add_data_parallel
from sim import simulate
from sim.costs.cost_file import load_profile
from sim.costs.profiled import PROFILE_SCHEMA, ProfiledCosts, StageCosts

# One stage: F 10 ms, B 20 ms, OPTIM 3 ms, no overheads; an all-reduce of a bucket takes ALPHA (beta inf).
STAGE = StageCosts(f=0.010, b=0.020, i=0.011, w=0.012, optim=0.003, param_bytes=1000)


def _ddp(buckets: int = 2):
    """gpipe, pp 1, one microbatch, ddp: 0F0, 0B0, bucket k all-reduced from (k+1)/K of B's work, OPTIM."""
    return validate(add_data_parallel(lower(build("gpipe", pp=1, microbatches=1)), "ddp", [buckets]))


def _costs(alpha: float, factor: float) -> ProfiledCosts:
    return ProfiledCosts(stages=(STAGE,), collectives=(("all_reduce", alpha, math.inf),), comm_slowdown=factor)


def _times(result) -> dict[str, tuple[float, float]]:
    df = result.trace
    return {a: (s, e) for a, s, e in zip(df["action"], df["start"], df["end"], strict=True)}


def test_pass_overlapping_part_of_a_collective_stretches_by_the_closed_form():
    """Bucket 0 is ready half-way through B (t = 10 + 10 ms) and all-reduces for 4 ms; B runs 1.5x slower then:
    B = 20 + 4 (1 - 1/1.5) ms. Bucket 1 is ready when B's work is done, and OPTIM follows it."""
    f, b, a, c = 0.010, 0.020, 0.004, 1.5
    t = _times(simulate(_ddp(), _costs(a, c)))
    b_end = f + b + a * (1 - 1 / c)
    assert t["0B0"] == (f, pytest.approx(b_end, rel=1e-12, abs=0))
    assert t["0ALLREDUCE_b0"] == (pytest.approx(f + b / 2, rel=1e-12), pytest.approx(f + b / 2 + a, rel=1e-12))
    assert t["0ALLREDUCE_b1"] == (pytest.approx(b_end, rel=1e-12), pytest.approx(b_end + a, rel=1e-12))
    assert t["0OPTIM"][1] == pytest.approx(b_end + a + 0.003, rel=1e-12)


def test_collective_outlasting_the_pass_slows_its_whole_rest_and_the_next_buckets_readiness():
    """A 20 ms all-reduce from half-way through B: the other half of B's work takes 1.5 x 10 ms; bucket 1,
    ready at B's end, waits for the port (bucket 0 ends at 10 + 10 + 20 ms)."""
    f, b, a, c = 0.010, 0.020, 0.020, 1.5
    t = _times(simulate(_ddp(), _costs(a, c)))
    assert t["0B0"][1] == pytest.approx(f + b / 2 + c * b / 2, rel=1e-12)
    assert t["0ALLREDUCE_b1"] == (pytest.approx(f + b / 2 + a, rel=1e-12), pytest.approx(f + b / 2 + 2 * a, rel=1e-12))


def test_buckets_readiness_is_counted_in_the_slowed_pass_work():
    """Four buckets, each all-reduce 1 ms, factor 2: bucket k is ready after (k+1)/4 of B's 20 ms of work.
    Work 0-5 ms at full speed; bucket 0 in flight 1 ms (0.5 ms of work), so bucket 1 is ready at 5 + 1 + 4.5."""
    f, a, c = 0.010, 0.001, 2.0
    t = _times(simulate(_ddp(4), _costs(a, c)))
    ready = [t[f"0ALLREDUCE_b{k}"][0] - f for k in range(4)]
    # each bucket: 1 ms in flight (0.5 ms of work), then 4.5 ms of work at full speed
    assert ready == pytest.approx([0.005, 0.0105, 0.016, 0.0215], rel=1e-12)
    assert t["0B0"][1] - f == pytest.approx(0.0215, rel=1e-12)


def test_factor_one_is_todays_engine_bit_for_bit(monkeypatch):
    """comm_slowdown 1.0 never enters the slowed path, so every time is the ordinary engine's."""
    import sim.engine

    def refuse(*args, **kwargs):
        raise AssertionError("the slowed path ran at factor 1.0")

    monkeypatch.setattr(sim.engine, "slowed_links", refuse)
    t = _times(simulate(_ddp(), _costs(0.004, 1.0)))
    assert t["0B0"] == (0.010, 0.010 + 0.020)
    assert t["0ALLREDUCE_b1"] == (0.010 + 0.020, 0.010 + 0.020 + 0.004)


def test_compute_without_a_collective_in_flight_is_untouched():
    """sync all-reduces after the last compute: nothing overlaps, so a factor changes no compute time."""
    graph = validate(add_data_parallel(lower(build("gpipe", pp=1, microbatches=2)), "sync", [2]))
    t1, t3 = (_times(simulate(graph, _costs(0.004, c))) for c in (1.0, 3.0))
    assert t1 == t3


def _profile(tmp_path: Path, section) -> Path:
    data = {"schema": PROFILE_SCHEMA, "partitions": [{"num_stages": 1, "stages": [
        {"stage": 0, "layers": [0, 2], "F": 0.01, "B": 0.02, "I": 0.011, "W": 0.012}]}]}
    if section != "absent":
        data["comm_slowdown"] = section
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("section", "factor"), [
    ({"factor": 1.25, "bucket_bytes": 1048576, "in_flight": 9, "short": 0}, 1.25),
    ("absent", 1.0),
    (None, 1.0),
])
def test_profile_field_round_trips(tmp_path, section, factor):
    costs = load_profile(_profile(tmp_path, section), 1)
    assert costs.comm_slowdown == factor
    assert costs.describe()["comm_slowdown"] == factor


@pytest.mark.parametrize(("section", "got"), [
    ({"factor": 0}, "0"), ({"factor": -1.5}, "-1.5"), ({"factor": "1.2"}, "'1.2'"), ({"factor": True}, "True"),
    ({}, "None"), (1.3, "1.3"),
])
def test_bad_profile_field_is_one_line_naming_it(tmp_path, section, got):
    path = _profile(tmp_path, section)
    with pytest.raises(CostFileError) as err:
        load_profile(path, 1)
    assert str(err.value) == (f"cost file {str(path)!r}: comm_slowdown.factor must be a finite factor > 0 (1.0: "
                              f"communication does not slow compute), got {got}")


def test_bad_factor_in_costs_is_refused():
    with pytest.raises(CostFileError, match=r"comm_slowdown must be a finite factor > 0 .*got inf"):
        _costs(0.004, math.inf)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, "1", True])
def test_profile_bucket_is_a_positive_size(bad):
    """The all-reduce kept in flight while comm_slowdown times the passes: refused before anything runs."""
    pytest.importorskip("torch")
    from real.profile.machine import ProfileConfig

    with pytest.raises(ConfigError) as err:
        ProfileConfig(bucket_mb=bad)
    assert str(err.value) == f"profile: bucket_mb must be a size > 0 MiB, got {bad!r}"


def _zero(mode: str, buckets: int = 4):
    return validate(add_data_parallel(lower(build("gpipe", pp=1, microbatches=1)), mode, [buckets]))


def _bounded(limit: int) -> ProfiledCosts:
    return ProfiledCosts(stages=(STAGE,), collectives=(("reduce_scatter", 0.012, math.inf),
                                                       ("all_gather", 0.001, math.inf)), max_inflight=limit)


def test_reduce_scatters_in_flight_bound_stops_the_backward():
    """zero2, 4 buckets ready at 5, 10, 15, 20 ms of B's 20 ms (B from t = 10 ms), each reduce-scatter 12 ms, one
    at a time: b0 15-27, b1 queued to 27-39. b2 is issued at 25 ms with b0 and b1 not done: three > 2, so B stops
    until b0 ends at 27; B ends at 10 + 20 + 2 ms. Without the bound, at 30 ms."""
    t = _times(simulate(_zero("zero2"), _bounded(2)))
    assert t["0B0"] == (0.010, pytest.approx(0.032, rel=1e-12))
    assert [t[f"0REDUCE_SCATTER0_b{k}"][0] for k in range(4)] == pytest.approx([0.015, 0.027, 0.039, 0.051],
                                                                                rel=1e-12)
    assert _times(simulate(_zero("zero2"), _bounded(0)))["0B0"] == (0.010, 0.030)


def test_the_bound_is_zero2_and_zero3s_only():
    """zero1's reduce-scatters come from the unbounded sync (real.dp.sync): a bound changes nothing there."""
    assert _times(simulate(_zero("zero1"), _bounded(1))) == _times(simulate(_zero("zero1"), _bounded(0)))
    with pytest.raises(CostFileError, match=r"max_inflight must be a whole number of collectives >= 0 .*got -1"):
        _bounded(-1)
