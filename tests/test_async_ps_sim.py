"""async-ps in the simulator (sim.costs.async_ps): trainers of different speeds under the staleness bound, closed forms.

τ_i = compute / v_i + push + pull (the server's update 0 unless said): the slowest trainer (τ_s) never waits; a
faster one starts step n at max(n τ_i, (n - S) τ_s), so over N steps it runs N / max(N τ_i, (N - S) τ_s) steps/s
and waits max(N τ_i, (N - S) τ_s) - N τ_i seconds in all.
"""

from __future__ import annotations

import json

import pytest

from analysis.dp_compare import predict_dp_modes
from schedules import ConfigError, Kind
from sim.costs.async_ps import Cycle, cycle_of, simulate_async_ps
from sim.costs.cluster import cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.comm_modes import mode_step_time
from sim.plan.study import Study, run_study

CYCLE = Cycle(compute_s=2.0, push_s=0.5, pull_s=0.5)  # τ = 3 s at speed 1, 2 s at speed 2
N = 10


def _own(speed: float) -> float:
    return CYCLE.compute_s / speed + CYCLE.push_s + CYCLE.pull_s


def test_staleness_0_is_synchronous_ps_the_slowest_paces_every_trainer_and_each_waits_for_the_update():
    r = simulate_async_ps(Cycle(2.0, 0.5, 0.5, update_s=0.25), (1, 2), 0, steps=N)
    period = _own(1) + 0.25  # the slowest's step, then the update of its push (the last), then the pull
    assert [t.steps_per_s for t in r.trainers] == pytest.approx([1 / period] * 2, rel=1e-12)
    assert r.time_per_step == pytest.approx(period, rel=1e-12)
    assert [t.wait_s for t in r.trainers] == pytest.approx([N * 0.25, N * (0.25 + _own(1) - _own(2))], rel=1e-12)
    assert [t.staleness for t in r.trainers] == [(0,) * N] * 2


def test_unbounded_staleness_runs_each_trainer_at_its_own_rate():
    r = simulate_async_ps(CYCLE, (1, 2), N, steps=N)
    assert [t.steps_per_s for t in r.trainers] == pytest.approx([1 / 3, 1 / 2], rel=1e-12)
    assert [t.wait_s for t in r.trainers] == [0.0, 0.0]
    assert r.time_per_step == pytest.approx(2 / (1 / 3 + 1 / 2), rel=1e-12)  # dp / sum of the rates


@pytest.mark.parametrize("staleness", [1, 2, 3])
def test_a_small_bound_lets_the_faster_trainer_run_exactly_s_steps_ahead(staleness):
    r = simulate_async_ps(CYCLE, (1, 2), staleness, steps=N)
    slow, fast = r.trainers
    start_n = max(N * _own(2), (N - staleness) * _own(1))  # when the faster one may start step N
    assert slow.steps_per_s == pytest.approx(1 / _own(1), rel=1e-12) and slow.wait_s == 0.0
    assert fast.steps_per_s == pytest.approx(N / start_n, rel=1e-12)
    assert fast.wait_s == pytest.approx(start_n - N * _own(2), rel=1e-12)
    assert fast.max_staleness == staleness and slow.staleness == (0,) * N
    assert r.time_per_step == pytest.approx(2 / (1 / _own(1) + N / start_n), rel=1e-12)


def test_bad_cycle_speeds_and_bound_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"^async-ps: staleness must be a whole number of steps >= 0, got -1$"):
        simulate_async_ps(CYCLE, (1, 1), -1)
    with pytest.raises(ConfigError, match=r"^async-ps cycle: pull_s must be a finite number of seconds >= 0, got -1$"):
        Cycle(1.0, 0.0, -1)
    with pytest.raises(ConfigError, match=r"^parallel: trainer_speeds has 3 speed\(s\), dp is 2; give one per "
                                          r"replica \(e.g. 1,1\)$"):
        ParallelConfig(pp=1, dp=2, dp_mode="async-ps", trainer_speeds=(1, 2, 3))
    with pytest.raises(ConfigError, match=r"^parallel: staleness applies to dp_mode async-ps, not 'ps'; use dp_mode "
                                          r"async-ps or leave it out$"):
        ParallelConfig(pp=1, dp=2, dp_mode="ps", staleness=1)


def _study(**parallel) -> Study:
    return Study(schedule="1f1b", microbatches=4, costs=TransformerCosts(
        model=model_preset("gpt-6.2b"), cluster=cluster_preset("dgx-h100:2+ps2"),
        parallel=ParallelConfig(pp=4, dp=2, dp_mode="async-ps", **parallel)))


def test_the_cycle_is_the_simulated_step_cut_at_the_last_compute_push_and_pull():
    r = run_study(_study())
    c = cycle_of(r, 0.0)
    assert c.compute_s > 0 and c.push_s >= 0 and c.pull_s > 0
    tasks, end = r.sim.graph.tasks, r.sim.end
    pushed = max(end[t.id] for t in tasks if t.action.kind is Kind.REDUCE_SCATTER)
    updated = max(end[t.id] for t in tasks if t.action.kind is Kind.OPTIM)  # the servers' last update (stage 0's)
    assert c.compute_s + c.push_s == pushed and updated > pushed
    # the step ends with its last pull, after the servers' last update (schedules.dp.modes)
    assert c.own(1.0) + (updated - pushed) == pytest.approx(max(end), rel=1e-12)


def test_the_study_mode_step_time_and_compare_use_the_bound_model():
    study = _study(staleness=2, trainer_speeds=(1, 0.5))
    r = run_study(study)
    a = r.async_ps
    assert a is not None and a.staleness == 2 and [t.speed for t in a.trainers] == [1.0, 0.5]
    assert a.cycle == cycle_of(r, a.cycle.update_s) and a.cycle.update_s > 0
    assert a == simulate_async_ps(a.cycle, (1, 0.5), 2)
    assert mode_step_time(study).per_step == a.time_per_step
    assert r.to_dict()["async_ps"] == a.to_dict()
    rows = predict_dp_modes(["ddp", "async-ps"], schedule="1f1b", microbatches=4, costs=study.costs)
    assert {row.mode: row.step_time for row in rows} == {"ddp": run_study(_study_mode("ddp")).step_time,
                                                         "async-ps": a.time_per_step}


def _study_mode(mode: str) -> Study:
    return Study(schedule="1f1b", microbatches=4, costs=TransformerCosts(
        model=model_preset("gpt-6.2b"), cluster=cluster_preset("dgx-h100:2+ps2"),
        parallel=ParallelConfig(pp=4, dp=2, dp_mode=mode)))


def test_python_m_sim_prints_each_trainer_under_the_bound(capsys):
    from analysis.cli.simulate import main

    argv = ["--model", "gpt-6.2b", "--cluster", "dgx-h100:2+ps2", "--pp", "4", "--dp", "2", "--schedule", "1f1b",
            "--microbatches", "4", "--dp-mode", "async-ps", "--staleness", "2", "--trainer-speeds", "1,0.5"]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["async_ps"]
    r = run_study(_study(staleness=2, trainer_speeds=(1, 0.5)))
    assert got == r.async_ps.to_dict()
    assert "\n".join(r.async_ps.format()) in r.format()


@pytest.mark.parametrize("flags, message", [
    (["--dp-mode", "ps", "--staleness", "1"],
     "parallel: staleness applies to dp_mode async-ps, not 'ps'; use dp_mode async-ps or leave it out"),
    (["--dp-mode", "async-ps", "--trainer-speeds", "1,0"],
     "config [parallel]: trainer_speeds must be a list of finite numbers > 0, one per replica (e.g. [1, 1.5]), got "
     "[1.0, 0.0] (flag --trainer-speeds)"),
    (["--dp-mode", "async-ps", "--trainer-speeds", "1,x"], "'1,x' is not comma-separated numbers, e.g. 1,1.5"),
])
def test_bad_async_flags_of_python_m_sim_are_one_line_and_exit_2(capsys, flags, message):
    from analysis.cli.simulate import main

    with pytest.raises(SystemExit) as exc:
        main(["--model", "gpt-6.2b", "--cluster", "dgx-h100:2+ps2", "--pp", "4", "--dp", "2", "--schedule", "1f1b",
              "--microbatches", "4", *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_compare_dp_modes_refuses_the_async_settings_without_async_ps(capsys):
    """With async-ps among --dp-modes they reach its row (predict_dp_modes, tested above)."""
    from analysis.cli.compare import compare_main

    with pytest.raises(SystemExit) as exc:
        compare_main(["--model", "gpt-6.2b", "--cluster", "dgx-h100:2+ps2", "--pp", "4", "--dp", "2", "--schedules",
                      "1f1b", "--microbatches", "4", "--staleness", "2", "--trainer-speeds", "1,0.5",
                      "--dp-modes", "ddp,ps"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("error: --staleness, --trainer-speeds have no effect unless --dp-modes has "
                                       "async-ps\n")
