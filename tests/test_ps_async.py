"""async-ps (real.dp.ps_async) checkpointed and resumed bit-identically, and its staleness against the simulator's.

One torchrun launch of 3 gloo processes (2 trainers + 1 server, pp 1) runs every case (this file is its worker):

* staleness 2 with trainer 1 a straggler (``slow_rank`` 1 sleeps :data:`SLOW_S` before each step), checkpointed at
  step 3 (a barrier) in a 6-step run that records the server's order; then the same 6 steps as 3 steps checkpointed
  and a resumed run, both following that order (``run(..., ps_order=)``, no straggler: the order alone decides);
* staleness 0: 2 steps checkpointed, resumed to 4, beside an uninterrupted 4-step run without checkpoints (and, in
  a launch of its own, the server killed at step 3 and restarted by torchrun);
* staleness 2 with the straggler and no checkpoint: the measured max staleness of each trainer against
  :func:`sim.costs.async_ps.simulate_async_ps` at the same speeds (trainer 0's own step time measured, trainer 1's that
  plus :data:`SLOW_S`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig, param_digest  # noqa: E402
from real.checkpoint import CheckpointConfig  # noqa: E402
from sim.costs.async_ps import Cycle, simulate_async_ps  # noqa: E402

LAUNCH_TIMEOUT = 150  # a hang guard
MODEL = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=32, seq=8)
STALENESS, SLOW_S = 2, 0.25


def _config(steps: int, staleness: int, directory: Path | None = None, every: int = 0, slow: bool = False) -> dict:
    ckpt = CheckpointConfig(directory=str(directory), every=every) if directory is not None else None
    extra = {"slow_rank": 1, "slow_s": SLOW_S} if slow else {}
    return RunConfig.of(schedule="1f1b", batch_size=8, steps=steps, model=MODEL, optimizer="sgd", lr=0.1,
                        timeout_s=60, dp=2, microbatches=2, servers=1, dp_mode="async-ps", staleness=staleness,
                        bucket_mb=0.002, checkpoint=ckpt, **extra).to_dict()


def _runs(tmp: Path) -> dict[str, dict]:
    """label -> {"config": RunConfig dict, "replay": the label whose recorded order the servers follow}."""
    return {
        "S2 whole": {"config": _config(6, STALENESS, tmp / "whole", 3, slow=True)},
        "S2 first": {"config": _config(3, STALENESS, tmp / "resumed", 3), "replay": "S2 whole"},
        "S2 resumed": {"config": _config(6, STALENESS, tmp / "resumed", 3), "replay": "S2 whole"},
        "S0 first": {"config": _config(2, 0, tmp / "s0", 2)},
        "S0 resumed": {"config": _config(4, 0, tmp / "s0", 2)},
        "S0 whole": {"config": _config(4, 0)},
        "S2 straggler": {"config": _config(6, STALENESS, slow=True)},
    }


pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT + 10)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    from tests.conftest import launch_worker  # the torchrun workers run this file without the tests package

    tmp = tmp_path_factory.mktemp("psasync")
    return launch_worker(__file__, 3, _runs(tmp), tmp, LAUNCH_TIMEOUT)


def test_resumed_async_ps_at_staleness_2_is_bit_identical_under_the_recorded_order(runs):
    whole, first, resumed = (runs[k] for k in ("S2 whole", "S2 first", "S2 resumed"))
    assert first["start_step"] == 0 and resumed["start_step"] == 3
    assert first["losses"] == whole["losses"][:3]
    assert resumed["losses"] == whole["losses"] and resumed["digest"] == whole["digest"]
    assert resumed["staleness"] == whole["staleness"]
    assert resumed["ps_order"] == whole["ps_order"]
    fast, slow = whole["staleness"][0], whole["staleness"][1]
    assert max(fast) == STALENESS and fast[3] == 0, whole["staleness"]  # step 3 follows the checkpoint's barrier
    assert slow == [0] * 6


def test_resumed_async_ps_at_staleness_0_is_bit_identical_to_an_uninterrupted_run(runs):
    first, resumed, whole = (runs[k] for k in ("S0 first", "S0 resumed", "S0 whole"))
    assert resumed["start_step"] == 2 and first["losses"] == whole["losses"][:2]
    assert resumed["losses"] == whole["losses"] and resumed["digest"] == whole["digest"]
    assert resumed["staleness"] == whole["staleness"] == {0: [0] * 4, 1: [0] * 4}


def test_the_measured_staleness_of_a_straggler_run_is_the_simulated_one(runs):
    got = runs["S2 straggler"]
    own = min(got["step_times"])  # trainer 0's step when nothing holds it back
    sim = simulate_async_ps(Cycle(own, 0.0, 0.0), (1.0, own / (own + SLOW_S)), STALENESS, steps=6)
    assert [max(got["staleness"][r]) for r in (0, 1)] == [t.max_staleness for t in sim.trainers] == [STALENESS, 0]


def _server_rows(trace) -> list:
    """The trace's rows of the server (rank 2): (step, action, stream, end - start > 0), and its updates as
    sim.replay reads them (server_update_times)."""
    from sim.replay import server_update_times

    rows = trace[trace["rank"] == 2]
    return [sorted(zip(rows["step"].astype(int), rows["action"].astype(str), rows["stream"].astype(str),
                       (rows["end"] > rows["start"]).tolist(), strict=True)), len(server_update_times([trace]))]


def test_async_ps_servers_trace_each_update_as_sync_ps_servers_do(runs):
    """The traced step's update (the last of the run) is one {s}OPTIM row of the server on the collective stream,
    which sim.replay reads as the servers' update (the grid's async-ps row's self-calibration)."""
    assert runs["S0 whole"]["server_rows"] == [[(3, "0OPTIM", "collective", True)], 1]
    assert runs["S2 straggler"]["server_rows"] == [[(5, "0OPTIM", "collective", True)], 1]


def _worker(cfg_file: str, out_file: str) -> None:
    """Runs under torchrun: every run of ``cfg_file`` in one process group, in order."""
    from datetime import timedelta

    import torch.distributed as dist

    from real import Mesh, make_plan, run

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh, results, orders = None, {}, {}
    for label, spec in json.loads(Path(cfg_file).read_text()).items():
        cfg = RunConfig.from_dict(spec["config"])
        mesh = mesh or Mesh.create(make_plan(cfg, world), "gloo", cfg.runtime.timeout_s)
        r = run(cfg, mesh=mesh, ps_order=orders.get(spec.get("replay")))
        box = [r.ps_order]
        dist.broadcast_object_list(box, src=0)  # the servers follow rank 0's record of their order
        orders[label] = box[0]
        if rank == 0:
            results[label] = {"losses": r.losses, "digest": param_digest(r.parameters.values()),
                              "start_step": r.start_step, "staleness": r.staleness, "ps_order": r.ps_order,
                              "step_times": r.step_times, "server_rows": _server_rows(r.trace)}
    if rank == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(*sys.argv[1:3])
