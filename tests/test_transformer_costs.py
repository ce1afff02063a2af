"""The real-units cost model: FLOPs, durations, uneven stages, collective formulas, link contention, overflow."""

from __future__ import annotations

import dataclasses
import math

import pytest

from analysis.cli.simulate import main
from schedules import Kind, Stream, build, lower
from schedules.dp.modes import add_data_parallel
from sim import simulate
from sim.costs import collectives as coll
from sim.costs.cluster import Link, cluster_preset
from sim.costs.nccl import nccl_choice
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset, partition_layers
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.study import Study, run_study

H100 = cluster_preset("dgx-h100:2")
GPT6 = model_preset("gpt-6.2b")


def _costs(pp=8, dp=1, mode="none", cluster=H100, **kw) -> TransformerCosts:
    """The constant-efficiency model (0.6 of peak, matmuls only) whose arithmetic these tests check by hand; the
    H100's device model (sim.costs.devices) is tested in tests/test_devices.py."""
    kw.setdefault("efficiency", 0.6)
    return TransformerCosts(model=GPT6, cluster=cluster, parallel=ParallelConfig(pp=pp, dp=dp, dp_mode=mode), **kw)


def test_flops_of_a_preset_equal_hand_computed_values():
    h, f, s, v = 4096, 16384, 1024, 51200
    assert GPT6.layer_flops("F") == 8 * h * h + 4 * h * f + 4 * s * h == 419_430_400
    assert GPT6.layer_flops("I") == 436_207_616 and GPT6.layer_flops("W") == 402_653_184
    assert GPT6.model_flops_per_token() == 30 * 1_258_291_200 + 6 * h * v == 39_007_027_200
    layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h  # attention, MLP (weights + biases), 2 layer norms
    assert GPT6.params == 30 * layer + v * h + s * h + 2 * h == 6_255_312_896


def test_uneven_partition_and_per_stage_durations():
    assert partition_layers(30, 8) == (4, 4, 4, 4, 4, 4, 3, 3)
    assert partition_layers(30, 16) == (2,) * 14 + (1, 1)
    c = _costs()
    rate = 989e12 * 0.6
    assert c.pass_flops(Kind.F, 0, 8) == 4 * 419_430_400 * 1024
    assert c.pass_flops(Kind.F, 7, 8) == (3 * 419_430_400 + 2 * 4096 * 51200) * 1024
    graph = lower(build("1f1b", pp=8, microbatches=8))
    dur = c.durations(graph)
    f0 = next(t for t in graph.tasks if str(t.action) == "0F0")
    b7 = next(t for t in graph.tasks if str(t.action) == "7B0")
    assert dur[f0.id] == c.pass_flops(Kind.F, 0, 8) / rate
    assert dur[b7.id] == (c.pass_flops(Kind.I, 7, 8) + c.pass_flops(Kind.W, 7, 8)) / rate


def test_v_placement_costs_each_stage_by_its_own_layers():
    graph = lower(build("zb-v", pp=8, microbatches=16, chunks=2))
    c = _costs()
    dur = c.durations(graph)
    by = {str(t.action): dur[t.id] for t in graph.tasks}
    rate = 989e12 * 0.6
    assert graph.schedule.stage_to_rank[0] == graph.schedule.stage_to_rank[15] == 0
    assert by["0F0"] == 2 * 419_430_400 * 1024 / rate  # stage 0: 2 layers
    assert by["15F0"] == (419_430_400 + 2 * 4096 * 51200) * 1024 / rate  # stage 15: 1 layer + LM head


def test_collective_formulas():
    link = Link(alpha=1e-5, bandwidth=1e10)
    n = 1e8
    assert coll.ring_allreduce(n, 4, link) == 2 * 3 * 1e-5 + 2 * 3 / 4 * n / 1e10
    assert coll.ring_gather(n, 4, link) == 3 * 1e-5 + 3 / 4 * n / 1e10
    assert coll.tree_allreduce(n, 5, link) == 2 * 3 * 1e-5 + 2 * n / 1e10
    inter = Link(alpha=2e-5, bandwidth=1e9)
    assert coll.hierarchical_allreduce(n, 8, 2, link, inter) == pytest.approx(
        2 * (7e-5 + 7 / 8 * n / 1e10) + 2 * 2e-5 + (n / 8) / 1e9, rel=1e-12)
    assert coll.ps_transfer(n, 4, 1, inter, inter) == 2e-5 + 4 * n / 1e9
    assert coll.ps_transfer(n, 4, 8, inter, inter) == 2e-5 + n / 1e9
    assert coll.ring_allreduce(n, 1, link) == 0.0


def test_dp_collective_task_costs_equal_their_formula():
    # dp-inner: the dp pair of each stage is on one node -> NVLink; pp-inner -> over the NICs (two nodes). NCCL picks
    # the algorithm per bucket (sim.costs.nccl); the alpha-beta ring stays with collective 'hierarchical'
    for order, nodes in (("dp-inner", 1), ("pp-inner", 2)):
        c = TransformerCosts(model=GPT6, cluster=H100, parallel=ParallelConfig(pp=8, dp=2, dp_mode="ddp", order=order))
        graph = add_data_parallel(lower(build("1f1b", pp=8, microbatches=8)), "ddp", c.buckets(8))
        dur = c.durations(graph)
        ar = [t for t in graph.tasks if t.action.kind is Kind.ALLREDUCE and t.rank == 3]
        sizes = c.bucket_sizes(3, 8)
        assert len(ar) == len(sizes) == math.ceil(2 * c.stage_params(3, 8) / 2**20 / 25)
        assert [dur[t.id] for t in ar] == [nccl_choice("allreduce", n, 2, nodes, H100.intra, H100.inter,
                                                       nvls=True).time for n in sizes]
    for order, link in (("dp-inner", H100.intra), ("pp-inner", H100.inter)):
        c = TransformerCosts(model=GPT6, cluster=H100, parallel=ParallelConfig(pp=8, dp=2, dp_mode="ddp", order=order,
                                                                               collective="hierarchical"))
        graph = add_data_parallel(lower(build("1f1b", pp=8, microbatches=8)), "ddp", c.buckets(8))
        dur = c.durations(graph)
        ar = [t for t in graph.tasks if t.action.kind is Kind.ALLREDUCE and t.rank == 3]
        assert [dur[t.id] for t in ar] == [coll.ring_allreduce(n, 2, link) for n in c.bucket_sizes(3, 8)]


def test_pipeline_send_across_nodes_uses_the_nic():
    c = _costs(dp=2)
    graph = lower(build("1f1b", pp=8, microbatches=2))
    sends = {str(t.action): t for t in graph.tasks if t.stream is Stream.SEND}
    n = 2 * 1024 * 4096
    # at NCCL's achieved rates (sim.costs.cluster): 47 of NDR's 50 GB/s, 370 of NVLink 4's 450
    assert c.duration(sends["3SEND_F0"], graph) == 5e-6 + n / (50e9 * (47 / 50))  # rank 3 node0 -> rank 4 node1
    assert c.duration(sends["0SEND_F0"], graph) == 3e-6 + n / (450e9 * (370 / 450))


@pytest.mark.parametrize("link_model", ["fcfs", "fair"])
def test_two_concurrent_transfers_on_one_link_take_longer_than_one(link_model):
    c = TransformerCosts(model=GPT6, cluster=H100,
                         parallel=ParallelConfig(pp=8, dp=2, dp_mode="sync", link_model=link_model))
    graph = add_data_parallel(lower(build("1f1b", pp=8, microbatches=2)), "sync", c.buckets(8))
    res = simulate(graph, c)
    a, b = [t.id for t in graph.tasks if t.action.kind is Kind.ALLREDUCE and t.rank == 0][:2]
    dur = c.durations(graph)
    one = dur[a]
    assert one > 0 and dur[b] == one
    # released together; the second waits for the first: its port (fcfs), its communicator (fair)
    assert res.end[a] - res.start[a] == pytest.approx(one, rel=1e-12)
    assert res.start[b] == res.end[a]
    assert res.end[b] - res.start[a] == pytest.approx(2 * one)

    class NoContention(TransformerCosts):
        __slots__ = ()

        def network(self, graph, dur):
            net = TransformerCosts.network(self, graph, dur)
            return dataclasses.replace(net, links=[()] * len(net.links), queue=None)

    free = simulate(graph, NoContention(model=GPT6, cluster=H100, parallel=c.parallel, efficiency=0.6))
    assert free.start[a] == free.start[b] and free.end[b] - free.start[a] == pytest.approx(one)
    assert res.makespan > free.makespan


def test_too_large_model_is_flagged_with_the_device(capsys):
    big = Study(schedule="1f1b", microbatches=4, costs=TransformerCosts(
        model=model_preset("gpt-28.3b"), cluster=cluster_preset("dgx-h100:1"), parallel=ParallelConfig(pp=2)))
    devices = run_study(big).devices()
    assert all(d.overflow for d in devices) and devices[0].device == "node0/trainer/GPU:0"
    assert devices[0].model_state_bytes > 80e9
    assert main(["--model", "gpt-28.3b", "--cluster", "dgx-h100:1", "--pp", "2", "--schedule", "1f1b",
                 "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    assert "node0/trainer/GPU:0" in out and "OVERFLOW" in out and "assumptions:" in out


def test_result_figures_are_consistent():
    s = Study(schedule="1f1b", microbatches=16,
              costs=TransformerCosts(model=GPT6, cluster=H100, parallel=ParallelConfig(pp=8, dp=2, dp_mode="ddp")))
    r = run_study(s)
    d = r.to_dict()
    assert d["tokens_per_step"] == 16 * 1024 * 2
    assert d["tokens_per_s"] == d["tokens_per_step"] / d["step_time"]
    assert d["mfu"] == GPT6.model_flops_per_token() * d["tokens_per_step"] / (16 * 989e12 * d["step_time"])
    assert 0 < d["mfu"] < 0.6  # below the assumed matmul efficiency: bubble and communication
    assert [x["rank"] for x in d["devices"]] == list(range(8))


def test_compare_in_real_units(capsys):
    from analysis.cli.compare import compare_main

    assert compare_main(["--model", "gpt-6.2b", "--cluster", "dgx-h100:2", "--pp", "8", "--dp", "2", "--dp-mode", "ddp",
                         "--microbatches", "16", "--schedules", "1f1b,zb-h1,interleaved-1f1b"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {ln.split()[0]: float(ln.split()[1]) for ln in lines if ln.split() and ln.split()[0] in ("1f1b", "zb-h1", "interleaved-1f1b")}
    assert set(rows) == {"1f1b", "zb-h1", "interleaved-1f1b"} and rows["zb-h1"] < rows["1f1b"]
