"""The mixture-of-experts GPT of the real runtime (real.moe) and its expert parallelism over gloo.

Fast: the MoE block equals a token-by-token sum over the chosen experts, forward and backward; the dense model is
unchanged; bad ep values are one line before anything runs. Slow: torchrun launches (2 and 4 processes) train the
MoE GPT with ep 2 (and 4) folded over dp (sync, ddp, zero1), alone and under pipelines (1F1B, split I/W, overlapped
F/B pairs, interleaved, recomputation), and equal single-process training at 1e-5; every rank's all-to-all bytes
are what its tokens predict; DualPipe-V's pairs run their forward in a thread beside their backward, and the trace
shows one microbatch's all-to-all in flight while the other computes. This file is also the worker the launches
start.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812

from analysis.cli.train import main as real_main  # noqa: E402
from real import ModelConfig, RunConfig, make_plan, param_digest  # noqa: E402
from real.models import DecoderBlock, build_layers, build_model  # noqa: E402
from real.moe import MoEBlock, shard_experts  # noqa: E402
from schedules import SchedlabError  # noqa: E402

LAUNCH_TIMEOUT = 90  # seconds for a whole launch (2 or 4 processes on a busy 2-core machine); a hang fails the test
MOE = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=32, seq=8, moe_experts=4, moe_top_k=2)
# The dense default model's parameters before real.moe existed (commit 10b78b3): param_digest(build_model(...)).
DENSE_SHA256 = "f51efdf8fc84083ce7696883be5bb9319d287c701e07e64b357d9a2d475eb8f2"


def _config(**kw) -> RunConfig:
    base = dict(schedule="1f1b", batch_size=16, steps=3, model=MOE, optimizer="sgd", lr=0.1, timeout_s=60,
                microbatches=2, bucket_mb=0.002)
    return RunConfig.of(**{**base, **kw})


# -- fast: one process --------------------------------------------------------------------------------------------


def _by_hand(block: MoEBlock, h: torch.Tensor) -> torch.Tensor:
    """Token by token: softmax over the router's logits, the top_k experts, their gates summing to 1."""
    rows = []
    for token in h:
        probs = F.softmax(token @ block.router.weight.T, dim=-1)
        chosen = sorted(range(block.num_experts), key=lambda e: -float(probs[e].detach()))[: block.top_k]
        total = sum(probs[e] for e in chosen)
        rows.append(sum(probs[e] / total * block.experts[str(e)].out(F.gelu(block.experts[str(e)].fc(token)))
                        for e in chosen))
    return torch.stack(rows)


@pytest.mark.parametrize(("experts", "top_k"), [(4, 2), (4, 1), (3, 3), (8, 2)])
def test_moe_equals_the_sum_over_each_tokens_chosen_experts_forward_and_backward(experts, top_k):
    cfg = ModelConfig(kind="gpt", layers=1, dim=8, heads=2, vocab=16, seq=5, moe_experts=experts, moe_top_k=top_k)
    (block,) = build_layers(cfg, 3, [1])
    assert isinstance(block, MoEBlock)
    h = torch.randn(2 * cfg.seq, cfg.dim, generator=torch.Generator().manual_seed(1))
    params = list(block.parameters())
    got = block.moe(h)
    want = _by_hand(block, h)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    probe = torch.randn_like(got)
    g_got = torch.autograd.grad((got * probe).sum(), params, allow_unused=True)
    g_want = torch.autograd.grad((want * probe).sum(), params, allow_unused=True)
    for (name, _), a, b in zip(block.named_parameters(), g_got, g_want, strict=True):
        a = torch.zeros(1) if a is None else a
        b = torch.zeros(1) if b is None else b
        assert torch.allclose(a, b, atol=1e-6), name
    # the block: attention as the dense block's, then x + moe(ln2(x))
    x = torch.randn(2, cfg.seq, cfg.dim)
    dense = DecoderBlock(cfg.dim, cfg.heads)
    dense.load_state_dict({k: v for k, v in block.state_dict().items() if k.split(".")[0] in
                           ("ln1", "qkv", "proj", "ln2")}, strict=False)
    with torch.no_grad():
        mid = x + dense.proj(_attention(dense, x))
        assert torch.allclose(block(x), mid + _by_hand(block, block.ln2(mid).reshape(-1, cfg.dim)).view_as(x),
                              atol=1e-6)


def _attention(block: DecoderBlock, x: torch.Tensor) -> torch.Tensor:
    b, t, d = x.shape
    q, k, v = block.qkv(block.ln1(x)).split(d, dim=-1)
    q, k, v = (z.view(b, t, block.heads, d // block.heads).transpose(1, 2) for z in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)


def test_a_rank_building_one_layer_gets_the_whole_models_experts():
    whole = dict(build_model(MOE, 7).named_parameters())
    (block,) = build_layers(MOE, 7, [2])
    for name, p in block.named_parameters():
        assert torch.equal(p, whole[f"2.{name}"]), name
    assert sum(".experts." in n for n in whole) == MOE.layers * MOE.moe_experts * 4


def test_moe_experts_0_is_the_dense_model_bit_for_bit():
    dense = build_model(ModelConfig(), 0)
    assert not any(isinstance(m, MoEBlock) for m in dense.modules())
    assert param_digest(p for p in dense.parameters())[1] == DENSE_SHA256
    assert param_digest(build_model(ModelConfig(moe_experts=0, moe_top_k=5), 0).parameters())[1] == DENSE_SHA256
    # a dense model's dict (traces' metadata, profiles) is what it was before the MoE fields existed
    assert ModelConfig().to_dict() == {"kind": "gpt", "layers": 4, "dim": 32, "heads": 2, "vocab": 64, "seq": 16}
    assert ModelConfig(**MOE.to_dict()) == MOE


def test_ep_of_one_rank_runs_the_all_to_all_path_and_equals_local(world_of_one):
    """shard_experts over a one-rank group: counts, dispatch and combine all-to-alls (to itself), same result."""
    (local,) = build_layers(MOE, 0, [1])
    (sharded,) = build_layers(MOE, 0, [1])
    ep = shard_experts([sharded], 0, 1, world_of_one)
    h = torch.randn(12, MOE.dim, requires_grad=True)
    a, b = local.moe(h), sharded.moe(h)
    assert torch.allclose(a, b, atol=1e-6)
    (ga,), (gb,) = torch.autograd.grad(a.sum(), [h]), torch.autograd.grad(b.sum(), [h])
    assert torch.allclose(ga, gb, atol=1e-6)
    sent = ep.take()
    # one rank: nothing leaves it; every (token, expert) pair's row stays (12 tokens x top_k 2 x dim 16 x 4 bytes)
    assert sent["dispatch"] == sent["combine"] == sent["dispatch_grad"] == sent["combine_grad"] == 0
    assert sent["dispatch_kept"] == sent["combine_kept"] == 12 * 2 * MOE.dim * 4


def test_a_checkpoint_written_before_the_moe_fields_resumes_a_dense_run_only(monkeypatch, tmp_path):
    """Its saved model has no moe_experts / moe_top_k: a dense model's, which a MoE run may not resume."""
    from types import SimpleNamespace

    from real import train
    from real.checkpoint import CheckpointConfig
    from schedules import CheckpointError

    dense = RunConfig.of(schedule="gpipe", microbatches=2, steps=4, checkpoint=CheckpointConfig(directory=str(tmp_path)))
    saved = dense.to_dict()
    for key in ("moe_experts", "moe_top_k"):
        del saved["data"]["model"][key]
    old = SimpleNamespace(step=2, path=tmp_path / "step_000002", info={"config": saved, "losses": [1.0, 1.0]})
    monkeypatch.setattr(train.ckpt, "latest_complete", lambda _: old)
    assert train.resume_point(dense) is old
    moe = RunConfig.of(schedule="gpipe", microbatches=2, steps=4, checkpoint=CheckpointConfig(directory=str(tmp_path)),
                       model=ModelConfig(moe_experts=2))
    with pytest.raises(CheckpointError, match="use the same model to resume"):
        train.resume_point(moe)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(moe_experts=-1), "moe_experts must be an integer >= 0 (0: the dense model), got -1"),
    (dict(moe_experts=4, moe_top_k=5), "moe_top_k 5 is more than the 4 experts; valid: 1..4"),
    (dict(moe_experts=4, moe_top_k=0), "moe_top_k must be an integer >= 1, got 0"),
    (dict(kind="mlp", moe_experts=4), "moe_experts 4 applies to the gpt model, not 'mlp'"),
])
def test_bad_moe_model_values_are_refused(kw, message):
    with pytest.raises(SchedlabError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(**kw)


SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8", "--batch-size", "16"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--dp", "4", "--ep", "3", "--moe-experts", "6"],
     "ep 3 does not divide dp 4 (expert parallelism is folded over the data-parallel replicas); valid ep: 1, 2, 4 "
     "(flag --ep)"),
    (["--dp", "4", "--ep", "4", "--moe-experts", "6"], "ep 4 does not divide moe_experts 6; valid ep: 1, 2 (flag --ep)"),
    (["--dp", "2", "--ep", "2"], "ep 2 shards the experts of the built-in MoE model; give moe_experts"),
    (["--dp", "2", "--ep", "0", "--moe-experts", "2"], "ep must be an integer >= 1, got 0"),
    (["--moe-experts", "2", "--moe-top-k", "3"], "moe_top_k 3 is more than the 2 experts; valid: 1..2 (flag --moe-top-k)"),
    (["--moe-experts", "-2"], "moe_experts must be an integer >= 0 (0: the dense model), got -2 (flag --moe-experts)"),
    (["--moe-top-k", "1"], "--moe-top-k has no effect without --moe-experts"),
    (["--dp", "2", "--ep", "2", "--moe-experts", "2", "--dp-mode", "zero2"],
     "ep 2 is not supported with dp_mode 'zero2'; use dp_mode sync, ddp, zero1 or leave ep out"),
    (["--dp", "2", "--ep", "2", "--moe-experts", "2", "--recompute", "bubbles", "--recompute-limit", "1"],
     "ep 2 is not supported with recompute 'bubbles'; use recompute none or full or leave ep out"),
    (["--dp", "2", "--ep", "2", "--moe-experts", "2", "--grad-compression", "fp16"],
     "ep 2 is not supported with grad_compression 'fp16'; use grad_compression none or leave ep out"),
])
def test_bad_ep_input_is_one_line_and_exit_2_before_launching(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        real_main(["--schedule", "1f1b", "--pp", "1", "--microbatches", "2", *SMALL, *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not dist.is_initialized()


def test_a_mesh_made_without_ep_is_refused_for_an_ep_run():
    """A Mesh reused from another run (no ep groups) would silently replicate the experts: refused first."""
    from real import Mesh
    from real.trainer import Trainer

    cfg = _config(dp=2, ep=2, dp_mode="ddp")
    mesh = Mesh(pp=1, dp=2, rank=0, device=torch.device("cpu"), p2p_groups=None, dp_group=None)
    with pytest.raises(SchedlabError, match="the mesh was made for ep 1, the run has ep 2"):
        Trainer(make_plan(cfg, 2), mesh, "gloo")


def _pair_run(overlap_timeout_s, fail=False):
    """One process, one stage (an MLP and the loss), F0 (F1;B0) B1: the gradients, the recorder's rows."""
    from real.executor import Executor, Stage
    from real.measure import ActivationMeter, Recorder
    from schedules import Kind, Schedule, lower

    torch.manual_seed(0)
    stage = Stage(0, 0, [torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU(), torch.nn.Linear(6, 3))],
                  is_last=True)
    graph = lower(Schedule.from_programs([["0F0", "(0F1;0B0)OVERLAP_F_B", "0B1"]], name="pair"))
    batches = [(torch.randn(4, 6), torch.randint(3, (4,))) for _ in range(2)]
    recorder = Recorder(torch.device("cpu"))
    recorder.begin(True)
    ex = Executor(graph, 0, {0: stage}, comm=None, meter=ActivationMeter(stage.parameters()), recorder=recorder,
                  overlap_timeout_s=overlap_timeout_s)
    if fail:
        forward = ex._compute[Kind.F]

        def second_fails(a, step):
            if a.microbatch == 1:
                raise ValueError("injected failure in 0F1")
            forward(a, step)

        ex._compute[Kind.F] = second_fails
    ex.run_step(batches)
    return [p.grad.clone() for p in stage.parameters()], recorder.rows


def test_a_pair_in_two_threads_equals_one_after_the_other_and_raises_its_forwards_error():
    """The forward of (0F1;0B0) in a thread, its backward in the caller: the same gradients bit for bit, one row
    per part on its stream; an error of the forward's thread is raised by run_step (no hang)."""
    from real.measure import Span

    want, rows = _pair_run(None)
    assert not [key for key, *_ in rows if isinstance(key, Span)]
    got, rows = _pair_run(30.0)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    spans = sorted((k.stream, k.name) for k, *_ in rows if isinstance(k, Span))
    assert spans == [("pair-backward", "0B0"), ("pair-forward", "0F1")]
    with pytest.raises(ValueError, match="injected failure in 0F1"):
        _pair_run(30.0, fail=True)


# -- slow: torchrun launches ----------------------------------------------------------------------------------------

TWO = {
    "1f1b dp2 ep2 ddp": _config(dp=2, ep=2, dp_mode="ddp"),
    "gpipe dp2 ep2 sync top1": _config(schedule="gpipe", dp=2, ep=2, dp_mode="sync",
                                       model=ModelConfig(**{**MOE.to_dict(), "moe_top_k": 1})),
    "1f1b dp2 ep1 moe": _config(dp=2, dp_mode="ddp"),
    # Megatron's EP A2A overlap without a pipeline: (F i+1; B i) pairs of the one stage, in two threads
    "combined-1f1b dp2 ep2 ddp": _config(schedule="combined-1f1b", dp=2, ep=2, microbatches=4, batch_size=32,
                                         dp_mode="ddp"),
}
FOUR = {
    "1f1b pp2 dp2 ep2 ddp": _config(pp=2, dp=2, ep=2, dp_mode="ddp"),
    "1f1b dp4 ep2 ddp": _config(dp=4, ep=2, dp_mode="ddp"),
    "gpipe dp4 ep4 sync 8 experts": _config(schedule="gpipe", dp=4, ep=4, dp_mode="sync",
                                            model=ModelConfig(**{**MOE.to_dict(), "moe_experts": 8})),
    "1f1b dp4 ep2 zero1": _config(dp=4, ep=2, dp_mode="zero1"),
    # I and W: both all-to-alls' backwards run in I (they are on the input's path), W only re-runs weight nodes
    "zb-h1 pp2 dp2 ep2 ddp": _config(schedule="zb-h1", pp=2, dp=2, ep=2, microbatches=4, batch_size=32,
                                     dp_mode="ddp"),
    "dualpipe-v pp2 dp2 ep2 ddp": _config(schedule="dualpipe-v", pp=2, dp=2, ep=2, microbatches=4, batch_size=32,
                                          dp_mode="ddp"),  # overlapped F/B pairs; a rank of 4 stages has no block
    "interleaved-1f1b pp2 dp2 ep2 ddp": _config(schedule="interleaved-1f1b", pp=2, dp=2, ep=2, dp_mode="ddp"),
    "combined-1f1b pp2 v2 dp2 ep2 ddp": _config(schedule="combined-1f1b", pp=2, chunks=2, dp=2, ep=2, microbatches=4,
                                                batch_size=32, dp_mode="ddp"),
    # R runs each forward again, all-to-alls included: every forward phase's bytes twice
    "1f1b pp2 dp2 ep2 recompute full": _config(pp=2, dp=2, ep=2, dp_mode="ddp", recompute="full"),
}


def _launch(nproc: int, runs: dict[str, RunConfig], tmp: Path) -> dict:
    from tests.conftest import launch_worker  # the torchrun workers run this file without the tests package

    return launch_worker(__file__, nproc, {k: c.to_dict() for k, c in runs.items()}, tmp, LAUNCH_TIMEOUT)


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict:
    return _launch(2, TWO, tmp_path_factory.mktemp("moe2"))


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> dict:
    return _launch(4, FOUR, tmp_path_factory.mktemp("moe4"))


def _assert_bytes(label: str, cfg: RunConfig, got: dict) -> None:
    """Each step, each rank's dispatch rows, sent and kept, are its tokens x top_k (x dim x 4 bytes, fp32) for
    every MoE block its stages hold; the combine sends back what the others dispatched to it, and each
    backward all-to-all mirrors a forward one."""
    model, lay = cfg.data.model, cfg.layout
    row = model.dim * 4
    passes = 2 if lay.recompute == "full" else 1  # forwards per microbatch: F, and R before its backward
    tokens = cfg.data.batch_size // lay.dp * model.seq
    blocks = {r: sum(1 for i in cfg_layers(cfg, r % lay.pp) if 0 < i < model.num_layers - 1) for r in range(lay.pp)}
    for rank, steps in enumerate(got["ep_bytes"]):
        assert len(steps) == cfg.steps, label
        for sent in steps:
            sent = {k: sent.get(k, 0) for k in ("dispatch", "dispatch_kept", "combine", "dispatch_grad",
                                                "combine_grad", "counts")}  # a rank without MoE blocks: none
            n = blocks[rank % lay.pp]
            assert sent["dispatch"] + sent["dispatch_kept"] == passes * tokens * model.moe_top_k * row * n, label
            assert passes * sent["dispatch_grad"] == sent["combine"], label
            assert passes * sent["combine_grad"] == sent["dispatch"], label
            assert sent["counts"] == passes * (lay.ep - 1) * model.moe_experts // lay.ep * 8 * lay.microbatches * n
    for step in range(cfg.steps):  # over an ep group, what is dispatched is what comes back
        for pp_rank in range(lay.pp):
            ranks = [d * lay.pp + pp_rank for d in range(lay.dp)]
            assert (sum(got["ep_bytes"][r][step].get("dispatch", 0) for r in ranks)
                    == sum(got["ep_bytes"][r][step].get("combine", 0) for r in ranks)), label


def cfg_layers(cfg: RunConfig, pp_rank: int) -> list[int]:
    plan = make_plan(cfg, cfg.layout.pp * cfg.layout.dp)
    return [i for s in plan.stages_of(pp_rank) for i in plan.layers[s]]


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.parametrize("label", list(TWO))
def test_two_ranks_ep_equals_plain_training(two, label):
    from tests.test_real_equality import _assert_equal_to_reference  # losses and every parameter at 1e-5

    _assert_equal_to_reference(label, TWO[label], two[label])
    if TWO[label].layout.ep > 1:
        _assert_bytes(label, TWO[label], two[label])


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.parametrize("label", list(FOUR))
def test_four_ranks_ep_equals_plain_training(four, label):
    from tests.test_real_equality import _assert_equal_to_reference

    _assert_equal_to_reference(label, FOUR[label], four[label])
    _assert_bytes(label, FOUR[label], four[label])


def _intervals(rows) -> list[tuple[float, float]]:
    return [(float(r.start), float(r.end)) for r in rows.itertuples(index=False)]


def _overlap(a: tuple[float, float], spans: list[tuple[float, float]], holes: list[tuple[float, float]]) -> float:
    """Seconds of ``a`` inside ``spans`` but outside ``holes`` (disjoint ``holes``, a pass's own all-to-alls)."""
    total = 0.0
    for lo, hi in spans:
        lo, hi = max(lo, a[0]), min(hi, a[1])
        if hi > lo:
            total += hi - lo - sum(max(0.0, min(hi, h1) - max(lo, h0)) for h0, h1 in holes)
    return total


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
def test_dualpipe_v_pairs_overlap_one_microbatchs_all_to_all_with_the_others_compute(four):
    """The traced step of dualpipe-v pp2 x dp2 ep2: every pair on the ranks with MoE blocks has its forward and its
    backward on streams of their own inside the pair's row, each all-to-all is on its pass's stream, named after
    it, its bytes summing to the step's ep_bytes; in at least one pair an all-to-all of one microbatch is in flight
    while the other microbatch's pass computes (outside its own all-to-alls)."""
    from analysis.perfetto import to_chrome_trace

    label = "dualpipe-v pp2 dp2 ep2 ddp"
    got = four[label]
    trace = got["trace"]
    a2a = trace[trace["kind"] == "ALL_TO_ALL"]
    assert set(a2a["rank"]) == {1, 3}  # pipeline rank 1 holds the two MoE blocks (stages 1 and 2)
    for rank in (1, 3):
        mine = a2a[a2a["rank"] == rank]
        phases = {}
        for r in mine.itertuples(index=False):
            phase = r.action.strip("0123456789").lower()
            assert r.stream == f"all-to-all-{'backward' if phase.endswith('_grad') else 'forward'}", r
            assert r.action == f"{r.stage}{phase.upper()}{r.microbatch}", r
            phases[phase] = phases.get(phase, 0) + int(r.bytes)
        last = got["ep_bytes"][rank][-1]  # the traced step is the last
        assert phases == {k: v for k, v in last.items() if not k.endswith("_kept")}, (phases, last)
    assert _pair_overlaps(trace, (1, 3)), "no all-to-all of a pair overlaps the other pass's compute"
    names = {e["args"]["name"]: e["tid"] for e in to_chrome_trace(trace)["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 1}
    assert {"compute", "pair-forward", "pair-backward", "all-to-all-forward", "all-to-all-backward"} <= set(names)
    assert len(set(names.values())) == len(names)


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
def test_combined_1f1b_pairs_overlap_one_microbatchs_all_to_all_with_the_others_compute(two):
    """combined-1f1b at pp 1 (Megatron-Core's EP A2A overlap without a pipeline): its (F i+1; B i) pairs of the one
    stage run in two threads, and in at least one an all-to-all of one microbatch is in flight while the other
    microbatch's pass computes."""
    trace = two["combined-1f1b dp2 ep2 ddp"]["trace"]
    pairs = trace[trace["kind"] == "OVERLAP_F_B"]
    assert sorted(pairs["action"][pairs["rank"] == 0]) == [f"(0F{i + 1};0B{i})OVERLAP_F_B" for i in range(3)]
    assert _pair_overlaps(trace, (0, 1)), "no all-to-all of a pair overlaps the other pass's compute"


def _pair_overlaps(trace, ranks) -> int:
    """How many all-to-alls of the pairs on ``ranks`` overlap the other part's compute (its interval less its own
    all-to-alls); each pair has one forward and one backward row of its parts, and all-to-alls on both streams."""
    overlapped = 0
    pairs = trace[(trace["kind"] == "OVERLAP_F_B") & trace["rank"].isin(list(ranks))]
    assert len(pairs)
    for pair in pairs.itertuples(index=False):
        rows = trace[(trace["rank"] == pair.rank) & (trace["start"] >= pair.start) & (trace["end"] <= pair.end)]
        fwd, bwd = (rows[rows["stream"] == f"pair-{p}"] for p in ("forward", "backward"))
        assert len(fwd) == len(bwd) == 1, pair
        assert {fwd.iloc[0].action, bwd.iloc[0].action} == set(pair.action[1:pair.action.index(")")].split(";"))
        f_a2a, b_a2a = (_intervals(rows[rows["stream"] == f"all-to-all-{p}"]) for p in ("forward", "backward"))
        assert f_a2a and b_a2a, pair
        # an all-to-all of one pass against the other pass's compute (its interval less its own all-to-alls)
        overlapped += sum(_overlap(x, _intervals(bwd), b_a2a) > 0 for x in f_a2a)
        overlapped += sum(_overlap(x, _intervals(fwd), f_a2a) > 0 for x in b_a2a)
    return overlapped


def _worker(cfg_file: str, out_file: str) -> None:
    """Runs under torchrun: every configuration of ``cfg_file`` in one process group; rank 0 saves the results,
    with every rank's all-to-all bytes."""
    from datetime import timedelta

    from real import Mesh, run

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    meshes: dict[tuple[int, int, int], Mesh] = {}
    results = {}
    for label, d in json.loads(Path(cfg_file).read_text()).items():
        cfg = RunConfig.from_dict(d)
        key = (cfg.layout.pp, cfg.layout.dp, cfg.layout.ep)
        if key not in meshes:
            meshes[key] = Mesh.create(make_plan(cfg, dist.get_world_size()), "gloo", cfg.runtime.timeout_s)
        r = run(cfg, mesh=meshes[key])
        every = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(r.ep_bytes, every, dst=0)
        if rank == 0:
            results[label] = {"losses": r.losses, "params": r.parameters, "ep_bytes": every, "trace": r.trace}
    if rank == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(*sys.argv[1:3])
