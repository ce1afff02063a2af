"""Gradient compression: the codecs' names and refusals, their bytes (IR and simulator), and their mathematics
on one process (int8's round trip and error feedback in closed form, PowerSGD exact on a rank-R matrix).
The 2-process runs (loss against exact ddp, bytes measured against predicted, resume): test_compression_real.py."""

from __future__ import annotations

import pytest

from schedules import ConfigError, Kind, Stream, build, lower
from schedules.dp.codecs import Compression, buffer_bytes, parse_compression, powersgd_split
from schedules.dp.modes import add_data_parallel
from sim.costs.cluster import cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import TransformerConfig
from sim.costs.transformer_costs import TransformerCosts

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from real.config import SyncConfig  # noqa: E402
from real.dp.compress import Codec, dequantize, quantize  # noqa: E402

VALID = "valid: none, fp16, bf16, int8, powersgd:R (R a rank from 1 to 1,048,576 (2^20), e.g. powersgd:2)"


@pytest.mark.parametrize("spec, want", [("none", Compression()), ("FP16", Compression("fp16")),
                                        ("bf16", Compression("bf16")), (" int8 ", Compression("int8")),
                                        ("powersgd:3", Compression("powersgd", 3))])
def test_codec_names_parse(spec, want):
    assert parse_compression(spec) == want
    assert parse_compression(want.spec) == want


@pytest.mark.parametrize("spec", ["int4", "powersgd", "powersgd:0", "powersgd:-1", "powersgd:x", ""])
def test_an_unknown_codec_is_one_line_naming_it(spec):
    with pytest.raises(ConfigError) as e:
        parse_compression(spec)
    assert str(e.value) == f"unknown grad compression {spec!r}; {VALID}"
    assert e.value.field == "grad_compression"


def test_powersgd_is_refused_with_the_zero_modes_and_every_codec_with_ps():
    with pytest.raises(ConfigError) as e:
        SyncConfig(dp_mode="zero2", grad_compression="powersgd:2")
    assert str(e.value) == ("grad compression powersgd:2 needs whole gradients (its factors are all-reduced), dp mode "
                            "zero2 reduce-scatters shards; use dp mode ddp or sync, or fp16, bf16 or int8")
    with pytest.raises(ConfigError) as e:
        ParallelConfig(pp=1, dp=2, dp_mode="ps", grad_compression="int8")
    assert str(e.value) == ("grad compression int8 applies to the gradient collectives of sync, ddp, zero1, zero2, "
                            "zero3, fsdp, not dp mode 'ps'; use one of them or grad compression none")
    with pytest.raises(ConfigError) as e:
        ParallelConfig(pp=1, dp=2, dp_mode="ddp", codec_ns_per_param=1.0)
    assert str(e.value) == ("parallel: codec_ns_per_param times a codec; give a grad_compression other than none or "
                            "leave it out")
    assert SyncConfig(dp_mode="zero3", grad_compression="INT8").grad_compression == "int8"


def test_bucket_bytes_of_each_codec_by_hand():
    shapes = [(16, 12), (12,), (3, 5)]  # 192 + 12 + 15 = 219 elements, padded to 220 over 2 ranks
    kw = {"padded": 220, "world": 2, "shapes": shapes}
    assert buffer_bytes(Compression(), reduce=True, **kw) == 880
    assert buffer_bytes(Compression("fp16"), reduce=True, **kw) == buffer_bytes(Compression("bf16"), reduce=False,
                                                                                **kw) == 440
    assert buffer_bytes(Compression("int8"), reduce=True, **kw) == 220 + 4 * 2  # 2 chunks of 110 + their scales
    # rank 2: (16+12)*2 = 56 factors (2*56 < 192); 3x5: r 2, 2*16 = 32 > 15, whole; the vector whole
    assert powersgd_split(shapes, 2) == (56, 27)
    assert buffer_bytes(Compression("powersgd", 2), reduce=True, **kw) == 4 * (56 + 27)
    assert powersgd_split(shapes, 5) == (0, 219)  # (16+12)*5*2 = 280 > 192: nothing worth compressing


def test_int8_round_trip_is_exact_on_its_grid_and_within_half_a_step_otherwise():
    x = torch.tensor([127.0, -3.0, 0.0, 64.0, 2.0, -1.0, 0.5, 0.25])  # chunk 0 absmax 127: scale 1
    q, scales = quantize(x, 2)
    assert q.dtype == torch.int8 and scales[0] == 1.0 and scales[1] == torch.tensor(2.0) / 127  # float32 scales
    assert q.tolist() == [127, -3, 0, 64, 127, -64, 32, 16]  # 2/(2/127) = 127, -1/(2/127) = -63.5 -> -64 (even)
    assert torch.equal(dequantize(q, scales)[:4], x[:4])
    assert float((dequantize(q, scales)[4:] - x[4:]).abs().max()) <= scales[1] / 2 + 1e-7
    q, scales = quantize(torch.zeros(6), 3)  # an all-zero chunk: scale 0, no division by zero
    assert scales.tolist() == [0.0] * 3 and torch.equal(dequantize(q, scales), torch.zeros(6))


def test_int8_error_feedback_loses_nothing_but_the_last_residuals(world_of_one):
    """Sum of what T steps delivered = sum of the T gradients - the worker's and the owner's last residuals
    (both telescope: r_{t+1} = x_t - sent_t)."""
    codec = Codec(Compression("int8"), world_of_one, {"s0b0": 40})
    gen = torch.Generator().manual_seed(0)
    delivered, given = torch.zeros(40), torch.zeros(40)
    for _ in range(5):
        g = torch.randn(40, generator=gen) * torch.logspace(-3, 0, 40)  # small values are rounded away at first
        given += g
        flat = g.clone()
        pending = codec.allreduce("s0b0", flat, [])
        assert pending.nbytes == 40 + 4 and not pending.is_completed()
        pending.wait()
        delivered += flat
    lost = codec.residual["s0b0"] + codec.owner_residual["s0b0"]
    assert float(lost.abs().max()) > 0
    assert torch.allclose(delivered + lost, given, atol=1e-6, rtol=0)


def _matrix(n: int, m: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, rank, generator=gen) @ torch.randn(rank, m, generator=gen)


def test_powersgd_is_exact_on_a_rank_r_matrix_and_keeps_the_rest_as_error(world_of_one):
    """torch's hook through the codec: a rank-2 16x12 gradient comes back whole at rank 2 (P spans its columns),
    the vector beside it exactly; at rank 1 what is lost is the error fed back: input - output."""
    m, v = _matrix(16, 12, 2), torch.arange(5.0)
    for rank, exact in ((2, True), (1, False)):
        flat = torch.cat([m.reshape(-1), v])
        grads = [flat[:192].view(16, 12), flat[192:]]
        codec = Codec(Compression("powersgd", rank), world_of_one, {"s0b0": 197})
        pending = codec.allreduce("s0b0", flat, grads)
        assert pending.is_completed() is False and pending.wait()
        assert pending.nbytes == 4 * ((16 + 12) * rank + 5)
        assert torch.equal(flat[192:], v)
        error = codec.psgd.error_dict[0]
        assert torch.allclose(error, torch.cat([m.reshape(-1), v]) - flat, atol=1e-6, rtol=0)
        assert (float((flat[:192] - m.reshape(-1)).abs().max()) < 1e-4) is exact


def test_codec_state_round_trips(world_of_one):
    """What a checkpoint keeps of a codec puts a fresh one in the same place: the next step's output is equal."""
    flat = torch.cat([_matrix(16, 12, 3).reshape(-1), torch.ones(4)])
    for comp in (Compression("int8"), Compression("powersgd", 1)):
        a, b = (Codec(comp, world_of_one, {"s0b0": 196}) for _ in range(2))
        first = flat.clone()
        a.allreduce("s0b0", first, [first[:192].view(16, 12), first[192:]]).wait()
        b.load(a.state())
        outs = []
        for codec in (a, b):
            x = flat.clone()
            codec.allreduce("s0b0", x, [x[:192].view(16, 12), x[192:]]).wait()
            outs.append(x)
        assert torch.equal(outs[0], outs[1]), comp
        other = Codec(comp, world_of_one, {"s0b0": 198})  # other buckets (another dp, bucket cap): nothing loads
        assert not other.fits(a.state())
        other.load(a.state())
        assert other.residual == {} and (other.psgd is None or other.psgd.error_dict == {})


TINY = TransformerConfig(name="tiny", layers=2, hidden=64, heads=4, vocab=128, seq_len=32)
H100 = cluster_preset("dgx-h100:1")
# One stage of 2 layers (49984 parameters each: 49152 in matrices, 832 in vectors), the tied embedding
# 128x64 and positions 32x64, the final norm 2x64: 110336 parameters, one bucket of 220672 16-bit bytes.
# PowerSGD rank 4 sends (192+64)4 + (64+64)4 + 2 (256+64)4 = 4096 per layer, (128+64)4 + (32+64)4 = 1152 for
# the tables, and the 2 x 832 + 128 vector elements whole: 11136 elements.
SIM_BYTES = {"none": 220672, "fp16": 220672, "bf16": 220672, "int8": 110336 + 4 * 4, "powersgd:4": 2 * 11136}


@pytest.mark.parametrize("codec", list(SIM_BYTES))
@pytest.mark.parametrize("reduce_dtype", ["bf16", "fp32"])
def test_simulated_bytes_of_each_codec_by_hand(codec, reduce_dtype):
    par = ParallelConfig(pp=1, dp=4, dp_mode="ddp", bucket_mb=1.0, grad_compression=codec)
    costs = TransformerCosts(model=TINY, cluster=H100, parallel=par, efficiency=0.6, reduce_dtype=reduce_dtype)
    want = SIM_BYTES[codec] * (2 if reduce_dtype == "fp32" and codec in ("none", "powersgd:4") else 1)
    assert costs.collective_bytes(Kind.ALLREDUCE, 0, 1, 0) == want
    assert costs.collective_bytes(Kind.ALL_GATHER, 0, 1, 0) == 220672  # parameters are not compressed


def test_the_codec_time_stretches_the_gradient_collective():
    graph = add_data_parallel(lower(build("1f1b", pp=1, microbatches=2)), "ddp", [1])
    task = next(t for t in graph.tasks if t.stream is Stream.COLLECTIVE)
    times = []
    for ns in (0.0, 2.0):
        par = ParallelConfig(pp=1, dp=4, dp_mode="ddp", bucket_mb=1.0, grad_compression="int8", codec_ns_per_param=ns)
        costs = TransformerCosts(model=TINY, cluster=H100, parallel=par, efficiency=0.6)
        times.append((costs.duration(task, graph), costs.latency(task, graph)))
    (d0, l0), (d1, l1) = times
    assert d1 - d0 == pytest.approx(2e-9 * 110336, rel=1e-12) and l1 - l0 == pytest.approx(2e-9 * 110336, rel=1e-12)


ONE = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--batch-size", "4", "--steps", "2"]


@pytest.mark.parametrize(("argv", "line"), [
    ([*ONE, "--dp", "1", "--grad-compression", "int8"],
     "--grad-compression has no effect at dp 1 (one replica: no gradients to synchronize)"),
    ([*ONE, "--dp", "2", "--dp-mode", "zero3", "--grad-compression", "powersgd:2"],
     "grad compression powersgd:2 needs whole gradients (its factors are all-reduced), dp mode zero3 reduce-scatters "
     "shards; use dp mode ddp or sync, or fp16, bf16 or int8 (flag --grad-compression)"),
    ([*ONE, "--dp", "2", "--grad-compression", "int4"], f"unknown grad compression 'int4'; {VALID} "
                                                          "(flag --grad-compression)"),
])
def test_schedlab_run_refuses_a_codec_before_anything_runs(capsys, argv, line):
    from analysis.cli.train import main

    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert (code, capsys.readouterr().err) == (2, f"error: {line}\n")


def test_the_simulators_layer_is_the_runtime_gpt_block_parameter_for_parameter():
    """sim.costs.compression.layer_shapes (what PowerSGD's simulated ratio is computed from) lists the built-in GPT
    block's parameters: the same shapes, so the same factors and whole tensors at every rank."""
    from real.config import ModelConfig
    from real.models import build_layers
    from sim.costs.compression import layer_shapes

    block = build_layers(ModelConfig(kind="gpt", layers=1, dim=32, heads=2, vocab=64, seq=16), 0, [1])[0]
    real = sorted(tuple(p.shape) for p in block.parameters())
    sim = sorted(layer_shapes(TransformerConfig(name="b", layers=1, hidden=32, heads=2, vocab=64, seq_len=16)))
    assert real == sim
    # qkv 96x32, proj 32x32, fc 128x32, out 32x128: (128 + 64 + 160 + 160) r factors; 416 vector elements whole;
    # at r 8 proj's 2 (64) 8 = 1024 is not < 32 x 32, so it goes whole
    assert [powersgd_split(real, r) for r in (1, 2, 4, 8)] == [(512, 416), (1024, 416), (2048, 416),
                                                                (128 * 8 + 320 * 8, 416 + 1024)]


@pytest.mark.parametrize(("codec", "modes"), [("int8", ("ddp", "zero1", "zero2", "fsdp")), ("powersgd:2", ("ddp",))])
def test_the_planners_bound_stays_below_the_compressed_step(codec, modes):
    """schedlab plan --grad-compression: every candidate with a dp mode is costed with the codec, and the lower
    bound that prunes candidates charges the codec's bytes too, so it stays below the simulated step."""
    from sim.plan.bounds import Bounds
    from sim.plan.space import PlanSpace, enumerate_configs
    from tests.test_plan import TINY as PLAN_TINY
    from tests.test_plan import _check_bound_and_memory

    space = PlanSpace(model=PLAN_TINY, cluster=cluster_preset("dgx-h100:1"), global_batch=8, chunks=(2,),
                      dp_modes=modes, grad_compression=codec)
    configs = [c for c in enumerate_configs(space) if c.dp > 1][::len(modes) * 27]  # 297 candidates per mode
    assert len(configs) == 11
    _check_bound_and_memory(space, configs)
    assert {Bounds(space).costs(c).parallel.grad_compression for c in configs} == {codec}
