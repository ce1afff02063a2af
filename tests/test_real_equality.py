"""Real multi-process runs equal plain single-process training, for every registered schedule.

Three torchrun launches (gloo: 2 processes, 2 with recomputation, 4) each run
many configurations in one process group; this file is also the worker they start. Every run
is compared with :func:`real.reference_run` (the whole model, a plain loop
over microbatches) computed here: losses and every parameter to 1e-5 after
three steps. Rank 1 reads a clock 1000 s ahead of rank 0's, so the merged
traces are only right if the clock offsets are measured and applied.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import schedules  # noqa: E402
from real import ModelConfig, RunConfig, make_plan, reference_run  # noqa: E402
from real.launch import torchrun  # noqa: E402
from schedules import SchedlabError  # noqa: E402

TOL = 1e-5
LAUNCH_TIMEOUT = 40  # seconds for a whole launch (2 or 4 processes, or the recomputation launch, with room for
# a busy machine); a hang fails the test
SKEW = 1000.0  # seconds rank 1's clock runs ahead in the worker
MODEL = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8)
# Every test here runs on a torchrun launch (a module fixture, set up within the first test's timeout).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT + 10)]


def _config(schedule: str, **kw) -> RunConfig:
    base = dict(schedule=schedule, batch_size=16, steps=3, model=MODEL, optimizer="sgd", lr=0.1, timeout_s=60)
    return RunConfig.of(**{**base, **kw})


def _pp2_configs() -> tuple[dict[str, RunConfig], dict[str, str]]:
    """One pp=2 run per registered schedule (default chunks; the first microbatch count it accepts)."""
    runs, skipped = {}, {}
    for name in schedules.names():
        reason = ""
        for m in (4, 8):
            cfg = _config(name, pp=2, microbatches=m,  # combined-1f1b takes v 2 at pp 2
                          **({"chunks": 2} if schedules.spec(name).any_chunks else {}))
            try:
                make_plan(cfg, 2)
            except SchedlabError as exc:
                reason = str(exc)
                continue
            runs[name] = cfg
            break
        else:
            skipped[name] = reason
    return runs, skipped


PP2, SKIPPED = _pp2_configs()
EXTRA2 = {
    "interleaved-1f1b recv-ahead 1": _config("interleaved-1f1b", pp=2, microbatches=4, recv_ahead=1),
    "1f1b mlp split 3,2": _config("1f1b", pp=2, microbatches=4, split=(3, 2),
                                  model=ModelConfig(kind="mlp", layers=3, dim=12, vocab=5)),
    "gpipe dp2 sync": _config("gpipe", dp=2, microbatches=2, dp_mode="sync"),
    # SGD with momentum: sharded optimizer state. (AdamW divides near-zero gradients by their own size, so
    # float reordering alone moves some parameters by ~1e-5; it is no good for a 1e-5 equality check.)
    "1f1b dp2 zero1": _config("1f1b", dp=2, microbatches=2, dp_mode="zero1", bucket_mb=0.002),
    "1f1b dp2 zero2": _config("1f1b", dp=2, microbatches=2, dp_mode="zero2", bucket_mb=0.002),
    "1f1b dp2 zero3": _config("1f1b", dp=2, microbatches=2, dp_mode="zero3", bucket_mb=0.002),
}
# Recomputation at pp=2: every schedule with an R right before each backward (its F runs without grad), and
# the Mario-style pass at 1 M_B, where it drops some R's and keeps or moves others (checked below).
RECOMPUTE2 = {f"{name} recompute full": _config(name, pp=2, microbatches=cfg.layout.microbatches, recompute="full",
                                                chunks=cfg.layout.chunks)
              for name, cfg in PP2.items()}
RECOMPUTE2["1f1b dp2 ddp recompute full"] = _config("1f1b", dp=2, microbatches=4, dp_mode="ddp", bucket_mb=0.002,
                                                   recompute="full")  # buckets launched from R-rebuilt backwards
RECOMPUTE2["1f1b dp2 zero3 recompute full"] = _config("1f1b", dp=2, microbatches=4, dp_mode="zero3", bucket_mb=0.002,
                                                     recompute="full")  # parameters gathered for R passes too
BUBBLES = ("1f1b", "zb-h1", "interleaved-1f1b", "dualpipe-v")  # B; I and W; two chunks; overlapped F/B pairs
RECOMPUTE2.update({f"{name} recompute bubbles 1": _config(name, pp=2, microbatches=4, recompute="bubbles",
                                                          recompute_limit=1.0) for name in BUBBLES})
FOUR = {
    "1f1b pp2 dp2 ddp": _config("1f1b", pp=2, dp=2, microbatches=2, dp_mode="ddp", bucket_mb=0.002),
    "zb-h1 pp2 dp2 ddp": _config("zb-h1", pp=2, dp=2, microbatches=4, batch_size=32, dp_mode="ddp"),
    "interleaved-1f1b pp2 dp2 zero1": _config("interleaved-1f1b", pp=2, dp=2, microbatches=2, dp_mode="zero1",
                                             bucket_mb=0.004),
    "zb-h1 pp2 dp2 zero2": _config("zb-h1", pp=2, dp=2, microbatches=4, batch_size=32, dp_mode="zero2",
                                   bucket_mb=0.002),
    "interleaved-1f1b pp2 dp2 zero3": _config("interleaved-1f1b", pp=2, dp=2, microbatches=2, dp_mode="zero3",
                                              bucket_mb=0.004),
    "zb-h1 pp2 dp2 fsdp": _config("zb-h1", pp=2, dp=2, microbatches=4, batch_size=32, dp_mode="fsdp"),
    "1f1b pp4": _config("1f1b", pp=4, microbatches=4),
    "interleaved-1f1b pp4 v2": _config("interleaved-1f1b", pp=4, microbatches=4, chunks=2,
                                       model=ModelConfig(kind="gpt", layers=6, dim=16, heads=2, vocab=32, seq=8)),
}


def _launch(nproc: int, runs: dict[str, RunConfig], tmp: Path) -> dict:
    from tests.conftest import launch_worker  # the torchrun workers run this file without the tests package

    return launch_worker(__file__, nproc, {k: c.to_dict() for k, c in runs.items()}, tmp, LAUNCH_TIMEOUT)


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict:
    return _launch(2, {**PP2, **EXTRA2}, tmp_path_factory.mktemp("real2"))


@pytest.fixture(scope="module")
def two_recompute(tmp_path_factory) -> dict:
    return _launch(2, RECOMPUTE2, tmp_path_factory.mktemp("real2r"))


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> dict:
    return _launch(4, FOUR, tmp_path_factory.mktemp("real4"))


def _assert_equal_to_reference(label: str, cfg: RunConfig, got: dict) -> None:
    ref_losses, ref_params = reference_run(cfg)
    assert len(got["losses"]) == cfg.steps
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref_losses, strict=True))
    assert worst <= TOL, f"{label}: losses {got['losses']} vs reference {ref_losses}"
    assert list(got["params"]) == list(ref_params), f"{label}: parameter names or order differ"
    for name, ref in ref_params.items():
        diff = float((got["params"][name] - ref).abs().max())
        assert diff <= TOL, f"{label}: parameter {name} differs from the reference by {diff:.3g}"


def _assert_trace(label: str, cfg: RunConfig, trace) -> None:
    """One row per task of the graph (plus collectives), times aligned across ranks despite the skew."""
    graph = make_plan(cfg, cfg.world_size).graph
    assert trace.attrs["source"] == "real" and trace.attrs["schedule"] == cfg.schedule
    tasks = trace[(trace["stream"] != "collective") & (trace["kind"] != "OPTIM")]
    want = sorted((d * cfg.layout.pp + t.rank, str(t.action)) for d in range(cfg.layout.dp) for t in graph.tasks)
    assert sorted(zip(tasks["rank"], tasks["action"], strict=True)) == want, f"{label}: trace rows != task graph"
    assert (trace["end"] >= trace["start"]).all() and trace["start"].min() == 0.0
    assert trace["end"].max() < 30.0, f"{label}: trace spans {trace['end'].max():.1f}s: clocks not aligned"
    by_key = {(r.rank, r.action): r for r in tasks.itertuples()}
    for r in tasks[tasks["stream"] == "recv"].itertuples():
        # The value cannot arrive before it was sent (to within the offset estimate).
        a = schedules.Action.parse(r.action)
        src_stage = a.stage - 1 if a.kind is schedules.Kind.RECV_F else a.stage + 1
        kind = "SEND_F" if a.kind is schedules.Kind.RECV_F else "SEND_B"
        sender = (r.rank // cfg.layout.pp) * cfg.layout.pp + graph.schedule.stage_to_rank[src_stage]
        send = by_key[(sender, f"{src_stage}{kind}{a.microbatch}")]
        assert r.end >= send.start - 2e-3, f"{label}: {r.action} ends before {send.action} starts"
    if cfg.layout.dp > 1:
        here = {s: sorted(rank for rank in trace["rank"].unique() if rank % cfg.layout.pp == graph.schedule.stage_to_rank[s])
                for s in range(graph.schedule.num_stages)}
        optim = sorted(zip(trace.loc[trace["kind"] == "OPTIM", "rank"], trace.loc[trace["kind"] == "OPTIM", "action"],
                           strict=True))
        assert optim == sorted((r, f"{s}OPTIM") for s, ranks in here.items() for r in ranks), f"{label}: OPTIM rows"
        for rank, rows in trace.groupby("rank"):
            first_sync = rows.loc[rows["stream"] == "collective", "start"].min()
            last_compute = rows.loc[rows["kind"].isin(["F", "I", "W", "B", "OVERLAP_F_B"]), "end"].max()
            # ddp/zero1 launch a bucket from inside the backward that completes it; sync only afterwards.
            overlapped = first_sync < last_compute
            assert overlapped == (cfg.sync.dp_mode != "sync"), f"{label}: rank {rank} collective timing vs {cfg.sync.dp_mode}"


def test_every_schedule_builds_on_two_ranks():
    """The skip below is for a schedule that stops building at pp=2; none may (each one would go untested)."""
    assert SKIPPED == {}


@pytest.mark.parametrize("name", schedules.names())
def test_every_schedule_on_two_ranks_equals_plain_training(two, name):
    if name in SKIPPED:
        pytest.skip(f"{name} builds for no microbatch count in (4, 8) at pp=2: {SKIPPED[name]}")
    _assert_equal_to_reference(name, PP2[name], two[name])
    _assert_trace(name, PP2[name], two[name]["trace"])


@pytest.mark.parametrize("label", list(EXTRA2))
def test_two_rank_variants_equal_plain_training(two, label):
    _assert_equal_to_reference(label, EXTRA2[label], two[label])
    _assert_trace(label, EXTRA2[label], two[label]["trace"])


@pytest.mark.parametrize("label", list(RECOMPUTE2))
def test_recomputation_on_two_ranks_equals_plain_training(two_recompute, label):
    cfg = RECOMPUTE2[label]
    _assert_equal_to_reference(label, cfg, two_recompute[label])
    _assert_trace(label, cfg, two_recompute[label]["trace"])
    schedule = make_plan(cfg, 2).graph.schedule
    recomputes = sum(a.kind is schedules.Kind.R for p in schedule.programs for x in p for a in x.parts())
    if cfg.layout.recompute == "full" or label == "zb-h1 recompute bubbles 1":
        # zb-h1 at 1 M_B: activations held until W (the runtime's memory, the pass's default), rank 1 holds 2 M_B
        # even with every R (its W's lag a microbatch), so no R can go
        assert recomputes == cfg.layout.microbatches * schedule.num_stages
    else:  # the pass dropped some R's and kept others (moved or not)
        assert 0 < recomputes < cfg.layout.microbatches * schedule.num_stages, f"{label}: {recomputes} R's"


def test_recomputation_memory_on_two_ranks(two_recompute):
    """1F1B, p=2, m=4: without recomputation the ranks peak at 2 and 1 microbatches (test above). With R before
    every B a rank holds one microbatch's activations and, on rank 0, the next microbatch's input (its token
    ids, 4 x 8 int64 = 256 bytes); the last rank runs F R B back to back. At 1 M_B the pass drops the last
    rank's R's and rank 0's first (0F0 keeps its activations until 0B0, while 0F1 keeps its input): the same
    peaks."""
    for label in ("1f1b recompute full", "1f1b recompute bubbles 1"):
        mem = two_recompute[label]["memory"]
        per_mb = [m["activation_bytes_per_microbatch"] for m in mem]
        assert [m["peak_activation_bytes"] for m in mem] == [per_mb[0] + 4 * MODEL.seq * 8, per_mb[1]], label


@pytest.mark.parametrize("label", list(FOUR))
def test_four_ranks_pp_x_dp_equal_plain_training(four, label):
    _assert_equal_to_reference(label, FOUR[label], four[label])
    _assert_trace(label, FOUR[label], four[label]["trace"])


@pytest.mark.parametrize(("label", "per_bucket"), [("zb-h1 pp2 dp2 fsdp", 12), ("interleaved-1f1b pp2 dp2 zero3", 4)])
def test_zero3_gathers_are_the_graphs_one_for_one_and_replay(four, label, per_bucket):
    """Every rank's traced all-gathers are its pipeline rank's in the IR (schedules.dp.modes, one_buffer), action for
    action (stage, microbatch of the pass served, bucket): zb-h1 gathers before F, I and W of 4 microbatches (12
    per bucket), interleaved 1F1B before F and B of 2 microbatches (4 per bucket of each of its 2 stages). The trace
    replays."""
    from collections import Counter

    from sim.replay import dp_replayable, graph_of, replay

    cfg, trace = FOUR[label], four[label]["trace"]
    graph = graph_of(trace)
    pp = cfg.layout.pp
    for rank in range(pp):
        want = Counter(str(graph.tasks[i].action) for i in graph.programs[rank]
                       if graph.tasks[i].action.kind is schedules.Kind.ALL_GATHER)
        assert sum(want.values()) == per_bucket * sum(graph.plan.buckets[s] for s in graph.schedule.stages_of(rank))
        for step, part in trace.groupby("step"):
            for replica in range(cfg.layout.dp):
                rows = part[(part["rank"] == replica * pp + rank) & (part["kind"] == "ALL_GATHER")]
                assert Counter(rows["action"]) == want, f"{label}: step {step}, rank {replica * pp + rank}"
    assert dp_replayable(trace, graph)
    steps = replay(trace)
    assert [s.step for s in steps] == sorted(cfg.traced_steps)
    assert all(abs(s.error) < 0.25 for s in steps), f"{label}: replay errors {[s.error for s in steps]}"


@pytest.mark.timeout(2 * LAUNCH_TIMEOUT + 10)  # run alone it sets up both launches; above their 2 timeouts
def test_memory_is_reported_per_rank(two, four):
    mem = two["1f1b"]["memory"]
    assert [m["rank"] for m in mem] == [0, 1]
    # 1F1B: pipeline rank r holds p - r microbatches at its peak (parameters are not activations, also
    # when ZeRO-1 has moved them into flat buckets).
    assert [round(m["peak_activations_mb"], 6) for m in mem] == [2.0, 1.0]
    assert [round(m["peak_activations_mb"], 6) for m in four["1f1b pp4"]["memory"]] == [4.0, 3.0, 2.0, 1.0]
    zero1 = four["interleaved-1f1b pp2 dp2 zero1"]["memory"]
    assert zero1[0]["peak_activation_bytes"] == zero1[2]["peak_activation_bytes"]  # replicas hold the same
    per_mb = {label: [m["activation_bytes_per_microbatch"] for m in two[label]["memory"]]
              for label in ("gpipe dp2 sync", "1f1b dp2 zero1")}  # same model and microbatch size
    assert per_mb["gpipe dp2 sync"] == per_mb["1f1b dp2 zero1"]


@pytest.mark.timeout(90)  # in one process; a hang guard, with room for a loaded CI machine
def test_a_rank_dying_mid_step_fails_the_launch_fast_with_its_error(tmp_path):
    """Rank 1 raises in its first backward while rank 0 waits for that gradient: no hang, the error shows."""
    cfg_file = tmp_path / "crash.json"
    cfg_file.write_text(json.dumps({"1f1b": PP2["1f1b"].to_dict()}))
    start = time.monotonic()
    proc = torchrun(2, [__file__, str(cfg_file), str(tmp_path / "out.pt"), "crash"], timeout=75, capture=True)
    assert proc.returncode != 0
    assert "RuntimeError: injected failure on rank 1" in proc.stderr
    assert time.monotonic() - start < 60


def _worker(cfg_file: str, out_file: str, crash: str = "") -> None:
    """Runs under torchrun: every configuration of ``cfg_file`` in one process group."""
    from datetime import timedelta

    import torch.distributed as dist

    from real import Mesh, run
    from real.executor import Executor

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    if crash and rank == 1:
        def fail(*_args):
            raise RuntimeError("injected failure on rank 1")

        Executor._backward = fail
    if rank == 1:
        real_clock = time.perf_counter
        time.perf_counter = lambda: real_clock() + SKEW  # a host whose clock disagrees with rank 0's
    meshes: dict[tuple[int, int], Mesh] = {}
    results = {}
    for label, d in json.loads(Path(cfg_file).read_text()).items():
        cfg = RunConfig.from_dict(d)
        if cfg.world_size != world:
            continue
        key = (cfg.layout.pp, cfg.layout.dp)
        if key not in meshes:
            meshes[key] = Mesh.create(make_plan(cfg, world), "gloo", cfg.runtime.timeout_s)
        r = run(cfg, mesh=meshes[key])
        if rank == 0:
            results[label] = {"losses": r.losses, "params": r.parameters, "trace": r.trace, "memory": r.memory}
    if rank == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(*sys.argv[1:4])
