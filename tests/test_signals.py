"""Signals and failures of real multi-process runs (slow, gloo, 2 processes, hard timeouts); see docs/guarantees.md.

* SIGTERM/SIGINT to ``schedlab run`` (and Ctrl-C to one ``python -m real``) stop every process of the run
  within a bound, with one line and status 143/130, leaving only complete checkpoints and no lock; also a
  parameter-server run (ps, async-ps) with a straggler;
* a NaN loss at pp 2 is one line (that no documented command, the README's fault restart among them, prints a
  traceback is checked by tests/test_docs.py, which runs them);
* a second run on a checkpoint directory in use is refused while the first trains on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from real.checkpoint import complete_checkpoints  # noqa: E402
from real.launch import descendants  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
ONE = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--batch-size", "4", "--steps", "2"]


# -- real processes: signals, one-line failures ------------------------------------------------------------------

PP2 = ["--schedule", "1f1b", "--pp", "2", "--microbatches", "2", "--batch-size", "4", *SMALL, "--timeout", "30"]
STOP_BOUND = 15.0  # seconds from the signal until every process of the run is gone (STOP_GRACE is 8)
STEP_LINE = re.compile(r"^step +(\d+) ")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _wait_for_step(proc: subprocess.Popen, step: int, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    for line in proc.stdout:
        m = STEP_LINE.match(line)
        if m and int(m[1]) >= step:
            return
        if time.monotonic() > deadline:
            break
    proc.kill()
    pytest.fail(f"the run did not reach step {step}; stderr: {proc.stderr.read()[-3000:]}")


def _gone(pids: list[int], bound: float) -> list[int]:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        left = [p for p in pids if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"]
        if not left:
            return []
        time.sleep(0.1)
    return left


def _stop_run(tmp_path: Path, command: list[str], sig: signal.Signals) -> tuple[int, str, Path]:
    """Start ``command`` (checkpoints every 3 steps), signal it at step 8; (status, stderr, checkpoint dir)."""
    root = tmp_path / "ck"
    proc = subprocess.Popen([*command, "--steps", "100000", "--checkpoint-dir", str(root), "--checkpoint-every", "3"],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _wait_for_step(proc, 8)
        tree = [proc.pid, *descendants(proc.pid)]
        proc.send_signal(sig)
        left = _gone(tree, STOP_BOUND)
        assert left == [], f"still running {STOP_BOUND} s after {sig.name}: {left}"
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err, root


def _only_complete(root: Path, err: str) -> None:
    m = re.fullmatch(r"interrupted at step (\d+); the last complete checkpoint is (step_\d+)\n", err)
    assert m, err
    names = sorted(p.name for p in root.iterdir())
    complete = [r.path.name for r in complete_checkpoints(root)]
    assert names == complete and complete[-1] == m[2] and int(m[1]) >= 9, (names, err)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_every_process_of_schedlab_run(tmp_path: Path, sig: signal.Signals, status: int) -> None:
    code, err, root = _stop_run(tmp_path, [sys.executable, "-m", "analysis", "run", *PP2], sig)
    assert code == status
    _only_complete(root, err)


PS = ["--schedule", "1f1b", "--pp", "1", "--dp", "2", "--microbatches", "2", "--batch-size", "4", *SMALL, "--timeout",
      "30", "--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--slow-rank", "1", "--slow-s", "0.1"]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("mode", "sig", "status"), [("ps", signal.SIGINT, 130), ("async-ps", signal.SIGTERM, 143)])
def test_a_signal_stops_a_parameter_server_run(tmp_path: Path, mode: str, sig: signal.Signals, status: int) -> None:
    """2 trainers (rank 1 a straggler) and a server, checkpointing: one line from the whole run, naming the
    checkpoint a rerun resumes from; async-ps's trainers, not in lockstep, each stop at their own boundary."""
    extra = ["--staleness", "1"] if mode == "async-ps" else []
    code, err, root = _stop_run(tmp_path, [sys.executable, "-m", "analysis", "run", *PS, "--dp-mode", mode, *extra],
                                sig)
    assert code == status
    _only_complete(root, err)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ctrl_c_in_one_process(tmp_path: Path) -> None:
    code, err, root = _stop_run(tmp_path, [sys.executable, "-m", "real", *ONE[:-2], *SMALL], signal.SIGINT)
    assert code == 130
    _only_complete(root, err)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_nan_at_pp2_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "analysis", "run", *PP2, "--steps", "3", "--lr", "1e30"], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=150)
    assert (proc.returncode, proc.stderr) == (2, "error: [rank 0] step 1: the loss is nan; training diverged with "
                                                 "adamw at lr 1e+30: try a smaller lr (flag --lr)\n")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_run_on_a_directory_in_use_is_refused(tmp_path: Path) -> None:
    """Run A trains with checkpoints; run B on the same directory is refused (by schedlab run before torchrun
    starts, and by a worker's rank 0 when started alone), and A goes on to stop cleanly on SIGTERM."""
    root = tmp_path / "ck"
    flags = ["--steps", "100000", "--checkpoint-dir", str(root), "--checkpoint-every", "3"]
    a = subprocess.Popen([sys.executable, "-m", "analysis", "run", *PP2, *flags], cwd=ROOT, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for_step(a, 5)
        holder = json.loads((root / "LOCK").read_text())
        refusal = (f"error: checkpoint directory {str(root)!r} is in use by another run (PID {holder['pid']} on this "
                   f"host, since {holder['since']}); wait for it to end or give another checkpoint directory "
                   "(flag --checkpoint-dir)\n")
        for b in ([sys.executable, "-m", "analysis", "run", *PP2, *flags],
                  [sys.executable, "-m", "real", *ONE[:-2], *SMALL, *flags]):
            done = subprocess.run(b, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
            assert (done.returncode, done.stderr) == (2, refusal)
        _wait_for_step(a, 12)  # A trains on, undisturbed
        a.send_signal(signal.SIGTERM)
        _, err = a.communicate(timeout=STOP_BOUND)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
    assert a.returncode == 143
    _only_complete(root, err)
