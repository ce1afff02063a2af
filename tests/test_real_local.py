"""The real runtime in one process: the executor on every schedule, the I/W split, buckets, memory, data."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import schedules  # noqa: E402
from analysis import summarize  # noqa: E402
from real import ModelConfig, RunConfig, make_plan, param_digest, partition, reference_run, run  # noqa: E402
from real.backward import backward_full, backward_input, backward_weight  # noqa: E402
from real.data.sources import make_batch, microbatches  # noqa: E402
from real.dp.sync import GradSync, make_buckets  # noqa: E402
from real.models import build_layers, build_model, loss_fn  # noqa: E402
from schedules import ConfigError  # noqa: E402
from schedules.library.recompute import recompute_full  # noqa: E402
from schedules.trace import TRACE_COLUMNS  # noqa: E402

MODEL = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8)


def _cfg(schedule: str, **kw) -> RunConfig:
    return RunConfig.of(**{**dict(schedule=schedule, microbatches=4, batch_size=16, steps=3, model=MODEL,
                               optimizer="sgd", lr=0.1), **kw})


@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("name", schedules.names())
def test_every_schedule_on_one_rank_equals_plain_training(name, recompute):
    """pp=1: multi-chunk schedules put all their stages on rank 0 (values pass in memory). With recompute full,
    every F runs without grad and an R re-runs it with grad before its backward: the same numbers."""
    cfg = _cfg(name, recompute=recompute)
    result = run(cfg)
    ref_losses, ref_params = reference_run(cfg)
    assert max(abs(a - b) for a, b in zip(result.losses, ref_losses, strict=True)) <= 1e-5
    assert max(float((result.parameters[k] - v).abs().max()) for k, v in ref_params.items()) <= 1e-5
    graph = make_plan(cfg, 1).graph
    assert sorted(result.trace["action"]) == sorted(str(t.action) for t in graph.tasks)
    assert (result.trace["kind"] == "R").sum() == (graph.schedule.num_stages * 4 if recompute == "full" else 0)
    if name in ("gpipe", "1f1b"):  # F and B per microbatch in the reference's order: the same bits
        assert result.param_sha256 == param_digest(ref_params.values())[1]


def test_trace_schema_memory_and_metrics():
    result = run(_cfg("gpipe", steps=2, trace_step=0))
    df = result.trace
    assert tuple(df.columns) == (*TRACE_COLUMNS, "step") and set(df["step"]) == {0}
    assert df.attrs["source"] == "real" and df.attrs["step"] == 0 and df.attrs["params"]["microbatches"] == 4
    assert df.attrs["step_times"] == {"0": result.step_times[0]}
    assert list(df["action"]) == ["0F0", "0F1", "0F2", "0F3", "0B0", "0B1", "0B2", "0B3"]
    assert (df["start"].diff().dropna() >= 0).all() and (df["end"] >= df["start"]).all()
    assert summarize(df)["makespan"] > 0
    (mem,) = result.memory
    assert mem["peak_activations_mb"] == 4.0  # GPipe holds every microbatch at its peak
    assert mem["peak_activation_bytes"] == 4 * mem["activation_bytes_per_microbatch"] > 0
    assert run(_cfg("1f1b", steps=1)).memory[0]["peak_activations_mb"] == 1.0


def test_a_recomputed_forward_keeps_only_its_input():
    """GPipe, pp=1, 4 microbatches: without recomputation the peak holds all 4 microbatches' activations; with
    R before each B it holds one microbatch's and the 3 other inputs (token ids: 4 x 8 int64 = 256 bytes each).
    A microbatch's activations, counted across its F and its R, are the same bytes."""
    plain = run(_cfg("gpipe", steps=1)).memory[0]
    (mem,) = run(_cfg("gpipe", steps=1, recompute="full")).memory
    per_mb = plain["activation_bytes_per_microbatch"]
    assert mem["activation_bytes_per_microbatch"] == per_mb and plain["peak_activation_bytes"] == 4 * per_mb
    assert mem["peak_activation_bytes"] == per_mb + 3 * 4 * MODEL.seq * 8


def test_a_recomputed_runs_trace_is_predicted_with_its_r_actions():
    """A real trace records the placement (params recompute); the prediction runs the same program."""
    from sim.plan.sweep import predict_for_trace

    for kw in (dict(recompute="full"), dict(recompute="bubbles", recompute_limit=2.0)):
        trace = run(_cfg("gpipe", steps=1, **kw)).trace
        predicted = predict_for_trace(trace.attrs).trace
        assert sorted(predicted["action"]) == sorted(trace["action"]) and (trace["kind"] == "R").any(), kw


def test_recompute_restores_the_random_numbers_of_its_forward():
    """An R draws the same random numbers as its forward did (dropout): the recomputed graph is the one the
    forward computed, so the gradients equal an ordinary forward and backward."""
    from real.executor import Executor, Stage
    from real.measure import ActivationMeter, Recorder

    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5)), nn.Linear(6, 3)]
    graph = schedules.lower(recompute_full(schedules.build("gpipe", pp=1, microbatches=2)))
    stage = Stage(0, 0, [nn.Sequential(*layers)], is_last=True)
    batches = [(torch.randn(4, 6), torch.randint(3, (4,))) for _ in range(2)]
    ex = Executor(graph, 0, {0: stage}, comm=None, meter=ActivationMeter(stage.parameters()), recorder=Recorder(
        torch.device("cpu")))
    torch.manual_seed(1)
    ex.run_step(batches)
    got = [p.grad.clone() for p in stage.parameters()]
    stage.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    for x, y in batches:  # the same draws in the same order: F0, F1 (R re-draws from a saved state)
        (loss_fn(stage(x), y) / 2).backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(got, stage.parameters(), strict=True))


def test_recompute_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="recompute bubbles needs recompute_limit"):
        _cfg("1f1b", recompute="bubbles")
    with pytest.raises(ConfigError, match="recompute_limit 2 applies to recompute bubbles only, not full"):
        _cfg("1f1b", recompute="full", recompute_limit=2)
    with pytest.raises(ConfigError, match="unknown recompute 'some'; valid: none, full, bubbles"):
        _cfg("1f1b", recompute="some")


def test_every_measured_step_is_traced(tmp_path):
    """trace_steps=3 of 4 steps: steps 1..3, each with the whole program and its wall time; the file keeps them,
    and median_step picks the step of median wall time, its times from 0."""
    from schedules.trace import median_step, read_trace, trace_steps

    result = run(_cfg("1f1b", steps=4, trace_steps=3), trace_path=tmp_path / "t.csv")
    df = read_trace(tmp_path / "t.csv")
    parts = trace_steps(df)
    assert list(parts) == [1, 2, 3]
    program = sorted(parts[1]["action"])
    assert all(sorted(p["action"]) == program for p in parts.values())
    assert df.attrs["step_times"] == {str(k): result.step_times[k] for k in (1, 2, 3)}
    assert all(parts[k]["start"].min() >= parts[k - 1]["end"].max() for k in (2, 3))  # in order on one clock
    walls = sorted((result.step_times[k], k) for k in (1, 2, 3))
    one = median_step(df)
    assert one.attrs["step"] == walls[1][1] and set(one["step"]) == {walls[1][1]} and one["start"].min() == 0.0
    with pytest.raises(ConfigError, match=r"trace_steps 5 reaches before step 0 .* valid: 1\.\.4"):
        _cfg("1f1b", steps=4, trace_steps=5)


def _stage_grads(layers: nn.Module, inp, tgt, grad, split: bool):
    params = list(layers.parameters())
    counts: dict[int, int] = {}
    handles = [p.register_post_accumulate_grad_hook(lambda p: counts.__setitem__(id(p), counts.get(id(p), 0) + 1))
               for p in params]
    for p in params:
        p.grad = None
    x = inp.detach().requires_grad_() if inp.is_floating_point() else inp
    out = layers(x)
    if tgt is not None:
        out = loss_fn(out, tgt)
    if split:
        dx, work = backward_input(out, grad, x if x.requires_grad else None, params)
        assert all(p.grad is None for p in params), "I must not touch the weights"
        backward_weight(work)
    else:
        backward_full(out, grad)
        dx = x.grad if x.requires_grad else None
    for h in handles:
        h.remove()
    assert sorted(counts.values()) == [1] * len(params), "each weight accumulates exactly once"
    return dx, [p.grad.clone() for p in params]


@pytest.mark.parametrize(("layer_range", "last"), [(range(0, 2), False), (range(1, 4), False), (range(3, 6), True)])
def test_input_then_weight_gradient_equals_full_backward(layer_range, last):
    layers = nn.Sequential(*build_layers(MODEL, 3, layer_range))
    ids, tgt = make_batch(MODEL, 0, 0, 4)
    inp = ids if layer_range.start == 0 else torch.randn(4, MODEL.seq, MODEL.dim)
    grad = None if last else torch.randn(4, MODEL.seq, MODEL.dim)
    dx_b, g_b = _stage_grads(layers, inp, tgt if last else None, grad, split=False)
    dx_s, g_s = _stage_grads(layers, inp, tgt if last else None, grad, split=True)
    assert (dx_b is None) == (dx_s is None) and (dx_b is None or torch.allclose(dx_b, dx_s, atol=1e-6))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_b, g_s, strict=True))


def test_weight_used_twice_is_one_group_and_not_counted_twice():
    """A shared layer leaves the input closure at two places: one group, clamped, gradient exact."""
    torch.manual_seed(0)
    shared, other = nn.Linear(5, 5), nn.Linear(5, 5)
    model = nn.Sequential(shared, nn.Tanh(), other, nn.Tanh(), shared)
    grad = torch.randn(3, 5)
    x = torch.randn(3, 5)
    dx_b, g_b = _stage_grads(model, x, None, grad, split=False)
    dx_s, g_s = _stage_grads(model, x, None, grad, split=True)
    assert torch.allclose(dx_b, dx_s, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_b, g_s, strict=True))


def test_buckets_are_reverse_order_and_capped():
    params = [nn.Parameter(torch.zeros(n)) for n in (10, 20, 30, 40)]  # 40, 80, 120, 160 bytes
    buckets = make_buckets(params, cap_bytes=200)
    assert [[p.numel() for p in b] for b in buckets] == [[40], [30, 20], [10]]
    assert [[p.numel() for p in b] for b in make_buckets(params, cap_bytes=1)] == [[40], [30], [20], [10]]


@pytest.mark.parametrize("mode", ["ddp", "sync"])
def test_bucket_collective_starts_when_its_last_gradient_is_in(world_of_one, mode):
    """ddp: a bucket is launched inside the backward, the moment its parameters have all microbatches."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    launched: list[tuple[int, int]] = []  # (bucket, backward passes done when launched)
    done = [0]
    sync = GradSync({0: list(model.parameters())}, group=world_of_one, mode=mode, bucket_mb=1e-6, accumulations=2,
                    stamp=lambda: None, record=lambda key, *_: launched.append((key.bucket, done[0])))
    sync.begin_step()
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        done[0] += 1
    sync.finish()
    assert len(sync.buckets) == 4
    if mode == "ddp":
        assert launched == [(0, 1), (1, 1), (2, 1), (3, 1)]  # during the second backward, last layer first
    else:
        assert launched == [(0, 2), (1, 2), (2, 2), (3, 2)]  # after the step's last backward
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_partition_even_and_explicit():
    assert partition(6, 4) == (range(0, 2), range(2, 4), range(4, 5), range(5, 6))
    assert partition(6, 2, (1, 5)) == (range(0, 1), range(1, 6))
    with pytest.raises(ConfigError, match="split 3,2 must give each of the 2 stages >= 1 layer and sum to the model's 6"):
        partition(6, 2, (3, 2))


def test_data_is_a_function_of_seed_and_step_and_every_layout_sees_it():
    a, b = make_batch(MODEL, 7, 3, 16), make_batch(MODEL, 7, 3, 16)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], make_batch(MODEL, 7, 4, 16)[0])
    shares = [x for d in range(2) for x, _ in microbatches(a, 2, d, 4)]
    assert torch.equal(torch.cat(shares), a[0])
    # The signal: most targets follow a fixed permutation of the previous token.
    ids, tgt = make_batch(MODEL, 0, 0, 256)
    follow = {}
    for x, y in zip(ids[:, -1].tolist(), tgt[:, -1].tolist(), strict=True):
        follow.setdefault(x, []).append(y)
    agree = sum(max(ys.count(y) for y in ys) for ys in follow.values()) / 256
    assert agree > 0.8


def test_layers_built_alone_equal_the_whole_model():
    whole = build_model(MODEL, 5)
    part = build_layers(MODEL, 5, [2, 3])
    for layer, ref in zip(part, [whole[2], whole[3]], strict=True):
        assert all(torch.equal(p, q) for p, q in zip(layer.parameters(), ref.parameters(), strict=True))


@pytest.mark.parametrize(("kw", "message"), [
    (dict(batch_size=10), "batch size 10 is not divisible by dp x microbatches = 1 x 4 = 4; use a multiple of 4, e.g. 8"),
    (dict(optimizer="lamb"), "unknown optimizer 'lamb'; valid: sgd, adamw"),
    (dict(dp_mode="nope"), "unknown dp mode 'nope'; valid: sync, ddp, zero1, zero2, zero3, fsdp, ps, async-ps"),
    (dict(dp_mode="ps"), "dp_mode ps needs parameter servers; give servers >= 1"),
    (dict(dp_mode="ddp", servers=1), "1 parameter server(s) with dp_mode ddp; servers serve dp_mode ps or async-ps only"),
    (dict(dp_mode="ps", servers=1, staleness=1), "staleness 1 applies to dp_mode async-ps only, not ps"),
    (dict(lr=0.0), "lr must be a finite number > 0, got 0.0"),
])
def test_config_errors_name_the_value(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _cfg("gpipe", **kw)
