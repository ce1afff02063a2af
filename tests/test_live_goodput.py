"""The live mode of the goodput model (sim/faults/live.py): closed forms checked by hand arithmetic."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from schedules import ConfigError
from sim.faults.failures import daly_interval, young_interval
from sim.faults.live import LiveCosts, checkpoint_interval, live_failure_cost, live_goodput, restart_goodput

ROOT = Path(__file__).resolve().parents[1]
# detection 1 s, quorum 0.5 s, transfer 1 ns/byte x 2 GB = 2 s, replacement 10 min, step 10 s
COSTS = LiveCosts(detection=1.0, quorum=0.5, transfer_s_per_byte=1e-9, state_bytes=2e9, replacement=600.0,
                  step_time=10.0)


def test_restart_goodput_is_dalys_wall_time_inverted():
    # M 1000 s, checkpoint 10 s, restart 20 s, every 100 s: wall per 100 s of work = 1000 e^0.02 (e^0.11 - 1)
    wall = 1000 * math.exp(20 / 1000) * (math.exp(110 / 1000) - 1)
    assert restart_goodput(1000.0, 10.0, 20.0, 100.0) == pytest.approx(100 / wall, rel=1e-12)
    assert restart_goodput(math.inf, 5.0, 10.0, 95.0) == 0.95  # no failure: the checkpoint overhead alone
    assert restart_goodput(math.inf, 5.0, 10.0, math.inf) == 1.0


def test_a_survivable_failure_costs_pause_half_a_step_degraded_time_and_the_join():
    # 1 + 0.5 + 10/2 (pause, redone half step) + 600/8 (a replica of 8 missing) + 0.5 + 2 (the join)
    assert live_failure_cost(COSTS, 8) == pytest.approx(84.0)
    assert COSTS.transfer == pytest.approx(2.0)


def test_live_goodput_without_job_wide_failures_never_checkpoints():
    goodput, interval = live_goodput(3600.0, 8, COSTS, checkpoint_cost=60.0, restart=600.0)
    assert interval == math.inf
    assert goodput == pytest.approx(1 - 84 / 3600)


@pytest.mark.parametrize("rule", ["young", "daly"])
def test_live_goodput_with_job_wide_failures_checkpoints_at_their_mtbf(rule):
    costs = LiveCosts(**{**{f: getattr(COSTS, f) for f in COSTS.__slots__}, "job_wide": 0.25})
    goodput, interval = live_goodput(3600.0, 8, costs, checkpoint_cost=60.0, restart=600.0, rule=rule)
    wide = 3600.0 / 0.25  # one failure in four stops the job: MTBF 4 h for the checkpoints
    expected_interval = young_interval(60.0, wide) if rule == "young" else daly_interval(60.0, wide)
    assert interval == pytest.approx(expected_interval)
    expected = restart_goodput(wide, 60.0, 600.0, expected_interval) * (1 - 0.75 / 3600 * 84)
    assert goodput == pytest.approx(expected, rel=1e-12)


def test_one_replica_has_no_survivor_so_live_is_checkpoint_restart():
    tau = daly_interval(60.0, 3600.0)
    assert live_goodput(3600.0, 1, COSTS, checkpoint_cost=60.0, restart=600.0) == (
        restart_goodput(3600.0, 60.0, 600.0, tau), tau)


def test_live_beats_restart_at_scale_and_clips_at_zero():
    mtbf = 600.0  # a failure every 10 min
    restart = restart_goodput(mtbf, 60.0, 600.0, checkpoint_interval("daly", 60.0, mtbf))
    live, _ = live_goodput(mtbf, 128, COSTS, checkpoint_cost=60.0, restart=600.0)
    assert live == pytest.approx(1 - (1 + 0.5 + 5 + 600 / 128 + 0.5 + 2) / 600) and live > restart
    assert live_goodput(50.0, 2, COSTS, checkpoint_cost=60.0, restart=600.0)[0] == 0.0  # a pause longer than the MTBF


@pytest.mark.parametrize(("call", "message"), [
    (lambda: live_failure_cost(COSTS, 1), "live fault tolerance needs dp >= 2 replicas (a survivor), got dp 1"),
    (lambda: LiveCosts(detection=1.0, quorum=0.5, transfer_s_per_byte=0.0, state_bytes=0.0, replacement=1.0,
                       step_time=1.0, job_wide=1.5), "job_wide must be a share in [0, 1], got 1.5"),
    (lambda: LiveCosts(detection=-1.0, quorum=0.5, transfer_s_per_byte=0.0, state_bytes=0.0, replacement=1.0,
                       step_time=1.0), "detection must be >= 0, got -1.0"),
    (lambda: checkpoint_interval("best", 1.0, 10.0), "checkpoint interval rule 'best' is unknown; valid rules are young, daly"),
    (lambda: restart_goodput(0.0, 1.0, 1.0, 1.0), "restart goodput: mtbf must be > 0 seconds (inf allowed), got 0.0"),
])
def test_bad_inputs_name_the_value(call, message):
    with pytest.raises(ConfigError) as err:
        call()
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(("args", "message"), [
    (["--job-wide", "2"], "--job-wide must be a share in [0, 1], got 2.0"),
    (["--pause", "nothere.json"], "--pause 'nothere.json' cannot be read ([Errno 2] No such file or directory: "
     "'nothere.json'); write it with python experiments/live_pause.py --json FILE"),
])
def test_the_goodput_script_refuses_bad_live_inputs_before_simulating(tmp_path, args, message):
    done = subprocess.run([sys.executable, "experiments/goodput.py", "--out", str(tmp_path), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (2, f"error: {message}\n")
