"""The parameter server (dp mode ps, :mod:`real.dp.ps`) for real: equal to plain training, memory, resume.

One torchrun launch of 3 gloo processes runs every case in one process group (this file is also its
worker): 2 trainers + 1 server (pp 1), 1 trainer x pp 2 + 1 server (zb-h1: split backwards), 1 trainer +
2 servers (every bucket split in two shards), and the pp 2 case checkpointed at step 2 and resumed to
step 4 beside an uninterrupted 4-step run. Each is compared with :func:`real.reference_run` (losses and
every parameter to 1e-5, SGD with momentum); the resumed run is bit-identical to the uninterrupted one.
The same launch runs async-ps (:mod:`real.dp.ps_async`): at staleness 0 bit-identical to ps, and at staleness 2
with trainer 1 delayed by :data:`DELAY_S` every step, where the logged staleness reaches the bound and never
passes it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig, make_plan, param_digest, reference_run  # noqa: E402
from real.checkpoint import CheckpointConfig  # noqa: E402
from sim.memory import rank_memory, server_memory  # noqa: E402

TOL = 1e-5
LAUNCH_TIMEOUT = 150  # seconds for the whole 3-process launch (7 short runs), with room for a busy machine
MODEL = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8)
KEYS = ("param_bytes", "grad_bytes", "optimizer_bytes")


def _config(schedule: str, **kw) -> RunConfig:
    base = dict(schedule=schedule, batch_size=16, steps=3, model=MODEL, optimizer="sgd", lr=0.1, timeout_s=60,
                dp_mode="ps", bucket_mb=0.002)
    return RunConfig.of(**{**base, **kw})


RUNS = {
    "2 trainers + 1 server": _config("1f1b", dp=2, microbatches=2, servers=1),
    "1 trainer pp2 + 1 server": _config("zb-h1", pp=2, microbatches=4, servers=1),
    "1 trainer + 2 servers": _config("1f1b", microbatches=2, servers=2),
}


STALENESS, DELAY_S = 2, 0.3
ASYNC = {
    "async-ps staleness 0": _config("1f1b", dp=2, microbatches=2, servers=1, dp_mode="async-ps"),
    "async-ps staleness 2, trainer 1 delayed": _config("1f1b", dp=2, microbatches=2, servers=1, dp_mode="async-ps",
                                                        staleness=STALENESS, steps=6),
}


def _resume_runs(directory: Path) -> dict[str, RunConfig]:
    ckpt = CheckpointConfig(directory=str(directory), every=2)
    return {"resume: first 2 steps": _config("zb-h1", pp=2, microbatches=4, servers=1, steps=2, checkpoint=ckpt),
            "resume: steps 2-3": _config("zb-h1", pp=2, microbatches=4, servers=1, steps=4, checkpoint=ckpt),
            "resume: uninterrupted": _config("zb-h1", pp=2, microbatches=4, servers=1, steps=4)}


pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT + 10)]


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> dict:
    from tests.conftest import launch_worker  # the torchrun workers run this file without the tests package

    tmp = tmp_path_factory.mktemp("ps3")
    runs = {**RUNS, **_resume_runs(tmp / "ckpt"), **ASYNC}
    return launch_worker(__file__, 3, {k: c.to_dict() for k, c in runs.items()}, tmp, LAUNCH_TIMEOUT)


@pytest.mark.parametrize("label", list(RUNS))
def test_ps_equals_plain_training(three, label):
    cfg, got = RUNS[label], three[label]
    ref_losses, ref_params = reference_run(cfg)
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref_losses, strict=True))
    assert len(got["losses"]) == cfg.steps and worst <= TOL, f"{label}: {got['losses']} vs {ref_losses}"
    assert list(got["params"]) == list(ref_params)
    for name, ref in ref_params.items():
        diff = float((got["params"][name] - ref).abs().max())
        assert diff <= TOL, f"{label}: parameter {name} differs from the reference by {diff:.3g}"


@pytest.mark.parametrize("label", list(RUNS))
def test_ps_trace_has_a_push_and_a_pull_per_bucket(three, label):
    """Every trainer pushes (REDUCE_SCATTER) and pulls (ALL_GATHER) each bucket of its stages once a step."""
    cfg, trace = RUNS[label], three[label]["trace"]
    coll = trace[trace["stream"] == "collective"]
    for rank in range(cfg.layout.pp * cfg.layout.dp):
        mine = coll[coll["rank"] == rank]
        pushes = sorted(mine[mine["kind"] == "REDUCE_SCATTER"]["action"])
        pulls = sorted(mine[mine["kind"] == "ALL_GATHER"]["action"])
        assert pushes and [a.replace("REDUCE_SCATTER", "") for a in pushes] == [a.replace("ALL_GATHER", "")
                                                                                  for a in pulls]
    trainers = cfg.layout.pp * cfg.layout.dp
    assert set(trace[trace["stream"] != "collective"]["rank"]) == set(range(trainers)), "servers run no passes"
    _check_server_updates(cfg, trace, trainers)


def _check_server_updates(cfg: RunConfig, trace, trainers: int) -> None:
    """Trainers step nothing: each server traces one update ({s}OPTIM, collective stream) per stage and step, the
    last stage first (real.dp.ps.ParamServer.step), on the server's own clock; the trace replays with them."""
    from sim.replay import replay, server_updates

    optim = trace[trace["kind"] == "OPTIM"]
    assert set(optim["stream"]) == {"collective"} and set(optim["rank"]) == set(range(trainers, cfg.world_size))
    stages = list(range(cfg.layout.pp))[::-1]  # one stage per pipeline rank here
    for (step, rank), rows in optim.groupby(["step", "rank"]):
        rows = rows.sort_values("start")
        assert list(rows["action"]) == [f"{s}OPTIM" for s in stages], (step, rank)
        assert (rows["start"] < rows["end"]).all() and (rows["end"].to_numpy()[:-1] <= rows["start"].to_numpy()[1:]).all()
    for step, part in trace.groupby("step"):
        assert sorted(server_updates(part, trainers)) == sorted(stages), step
    if cfg.layout.dp > 1:  # a data-parallel trace replays on the ps graph, each server update as long as traced
        assert len(replay(trace)) == len(set(trace["step"]))


@pytest.mark.parametrize("label", list(RUNS))
def test_ps_memory_per_rank_matches_the_simulator(three, label):
    """Trainers: whole weights and gradients, no optimizer state; servers: 1/K of all three (within 5%)."""
    cfg, got = RUNS[label], three[label]
    plan = make_plan(cfg, cfg.world_size)
    sizes = [sum(t.numel() for n, t in got["params"].items() if int(n.split(".", 1)[0]) in plan.layers[s])
             for s in range(plan.num_stages)]
    memory = sorted(got["memory"], key=lambda m: m["rank"])
    assert [m["rank"] for m in memory] == list(range(cfg.world_size))
    for m in memory:
        if m.get("server") is not None:
            want = server_memory(sizes, cfg.sync.servers, optimizer_bytes=4)  # SGD: one momentum buffer
        else:
            want = rank_memory(plan.graph, sizes, m["pp_rank"], "ps", cfg.layout.dp,
                               microbatch_bytes=m["activation_bytes_per_microbatch"])
            assert m["optimizer_bytes"] == 0 == want["optimizer_bytes"]
        for key in KEYS:
            if want[key]:
                assert abs(m[key] - want[key]) <= 0.05 * want[key], f"{label} rank {m['rank']} {key}: {m[key]} vs {want[key]}"


def test_ps_resume_is_bit_identical(three):
    first, resumed, whole = (three[k] for k in ("resume: first 2 steps", "resume: steps 2-3", "resume: uninterrupted"))
    assert first["start_step"] == 0 and resumed["start_step"] == 2
    assert resumed["losses"] == whole["losses"]
    assert resumed["digest"] == whole["digest"]
    assert first["losses"] == whole["losses"][:2]


def test_async_ps_at_staleness_0_is_sync_ps_exactly(three):
    sync, got = three["2 trainers + 1 server"], three["async-ps staleness 0"]
    assert got["losses"] == sync["losses"] and got["digest"] == sync["digest"]
    assert got["staleness"] == {0: [0, 0, 0], 1: [0, 0, 0]}


def test_async_ps_staleness_reaches_its_bound_and_never_passes_it(three):
    """Trainer 1 sleeps before every step: trainer 0 runs ahead until the bound holds it back."""
    got = three["async-ps staleness 2, trainer 1 delayed"]
    fast, slow = got["staleness"][0], got["staleness"][1]
    assert len(fast) == len(slow) == 6
    assert max(fast) == STALENESS and min(fast + slow) >= 0, got["staleness"]
    assert max(slow) == 0, "the slowest trainer is never ahead"
    assert all(abs(x) < 10 for x in got["losses"])


@pytest.mark.timeout(130)
def test_a_dead_server_is_named_and_torchrun_restarts_the_group_bit_identically(three, tmp_path):
    """The server is killed at step 1 (first attempt); the trainers name it; the restarted group resumes from the
    step-1 checkpoint and ends with the parameters of the uninterrupted run above, bit for bit."""
    from real.launch import torchrun

    cfg, m = RUNS["2 trainers + 1 server"], MODEL
    argv = ["-m", "real", "--schedule", "1f1b", "--pp", "1", "--microbatches", "2", "--batch-size", "16",
            "--steps", str(cfg.steps), "--optimizer", "sgd", "--lr", "0.1", "--bucket-mb", "0.002", "--timeout", "60",
            "--layers", str(m.layers), "--dim", str(m.dim), "--heads", str(m.heads), "--vocab", str(m.vocab),
            "--seq", str(m.seq), "--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--checkpoint-dir",
            str(tmp_path / "ck"), "--checkpoint-every", "1", "--fail-at-step", "1", "--fail-rank", "2", "--json"]
    proc = torchrun(3, argv, timeout=120, capture=True, launcher_args=["--max-restarts=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "parameter server 0 (rank 2) failed the push of stage 0 bucket 0: it died or hangs" in proc.stderr
    got = json.loads(proc.stdout)
    assert got["restart_count"] == 1 and got["start_step"] == 1
    assert got["param_sha256"] == three["2 trainers + 1 server"]["digest"][1]
    assert got["losses"] == three["2 trainers + 1 server"]["losses"]


def _worker(cfg_file: str, out_file: str) -> None:
    """Runs under torchrun: every configuration of ``cfg_file`` in one process group."""
    from datetime import timedelta

    import torch.distributed as dist

    from real import Mesh, run
    from real.executor import Executor

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    meshes: dict[tuple[int, int, int], Mesh] = {}
    results = {}
    for label, d in json.loads(Path(cfg_file).read_text()).items():
        cfg = RunConfig.from_dict(d)
        key = (cfg.layout.pp, cfg.layout.dp, cfg.sync.servers)
        if key not in meshes:
            meshes[key] = Mesh.create(make_plan(cfg, world), "gloo", cfg.runtime.timeout_s)
        plain = Executor.run_step
        if "delayed" in label and rank == 1:
            def slow(self, batches, _plain=plain):
                time.sleep(DELAY_S)
                return _plain(self, batches)

            Executor.run_step = slow
        r = run(cfg, mesh=meshes[key])
        Executor.run_step = plain
        if rank == 0:
            results[label] = {"losses": r.losses, "params": r.parameters, "trace": r.trace, "memory": r.memory,
                              "start_step": r.start_step, "digest": param_digest(r.parameters.values()),
                              "staleness": r.staleness}
    if rank == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(*sys.argv[1:3])
