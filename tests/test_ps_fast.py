"""The parameter-server modes without processes: async-ps in the IR and the cost model, the flags' errors.

The runs themselves (ps and async-ps equal to plain training, memory, resume, the staleness bound) are in
``tests/test_ps.py`` (one 3-process launch).
"""

from __future__ import annotations

import json

import pytest

from schedules import Kind, Stream, build, lower
from schedules.dp.modes import add_data_parallel
from sim.costs import collectives as coll
from sim.costs.cluster import cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.memory import server_memory
from sim.plan.study import Study, run_study

GPT6 = model_preset("gpt-6.2b")


def _study(mode: str, servers: int, link_model: str = "fcfs") -> Study:
    return Study(schedule="1f1b", microbatches=4, costs=TransformerCosts(
        model=GPT6, cluster=cluster_preset(f"dgx-h100:2+ps{servers}"),
        parallel=ParallelConfig(pp=4, dp=4, dp_mode=mode, link_model=link_model)))


def test_async_ps_has_the_tasks_of_ps():
    graph = lower(build("zb-h1", pp=2, microbatches=4))
    ps, asynchronous = (add_data_parallel(graph, mode, [2, 3]) for mode in ("ps", "async-ps"))
    assert [(t.rank, t.stream, str(t.action), t.deps) for t in asynchronous.tasks] == \
           [(t.rank, t.stream, str(t.action), t.deps) for t in ps.tasks]
    assert asynchronous.plan.mode == "async-ps" and asynchronous.plan.ready == ps.plan.ready


@pytest.mark.parametrize(("schedule", "pp", "buckets"), [("zb-h1", 2, [2, 3]), ("interleaved-1f1b", 2, [1, 2, 1, 3]),
                                                         ("1f1b", 1, [2])])
def test_the_servers_update_each_stage_after_its_pushes_last_stage_first_and_the_pulls_wait(schedule, pp, buckets):
    """real.dp.ps.ParamServer.step: a stage's update once all its buckets' pushes are in, the stages one at a time
    from the last; each pull waits for its stage's update. On the stage's rank, on the collective stream."""
    graph = lower(build(schedule, pp=pp, microbatches=4))
    ps = add_data_parallel(graph, "ps", buckets)
    ids = {str(t.action): t.id for t in ps.tasks if t.stream is Stream.COLLECTIVE}
    n = graph.schedule.num_stages
    assert sorted(a for a in ids if "OPTIM" in a) == sorted(f"{s}OPTIM" for s in range(n))
    for s in range(n):
        update = ps.tasks[ids[f"{s}OPTIM"]]
        assert (update.rank, update.stream) == (graph.schedule.stage_to_rank[s], Stream.COLLECTIVE)
        after = (ids[f"{s + 1}OPTIM"],) if s + 1 < n else ()
        assert update.deps == (*(ids[f"{s}REDUCE_SCATTER_b{k}"] for k in range(buckets[s])), *after)
        assert [ps.tasks[ids[f"{s}ALL_GATHER_b{k}"]].deps for k in range(buckets[s])] == [(update.id,)] * buckets[s]
    assert not any(t.action.kind is Kind.OPTIM for t in ps.tasks if t.stream is Stream.COMPUTE)  # trainers: none


@pytest.mark.parametrize("mode", ["ps", "async-ps"])
@pytest.mark.parametrize(("servers", "tp"), [(1, 1), (2, 2), (4, 1)])
def test_a_servers_update_moves_28_bytes_per_parameter_of_its_shard_at_its_memory_bandwidth(mode, servers, tp):
    """Each stage's update: 28 B x (stage params x tp) / K at the server's memory bandwidth (sim.costs.async_ps.update_time,
    one function for both modes); it holds no link, so it starts when its last dependency ends."""
    r = run_study(Study(schedule="1f1b", microbatches=4, costs=TransformerCosts(
        model=GPT6, cluster=cluster_preset(f"dgx-h100:2+ps{servers}"),
        parallel=ParallelConfig(pp=4, dp=2, tp=tp, dp_mode=mode))))
    costs, sim = r.study.costs, r.sim
    bw = r.study.cluster.pserver_spec.memory_bw
    assert bw == 0.3e12
    updates = [t for t in sim.graph.tasks if t.action.kind is Kind.OPTIM]
    assert len(updates) == 4
    for t in updates:
        expected = 28 * costs.stage_params(t.action.stage, 4) * tp / servers / bw
        assert sim.end[t.id] - sim.start[t.id] == pytest.approx(expected, rel=1e-12)
        assert sim.start[t.id] == max(sim.end[d] for d in t.deps)
        assert sim.bytes_moved[t.id] == 0.0
    total = sum(costs.server_update_time(s, 4) for s in range(4))
    assert total == pytest.approx(28 * GPT6.params * (sum(costs.stage_params(s, 4) for s in range(4)) * tp
                                                       / GPT6.params) / servers / bw, rel=1e-12)
    if mode == "async-ps":
        assert r.async_ps.cycle.update_s == total
    else:  # the trainers step nothing: the step ends with the last pull, after the servers' last update
        assert r.step_time == max(sim.end)
        last = max(sim.end[t.id] for t in updates)
        assert last == sim.end[next(t.id for t in updates if t.action.stage == 0)]


@pytest.mark.parametrize(("servers", "dp", "pp", "bucket_mb", "link_model"), [
    (2, 2, 1, 1e5, "fair"), (2, 2, 1, 25, "fair"), (4, 4, 1, 25, "fcfs"), (4, 2, 1, 100, "fair"),
    (2, 2, 4, 25, "fair"), (2, 2, 4, 1e5, "fcfs"), (4, 4, 2, 25, "fair")])
def test_async_ps_at_staleness_0_is_the_ps_step_plus_the_update_ps_hides_before_the_last_push(
        servers, dp, pp, bucket_mb, link_model):
    """Equal speeds, S = 0, dp <= K (a push or pull costs the same alone as with every trainer's): async-ps's time
    per update = the ps step + the servers' update work ps does before the step's last push is in (the later
    stages', while the earlier ones push): sim.costs.async_ps runs the whole update after the last push. At pp 1
    there is none: the two are equal."""
    def study(mode):
        return Study(schedule="1f1b", microbatches=4, costs=TransformerCosts(
            model=GPT6, cluster=cluster_preset(f"dgx-h100:2+ps{servers}"),
            parallel=ParallelConfig(pp=pp, dp=dp, dp_mode=mode, bucket_mb=bucket_mb, link_model=link_model)))
    ps, asynchronous = run_study(study("ps")), run_study(study("async-ps"))
    sim = ps.sim
    pushed = max(sim.end[t.id] for t in sim.graph.tasks if t.action.kind is Kind.REDUCE_SCATTER)
    updated = max(sim.end[t.id] for t in sim.graph.tasks if t.action.kind is Kind.OPTIM)
    hidden = asynchronous.async_ps.cycle.update_s - (updated - pushed)
    assert asynchronous.async_ps.time_per_step == pytest.approx(ps.step_time + hidden, rel=1e-12)
    if pp == 1:
        assert hidden == pytest.approx(0.0, abs=1e-12)
    else:
        assert hidden > 0.0


@pytest.mark.parametrize("servers", [1, 4])
def test_async_ps_transfers_are_one_trainers_alone(servers):
    """alpha + max(n/B, n/(k B)) = alpha + n/B: the server's link carries one trainer's push, not dp of them."""
    r = run_study(_study("async-ps", servers))
    costs, graph, link = r.study.costs, r.sim.graph, r.study.cluster.inter
    collectives = [t for t in graph.tasks if t.stream is Stream.COLLECTIVE and t.action.kind is not Kind.OPTIM]
    assert collectives
    for t in collectives:
        n = costs.bucket_sizes(t.action.stage, 4)[t.action.bucket]
        assert r.sim.end[t.id] - r.sim.start[t.id] == pytest.approx(link.alpha + n / link.rate, rel=1e-12)
        assert link.alpha + n / link.rate == coll.ps_transfer(n, 1, servers, link, link)


def test_async_ps_predicts_a_shorter_step_than_ps_when_the_servers_are_the_bottleneck():
    runs = {mode: run_study(_study(mode, 1, "fair")) for mode in ("ps", "async-ps")}
    assert runs["async-ps"].step_time < runs["ps"].step_time
    assert runs["ps"].assumptions()[-1] == ("parameter servers: 1; a push or pull is every replica's at once, "
                                            "alpha + max(n / B, 4 n / (1 B)) (synchronous SGD); the servers update a "
                                            "stage once its pushes are in (the stages one at a time, the last first) "
                                            "and its pulls wait for that")
    assert runs["async-ps"].assumptions()[-1].startswith("parameter servers: 1; a push or pull is one trainer's alone")


def test_a_server_holds_its_share_of_every_stage():
    assert server_memory([1000, 3000], 2) == {"param_bytes": 8000.0, "grad_bytes": 8000.0, "optimizer_bytes": 16000.0,
                                              "gathered_param_bytes": 0.0, "peak_activation_bytes": 0.0}


BASE = ["--schedule", "1f1b", "--pp", "1", "--microbatches", "2", "--batch-size", "16"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--dp", "2", "--dp-mode", "ps"], "data-parallel sync: dp_mode ps needs parameter servers; give servers >= 1 (a "
     "placement with /pserver devices, e.g. '/pserver/CPU:0,/trainer/CPU:0-1') (flag --placement)"),
    (["--placement", "/trainer/CPU:0-1"], "placement '/trainer/CPU:0-1' has no parameter servers; add one, e.g. "
     "'/pserver/CPU:0,/trainer/CPU:0-1' (flag --placement)"),
    (["--placement", "/pserver/CPU:0,/trainer/CPU:0-2", "--pp", "2"], "placement '/pserver/CPU:0,/trainer/CPU:0-2' has "
     "3 trainer devices, not a multiple of pp 2 (each trainer replica is a pipeline of pp ranks); give e.g. "
     "'/trainer/CPU:0-3' (flag --placement)"),
    (["--placement", "/pserver/CPU:0,/trainer/GPU:0-1"], "placement '/pserver/CPU:0,/trainer/GPU:0-1': the "
     "parameter-server runtime runs CPU processes (gloo) only, not GPU; use /trainer/CPU and /pserver/CPU devices "
     "(flag --placement)"),
    (["--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--dp", "3"], "--dp 3 does not match placement "
     "'/pserver/CPU:0,/trainer/CPU:0-1': 2 trainers at pp 1 are dp 2; leave --dp out"),
    (["--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--dp-mode", "ddp"], "data-parallel sync: 1 parameter "
     "server(s) with dp_mode ddp; servers serve dp_mode ps or async-ps only (flag --placement)"),
    (["--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--staleness", "0"], "--staleness has no effect without "
     "--dp-mode async-ps (the other modes do not run ahead)"),
    (["--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--dp-mode", "async-ps", "--slow-rank", "3", "--slow-s", "1"],
     "run of '1f1b': slow_rank 3 is not a rank of the 3 processes; valid: 0..2 (flag --slow-rank)"),
    (["--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--dp-mode", "async-ps", "--slow-rank", "1"],
     "run of '1f1b': slow_rank and slow_s go together (a rank that sleeps slow_s > 0 seconds each step), got "
     "slow_rank 1 and slow_s 0.0 (flag --slow-rank)"),
    (["--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--nproc-per-node", "2"], "world size 2 (processes "
     "launched) does not equal pp x dp + servers = 1 x 2 + 1 = 3; launch 3 processes or change pp/dp"),
])
def test_bad_parameter_server_flags_are_one_line_and_exit_2(capsys, flags, message):
    from analysis.cli.train import launch_main

    with pytest.raises(SystemExit) as exc:
        launch_main([*BASE, *flags])  # a later --pp overrides BASE's
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == f"error: {message}\n"


@pytest.mark.parametrize("text, message", [
    ("{", "is not JSON"),
    ('{"losses": [1.0]}', 'holds no "ps_order" mapping of server rank to [[kind, trainer, stage, step], ...]'),
    ('{"ps_order": {"2": [[0, 1, 0]]}}', 'holds no "ps_order" mapping of server rank to [[kind, trainer, stage, '
                                         'step], ...]'),
])
def test_a_bad_ps_order_file_is_one_line_and_exit_2_before_any_process_starts(capsys, tmp_path, text, message):
    from analysis.cli.train import launch_main

    path = tmp_path / "order.json"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        launch_main([*BASE, "--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--dp-mode", "async-ps",
                     "--ps-order", str(path)])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (f"error: ps order file {str(path)!r}: {message}; give the --json output of an "
                                       "async-ps run (flag --ps-order)\n")


def test_a_ps_order_file_reads_back_what_a_run_s_json_holds(tmp_path):
    from real.dp.ps_async import ANSWER, FOLD, read_ps_order

    order = {2: [(FOLD, 0, 0, 0), (ANSWER, 0, 0, 1), (FOLD, 1, 0, 0)]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"losses": [3.4], "ps_order": {str(r): [list(e) for e in v] for r, v in order.items()}}))
    assert read_ps_order(str(path)) == order
