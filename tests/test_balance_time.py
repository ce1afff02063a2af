"""``balance="time"`` on two ranks: rank 0's profiled split is the one every rank uses, and training is exact.

One torchrun launch (gloo, 2 processes, pp=2) trains a small user model with
``balance="time"``. Each rank's own profile would differ (timings do); to make
that certain, rank 1's profiler is made to return another valid split. Both ranks
train with rank 0's split, which they report, and the losses and every
parameter equal plain single-process training with that split to 1e-5. This
file is also the worker.
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

from real import RunConfig, UserModel  # noqa: E402
from real.reference import reference_user_run  # noqa: E402

TOL = 1e-5
LAUNCH_TIMEOUT = 120  # seconds: a hang guard, with room for a loaded 2-core CI machine
BATCH = 8


def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(500 + step)
    x = torch.randn(BATCH, 10, generator=g)
    return x, x[:, :4].argmax(-1)


def make_user() -> UserModel:
    """Six blocks, each with parameters (any split of them into two stages is valid), one much heavier."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(10, 2048), nn.Linear(2048, 10), nn.Linear(10, 10), nn.Linear(10, 10),
                        nn.Linear(10, 10), nn.Linear(10, 4))
    return UserModel(model=net, loss=F.cross_entropy, batches=batches)


def _config(**kw) -> RunConfig:
    return RunConfig.of(schedule="1f1b", pp=2, microbatches=2, batch_size=BATCH, steps=3, optimizer="sgd", lr=0.1,
                        timeout_s=30, **kw)


# What rank 1 "profiles": the last block alone. Rank 0's real profile cannot give it: blocks 0 and 1 (10x2048,
# 2048x10) each take longer than the light last block, so a stage of blocks 0..4 is never the balanced choice.
RANK1_SPLIT = (5, 1)


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 15)
def test_every_rank_trains_with_rank_0s_profiled_split(tmp_path):
    from tests.conftest import launch_self

    reports = launch_self(__file__, 2, tmp_path, LAUNCH_TIMEOUT)
    profiled = [tuple(r["profiled"]) for r in reports]
    used = [tuple(r["split"]) for r in reports]
    assert profiled[1] == RANK1_SPLIT != profiled[0]  # rank 1's own profile says otherwise
    assert used == [profiled[0], profiled[0]]  # both train with rank 0's

    got = torch.load(tmp_path / "out.pt", weights_only=False)
    ref_losses, ref_params = reference_user_run(make_user(), _config(split=used[0]))
    assert max(abs(a - b) for a, b in zip(got["losses"], ref_losses, strict=True)) <= TOL
    assert sorted(got["params"]) == sorted(ref_params)
    for name, ref in ref_params.items():
        assert float((got["params"][name] - ref).abs().max()) <= TOL, name


def _worker(out: str) -> None:
    import real.model_api as api
    from real import run

    rank = int(os.environ["RANK"])
    real_split, seen = api.balance_split, []

    def profile(blocks, sample, num_stages):
        split = real_split(blocks, sample, num_stages)
        if rank == 1:  # a rank 1 whose profile disagrees with rank 0's
            split = RANK1_SPLIT
        seen.append(split)
        return split

    api.balance_split = profile
    result = run(_config(balance="time"), user=make_user())
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"profiled": seen[0],
                                                             "split": result.config.layout.split}))
    if rank == 0:
        torch.save({"losses": result.losses, "params": result.parameters}, Path(out) / "out.pt")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(sys.argv[1])
