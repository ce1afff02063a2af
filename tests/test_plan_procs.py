"""A killed planner leaves no process behind: its pool's workers die with it (common.procs.die_with_parent)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A search of several seconds with a pool of two (the pool starts after about a second of enumeration)
PLAN = ["plan", "--model", "gpt-1.5b", "--cluster", "dgx-h100:1", "--global-batch", "64", "--seq-len", "1024",
        "--workers", "2", "--top", "5"]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or sys.platform != "linux",
                    reason="die_with_parent is Linux's prctl; the test reads /proc")
def test_sigkilled_plan_leaves_no_worker(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "analysis", *PLAN, "--out", str(tmp_path / "plan")], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 40
        while len(workers) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            workers = _children(proc.pid)
        assert len(workers) == 2, f"the planner's pool did not start (children {workers}, exit {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [w for w in workers if _alive(w)] == []
    finally:  # what a failure leaves is ended here, by pid, not left to run
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
