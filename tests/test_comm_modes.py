"""Decentralized and local SGD in the IR and the simulator (closed forms), and time-to-loss arithmetic."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from analysis.time_to_loss import (
    LossCurve,
    ModeSpec,
    parse_mode,
    read_curve,
    smoothed,
    steps_to_loss,
    time_to_loss_rows,
)
from schedules import Action, ConfigError, Kind, ScheduleError, Stream, build, lower, validate
from schedules.dp.modes import add_data_parallel, exchange_peers, random_peer, ring_neighbours
from sim.costs.cluster import Link, cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.comm_modes import amortized, mode_step_time
from sim.plan.study import Study, run_study


def _tasks(graph, rank, kind):
    return [graph.tasks[i] for i in graph.programs[rank] if graph.tasks[i].action.kind is kind]


@pytest.mark.parametrize("text", ["0EXCHANGE_b3", "1EXCHANGE1_b0"])
def test_exchange_actions_print_and_parse_back(text):
    assert str(Action.parse(text)) == text


@pytest.mark.parametrize("peers", [1, 2])
def test_decentralized_exchanges_every_bucket_with_each_neighbour_from_the_step_start(peers):
    base = lower(build("1f1b", pp=2, microbatches=4))
    graph = validate(add_data_parallel(base, "decentralized", [3, 3], peers=peers))
    for rank in range(2):
        ex = _tasks(graph, rank, Kind.EXCHANGE)
        assert [str(t.action) for t in ex] == [f"{rank}EXCHANGE{j}_b{k}" for j in range(peers) for k in range(3)]
        assert all(t.deps == () and t.stream is Stream.COLLECTIVE for t in ex)
        (opt,) = _tasks(graph, rank, Kind.OPTIM)
        compute = [i for i in graph.programs[rank] if graph.tasks[i].stream is Stream.COMPUTE and i != opt.id]
        assert opt.deps == (compute[-1], *(t.id for t in ex))
        assert not _tasks(graph, rank, Kind.ALLREDUCE)


@pytest.mark.parametrize("averaging", [True, False])
def test_local_sgd_all_reduces_the_parameters_after_the_step_only_when_averaging(averaging):
    base = lower(build("1f1b", pp=2, microbatches=4))
    graph = validate(add_data_parallel(base, "local-sgd", [2, 2], averaging=averaging))
    for rank in range(2):
        (opt,) = _tasks(graph, rank, Kind.OPTIM)
        ar = _tasks(graph, rank, Kind.ALLREDUCE)
        assert [(str(t.action), t.deps) for t in ar] == ([(f"{rank}ALLREDUCE_b{k}", (opt.id,)) for k in range(2)]
                                                          if averaging else [])
        assert not _tasks(graph, rank, Kind.EXCHANGE)


def test_peers_out_of_range():
    base = lower(build("1f1b", pp=2, microbatches=2))
    with pytest.raises(ScheduleError, match=r"^peers 3 must be 1 or 2 \(the neighbours of a decentralized replica\)$"):
        add_data_parallel(base, "decentralized", [1, 1], peers=3)


def test_ring_neighbours_and_peer_counts():
    assert [ring_neighbours(r, 4) for r in range(4)] == [(1, 3), (2, 0), (3, 1), (0, 2)]
    assert ring_neighbours(0, 2) == (1,) and ring_neighbours(1, 2) == (0,) and ring_neighbours(0, 1) == ()
    assert [exchange_peers("ring", dp) for dp in (2, 3, 64)] == [1, 2, 2]
    assert exchange_peers("random", 64) == 1


def test_random_peers_pair_every_replica_and_follow_the_seed():
    for step in range(20):
        peers = [random_peer(r, 8, 5, step) for r in range(8)]
        assert all(peers[peers[r]] == r != peers[r] for r in range(8))
    assert [random_peer(0, 8, 5, s) for s in range(20)] == [random_peer(0, 8, 5, s) for s in range(20)]
    assert len({random_peer(0, 8, 5, s) for s in range(20)}) > 1
    assert [random_peer(0, 8, 5, s) for s in range(20)] != [random_peer(0, 8, 6, s) for s in range(20)]
    with pytest.raises(ScheduleError, match=r"^random peer selection pairs the replicas and needs an even dp, got "
                                            r"dp 3; use an even dp or peer selection ring$"):
        random_peer(0, 3, 0, 0)


def _study(mode, *, cluster=None, dp=2, contention=0.0, **parallel):
    """contention 0: these closed forms are of the transfers, not of the compute they slow (test_links);
    None: the device's, as the command line has it."""
    cl = cluster or cluster_preset("dgx-h100:1")
    return Study(schedule="1f1b", microbatches=4, costs=TransformerCosts(
        model=model_preset("gpt-6.2b"), cluster=cl, contention=contention,
        parallel=ParallelConfig(pp=1, dp=dp, dp_mode=mode, **parallel)))


def _slow(cluster, gbps):
    return replace(cluster, intra=Link(alpha=1e-5, bandwidth=gbps * 1e9 / 8), inter=Link(alpha=2e-5,
                                                                                         bandwidth=gbps * 1e9 / 8))


def test_decentralized_exchange_is_alpha_beta_on_the_group_link_and_hides_behind_compute():
    none = run_study(_study("none", dp=1)).step_time
    fast = run_study(_study("decentralized", dp=8))
    costs = fast.study.costs
    n_bytes = [costs.bucket_size(0, 1, k) for k in range(costs.buckets(1)[0])]  # 16-bit (reduce_dtype bf16)
    assert n_bytes == [costs.collective_bytes(Kind.EXCHANGE, 0, 1, k) for k in range(len(n_bytes))]
    link = fast.study.cluster.intra
    spans = [fast.sim.end[t.id] - fast.sim.start[t.id] for t in fast.sim.graph.tasks if t.action.kind is Kind.EXCHANGE]
    assert len(spans) == 2 * len(n_bytes)
    assert sum(spans) == pytest.approx(2 * sum(link.alpha + n / link.rate for n in n_bytes), rel=1e-9)
    assert fast.step_time == pytest.approx(none, rel=1e-12)  # 450 GB/s: hidden behind the passes
    slow_cluster = _slow(cluster_preset("dgx-h100:1"), 1.0)
    slow = run_study(_study("decentralized", dp=8, cluster=slow_cluster))
    optim = slow.study.costs.optim_time(0, 1)
    exchanges = 2 * sum(1e-5 + n / (1e9 / 8) for n in n_bytes)  # serial on the rank's communicator
    assert slow.step_time == pytest.approx(exchanges + optim, rel=1e-9)


def test_local_sgd_amortizes_the_parameter_all_reduce_over_k_steps():
    k = 4
    t = mode_step_time(_study("local-sgd", dp=8, sync_every=k))
    r = run_study(_study("local-sgd", dp=8, sync_every=k))
    costs, group = r.study.costs, r.study.costs.group(0)
    allreduces = sum(group.allreduce(costs.bucket_size(0, 1, b)) for b in range(costs.buckets(1)[0]))
    assert t.averaging_s == r.step_time == pytest.approx(t.local_s + allreduces, rel=1e-9)
    assert t.local_s == pytest.approx(run_study(_study("none", dp=1)).step_time, rel=1e-12)
    assert t.per_step == amortized(t.local_s, t.averaging_s, k) == ((k - 1) * t.local_s + t.averaging_s) / k
    assert mode_step_time(_study("ddp", dp=8)).per_step == run_study(_study("ddp", dp=8)).step_time


CURVE = ((0, 1, 2, 3, 4), (3.0, 2.5, 2.2, 1.9, 2.0))


def test_steps_to_loss_counts_the_steps_done_at_the_first_crossing():
    assert [steps_to_loss(*CURVE, target) for target in (3.0, 2.5, 2.0, 1.9, 1.8)] == [1, 2, 4, 4, None]


def test_time_to_loss_rows_multiply_steps_by_the_simulated_step_time():
    curves = [LossCurve(ModeSpec("ddp"), *CURVE), LossCurve(ModeSpec("local-sgd", sync_every=4), (0, 1, 2),
                                                            (3.0, 2.4, 2.3))]
    rows = time_to_loss_rows(curves, {"ddp": 0.5, "local-sgd:4": 0.25}, 2.2)
    assert [(r["mode"], r["steps_to_loss"], r["time_to_loss_s"]) for r in rows] == [("ddp", 3, 1.5),
                                                                                    ("local-sgd:4", None, None)]


def test_curves_read_from_metrics_jsonl_and_csv(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text("\n".join(json.dumps(d) for d in [{"step": 1, "loss": 2.5, "lr": 0.1}, {"step": 0, "loss": 3.0},
                                                        {"step": 1, "memory/rank0/x": 5}]) + "\n")
    assert read_curve(jsonl) == ((0, 1), (3.0, 2.5))
    csv = tmp_path / "c.csv"
    csv.write_text("step,loss\n0,3\n1,2.5\n")
    assert read_curve(csv) == ((0, 1), (3.0, 2.5))
    bad = tmp_path / "bad.csv"
    bad.write_text("step,los\n0,3\n")
    with pytest.raises(ConfigError, match=r"is not a metrics.jsonl or a step,loss CSV \(KeyError: 'loss'\)$"):
        read_curve(bad)


def test_mode_names():
    assert parse_mode("local-sgd:8") == ModeSpec("local-sgd", sync_every=8)
    assert parse_mode("decentralized") == ModeSpec("decentralized", peer_selection="ring")
    assert parse_mode("decentralized:random").label == "decentralized:random"
    with pytest.raises(ConfigError, match=r"^time to loss: 'local-sgd' needs its averaging period, e.g. local-sgd:4"):
        parse_mode("local-sgd")
    with pytest.raises(ConfigError, match=r"^time to loss: mode 'allreduce' is not a data-parallel mode; valid: sync"):
        parse_mode("allreduce")


def test_smoothing_is_a_trailing_mean():
    assert smoothed((4.0, 2.0, 3.0, 1.0), 2) == (4.0, 3.0, 2.5, 2.0)
    assert smoothed(CURVE[1], 1) == CURVE[1]
    with pytest.raises(ConfigError, match=r"^time to loss: smooth 0 must be a whole number of steps >= 1"):
        smoothed(CURVE[1], 0)


def _compare(capsys, *argv):
    from analysis.cli.compare import compare_main

    try:
        code = compare_main(list(argv))
    except SystemExit as exc:
        code = exc.code
    return code, *capsys.readouterr()


def test_compare_time_to_loss_reports_each_mode_and_draws_the_curves(tmp_path, capsys):
    for name, losses in (("ddp", (3.0, 2.5, 2.2)), ("lsgd", (3.0, 2.6, 2.4, 2.2))):
        (tmp_path / f"{name}.csv").write_text("step,loss\n" + "".join(f"{i},{x}\n" for i, x in enumerate(losses)))
    argv = ["--model", "gpt-6.2b", "--cluster", "dgx-h100:1", "--pp", "1", "--dp", "8", "--microbatches", "4",
            "--time-to-loss", "2.3", "--curve", f"ddp={tmp_path / 'ddp.csv'}",
            "--curve", f"local-sgd:4={tmp_path / 'lsgd.csv'}", "--out", str(tmp_path / "out"), "--json"]
    code, out, err = _compare(capsys, *argv)
    assert code == 0, err
    got = json.loads(out)
    ddp = run_study(_study("ddp", dp=8, contention=None)).step_time
    lsgd = mode_step_time(_study("local-sgd", dp=8, sync_every=4, contention=None)).per_step
    assert [(r["mode"], r["steps_to_loss"], r["step_time_s"], r["time_to_loss_s"]) for r in got["modes"]] == [
        ("ddp", 3, ddp, 3 * ddp), ("local-sgd:4", 4, lsgd, 4 * lsgd)]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["time-to-loss.csv", "time-to-loss.png"]


def test_compare_time_to_loss_needs_curves(capsys):
    code, _, err = _compare(capsys, "--model", "gpt-6.2b", "--cluster", "dgx-h100:1", "--time-to-loss", "2")
    assert code == 2 and err == ("error: schedlab compare: --time-to-loss needs at least one --curve MODE=FILE "
                                 "(e.g. --curve ddp=run/metrics.jsonl)\n")


@pytest.mark.parametrize(("kw", "message"), [
    ({"dp_mode": "ddp", "sync_every": 3}, "parallel: sync_every applies to dp_mode local-sgd, not 'ddp'; use dp_mode "
                                          "local-sgd or leave it out"),
    ({"dp_mode": "local-sgd", "peer_selection": "random"}, "parallel: peer_selection applies to dp_mode "
                                                            "decentralized, not 'local-sgd'; use dp_mode decentralized "
                                                            "or leave it out"),
    ({"dp_mode": "decentralized", "peer_selection": "random", "dp": 3}, "parallel: peer_selection random pairs the "
                                                                        "replicas and needs an even dp, got dp 3; use "
                                                                        "an even dp or peer_selection ring"),
    ({"dp_mode": "local-sgd", "sync_every": 0}, "parallel: sync_every must be an integer >= 1, got 0"),
])
def test_peer_options_are_refused_where_they_do_nothing_or_cannot_work(kw, message):
    with pytest.raises(ConfigError) as err:
        ParallelConfig(pp=1, **{"dp": 4, **kw})
    assert str(err.value) == message


def test_run_config_refuses_peer_options_of_another_mode_and_random_peers_at_odd_dp():
    from real.config import RunConfig

    with pytest.raises(ConfigError, match=r"^data-parallel sync: sync_every 2 applies to dp_mode local-sgd, not "
                                          r"'ddp'; use dp_mode local-sgd or leave it out$"):
        RunConfig.of(schedule="1f1b", dp=2, sync_every=2)
    with pytest.raises(ConfigError, match=r"^run of '1f1b': peer_selection random pairs the replicas and needs an "
                                          r"even dp, got dp 3; use an even dp or peer_selection ring$"):
        RunConfig.of(schedule="1f1b", dp=3, batch_size=30, dp_mode="decentralized", peer_selection="random")


@pytest.mark.parametrize("mode", ["decentralized", "local-sgd"])
def test_each_replica_holds_its_whole_model_states(mode):
    from sim.memory import model_state_bytes

    assert model_state_bytes(1000, mode, 8) == model_state_bytes(1000, "ddp", 8) == 16 * 1000


def test_a_cost_file_times_an_exchange_as_one_measured_message_of_the_bucket(tmp_path):
    from sim.costs.cost_file import load_profile
    from tests.test_profiled import PROFILE

    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    costs = load_profile(path, 2)
    graph = add_data_parallel(lower(build("1f1b", pp=2, microbatches=2)), "decentralized", [2, 4], peers=2)
    ex = [t for t in graph.tasks if t.action.kind is Kind.EXCHANGE]
    assert len(ex) == 2 * (2 + 4)
    for t in ex:
        n = (1000 / 2, 2000 / 4)[t.action.stage]  # the stage's param_bytes over its buckets
        assert costs.bytes(t, graph) == n
        assert costs.duration(t, graph) == 0.0001 + n / 1e8


def test_a_peer_mode_checkpoint_resumes_with_the_same_mode_dp_and_pp_only(tmp_path):
    from real.checkpoint import Restored
    from real.config import RunConfig
    from real.dp.peer_sync import check_resume
    from schedules import CheckpointError

    def cfg(mode, dp):
        return RunConfig.of(schedule="1f1b", dp=dp, batch_size=32, dp_mode=mode).to_dict()

    restored = Restored(tmp_path / "step_000002", {"step": 2})
    check_resume(restored, cfg("local-sgd", 2), cfg("local-sgd", 2))
    check_resume(restored, cfg("ddp", 2), cfg("zero1", 4))
    with pytest.raises(CheckpointError, match=r"was written with dp mode local-sgd at dp 2, pp 1; this run has local-sgd at "
                                          r"dp 4, pp 1: decentralized and local-sgd checkpoints hold each replica's "):
        check_resume(restored, cfg("local-sgd", 2), cfg("local-sgd", 4))
    with pytest.raises(CheckpointError, match=r"written with dp mode ddp at dp 2, pp 1; this run has decentralized at dp 2"):
        check_resume(restored, cfg("ddp", 2), cfg("decentralized", 2))
