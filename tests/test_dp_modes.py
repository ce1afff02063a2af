"""The sharded data-parallel modes (zero1, zero2, zero3/fsdp): resume, memory, every schedule.

Two torchrun launches (gloo; tests/run_configs.py):

* 4 processes: every registered schedule at pp 2 x dp 2, with zero2 or zero3 in turn, equals
  single-process training to 1e-5 after 3 steps.
* 2 processes (dp 2), per sharded mode: 2 steps that checkpoint at step 2, 4 steps in the same
  directory (resumed at step 2) and 4 uninterrupted steps; the resumed run's losses and parameters equal
  the uninterrupted run's exactly. Checkpoints hold whole tensors under whole-model names in every
  mode, so one written by zero3 resumes under zero1 and ends equal to plain training (1e-5, SGD).
  The uninterrupted runs of every mode (and none: pp 2) give the memory per rank and category, checked
  against the simulator's figure within 5%.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig, reference_run  # noqa: E402
from real.checkpoint import CheckpointConfig  # noqa: E402
from real.config import make_plan  # noqa: E402
from sim.memory import rank_memory  # noqa: E402

LAUNCH_TIMEOUT = 150  # seconds for the launch (12 runs of 2-4 steps on 2 processes)
MODEL = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8)
MODES = ("zero1", "zero2", "zero3")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT + 10)]


def _config(mode: str, steps: int, directory: Path | None, optimizer: str = "adamw") -> RunConfig:
    return RunConfig.of(schedule="1f1b", dp=2, microbatches=2, batch_size=16, steps=steps, model=MODEL,
                        optimizer=optimizer, lr=0.01, timeout_s=60, dp_mode=mode, bucket_mb=0.002,
                        checkpoint=None if directory is None else CheckpointConfig(directory=str(directory), every=2))


def _runs(tmp: Path) -> dict[str, RunConfig]:
    runs: dict[str, RunConfig] = {"none plain": RunConfig.of(schedule="1f1b", pp=2, microbatches=2, batch_size=16, steps=4,
                                                             model=MODEL, optimizer="adamw", lr=0.01, timeout_s=60)}
    runs.update({f"{mode} plain": _config(mode, 4, None) for mode in ("sync", "ddp")})
    for mode in MODES:
        runs[f"{mode} first"] = _config(mode, 2, tmp / mode)
        runs[f"{mode} resumed"] = _config(mode, 4, tmp / mode)
        runs[f"{mode} plain"] = _config(mode, 4, None)
    # SGD (momentum): AdamW's division by a near-zero gradient's own size turns float reordering into ~1e-4
    runs["zero3 -> zero1 first"] = _config("zero3", 2, tmp / "cross", "sgd")
    runs["zero3 -> zero1 resumed"] = _config("zero1", 4, tmp / "cross", "sgd")
    return runs


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[dict[str, RunConfig], dict]:
    from tests.conftest import launch_runs

    tmp = tmp_path_factory.mktemp("dpmodes")
    runs = _runs(tmp)
    return runs, launch_runs(runs, 2, tmp, LAUNCH_TIMEOUT)


@pytest.mark.parametrize("mode", MODES)
def test_a_sharded_mode_resumes_bit_for_bit(launched, mode):
    _, got = launched
    resumed, plain = got[f"{mode} resumed"], got[f"{mode} plain"]
    assert got[f"{mode} first"]["start_step"] == 0 and resumed["start_step"] == 2
    assert resumed["losses"] == plain["losses"] and len(plain["losses"]) == 4
    assert list(resumed["params"]) == list(plain["params"])
    for name, t in plain["params"].items():
        assert torch.equal(resumed["params"][name], t), f"{mode}: {name} differs after resuming"


def test_a_zero3_checkpoint_resumes_under_zero1_as_plain_training(launched):
    runs, got = launched
    resumed = got["zero3 -> zero1 resumed"]
    assert resumed["start_step"] == 2 and resumed["losses"][:2] == got["zero3 -> zero1 first"]["losses"]
    ref_losses, ref_params = reference_run(runs["zero3 -> zero1 resumed"])
    assert max(abs(a - b) for a, b in zip(resumed["losses"], ref_losses, strict=True)) <= 1e-5
    for name, t in ref_params.items():
        diff = float((resumed["params"][name] - t).abs().max())
        assert diff <= 1e-5, f"{name}: {diff:.3g}"  # microbatches summed in another order than the reference


def _predicted(cfg: RunConfig, params: dict[str, torch.Tensor], rank: int, per_mb: int) -> dict[str, float]:
    """The simulator's bytes for pipeline rank ``rank`` (fp32 weights and gradients, AdamW)."""
    plan = make_plan(cfg, cfg.world_size)
    sizes = [sum(t.numel() for n, t in params.items() if int(n.split(".", 1)[0]) in plan.layers[s])
             for s in range(plan.num_stages)]
    return rank_memory(plan.graph, sizes, rank, cfg.sync.dp_mode, cfg.layout.dp, microbatch_bytes=per_mb)


MEMORY_TOL = 0.05  # the memory table's bound; measured off by < 1% (bucket padding, AdamW's step counters)


@pytest.mark.parametrize("mode", ["none", "sync", "ddp", *MODES])
def test_memory_per_rank_by_category_is_the_simulators_within_5_percent(launched, mode):
    runs, got = launched
    cfg, run_ = runs[f"{mode} plain"], got[f"{mode} plain"]
    for mem in run_["memory"]:
        want = _predicted(cfg, run_["params"], mem["pp_rank"], mem["activation_bytes_per_microbatch"])
        if mode not in ("zero3",):
            assert mem.get("gathered_param_bytes", 0) == 0 and want["gathered_param_bytes"] == 0
        for key, value in want.items():
            if key == "gathered_param_bytes" and mode != "zero3":
                continue
            assert abs(mem[key] - value) <= MEMORY_TOL * value, f"{mode} rank {mem['rank']} {key}: {mem[key]} vs {value}"
        if mode in ("zero2", "zero3"):  # at its peak too, shard + in flight < a whole gradient (dp 2: twice the shard)
            assert 0 < mem["grad_bytes"] + mem["inflight_grad_bytes"] < 2 * mem["grad_bytes"], mem


FOUR_TIMEOUT = 180  # seconds for the 4-process launch of 12 runs (measured 37 s on 2 shared cores)
SHARDED = ("zero2", "zero3")  # sync, ddp and zero1 at pp 2 x dp 2: test_real_equality's FOUR


def _every_schedule() -> dict[str, RunConfig]:
    """Every registered schedule at pp 2 x dp 2 (its pp=2 configuration of test_real_equality, batch 32),
    zero2 and zero3 taken in turn: each meets six schedules."""
    from tests.test_real_equality import PP2

    return {f"{name} pp2 dp2 {SHARDED[i % 2]}":
            RunConfig.of(**{**cfg.to_dict()["layout"], "dp": 2}, batch_size=32, steps=3, model=cfg.data.model,
                         optimizer="sgd", lr=0.1, timeout_s=60, dp_mode=SHARDED[i % 2],
                         bucket_mb=0.004)
            for i, (name, cfg) in enumerate(sorted(PP2.items()))}


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> tuple[dict[str, RunConfig], dict]:
    from tests.conftest import launch_runs

    runs = _every_schedule()
    return runs, launch_runs(runs, 4, tmp_path_factory.mktemp("dpmodes4"), FOUR_TIMEOUT)


@pytest.mark.timeout(FOUR_TIMEOUT + 10)
@pytest.mark.parametrize("label", list(_every_schedule()))
def test_every_schedule_at_pp2_dp2_equals_plain_training(four, label):
    from tests.test_real_equality import _assert_equal_to_reference

    runs, got = four
    _assert_equal_to_reference(label, runs[label], got[label])
