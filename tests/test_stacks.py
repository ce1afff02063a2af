"""The training stacks (sim.costs.stacks): blocking sends, the host's launches and syncs, the optimizer's fixed part."""

from __future__ import annotations

import dataclasses

import pytest

from common.errors import ConfigError
from schedules import Kind, Stream, build, lower
from sim.costs.cluster import cluster_preset
from sim.costs.devices import DEVICE_MODELS
from sim.costs.nccl import nccl_choice
from sim.costs.parallel import ParallelConfig
from sim.costs.stacks import LAUNCH_S, block_sends, blocking_p2p
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.study import Study, build_graph, run_study

H100 = cluster_preset("dgx-h100:1")
GPT6 = model_preset("gpt-6.2b")


def _costs(stack="none", model=GPT6, **parallel):
    par = {"pp": 2, **parallel}
    return TransformerCosts(model=model, cluster=H100, contention=0, stack=stack, parallel=ParallelConfig(**par))


def _task(graph, rank, kind, mb):
    return next(t for t in graph.tasks if t.rank == rank and t.action.kind is kind and t.action.microbatch == mb)


def test_blocking_sends_hold_the_senders_next_pass():
    graph = lower(build("1f1b", pp=2, microbatches=2))
    blocked = block_sends(graph)
    f1, send0 = _task(blocked, 0, Kind.F, 1), _task(blocked, 0, Kind.SEND_F, 0)
    assert send0.id in f1.deps and send0.id not in _task(graph, 0, Kind.F, 1).deps
    # every other dependency is kept: only SEND -> next compute edges are added, one per send followed by a pass
    added = sum(len(b.deps) - len(a.deps) for a, b in zip(graph.tasks, blocked.tasks, strict=True))
    sends = [i for prog in graph.programs for k, i in enumerate(prog) if graph.tasks[i].stream is Stream.SEND
             and any(graph.tasks[j].action.is_compute for j in prog[k + 1:])]
    assert added == len(sends) > 0
    # rank 0's F1 starts when its send of microbatch 0 is done, plus one launch after the synchronize (stack
    # megatron, no virtual stages); without a stack right after F0
    for stack, start in (("none", lambda s: s.end[_task(s.graph, 0, Kind.F, 0).id]),
                         ("megatron", lambda s: s.end[_task(s.graph, 0, Kind.SEND_F, 0).id] + LAUNCH_S)):
        res = run_study(Study(schedule="1f1b", microbatches=2, costs=_costs(stack)))
        assert res.sim.start[_task(res.sim.graph, 0, Kind.F, 1).id] == pytest.approx(start(res.sim), rel=1e-12)
    end_none = run_study(Study(schedule="1f1b", microbatches=2, costs=_costs("none"))).step_time
    assert run_study(Study(schedule="1f1b", microbatches=2, costs=_costs("megatron"))).step_time > end_none


def test_which_stacks_block_on_which_schedules():
    plain = lower(build("1f1b", pp=2, microbatches=4))
    interleaved = lower(build("interleaved-1f1b", pp=2, microbatches=4, chunks=2))
    assert [blocking_p2p(s, plain) for s in ("none", "megatron", "megatron-legacy", "deepspeed", "torchtitan")] \
        == [False, True, True, True, False]
    # Megatron-LM overlaps p2p with virtual stages (overlap_p2p_comm on by default since May 2023); not before
    assert [blocking_p2p(s, interleaved) for s in ("megatron", "megatron-legacy")] == [False, True]
    study = Study(schedule="interleaved-1f1b", microbatches=4, chunks=2, costs=_costs("megatron"))
    assert build_graph(study).tasks == build_graph(dataclasses.replace(study, costs=_costs("none"))).tasks


def test_a_pass_lasts_at_least_its_launches():
    tiny = model_preset("gpt-tiny")
    # the H100's GEMM curve gives every GEMM at least half_flops / (peak_fraction x peak) (31 us): longer than a
    # launch, so a pass is never host-bound on it; a device whose small GEMMs are fast (half_flops 1e6) is
    device = DEVICE_MODELS["H100"]
    fast = dataclasses.replace(device, gemm=dataclasses.replace(device.gemm, half_flops=1e6))
    eager = dataclasses.replace(_costs("torchtitan", model=tiny), device_model=fast)
    ops = eager.layer_costs().ops
    n, weights, layers = len(ops), sum(op.weight for op in ops), eager.stage_layers(2)[1]
    assert eager.host_time(Kind.F, layers) == pytest.approx(LAUNCH_S * layers * n)
    assert eager.host_time(Kind.W, layers) == pytest.approx(LAUNCH_S * layers * weights)
    assert eager.host_time(Kind.B, layers) == pytest.approx(LAUNCH_S * layers * (n + weights))
    gpu = dataclasses.replace(eager, stack="none").pass_time(Kind.F, 0, 2)
    assert gpu < eager.host_time(Kind.F, layers)  # gpt-tiny's kernels are shorter than their launches
    assert eager.pass_time(Kind.F, 0, 2) == eager.host_time(Kind.F, layers)
    # on the H100's own curve, and for a 6.2B layer, the launches hide under the kernels: the stack changes nothing
    for model in (tiny, GPT6):
        assert _costs("torchtitan", model=model).pass_time(Kind.F, 1, 2) == _costs("none", model=model).pass_time(
            Kind.F, 1, 2)


def test_the_optimizer_waits_for_the_global_gradient_norm():
    # pp 2 x tp 2 on one node: an all-reduce of one fp32 value over 4 GPUs, NCCL's LL ring (6.6 us + 6 steps of
    # 0.6 us, at 141 GB/s x 4/6), then the host's synchronize: one launch
    c = _costs("megatron", tp=2, dp=2, dp_mode="zero1")
    norm = (6.6 + 6 * 0.6) * 1e-6 + 4 / (141e9 * 4 / 6)
    assert nccl_choice("allreduce", 4.0, 4, 1, H100.intra, H100.inter, nvls=True).time == pytest.approx(norm)
    assert c.optimizer_fixed(0, 2) == pytest.approx(norm + LAUNCH_S)
    post = dataclasses.replace(c, post_validation=True)
    assert post.optimizer_fixed(0, 2) == 0.0
    assert c.optim_time(0, 2) - post.optim_time(0, 2) == pytest.approx(norm + LAUNCH_S)
    assert _costs("deepspeed", tp=2, dp=2, dp_mode="zero1").optimizer_fixed(0, 2) == 0.0  # no clipping by default


def test_legacy_megatron_gathers_the_received_tensor_over_the_tp_group():
    c = _costs("megatron-legacy", tp=2)
    n = 2 * GPT6.seq_len * GPT6.hidden  # 2sbh, b = 1
    assert c.p2p_gather_time() == nccl_choice("all_gather", float(n), 2, 1, H100.intra, H100.inter, nvls=True).time
    assert _costs("megatron-legacy", tp=2, sp=True).p2p_gather_time() == 0.0  # SP: the tensor is already a shard
    graph = build_graph(Study(schedule="1f1b", microbatches=2, costs=c))
    net = c.network(graph, c.durations(graph))
    after_recv, after_send = _task(graph, 1, Kind.F, 0), _task(graph, 0, Kind.F, 1)
    assert net.lag[after_recv.id] == pytest.approx(LAUNCH_S + c.p2p_gather_time())
    assert net.lag[after_send.id] == pytest.approx(LAUNCH_S)


def test_bad_stacks_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^costs: unknown stack 'nemo'; valid: none, megatron, megatron-legacy, "
                                          r"deepspeed, torchtitan$"):
        _costs("nemo")
    with pytest.raises(ConfigError, match=r"^costs: post_validation removes .* stack 'none' does not have"):
        dataclasses.replace(_costs(), post_validation=True)


def test_fsdp2_copies_delay_the_pass_after_an_all_gather_and_each_reduce_scatter():
    # torchtitan (FSDP2): per bucket of n 16-bit bytes, the copy-out reads and writes n (2n / HBM bandwidth); the
    # copy-in reads n and writes n/2 elements in fp32 (n/2 x (2 + 4) bytes)
    def costs(stack):
        return TransformerCosts(model=GPT6, cluster=H100, contention=0, stack=stack, reduce_dtype="fp32",
                                parallel=ParallelConfig(pp=1, dp=8, dp_mode="fsdp"))
    c = costs("torchtitan")
    n, bw = c.bucket_size(0, 1, 0), H100.spec.memory_bw
    assert c.fsdp_copy_out(0, 1, 0) == pytest.approx(2 * n / bw)
    assert c.fsdp_copy_in(0, 1, 0) == pytest.approx(n / 2 * 6 / bw)
    graph = build_graph(Study(schedule="1f1b", microbatches=1, costs=c))
    dur = c.durations(graph)
    with_copies, without = c.network(graph, dur).lag, costs("none").network(graph, dur).lag
    for t in graph.tasks:
        a = t.action
        want = 0.0
        if a.kind is Kind.REDUCE_SCATTER:
            want = c.fsdp_copy_in(a.stage, 1, a.bucket)
        elif a.is_compute:
            want = sum(c.fsdp_copy_out(0, 1, graph.tasks[d].action.bucket) for d in t.deps
                       if graph.tasks[d].action.kind is Kind.ALL_GATHER)
        assert with_copies[t.id] - without[t.id] == pytest.approx(want, abs=1e-15)
    assert sum(with_copies) > sum(without)
