"""Device models, fused attention, FP8 GEMMs and the recompute policies, on hand-computed cases."""

from __future__ import annotations

import pytest

from schedules import ConfigError, Kind
from sim.costs.cluster import cluster_preset
from sim.costs.devices import DEVICE_MODELS, MAMF, transferred_gemm
from sim.costs.gpu_model import Op, flash_attention_flops, layer_ops
from sim.costs.parallel import ParallelConfig
from sim.costs.recompute_modes import check_recompute
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts

LLAMA8 = model_preset("llama-8b")
GPT175 = model_preset("gpt3-175b")


def test_h100_curve_is_the_a100_fit_moved_by_the_matmul_microbenchmark():
    a100, h100 = DEVICE_MODELS["A100"].gemm, DEVICE_MODELS["H100"].gemm
    assert h100.peak_fraction == round(0.794 * (794.5 / 989) / (271.2 / 312), 4) == 0.7338
    # the half-efficiency GEMM takes the same time on both: half_flops / (peak x fraction)
    assert h100.half_flops / (989e12 * 0.7338) == pytest.approx(a100.half_flops / (312e12 * 0.794), rel=2e-3)
    assert transferred_gemm(MAMF["A100"], 312e12).peak_fraction == 0.794


def test_flash_attention_flops_and_time():
    """Causal: half of 4 b s^2 d per head forward; the backward 2.5x at the backward's fraction."""
    assert flash_attention_flops(seq_len=8192, b=1, heads=32, head_dim=128) == 2 * 32 * 8192**2 * 128
    assert flash_attention_flops(seq_len=10, b=2, heads=1, head_dim=4, causal=False) == 4 * 2 * 100 * 4
    ops = {o.name: o for o in layer_ops(hidden=4096, heads=32, kv_hidden=1024, ffn=14336, gated=True, seq_len=8192,
                                        b=1, tp=1, sp=False, attention="flash")}
    assert "softmax" not in ops and "scores" not in ops
    fa, spec, dev = ops["flash-attn"], cluster_preset("dgx-h100").spec, DEVICE_MODELS["H100"]
    flops = 2 * 32 * 8192**2 * 128
    assert fa.time(spec, dev.gemm, dev) == pytest.approx(flops / (989e12 * 610 / 989))
    assert fa.input_grad_time(spec, dev.gemm, dev) == pytest.approx(2.5 * flops / (989e12 * 470 / 989))


def test_fp8_runs_weight_gemms_at_the_fp8_peak():
    spec, dev = cluster_preset("dgx-h100").spec, DEVICE_MODELS["H100"]
    gemm = Op("fc1", 1e12, 1e6, True, weight=True)
    assert gemm.time(spec, dev.gemm, dev, fp8=True) == pytest.approx(1e12 / (1979e12 * dev.fp8_gemm(1e12)))
    costs = dict(model=LLAMA8, parallel=ParallelConfig(pp=1))
    fp8 = TransformerCosts(cluster=cluster_preset("dgx-h100"), dtype="fp8", **costs)
    bf16 = TransformerCosts(cluster=cluster_preset("dgx-h100"), **costs)
    assert fp8.pass_time(Kind.F, 0, 1) < bf16.pass_time(Kind.F, 0, 1)
    with pytest.raises(ConfigError, match=r"dtype fp8 needs a device with FP8 tensor cores .* A100 has none"):
        TransformerCosts(cluster=cluster_preset("dgx-a100"), dtype="fp8", **costs)


def test_fp8_quantizes_each_gemms_input_in_the_forward_and_its_output_gradient_in_the_backward():
    # current scaling: amax (read 2 bytes), cast (read 2, write 1 row-wise + 1 transposed): 6 bytes per element
    spec, dev = cluster_preset("dgx-h100").spec, DEVICE_MODELS["H100"]
    fc1 = layer_ops(hidden=4096, heads=32, kv_hidden=1024, ffn=14336, gated=True, seq_len=8192, b=1, tp=1,
                    sp=False, attention="flash")[6]
    assert fc1.name == "fc1" and (fc1.in_elems, fc1.out_elems) == (8192 * 4096, 8192 * 2 * 14336)
    assert fc1.fp8_cast_time(spec, dev, True) == pytest.approx(6 * 8192 * 4096 / spec.memory_bw)
    assert fc1.fp8_cast_time(spec, dev, True, backward=True) == pytest.approx(6 * 8192 * 2 * 14336 / spec.memory_bw)
    assert fc1.fp8_cast_time(spec, dev, False) == 0.0
    costs = dict(model=LLAMA8, parallel=ParallelConfig(pp=1), dtype="fp8", cluster=cluster_preset("dgx-h100"))
    lc = TransformerCosts(**costs).layer_costs()
    casts = [(op.fp8_cast_time(spec, dev, True), op.fp8_cast_time(spec, dev, True, backward=True)) for op in lc.ops]
    assert lc.forward() == pytest.approx(sum(lc._t(op) for op in lc.ops) + sum(f for f, _ in casts))
    assert lc.input_grad() == pytest.approx(sum(op.input_grad_time(spec, lc.efficiency, dev, True) for op in lc.ops)
                                            + sum(b for _, b in casts))
    assert lc.weight_grad() == sum(lc._t(op) for op in lc.ops if op.weight)  # W reuses both quantized operands
    assert sum(1 for f, _ in casts if f) == 4  # QKV, out-projection, fc1, fc2


def test_llama_activation_bytes_by_hand():
    """Per token: replicated 8h (no dropout), split Q,K,V 2(h+2h_kv) + out 2h + gated MLP 6f, core 4a (flash)."""
    h, f, kv, a, s = 4096, 14336, 1024, 32, 8192
    per_token = 8 * h + 2 * (h + 2 * kv) + 2 * h + 6 * f + 4 * a
    assert LLAMA8.layer_activation_bytes(1) == s * per_token
    tp8_sp = (8 * h + 2 * (h + 2 * kv) + 2 * h + 6 * f + 4 * a) / 8
    assert LLAMA8.layer_activation_bytes(1, 8, True) == pytest.approx(s * tp8_sp)
    # selective-op keeps the input 2h, q 2h, v 2h_kv, down 2h (odd matmuls) and the attention output 2h + 4a
    assert LLAMA8.layer_activation_bytes(1, recompute="selective-op") == s * (2 * h + 2 * h + 2 * kv + 2 * h
                                                                             + 2 * f + 2 * h + 4 * a)
    full, none = LLAMA8.layer_activation_bytes(1, recompute="full"), LLAMA8.layer_activation_bytes(1)
    assert full == 2 * s * h
    assert LLAMA8.layer_activation_bytes(1, recompute="layer:4") == (full + 3 * none) / 4
    unfused = model_preset("gpt3-175b")
    assert unfused.attention == "unfused" and LLAMA8.attention == "flash"


def test_recompute_flops_of_the_policies():
    h, f, kv = 4096, 14336, 1024
    assert LLAMA8.recompute_flops("selective-op") == 2 * h * kv + 2 * h * h + 2 * h * f  # k, out, up
    assert GPT175.recompute_flops("selective-op") == 2 * 12288**2 + 2 * 4 * 12288**2  # out, fc2
    assert LLAMA8.recompute_flops("layer:2") == LLAMA8.layer_flops("F") / 2


def test_recompute_names_are_checked():
    assert check_recompute("costs", "layer:3") == "layer:3"
    for bad in ("layer:0", "layer:x", "op", 3):
        with pytest.raises(ConfigError, match=r"unknown recompute .*; valid: none, selective, full, selective-op, "
                                              r"layer:N \(N >= 1: every N-th layer in full\)"):
            check_recompute("costs", bad)


def test_context_parallelism_splits_tokens_and_exposes_the_ring_beyond_the_kernel():
    """cp ranks of s/cp tokens: GEMMs and activations / cp, attention FLOPs / cp (s/cp queries x s keys, causal),
    and cp - 1 K/V block transfers per layer forward (twice in the backward) hidden behind the attention kernel."""
    from sim.costs.cluster import cluster_preset as cp_cluster

    base = dict(model=LLAMA8, cluster=cp_cluster("dgx-h100"))
    one = TransformerCosts(parallel=ParallelConfig(pp=1), **base)
    four = TransformerCosts(parallel=ParallelConfig(pp=1, cp=4), **base)
    assert four.parallel.world == 4 and four.local.seq_len == 2048
    assert four.activations_of(32, False) == pytest.approx(one.activations_of(32, False) / 4)
    fa = {o.name: o for o in four.layer_costs().ops}["flash-attn"]
    assert fa.flops == pytest.approx(flash_attention_flops(seq_len=8192, b=1, heads=32, head_dim=128) / 4)
    block = 2 * 2.0 * 2048 * 1024  # K and V of 2048 tokens, h_kv 1024, 16-bit
    ring = 3 * (3e-6 + block / 450e9)  # NVLink 4: 3 us, 450 GB/s
    kernel = four.layer_costs()._t(fa)
    assert four.cp_exchange(Kind.F) == pytest.approx(max(0.0, ring - kernel)) == 0.0  # hidden on NVLink
    slow = TransformerCosts(parallel=ParallelConfig(pp=1, cp=4), model=model_preset("llama-8b"),
                            cluster=cp_cluster("dgx-h100"), efficiency=None, microbatch_size=1)
    assert slow.cp_exchange(Kind.W) == 0.0
    with pytest.raises(ConfigError, match=r"context parallelism \(cp=2\) is ring attention over a fused kernel"):
        TransformerCosts(parallel=ParallelConfig(pp=1, cp=2, tp=1), model=GPT175, cluster=cp_cluster("dgx-a100"))
