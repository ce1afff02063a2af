"""Collectives as NCCL runs them (sim.costs.nccl): each pick and its time from NCCL 2.30.7's tables by hand."""

from __future__ import annotations

import pytest

from common.errors import ClusterError
from schedules import Kind, build, lower
from schedules.dp.modes import add_data_parallel
from sim.costs.cluster import cluster_preset
from sim.costs.nccl import nccl_choice
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts

H100 = cluster_preset("dgx-h100:2")
A100 = cluster_preset("dgx-a100:2")
NVL4, NDR = 370e9, 47e9  # the achieved rates of sim.costs.cluster: NVLink 4, NDR 400 Gb/s per GPU


def _pick(op, n, ranks, nodes, cluster=H100, **kw):
    c = nccl_choice(op, float(n), ranks, nodes, cluster.intra, cluster.inter, nvls=cluster.nvls,
                    arch="ampere" if cluster is A100 else "hopper", **kw)
    return c.algorithm, c.protocol, c.time, c.latency


def test_a_small_allreduce_in_a_node_runs_the_ll_ring():
    # LL ring: base 6.6 us + 14 NVLink steps of 0.6 us; bandwidth half the bus rate, capped at Hopper's LL 141 GB/s,
    # times p / steps = 8 / 14
    assert _pick("allreduce", 1000, 8, 1) == ("ring", "LL", pytest.approx(15.0e-6 + 1000 / (141e9 * 8 / 14)),
                                              pytest.approx(15.0e-6))


def test_a_large_allreduce_in_an_h100_node_runs_nvls_and_not_on_an_a100():
    n = 50e6
    # NVLS: its 25 us hop alone; 480 GB/s bus bandwidth on 8 GPUs (the measured figure), times 8 / 14
    assert _pick("allreduce", n, 8, 1) == ("nvls", "Simple", pytest.approx(25e-6 + n / (480e9 * 8 / 14)),
                                           pytest.approx(25e-6))
    # A100 (no NVLink SHARP): the Simple ring, 8.4 us + 14 x 3.4 us, at NVLink 3's 240 GB/s
    assert _pick("allreduce", n, 8, 1, A100) == ("ring", "Simple", pytest.approx(56.0e-6 + 2 * 7 / 8 * n / 240e9),
                                                 pytest.approx(56.0e-6))


def test_one_gpu_per_node_gathers_by_pat_and_reduces_by_tree():
    # 128 ranks on 128 nodes (tp 8 fills each node): PAT's latency 8 + log2(128) x 14 / 3.5 + 128 x 2.8 us at
    # 0.75 of the NIC's rate; the LL ring would pay 6.6 + 127 x 5.0 us (the tree's network hop at ppn 1)
    n = 1e6
    pat = (8 + 7 * 14 / 3.5 + 128 * 2.8) * 1e-6
    for op in ("reduce_scatter", "all_gather"):
        assert _pick(op, n, 128, 128) == ("pat", "Simple", pytest.approx(pat + n / (0.75 * NDR)), pytest.approx(pat))
    ring = (6.6 + 127 * 5.0) * 1e-6
    assert _pick("reduce_scatter", n, 128, 128, algorithm="ring")[3] == pytest.approx(ring)
    # all-reduce: the LL128 tree, 14 + 2 x 7 x 8.5 us; bandwidth 0.92 x 120/128 of the NIC, halved, and NCCL's
    # tree correction 0.6 at 1 MB (log2(1e6 / 64) = 13)
    tree = (14 + 2 * 7 * 8.5) * 1e-6
    assert _pick("allreduce", n, 128, 128) == (
        "tree", "LL128", pytest.approx(tree + n / (0.5 * 0.92 * NDR * 120 / 128 * 0.6)), pytest.approx(tree))


def test_a_large_multi_node_allreduce_runs_the_simple_ring_with_its_plateau():
    # 16 ranks on 2 nodes: 30 steps, 2 of them across nodes; intra hop max(3.4, 3 x 1 us net overhead);
    # x1.4 (NCCL's plateau effect of ring); bus bandwidth min(NVLink, 8 NICs) = 370 GB/s, times 16 / 30
    n = 800e6
    lat = (8.4 + 28 * 3.4 + 2 * 14.0) * 1.4e-6
    assert _pick("allreduce", n, 16, 2) == ("ring", "Simple", pytest.approx(lat + n * 30 / 16 / NVL4),
                                            pytest.approx(lat))


def test_a_forced_algorithm_holds_where_the_operation_has_it():
    n = 1e6
    assert _pick("allreduce", n, 128, 128, algorithm="ring")[:2] == ("ring", "LL")
    assert _pick("reduce_scatter", n, 128, 128, algorithm="tree")[0] == "pat"  # no tree reduce-scatter in NCCL
    assert _pick("allreduce", 50e6, 8, 1, algorithm="tree")[0] == "tree"


def test_dp_collectives_and_their_latency_are_nccls_pick():
    model = model_preset("gpt-6.2b")
    c = TransformerCosts(model=model, cluster=H100, parallel=ParallelConfig(pp=1, dp=16, dp_mode="zero1"))
    graph = add_data_parallel(lower(build("1f1b", pp=1, microbatches=2)), "zero1", c.buckets(1))
    dur = c.durations(graph)
    net = c.network(graph, dur)
    group = c.group(0)
    assert (group.size, group.nodes, group.per_node, group.algorithm, group.uses) == (16, 2, 8, "nccl",
                                                                                     ("intra", "inter"))
    for t in graph.tasks:
        if t.action.kind in (Kind.REDUCE_SCATTER, Kind.ALL_GATHER):
            op = "reduce_scatter" if t.action.kind is Kind.REDUCE_SCATTER else "all_gather"
            n = c.collective_bytes(t.action.kind, 0, 1, t.action.bucket)
            assert dur[t.id] == _pick(op, n, 16, 2)[2] and net.latency[t.id] == _pick(op, n, 16, 2)[3]
    # the alpha-beta formulas stay with collective 'hierarchical', and on gloo (CPU) clusters
    assert TransformerCosts(model=model, cluster=H100, parallel=ParallelConfig(
        pp=1, dp=16, dp_mode="zero1", collective="hierarchical")).group(0).algorithm == "hierarchical"
    cpu = cluster_preset("cpu-host:2")
    assert cpu.backend == "gloo" and ParallelConfig(pp=1, dp=4).group(cpu, 0).algorithm == "hierarchical"


def test_nccl_only_algorithms_are_refused_where_nccl_cannot_run_them():
    with pytest.raises(ClusterError, match=r"^collective 'nvls' needs NVLink SHARP switches .* cluster 'dgx-a100:2' "
                                           r"has none: use auto, ring or tree$"):
        ParallelConfig(pp=1, dp=16, collective="nvls").check_fits(A100)
    with pytest.raises(ClusterError, match=r"^collective 'pat' is an NCCL algorithm; cluster 'cpu-host:2' runs gloo"):
        ParallelConfig(pp=1, dp=4, collective="pat").check_fits(cluster_preset("cpu-host:2"))
