"""Multi-node elasticity in CI: torchrun's c10d rendezvous with ``--nnodes 1:2``, two agents on localhost, one killed.

Agent A (which hosts the rendezvous store) and agent B each start one worker:
a world of 2, ``--dp auto`` -> dp 2. Once the checkpoint of step 10 is
complete, agent B and its worker are SIGKILLed (a lost node). A's worker
fails on its next collective, A restarts it, the rendezvous closes with A
alone (world 1, dp 1), and the new worker resumes from the newest complete
checkpoint and finishes every step. Checked: A's exit status 0, one restart,
the resume point, dp 1 at the end, one loss per step, and the losses equal
plain single-process training at 1e-5 (the global batch never changed).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig, reference_run  # noqa: E402
from real.checkpoint import MARKER  # noqa: E402
from real.launch import descendants  # noqa: E402

STEPS, EVERY = 80, 10
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
MODEL = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=32, seq=8)
TIMEOUT = 90  # seconds for the whole run; agent A is killed past it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _agent(port: int, ckpt: Path, *, host: bool) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", "ci-resize",
           # a lost agent is dropped after 2 missed heartbeats of 1 s (default 3 of 5 s)
           "--rdzv-conf", "join_timeout=60,last_call_timeout=5,close_timeout=5,keep_alive_interval=1,"
           f"keep_alive_max_attempt=2,is_host={str(host).lower()}", "--max-restarts", "2",
           "--monitor-interval", "0.2",
           "-m", "real", "--schedule", "gpipe", "--pp", "1", "--dp", "auto", "--microbatches", "1",
           "--batch-size", "8", *SMALL, "--optimizer", "sgd", "--lr", "0.1", "--steps", str(STEPS),
           "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY), "--timeout", "10", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def _kill_tree(proc: subprocess.Popen) -> None:
    for pid in [*descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 20)
def test_c10d_resize_survives_a_lost_agent(tmp_path):
    port, ckpt = _free_port(), tmp_path / "ckpt"
    deadline = time.monotonic() + TIMEOUT
    # together, so that both join the first round (within its last call, 5 s); a late B would make A restart
    # its workers for a round of 2, which torch 2.13's c10d rendezvous can deadlock (each agent waits for a key
    # the other writes); A hosts the store, so that B can be lost
    a, b = _agent(port, ckpt, host=True), _agent(port, ckpt, host=False)
    try:
        while not (ckpt / f"step_{EVERY:06d}" / MARKER).exists() and time.monotonic() < deadline:
            if a.poll() is not None or b.poll() is not None:
                _kill_tree(a)
                _kill_tree(b)
                pytest.fail(f"an agent ended before the first checkpoint; A's stderr:\n{a.communicate()[1][-3000:]}"
                            f"\nB's stderr:\n{b.communicate()[1][-3000:]}")
            time.sleep(0.02)
        _kill_tree(b)
        out, err = a.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_tree(a)
        out, err = a.communicate()
        pytest.fail(f"agent A did not finish in time; stderr:\n{err[-6000:]}")
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                _kill_tree(proc)
    assert a.returncode == 0, err[-6000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["restart_count"] == 1 and result["dp"] == 1 and result["world_size"] == 1
    start = result["start_step"]
    assert start >= EVERY and start % EVERY == 0 and result["resumed_from"] == str(ckpt / f"step_{start:06d}")
    assert len(result["losses"]) == STEPS and len(result["step_times"]) == STEPS - start
    cfg = RunConfig.of(schedule="gpipe", microbatches=1, batch_size=8, steps=STEPS, model=MODEL, optimizer="sgd",
                       lr=0.1)
    ref_losses, _ = reference_run(cfg)
    assert result["losses"] == pytest.approx(ref_losses, abs=1e-5)
