"""Failures, checkpoints, restarts: exact traces, Young's and Daly's formulas, the elastic scenario."""

from __future__ import annotations

import math

import pytest

from schedules import ConfigError
from sim.faults.failures import (
    CheckpointPolicy,
    FailureModel,
    daly_interval,
    daly_wall_time,
    simulate_elastic,
    simulate_job,
    sweep_intervals,
    young_interval,
)

MIN = 60.0
HOUR = 3600.0


@pytest.mark.parametrize(("mtbf_h", "expected_min"), [(24, 117), (6, 57), (0.25, 9.1)])
def test_daly_worked_cases(mtbf_h, expected_min):
    """Daly (2006): checkpoint 5 min, restart 10 min: MTBF 24 h -> 117 min, 6 h -> 57 min, 15 min -> 9.1 min."""
    tau = daly_interval(5 * MIN, mtbf_h * HOUR) / MIN
    assert round(tau, 1 if expected_min < 10 else 0) == expected_min


def test_young_and_daly_limits():
    assert young_interval(5 * MIN, 24 * HOUR) == pytest.approx(120 * MIN)  # sqrt(2 * 5 * 1440) = 120 min
    assert daly_interval(3 * HOUR, HOUR) == HOUR  # delta >= 2M: checkpoint every MTBF


def test_whole_run_with_one_failure():
    """10 steps of 1 s, checkpoint (0.5 s) every 3 steps, restart 2 s, one failure at t=5.2.

    [0,3] steps 1-3; [3,3.5] checkpoint (3 saved); [3.5,5.2] step 4 partly, lost (1.7 s);
    [5.2,7.2] restart; [7.2,10.2] steps 4-6; [10.2,10.7] checkpoint; [10.7,13.7] steps 7-9;
    [13.7,14.2] checkpoint; [14.2,15.2] step 10.
    """
    r = simulate_job(10, 1.0, FailureModel(devices=4, trace=((5.2, 1),)), CheckpointPolicy(every_steps=3, cost=0.5, restart=2.0))
    assert (r.wall_time, r.restarts, r.checkpoint_time, r.restart_time) == (15.2, 1, 1.5, 2.0)
    assert r.lost_work == pytest.approx(1.7)
    assert r.goodput == pytest.approx(10 / 15.2)


def test_async_checkpoint_counts_once_written():
    """Blocking 0.1 s of 0.5: the write of step 3 lands at 3.5, before the failure at 5.2, so it counts.

    [0,3] steps; [3,3.1] blocking part; [3.1,5.2] 2.1 s lost; [5.2,7.2] restart; [7.2,10.2];
    [10.2,10.3]; [10.3,13.3]; [13.3,13.4]; [13.4,14.4] last step.
    """
    pol = CheckpointPolicy(every_steps=3, cost=0.5, restart=2.0, blocking=0.1)
    r = simulate_job(10, 1.0, FailureModel(devices=4, trace=((5.2, 1),)), pol)
    assert r.wall_time == pytest.approx(14.4) and r.lost_work == pytest.approx(2.1)
    assert r.checkpoint_time == pytest.approx(0.3)


def test_async_checkpoint_lost_if_failure_hits_the_write():
    """Blocking 0.1 of a 3 s write: failure at 4.0 comes before it lands at 6.1, so all 4 s are lost."""
    pol = CheckpointPolicy(every_steps=3, cost=3.0, restart=2.0, blocking=0.1)
    r = simulate_job(10, 1.0, FailureModel(devices=1, trace=((4.0, 0),)), pol)
    assert r.lost_work == pytest.approx(3.0 + 0.9)


def test_failure_during_restart_restarts_again():
    r = simulate_job(4, 1.0, FailureModel(devices=1, trace=((1.0, 0), (2.0, 0))), CheckpointPolicy(every_steps=10, cost=0, restart=2.0))
    # [0,1] lost; restart [1,2] interrupted; restart [2,4]; steps [4,8].
    assert (r.wall_time, r.restarts, r.restart_time) == (8.0, 2, 3.0)


def test_monte_carlo_matches_dalys_expected_wall_time():
    """Mean over 200 seeds within 2% of Daly's eq. 20 at MTBF 100 s, delta 5 s, R 10 s."""
    failures = FailureModel(devices=10, mtbf_device=1000.0)
    for k in (10, 30, 60):
        mean = sweep_intervals(2000, 1.0, failures, intervals=[k], cost=5.0, restart=10.0, trials=200)[0]["wall_time"]
        assert mean == pytest.approx(daly_wall_time(2000, k, 5.0, 10.0, 100.0), rel=0.02)


def test_sweep_best_interval_is_near_daly():
    """The simulated optimum sits where Young and Daly put it (sqrt(2*5*100) = 31.6 s, Daly 28.4 s)."""
    failures = FailureModel(devices=10, mtbf_device=1000.0)
    rows = sweep_intervals(2000, 1.0, failures, intervals=[5, 10, 20, 30, 45, 70, 100], cost=5.0, restart=10.0, trials=100)
    best = max(rows, key=lambda r: r["goodput"])
    assert best["every_steps"] in (20, 30, 45)
    assert daly_interval(5.0, 100.0) == pytest.approx(28.38, abs=0.01)


def test_no_failures_goodput_is_the_checkpoint_overhead():
    r = simulate_job(100, 1.0, FailureModel(devices=8), CheckpointPolicy(every_steps=10, cost=2.0, restart=5.0))
    assert r.wall_time == 100 + 9 * 2.0 and r.restarts == 0


def test_elastic_shrink_beats_waiting_for_repair():
    """Replicas fail (MTBF 200 h per device, 8 per replica) and take 1 h to repair; shrinking keeps training."""
    common = dict(dp=8, devices_per_replica=8, steps=2000, step_time=10.0, mtbf_device=200 * HOUR,
                  repair_time=HOUR, restart=300.0, checkpoint_every=50, checkpoint_cost=30.0)
    gains = []
    for seed in range(6):
        wait = simulate_elastic(shrink=False, seed=seed, **common)
        shrink = simulate_elastic(shrink=True, seed=seed, **common)
        assert shrink.goodput >= wait.goodput  # equal only for a seed without failures
        assert all(n in (0, 8) for _, n in wait.timeline)
        if len(shrink.timeline) > 2:
            assert any(0 < n < 8 for _, n in shrink.timeline)  # it trained at a smaller dp
        gains.append(shrink.goodput - wait.goodput)
    assert sum(gains) / len(gains) > 0.05


def test_elastic_without_failures_is_plain_training():
    r = simulate_elastic(dp=4, devices_per_replica=2, steps=100, step_time=1.0, mtbf_device=math.inf, repair_time=10,
                         restart=5, checkpoint_every=10, checkpoint_cost=1.0, shrink=True)
    assert r.wall_time == 100 + 9 * 1.0 and r.timeline[0] == (0.0, 4)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: FailureModel(devices=0), "failure model: devices must be an integer >= 1, got 0"),
    (lambda: FailureModel(devices=2, mtbf_device=0), "mtbf_device must be > 0 seconds"),
    (lambda: FailureModel(devices=2, trace=((3.0, 0), (1.0, 1))), "increasing time"),
    (lambda: FailureModel(devices=2, trace=((1.0, 5),)), "names device 5; valid devices are 0..1"),
    (lambda: CheckpointPolicy(every_steps=0, cost=1, restart=1), "checkpoint policy: every_steps must be an integer >= 1, got 0"),
    (lambda: CheckpointPolicy(every_steps=1, cost=1, restart=1, blocking=2), "blocking part must be in [0, cost=1]"),
])
def test_bad_input(make, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        make()
