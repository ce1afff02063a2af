"""Checkpoints and resume with expert parallelism (real.moe, real.checkpoint): bit for bit, and across ep.

An expert's parameters and optimizer state are saved under its whole-model name (``3.experts.5.fc.weight``), once
(DCP keeps one copy of a tensor its expert data-parallel group replicates), and each rank reads back the experts
it holds, so a run resumes with another ep as with another dp. Two torchrun launches (gloo; tests/run_configs.py):

* 2 processes, dp 2 ep 2 (ddp with AdamW; zero1): 2 steps that checkpoint at step 2, 4 steps in the same
  directory (resumed at step 2) and 4 uninterrupted steps; the resumed run's losses and parameters equal the
  uninterrupted run's exactly, and COMPLETE records ep 2. A checkpoint of ep 2 resumes at ep 1 (each rank then
  holds every expert) and ends equal to uninterrupted ep 2 training at 1e-5 (SGD).
* 4 processes, pp 2 x dp 2 ep 2 (ddp) and dp 4 ep 2 (zero1: the experts' optimizer state sharded over their
  expert data-parallel group of 2): the same bit-for-bit resume.

Fast: a checkpoint of another moe_experts is refused in one line naming both values, before anything runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig  # noqa: E402
from real.checkpoint import CheckpointConfig, read_metadata  # noqa: E402
from schedules import CheckpointError  # noqa: E402

LAUNCH_TIMEOUT = 120  # seconds for a whole launch (9 or 6 runs of 2-4 steps, on a busy 2-core machine)
MOE = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8, moe_experts=4, moe_top_k=2)


def _config(steps: int, directory: Path | None, **kw) -> RunConfig:
    base = dict(schedule="1f1b", dp=2, ep=2, microbatches=2, batch_size=16, model=MOE, optimizer="adamw", lr=0.01,
                timeout_s=60, dp_mode="ddp", bucket_mb=0.002)
    return RunConfig.of(**{**base, **kw}, steps=steps,
                        checkpoint=None if directory is None else CheckpointConfig(directory=str(directory), every=2))


def _resumes(label: str, tmp: Path, **kw) -> dict[str, RunConfig]:
    """first (2 steps, checkpointed at 2), resumed (to 4 from it) and plain (4 steps, no checkpoint)."""
    return {f"{label} first": _config(2, tmp / label, **kw), f"{label} resumed": _config(4, tmp / label, **kw),
            f"{label} plain": _config(4, None, **kw)}


def _two(tmp: Path) -> dict[str, RunConfig]:
    runs = {**_resumes("dp2 ep2 ddp", tmp), **_resumes("dp2 ep2 zero1", tmp, dp_mode="zero1")}
    # SGD (momentum): AdamW's division by a near-zero gradient's own size turns float reordering into ~1e-4
    runs["ep2 -> ep1 first"] = _config(2, tmp / "cross", optimizer="sgd")
    runs["ep2 -> ep1 resumed"] = _config(4, tmp / "cross", optimizer="sgd", ep=1)
    runs["ep2 -> ep1 plain"] = _config(4, None, optimizer="sgd")
    return runs


def _four(tmp: Path) -> dict[str, RunConfig]:
    return {**_resumes("pp2 dp2 ep2 ddp", tmp, pp=2), **_resumes("dp4 ep2 zero1", tmp, dp=4, dp_mode="zero1")}


def _launched(nproc: int, make, tmp: Path) -> tuple[dict[str, RunConfig], dict, Path]:
    from tests.conftest import launch_runs

    runs = make(tmp)
    return runs, launch_runs(runs, nproc, tmp, LAUNCH_TIMEOUT), tmp


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _launched(2, _two, tmp_path_factory.mktemp("moeckpt2"))


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _launched(4, _four, tmp_path_factory.mktemp("moeckpt4"))


def _assert_resumed_bit_for_bit(got: dict, label: str) -> None:
    first, resumed, plain = (got[f"{label} {k}"] for k in ("first", "resumed", "plain"))
    assert first["start_step"] == 0 and resumed["start_step"] == 2, label
    assert resumed["losses"] == plain["losses"] and len(plain["losses"]) == 4, label
    assert resumed["losses"][:2] == first["losses"], label
    assert list(resumed["params"]) == list(plain["params"]), label
    assert any(".experts." in name for name in plain["params"]), label
    for name, t in plain["params"].items():
        assert torch.equal(resumed["params"][name], t), f"{label}: {name} differs after resuming"


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.parametrize("label", ["dp2 ep2 ddp", "dp2 ep2 zero1"])
def test_two_ranks_ep_resume_bit_for_bit(two, label):
    _, got, tmp = two
    _assert_resumed_bit_for_bit(got, label)
    info = json.loads((tmp / label / "step_000002" / "COMPLETE").read_text())
    assert (info["pp"], info["dp"], info["ep"], info["config"]["layout"]["ep"]) == (1, 2, 2, 2)
    assert info["config"]["data"]["model"]["moe_experts"] == 4
    # every expert of every MoE block once, with its AdamW state, however ranks shared them
    keys = read_metadata(tmp / label / "step_000002").state_dict_metadata
    experts = {tuple(k.split(".")[1:4:2]) for k in keys if k.startswith("model.") and ".experts." in k}
    blocks = {b for b, _ in experts}
    assert len(blocks) == MOE.layers and experts == {(b, str(e)) for b in blocks for e in range(4)}, experts
    assert {f"optim.{k[len('model.'):]}.exp_avg" for k in keys if k.startswith("model.")} <= set(keys)


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
def test_an_ep2_checkpoint_resumes_at_ep1_as_uninterrupted_ep2_training(two):
    _, got, _ = two
    first, resumed, plain = (got[f"ep2 -> ep1 {k}"] for k in ("first", "resumed", "plain"))
    assert resumed["start_step"] == 2 and resumed["losses"][:2] == first["losses"]
    assert max(abs(a - b) for a, b in zip(resumed["losses"], plain["losses"], strict=True)) <= 1e-5
    assert list(resumed["params"]) == list(plain["params"])
    for name, t in plain["params"].items():
        diff = float((resumed["params"][name] - t).abs().max())
        assert diff <= 1e-5, f"{name}: {diff:.3g}"  # the experts' gradients summed in another order


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.parametrize("label", ["pp2 dp2 ep2 ddp", "dp4 ep2 zero1"])
def test_four_ranks_ep_resume_bit_for_bit(four, label):
    _, got, _ = four
    _assert_resumed_bit_for_bit(got, label)


def test_a_checkpoint_of_other_experts_is_refused_in_one_line_naming_both(monkeypatch, tmp_path):
    from real import train

    saved = _config(4, tmp_path)
    old = SimpleNamespace(step=2, path=tmp_path / "step_000002",
                          info={"config": saved.to_dict(), "losses": [1.0, 1.0], "ep": 2})
    monkeypatch.setattr(train.ckpt, "latest_complete", lambda _: old)
    assert train.resume_point(_config(4, tmp_path, ep=1, dp=4)) is old  # another ep or dp: resharded on load
    other = _config(4, tmp_path, model=ModelConfig(**{**MOE.to_dict(), "moe_experts": 8}))
    with pytest.raises(CheckpointError) as exc:
        train.resume_point(other)
    assert str(exc.value) == (f"checkpoint {old.path} was written with model moe_experts 4, this run has moe_experts "
                              "8; use the same model to resume, or another checkpoint directory")
