"""Live elastic training of pipeline replicas (``--elastic live --pp 2``): a replica's rank dies, the other goes on.

One launch (slow, gloo, 4 training processes under 2 torchruns): a torchft
lighthouse in this process; replicas 0 and 1, each a 2-stage pipeline
(1f1b, 4 microbatches of 2 rows: global batch 8), each under its own torchrun
with ``--max-restarts 1``, train 12 steps of a token file; pipeline rank 1 of
replica 1 SIGKILLs itself at the start of step 5 (first attempt only) and
torchrun restarts replica 1's two processes. Replica 0 is paused (SIGSTOP,
both ranks) once it has finished step 5 alone, until both new processes of
replica 1 have started, then continued: a stand-in for steps longer than a
process start. Checked from the event logs and each process's JSON result:

* replica 0's two ranks are the same two processes throughout (no restart);
  their step 5 failed with 2 participants (2 microbatches each) and was
  committed with 1 (all 4 microbatches), every rank agreeing;
* both new processes of replica 1 received their own pipeline rank's state
  from replica 0 (a ``heal`` on each, of exactly that stage's bytes) and
  committed within 3 steps;
* every committed step's microbatch shares partition its global batch, so the
  96 windows trained are the sampler's first 96, each once;
* the checkpoints of steps 8 and 12 are complete, with the losses so far;
* both replicas end with the same parameters, stage by stage (SHA-256), and
  every rank with the same 12 losses, which equal plain single-process
  training on the whole batch at 1e-5.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchft")

from real.checkpoint import complete_checkpoints  # noqa: E402
from real.config import ModelConfig  # noqa: E402
from real.data.tokens import TokenBatches, TokenFile, prepare  # noqa: E402
from real.faults.elastic import pause_report, share  # noqa: E402
from real.launch import torchrun  # noqa: E402
from real.models import build_model  # noqa: E402
from tests.test_elastic_live import OP_TIMEOUT, _events, _reference, _wait_for  # noqa: E402  (shared: log, reference, limit)

ROOT = Path(__file__).resolve().parents[1]
STEPS, BATCH, MICRO, SEQ, KILL_AT = 12, 8, 4, 8, 5
MODEL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "256", "--seq", str(SEQ)]
LAUNCH_TIMEOUT = 90  # seconds per replica's torchrun; the test's own timeout is above it


def _launch(lighthouse: str, tmp: Path, data: Path) -> tuple[dict, list[dict], list[dict], int, dict]:
    """Both replicas and replica 0's pause; ({(replica, pp rank): result}, events 0, events 1, step resumed at,
    {replica: its torchrun's stderr})."""
    common = ["-m", "real", "--elastic", "live", "--lighthouse", lighthouse, "--wait-replicas", "2",
              "--pp", "2", "--microbatches", str(MICRO), "--schedule", "1f1b",
              "--steps", str(STEPS), "--batch-size", str(BATCH), *MODEL, "--data", str(data), "--lr", "0.01",
              "--timeout", str(OP_TIMEOUT), "--min-step-time", "0.1", "--json",
              "--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "4"]
    procs: dict[int, subprocess.CompletedProcess] = {}

    def go(i: int, extra: list[str]) -> None:
        try:
            procs[i] = torchrun(2, [*common, "--replica-id", str(i), "--events", str(tmp / f"ev{i}.jsonl"), *extra],
                                timeout=LAUNCH_TIMEOUT, capture=True,
                                launcher_args=["--max-restarts=1", "--monitor-interval=0.2"])
        except subprocess.TimeoutExpired as exc:
            procs[i] = subprocess.CompletedProcess([], -1, exc.output or "", exc.stderr or "")

    threads = [threading.Thread(target=go, args=(0, [])),
               threading.Thread(target=go, args=(1, ["--fail-at-step", str(KILL_AT), "--fail-rank", "1"]))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    ev0, ev1 = tmp / "ev0.jsonl", tmp / "ev1.jsonl"
    alone = _wait_for("both ranks of replica 0 to commit step 5 alone", lambda: [
        e for e in _events(ev0) if e["event"] == "step" and e["step"] == KILL_AT and e["committed"]][1:], deadline)
    pids = {e["pid"] for e in _events(ev0)}
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        _wait_for("replica 1's two new processes", lambda: len([e for e in _events(ev1) if e["event"] == "start"]) == 4,
                  deadline)
        resumed_at = max(e["step"] for e in _events(ev0) if e["event"] == "step")
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    for t in threads:
        t.join()
    for i, proc in sorted(procs.items()):
        assert proc.returncode == 0, f"replica {i}: {proc.stderr[-4000:]}"
    results = {}
    decoder = json.JSONDecoder()
    for i, proc in procs.items():
        for line in proc.stdout.splitlines():  # torchrun merges the ranks' stdout: two objects may share a line
            pos = line.find("{") if line.startswith("{") else -1
            while pos != -1:
                r, end = decoder.raw_decode(line, pos)
                results[i, r["pp_rank"]] = r
                pos = line.find("{", end)
    assert alone
    return results, _events(ev0), _events(ev1), resumed_at, {i: proc.stderr for i, proc in procs.items()}


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 20)
def test_a_pipeline_replica_rank_killed_rejoins_live_and_no_step_is_lost(tmp_path):
    from torchft.coordination import LighthouseServer

    data = tmp_path / "corpus.u16"
    prepare([ROOT / "README.md"], data)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100, quorum_tick_ms=10,
                                  heartbeat_timeout_ms=300)
    try:
        results, ev0, ev1, resumed_at, stderr = _launch(lighthouse.address(), tmp_path, data)
    finally:
        lighthouse.shutdown()

    assert sorted(results) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # replica 0 never stopped: the same two processes, one start each; step 5 redone alone, on both ranks
    starts0 = [e for e in ev0 if e["event"] == "start"]
    assert sorted((e["pp_rank"], e["pid"]) for e in starts0) == [(r, results[0, r]["pid"]) for r in (0, 1)], \
        stderr[0][-6000:]
    for r in (0, 1):
        fives = [(e["participants"], e["committed"], e["microbatches"]) for e in ev0
                 if e["event"] == "step" and e["step"] == KILL_AT and e["pp_rank"] == r]
        assert fives == [(2, False, [0, 2]), (1, True, [0, 4])], (r, fives)
    # replica 1: its rank 1 killed at step 5; torchrun restarted both ranks, each healed from replica 0's same rank
    faults = [e for e in ev1 if e["event"] == "fault"]
    assert [(e["step"], e["pp_rank"]) for e in faults] == [(KILL_AT, 1)]
    new = {e["pp_rank"]: e["pid"] for e in ev1 if e["event"] == "start"}  # the later start of each rank
    assert new == {r: results[1, r]["pid"] for r in (0, 1)} and faults[0]["pid"] != new[1]
    model = build_model(ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=256, seq=SEQ), 0)  # 4 layers
    for r in (0, 1):
        heals = [e for e in ev1 if e["event"] == "heal" and e["pid"] == new[r]]
        # rank r's state only: its stage's 2 layers' parameters, AdamW's two moments of each and its step count
        params = [q for layer in model[2 * r:2 * r + 2] for q in layer.parameters()]
        assert heals[-1]["bytes"] == sum(q.numel() for q in params) * 4 * 3 + len(params) * 4
        first = min(e["step"] for e in ev1 if e["event"] == "step" and e["pid"] == new[r] and e["committed"])
        assert heals and heals[-1]["step"] == first and heals[-1]["bytes"] > 0, (r, heals)
        assert first <= resumed_at + 3, (r, first, resumed_at)
    # what the death cost replica 0, seen from the killed rank's stage (pipeline rank 1) on both sides
    report = pause_report([e for e in ev0 if e["pp_rank"] == 1], [e for e in ev1 if e["pp_rank"] == 1])
    assert 0 < report["detection"] < 10 and report["quorum"] >= 0 and report["replacement"] > report["detection"]
    # exactly once: on every rank, the committed microbatch shares of each step partition its global batch
    batches = TokenBatches(TokenFile(data, SEQ), BATCH, 0)
    size = BATCH // MICRO
    committed = [e for e in ev0 + ev1 if e["event"] == "step" and e["committed"]]
    trained = []
    for step in range(STEPS):
        ids = batches.ids(step).tolist()
        for r in (0, 1):
            shares = sorted((e["rank"], e["participants"], e["microbatches"], e["windows"]) for e in committed
                            if e["step"] == step and e["pp_rank"] == r)
            n = shares[0][1]
            assert [(q, p) for q, p, _, _ in shares] == [(q, n) for q in range(n)], (step, r, shares)
            assert all(list(mb) == list(share(MICRO, n, q)) for q, _, mb, _ in shares)
            assert all(ws == ids[mb[0] * size:mb[1] * size] for _, _, mb, ws in shares)
        trained += [w for *_, ws in sorted((e["rank"], e["windows"]) for e in committed
                                          if e["step"] == step and e["pp_rank"] == 0) for w in ws]
    assert trained == batches.sampler.take(0, STEPS * BATCH).tolist() and len(set(trained)) == STEPS * BATCH
    # periodic checkpoints went on (by the replica of quorum rank 0, both its ranks), the last 2 kept, with losses
    kept = complete_checkpoints(tmp_path / "ckpt")
    assert [c.step for c in kept] == [8, 12]
    assert all(c.info["losses"] == results[0, 0]["losses"][:c.step] and c.info["pp"] == 2 for c in kept)
    # replica 0 read none; replica 1's new processes found step 4's (written before the kill), each rank loaded
    # its share, and were then overwritten by replica 0's live state (the heals above)
    assert [results[0, r]["resumed_from"] for r in (0, 1)] == [None, None]
    assert [Path(results[1, r]["resumed_from"]).name for r in (0, 1)] == ["step_000004"] * 2
    # both replicas end identical, stage by stage; every rank has every step's loss: plain training's at 1e-5
    for r in (0, 1):
        assert results[0, r]["param_sha256"] == results[1, r]["param_sha256"]
    assert results[0, 0]["param_sha256"] != results[0, 1]["param_sha256"]
    losses = results[0, 1]["losses"]
    assert all(res["losses"] == losses for res in results.values()) and len(losses) == STEPS
    assert losses == pytest.approx(_reference(data, BATCH), abs=1e-5)
