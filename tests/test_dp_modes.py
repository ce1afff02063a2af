"""The sharded data-parallel modes (zero1, zero2, zero3/fsdp) resume from a checkpoint bit for bit.

One torchrun launch (gloo, 2 processes, dp=2; this file is also the worker). Per mode: a run of 2 steps
that checkpoints at step 2, a run of 4 steps in the same directory (it resumes at step 2), and an
uninterrupted run of 4 steps; the resumed run's losses and parameters equal the uninterrupted run's
exactly. Checkpoints hold whole tensors under whole-model names in every mode, so one written by zero3
resumes under zero1 and ends equal to plain single-process training (1e-5, SGD).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig, reference_run  # noqa: E402
from real.checkpoint import CheckpointConfig  # noqa: E402

LAUNCH_TIMEOUT = 60  # seconds for the launch (12 runs of 2-4 steps on 2 processes)
MODEL = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8)
MODES = ("zero1", "zero2", "zero3")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT + 10)]


def _config(mode: str, steps: int, directory: Path | None, optimizer: str = "adamw") -> RunConfig:
    return RunConfig.of(schedule="1f1b", dp=2, microbatches=2, batch_size=16, steps=steps, model=MODEL,
                        optimizer=optimizer, lr=0.01, timeout_s=60, dp_mode=mode, bucket_mb=0.002,
                        checkpoint=None if directory is None else CheckpointConfig(directory=str(directory), every=2))


def _runs(tmp: Path) -> dict[str, RunConfig]:
    runs: dict[str, RunConfig] = {}
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
    from tests.conftest import launch_worker

    tmp = tmp_path_factory.mktemp("dpmodes")
    runs = _runs(tmp)
    return runs, launch_worker(__file__, 2, {k: c.to_dict() for k, c in runs.items()}, tmp, LAUNCH_TIMEOUT)


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


def _worker(cfg_file: str, out_file: str) -> None:
    import json
    from datetime import timedelta

    import torch.distributed as dist

    from real import Mesh, make_plan, run

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    mesh, results = None, {}
    for label, d in json.loads(Path(cfg_file).read_text()).items():
        cfg = RunConfig.from_dict(d)
        mesh = mesh or Mesh.create(make_plan(cfg, dist.get_world_size()), "gloo", cfg.runtime.timeout_s)
        r = run(cfg, mesh=mesh)
        if dist.get_rank() == 0:
            results[label] = {"losses": r.losses, "params": r.parameters, "start_step": r.start_step}
    if dist.get_rank() == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(*sys.argv[1:3])
