"""A user's own model, split three ways, trains exactly as plain single-process training does.

The model is not a transformer: linear, GELU, an ``Unflatten`` to (4, 6), a
1-D convolution, ``Flatten``, linear, tanh, linear: 8 blocks with stage
boundaries of three different shapes ((B, 4, 6), (B, 8, 6), (B, 16)). One
torchrun launch (gloo, 2 processes) runs every registered schedule at pp=2 on
it, with uneven stages (blocks 3+5 for two stages by ``split``; 3,1,2,2 for four
by ``boundaries``), and the same model given as a list of two stage modules and
as a module traced by torch.distributed.pipelining (``pipe_split()`` in its
forward). Losses and every parameter after three steps agree with
:func:`real.reference.reference_user_run` to 1e-5. This file is also the worker.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812
from torch import nn  # noqa: E402

import schedules  # noqa: E402
from real import RunConfig, UserModel, make_plan  # noqa: E402
from real.reference import reference_user_run  # noqa: E402
from schedules import SchedlabError  # noqa: E402

TOL = 1e-5
LAUNCH_TIMEOUT = 45  # seconds for the launch; a hang fails the test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT + 10)]
BATCH = 16


def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch of ``step``: Gaussian inputs labelled by a fixed rule."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 12, generator=g)
    return x, (x[:, :5] * torch.arange(1, 6)).argmax(-1)


def blocks() -> nn.Sequential:
    return nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.Unflatten(1, (4, 6)), nn.Conv1d(4, 8, 3, padding=1),
                         nn.Flatten(), nn.Linear(48, 16), nn.Tanh(), nn.Linear(16, 5))


class Traced(nn.Module):
    """The same computation as one module, marked for torch's tracer."""

    def __init__(self) -> None:
        super().__init__()
        self.body = blocks()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.pipelining import pipe_split

        for i, block in enumerate(self.body):
            if i == 3:
                pipe_split()
            x = block(x)
        return x


def make_user(form: str) -> UserModel:
    """A fresh model of ``form`` (the same initial parameters every call)."""
    torch.manual_seed(0)
    if form == "traced":
        model = Traced()
    else:
        model = blocks()
        if form == "stages":
            model = [model[:3], model[3:]]
    return UserModel(model=model, loss=F.cross_entropy, batches=batches)


def _config(schedule: str, **kw) -> RunConfig:
    return RunConfig.of(**{**dict(schedule=schedule, batch_size=BATCH, steps=3, optimizer="sgd", lr=0.1,
                                  timeout_s=60), **kw})


def _runs() -> tuple[dict[str, tuple[str, RunConfig]], dict[str, str]]:
    runs, skipped = {}, {}
    for name in schedules.names():
        reason = ""
        for m in (4, 8):
            cfg = _config(name, pp=2, microbatches=m,  # combined-1f1b takes v 2 at pp 2
                          **({"chunks": 2} if schedules.spec(name).any_chunks else {}))
            try:
                stages = make_plan(cfg, 2, num_layers=8, what="blocks").num_stages
            except SchedlabError as exc:
                reason = str(exc)
                continue
            split = dict(split=(3, 5)) if stages == 2 else dict(boundaries=(3, 4, 6))
            runs[name] = ("blocks", _config(name, pp=2, microbatches=m, chunks=cfg.layout.chunks, **split))
            break
        else:
            skipped[name] = reason
    runs["stage modules 1f1b"] = ("stages", _config("1f1b", pp=2, microbatches=4))
    runs["traced zb-h1"] = ("traced", _config("zb-h1", pp=2, microbatches=4))
    return runs, skipped


RUNS, SKIPPED = _runs()


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict:
    from tests.conftest import launch_worker  # the torchrun workers run this file without the tests package

    return launch_worker(__file__, 2, {k: [form, c.to_dict()] for k, (form, c) in RUNS.items()},
                         tmp_path_factory.mktemp("user2"), LAUNCH_TIMEOUT)


def _check(label: str, form: str, cfg: RunConfig, got: dict) -> None:
    ref_losses, ref_params = reference_user_run(make_user(form), cfg)
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref_losses, strict=True))
    assert worst <= TOL, f"{label}: losses {got['losses']} vs reference {ref_losses}"
    params = got["params"]
    if form == "traced":  # "{stage}.{qualified name}" -> the module's own name
        params = {name.split(".", 1)[1]: t for name, t in params.items()}
    assert sorted(params) == sorted(ref_params), f"{label}: parameter names differ"
    for name, ref in ref_params.items():
        diff = float((params[name] - ref).abs().max())
        assert diff <= TOL, f"{label}: parameter {name} differs from the reference by {diff:.3g}"


def test_every_schedule_builds_for_a_user_model():
    """The skip below is for a schedule that stops building at pp=2; none may (each one would go untested)."""
    assert SKIPPED == {}


@pytest.mark.parametrize("label", list(RUNS))
def test_user_model_on_two_ranks_equals_plain_training(launched, label):
    if label in SKIPPED:
        pytest.skip(SKIPPED[label])
    form, cfg = RUNS[label]
    _check(label, form, cfg, launched[label])


def test_boundaries_of_other_shapes_travel_with_their_shapes(launched):
    """The trace's p2p bytes are those of each boundary's shape: (4,6), (8,6), (16) floats per sample."""
    trace = launched["1f1b"]["trace"]
    mb = BATCH // RUNS["1f1b"][1].layout.microbatches
    sends = trace[trace["kind"] == "SEND_F"]
    assert set(sends["bytes"]) == {mb * 4 * 6 * 4}  # stage 0 (blocks 0..2) ends in (B, 4, 6) float32
    trace4 = launched["interleaved-1f1b"]["trace"]
    mb4 = BATCH // RUNS["interleaved-1f1b"][1].layout.microbatches
    by_stage = trace4[trace4["kind"] == "SEND_F"].groupby("stage")["bytes"].unique()
    assert {s: list(b) for s, b in by_stage.items()} == {0: [mb4 * 24 * 4], 1: [mb4 * 48 * 4], 2: [mb4 * 16 * 4]}


def _worker(cfg_file: str, out_file: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from real import Mesh, run

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    meshes, results = {}, {}
    for label, (form, d) in json.loads(Path(cfg_file).read_text()).items():
        cfg = RunConfig.from_dict(d)
        key = (cfg.layout.pp, cfg.layout.dp)
        if key not in meshes:
            meshes[key] = Mesh.create(make_plan(cfg, 2, num_layers=8, what="blocks"), "gloo", 60)
        r = run(cfg, mesh=meshes[key], user=make_user(form))
        if rank == 0:
            results[label] = {"losses": r.losses, "params": r.parameters, "trace": r.trace}
    if rank == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(*sys.argv[1:3])
