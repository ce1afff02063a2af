"""Tensor and sequence parallelism, activation recomputation and the GPU operation model, on hand-computed cases."""

from __future__ import annotations

import json
import math
import re

import pytest

from schedules import ConfigError, Kind
from sim.costs import collectives as coll
from sim.costs.cluster import cluster_preset
from sim.costs.devices import DEVICE_MODELS
from sim.costs.gpu_model import GemmEfficiency, Op, layer_ops
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.study import Study, load_study, run_study

GPT175 = model_preset("gpt3-175b")
M22 = model_preset("megatron-22b")


def _costs(model=GPT175, *, pp=8, tp=8, sp=False, recompute="none", b=1, efficiency=None, cluster="dgx-a100:8"):
    return TransformerCosts(model=model, cluster=cluster_preset(cluster), parallel=ParallelConfig(pp=pp, tp=tp, sp=sp),
                            microbatch_size=b, recompute=recompute, efficiency=efficiency)


def test_presets_follow_korthikanti_table_3():
    shapes = {n: (m.layers, m.hidden, m.heads, m.seq_len, m.vocab) for n, m in (
        (n, model_preset(n)) for n in ("megatron-22b", "gpt3-175b", "mt-nlg-530b", "megatron-1t"))}
    assert shapes == {"megatron-22b": (48, 6144, 64, 2048, 51200), "gpt3-175b": (96, 12288, 96, 2048, 51200),
                      "mt-nlg-530b": (105, 20480, 128, 2048, 51200), "megatron-1t": (128, 25600, 160, 2048, 51200)}
    assert round(GPT175.params / 1e9, 1) == 174.6
    llama = model_preset("llama3-405b")
    assert (llama.layers, llama.hidden, llama.heads, llama.kv_heads, llama.ffn) == (126, 16384, 128, 8, 53248)
    assert 400e9 < llama.params < 410e9


def test_tp_bytes_and_collectives_per_layer():
    """Two all-reduces of 2sbh bytes per layer in F and in I; with SP each is a reduce-scatter + all-gather."""
    c = _costs()
    n = 2 * 2048 * 1 * 12288
    assert c.tp_bytes() == n == 50_331_648
    nvlink = c.cluster.intra  # 300 GB/s per direction, of which NCCL moves 80% (sim/costs/cluster.py), 3 us
    ring = 2 * 7 * 3e-6 + 2 * 7 / 8 * n / (300e9 * 0.8)  # the alpha-beta ring (gloo's; collective 'hierarchical')
    assert coll.ring_allreduce(n, 8, nvlink) == pytest.approx(ring)
    assert ring == pytest.approx(4.090e-4, rel=1e-3)
    # NCCL's pick for 50 MB on 8 A100s (sim.costs.nccl): the ring, Simple protocol, its latency NCCL's base 8.4 us
    # plus 3.4 us per NVLink step (14 steps for an all-reduce, 7 for a reduce-scatter or an all-gather)
    ar = (8.4 + 14 * 3.4) * 1e-6 + 2 * 7 / 8 * n / (300e9 * 0.8)
    assert ar == pytest.approx(ring + (8.4 + 14 * 0.4) * 1e-6)
    # stage 1 of 8 (12 layers, neither embedding nor head): 2 per layer in F and I, none in W
    assert c.tp_comm(Kind.F, 1, 8) == pytest.approx(12 * 2 * ar)
    assert c.tp_comm(Kind.I, 1, 8) == pytest.approx(12 * 2 * ar)
    assert c.tp_comm(Kind.W, 1, 8) == 0.0
    # stage 0 adds the embedding's all-reduce, the last stage the LM head's input gradient
    assert c.tp_comm(Kind.F, 0, 8) == pytest.approx(25 * ar)
    assert c.tp_comm(Kind.I, 7, 8) == pytest.approx(25 * ar)
    # full recomputation repeats the forward's two in the backward
    assert _costs(recompute="full").tp_comm(Kind.I, 1, 8) == pytest.approx(12 * 4 * ar)
    # SP: reduce-scatter + all-gather move what one all-reduce moves; the backward gathers the inputs of
    # QKV and fc1 again (two more all-gathers = one more pair per layer)
    pair = 2 * ((8.4 + 7 * 3.4) * 1e-6 + 7 / 8 * n / (300e9 * 0.8))
    assert pair == pytest.approx(ar + 8.4e-6)  # the same bytes, one base latency more
    sp = _costs(sp=True, recompute="selective")
    assert sp.tp_comm(Kind.F, 1, 8) == pytest.approx(12 * 2 * pair)
    assert sp.tp_comm(Kind.I, 1, 8) == pytest.approx(12 * 3 * pair)
    assert _costs(tp=1, cluster="dgx-a100:1").tp_comm(Kind.F, 1, 8) == 0.0


@pytest.mark.parametrize(("tp", "sp", "recompute", "per_sbh"), [
    (1, False, "none", 34 + 5 * 64 * 2048 / 6144),       # eq. 1: sbh(34 + 5as/h)
    (8, False, "none", 10 + 24 / 8 + 5 * 64 * 2048 / (6144 * 8)),  # TP: sbh(10 + 24/t + 5as/(ht))
    (8, True, "none", 34 / 8 + 5 * 64 * 2048 / (6144 * 8)),        # TP + SP: sbh(34/t + 5as/(ht))
    (8, False, "selective", 10 + 24 / 8),                          # TP + selective: sbh(10 + 24/t)
    (8, True, "selective", 34 / 8),                                # TP + SP + selective: sbh(34/t)
    (8, False, "full", 2),                                         # full: the layer input, 2sbh
    (8, True, "full", 2 / 8),                                      # full + SP: the input is split, 2sbh/t
])
def test_korthikanti_activation_memory_per_layer(tp, sp, recompute, per_sbh):
    sbh = 2048 * 4 * 6144
    assert M22.layer_activation_bytes(4, tp, sp, recompute) == pytest.approx(sbh * per_sbh)


def test_twenty_two_b_by_hand():
    """22B, t = 8, b = 4: 5as/(ht) = 13.33, so the TP baseline is sbh x 26.33 per layer, 48 layers."""
    sbh = 2048 * 4 * 6144
    assert M22.layer_activation_bytes(4, 8) == pytest.approx(sbh * (13 + 40 / 3))
    assert 48 * M22.layer_activation_bytes(4, 8) / 2**30 == pytest.approx(59.25, rel=0.01)  # Figure 1
    assert 48 * M22.layer_activation_bytes(4, 8, True, "selective") / 2**30 == pytest.approx(9.5625, rel=0.01)


def test_recomputed_flops():
    """full: the layer's forward again in I; selective: the attention core's two matmuls, 4sh per token."""
    s, h = 2048, 12288
    fwd = 24 * h * h + 4 * s * h
    assert GPT175.layer_flops("F") == fwd
    assert GPT175.recompute_flops("full") == fwd
    assert GPT175.recompute_flops("selective") == 4 * s * h
    assert GPT175.recompute_flops("none") == 0
    base = _costs().pass_flops(Kind.I, 1, 8)
    assert _costs(recompute="full").pass_flops(Kind.I, 1, 8) - base == pytest.approx(12 * fwd * s / 8)
    assert _costs(recompute="selective").pass_flops(Kind.I, 1, 8) - base == pytest.approx(12 * 4 * s * h * s / 8)
    assert _costs(recompute="full").pass_flops(Kind.W, 1, 8) == _costs().pass_flops(Kind.W, 1, 8)


def test_gemm_efficiency_and_roofline():
    e = GemmEfficiency(peak_fraction=0.8, half_flops=1e10)
    assert e(1e10) == pytest.approx(0.4) and e(1e14) == pytest.approx(0.8, rel=1e-3)
    spec = cluster_preset("dgx-a100").spec
    big = Op("gemm", 2e12, 1e6, True)  # compute-bound: FLOPs / (peak x e)
    assert big.time(spec, e) == pytest.approx(2e12 / (312e12 * e(2e12)))
    thin = Op("gemm", 1e9, 4e9, True)  # memory-bound: bytes / HBM bandwidth
    assert thin.time(spec, e) == pytest.approx(4e9 / 2.039e12)
    norm = Op("layernorm", 0.0, 1e8, False)
    assert norm.time(spec, e) == pytest.approx(1e8 / 2.039e12)


def test_layer_ops_shapes():
    ops = {op.name: op for op in layer_ops(hidden=12288, heads=96, kv_hidden=12288, ffn=4 * 12288, gated=False,
                                           seq_len=2048, b=1, tp=8, sp=False)}
    h, s, t = 12288, 2048, 8
    assert ops["qkv"].flops == 2 * s * h * 3 * h / t
    assert ops["scores"].flops == ops["context"].flops == 2 * (96 / t) * s * 128 * s
    assert sum(o.flops for o in ops.values()) == pytest.approx(GPT175.layer_flops("F") * s / t)  # Narayanan's count
    assert ops["layernorm1"].bytes == 4 * s * h  # replicated without SP ...
    sp_ops = {op.name: op for op in layer_ops(hidden=12288, heads=96, kv_hidden=12288, ffn=4 * 12288, gated=False,
                                              seq_len=2048, b=1, tp=8, sp=True)}
    assert sp_ops["layernorm1"].bytes == 4 * s * h / t  # ... divided by t with it
    assert sp_ops["softmax"].bytes == ops["softmax"].bytes == 4 * (96 / t) * s * s


def test_override_keeps_the_constant_model():
    """A number for efficiency: FLOPs / (peak x efficiency), plus the TP collectives."""
    c = _costs(efficiency=0.5, recompute="selective")
    assert c.gemm_efficiency is None
    expect = c.pass_flops(Kind.I, 1, 8) / (312e12 * 0.5) + c.tp_comm(Kind.I, 1, 8)
    assert c.pass_time(Kind.I, 1, 8) == pytest.approx(expect)
    h100 = TransformerCosts(model=model_preset("gpt-6.2b"), cluster=cluster_preset("dgx-h100:2"),
                            parallel=ParallelConfig(pp=8))
    assert h100.gemm_efficiency is DEVICE_MODELS["H100"].gemm  # H100 has a device model now (sim.costs.devices)
    cpu = TransformerCosts(model=model_preset("gpt-tiny"), cluster=cluster_preset("cpu-host"),
                           parallel=ParallelConfig(pp=2))
    assert cpu.gemm_efficiency is None and cpu.matmul_efficiency == 0.6  # no device model: the stated constant
    assert _costs().gemm_efficiency is DEVICE_MODELS["A100"].gemm


def test_recompute_and_sp_are_checked_fields():
    with pytest.raises(Exception, match=re.escape("unknown recompute 'some'; valid: none, selective, full, selective-op, layer:N")) as err:
        _costs(recompute="some")
    assert err.value.field == "recompute"
    with pytest.raises(Exception, match="sp must be true or false"):
        ParallelConfig(pp=1, sp="yes")


def test_seq_len_overrides_a_preset():
    s = load_study(None, {"model": {"preset": "gpt3-175b", "seq_len": 4096}, "cluster": {"preset": "dgx-a100:8"},
                          "parallel": {"pp": 8, "tp": 8}, "run": {"schedule": "1f1b", "microbatches": 8}})
    assert s.model.seq_len == 4096 and s.model.layers == 96


def test_the_issue_command_prints_step_time_mfu_hfu(capsys):
    from analysis.cli.simulate import main

    argv = ("--model gpt3-175b --cluster dgx-a100:8 --tp 8 --pp 8 --dp 1 --schedule interleaved-1f1b --chunks 3 "
            "--microbatches 64 --microbatch-size 1 --seq-len 2048 --recompute selective --sp --json").split()
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"step_time", "mfu", "hfu", "devices"} <= set(d)
    assert d["hfu"] > d["mfu"] and d["hfu"] / d["mfu"] == pytest.approx(1 + 4 * 2048 * 12288 * 96 / (
        GPT175.model_flops_per_token()))
    assert abs(d["step_time"] / 13.75 - 1) < 0.10  # Korthikanti et al. 2022, Table 5
    assert d["devices"][0]["activation_bytes"] / 2**30 == pytest.approx(12.3515625, rel=0.05)  # Figure 1
    assert d["costs"]["recompute"] == "selective" and d["costs"]["sp"] is True


def test_no_recomputation_has_hfu_equal_mfu():
    r = run_study(Study(schedule="1f1b", microbatches=4, costs=_costs(model_preset("gpt-tiny"), pp=2, tp=4,
                                                                       cluster="dgx-a100:1")))
    assert r.hfu == r.mfu


@pytest.fixture(scope="module")
def korthikanti():
    """The megatron-2022 suite's scored rows and its activation-memory rows, computed once (about 30 s)."""
    from sim.published import memory_rows, score, suite_runs

    return score(suite_runs("megatron-2022")), memory_rows()


@pytest.mark.slow
def test_published_table_5_and_memory(korthikanti):
    """Every iteration time within 10% of Table 5, mean |error| <= 5%, activation memory within 5%."""
    from sim.published import summarize

    times, memory = korthikanti
    assert len(times) == 8 and summarize(times)["fit"]["rows"] == 4 and summarize(times)["held_out"]["rows"] == 4
    assert all(abs(r["error"]) < 0.10 for r in times), [(r["model"], r["mode"], r["error"]) for r in times]
    assert sum(abs(r["error"]) for r in times) / 8 <= 0.05
    assert all(abs(r["error"]) < 0.05 for r in memory)
    assert not math.isnan(sum(r["mfu"] for r in times))
    assert summarize(times)["held_out"]["mean_abs_error"] <= 0.05


def test_optimizer_step_counts_without_data_parallel_tasks():
    """dp mode none adds no OPTIM task: each rank's Adam step (28 bytes/param at HBM speed) ends the step."""
    costs = _costs(M22, pp=1, b=4, recompute="full", cluster="dgx-a100:1")
    r = run_study(Study(schedule="1f1b", microbatches=1, costs=costs))
    optim = 28 * costs.stage_params(0, 1) / 2.039e12
    assert optim == pytest.approx(28 * M22.params / 8 / 2.039e12, rel=1e-3)  # ~38 ms for 22B / 8 shards
    assert r.step_time == pytest.approx(r.sim.ranks[0].last_end + optim)
    ddp = TransformerCosts(model=M22, cluster=cluster_preset("dgx-a100:1"),
                           parallel=ParallelConfig(pp=1, tp=8, dp_mode="ddp"), microbatch_size=4, recompute="full")
    with_task = run_study(Study(schedule="1f1b", microbatches=1, costs=ddp))
    assert with_task.step_time == pytest.approx(r.step_time)  # the OPTIM task costs the same


def test_compare_takes_tp_sp_and_recompute(capsys):
    from analysis.cli import main

    argv = ["compare", "--model", "megatron-22b", "--cluster", "dgx-a100:2", "--tp", "8", "--pp", "2",
            "--microbatches", "4", "--schedules", "1f1b", "--json"]
    assert main([*argv, "--recompute", "full"]) == 0
    full = json.loads(capsys.readouterr().out)["schedules"][0]
    assert main([*argv, "--recompute", "selective", "--sp"]) == 0
    sel = json.loads(capsys.readouterr().out)["schedules"][0]
    assert sel["step_time"] < full["step_time"]
    assert (full["costs"]["recompute"], sel["costs"]["recompute"], sel["costs"]["sp"]) == ("full", "selective", True)


@pytest.mark.slow
def test_published_report_keeps_fit_and_held_out_apart(korthikanti):
    """The text and Markdown tables of the megatron-2022 suite: fit and held-out means apart."""
    from sim.published import summarize
    from sim.published.report import markdown, text

    rows, memory = korthikanti
    s = summarize(rows)
    assert s["fit"]["mean_abs_error"] <= 0.05 and s["held_out"]["mean_abs_error"] <= 0.05
    page = markdown(rows, memory)  # the body; analysis.results_page puts the command, date, machine on top
    assert "## megatron-2022\n\n- fit rows: 4 rows" in page and "- held-out rows: 4 rows" in page
    assert "fit rows: 4 rows" in text(rows) and "held-out rows: 4 rows" in text(rows)


def test_sequence_parallelism_without_tensor_parallelism_is_refused():
    """With tp=1 there is nothing to split the sequence over: --sp would silently do nothing."""
    with pytest.raises(ConfigError, match=r"needs tp > 1; give tp > 1 or leave sp out") as err:
        ParallelConfig(pp=8, tp=1, sp=True)
    assert err.value.field == "sp"
