"""No process outlives its parent, and --elastic live refuses what it cannot do (see docs/guarantees.md).

* the table of ``--elastic live`` flag cases of analysis.hostile_procs, each its exact one line, in-process;
  torchft's own failures (an unreachable lighthouse, too few replicas for --min-replicas) one line each;
* SIGKILL of a parent (experiments/validate_sim.py; ``schedlab run`` with ps, async-ps and --elastic live):
  every process below it that was there before the kill is gone within 8 s (slow, gloo, <= 3 processes).
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

from analysis.hostile_procs import cases
from tests.conftest import run_schedlab

torch = pytest.importorskip("torch")

from real.launch import STOP_GRACE, descendants  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
# Seconds after the parent's SIGKILL by which every process below it must be gone: a rank blocked in a collective
# whose peer is gone ends itself real.stop.GRACE_S (5 s) after its SIGTERM, which reaches it through torchrun, so
# the bound is schedlab run's own STOP_GRACE (GRACE_S + 3 s), not GRACE_S (CI once saw a rank live past 5.0 s).
GONE_S = STOP_GRACE
PS = ["--schedule", "1f1b", "--pp", "1", "--dp", "2", "--microbatches", "2", "--batch-size", "4", *SMALL,
      "--timeout", "30", "--placement", "/pserver/CPU:0,/trainer/CPU:0-1", "--slow-rank", "1", "--slow-s", "0.1"]


def _procs_cases(tmp: Path, group: str):
    return [c for c in cases(tmp) if c.group == group]


def test_every_live_flag_case_is_its_one_line(tmp_path: Path, capsys) -> None:
    """Each flag --elastic live cannot honour (or a value torchft cannot take) is refused before launch."""
    cases = _procs_cases(tmp_path, "procs: live flags")
    assert len(cases) == 11
    for case in cases:
        assert case.argv[1:4] == ("-m", "analysis", "run")
        got = run_schedlab(capsys, *case.argv[3:])
        assert (got[0], got[2]) == (2, f"error: {case.message}\n"), case.argv
    assert not (tmp_path / "p.pt").exists()


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torchft_failures_are_one_line(tmp_path: Path) -> None:
    """An unreachable lighthouse names --lighthouse; a quorum short of --min-replicas for --quorum-timeout
    seconds names --min-replicas, once (rank 0 of a 2-rank pipeline replica), with none of torchft's warnings."""
    from torchft.coordination import LighthouseServer

    (case,) = _procs_cases(tmp_path, "procs: torchft")
    done = subprocess.run(case.argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, f"error: {case.message}\n")
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100, quorum_tick_ms=10,
                                  heartbeat_timeout_ms=300)
    try:
        done = subprocess.run([sys.executable, "-m", "analysis", "run", "--elastic", "live", "--lighthouse",
                               lighthouse.address(), "--pp", "2", "--microbatches", "2", "--batch-size", "4",
                               "--steps", "3", *SMALL, "--timeout", "20", "--min-replicas", "2", "--quorum-timeout",
                               "1"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=90)
    finally:
        lighthouse.shutdown()
    assert (done.returncode, done.stderr) == (2, "error: [rank 0] replica 0: 1 replica(s) in the quorum for 1 s, "
                                                 "fewer than the 2 a step needs (are the others running?); start "
                                                 "them, or give fewer (flag --min-replicas)\n")


# -- SIGKILL of a parent ------------------------------------------------------------------------------------------


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _kill_and_watch(proc: subprocess.Popen, want: int) -> list[int]:
    """SIGKILL ``proc`` once it has ``want`` processes below it; those still running GONE_S seconds later."""
    tree = descendants(proc.pid)
    assert len(tree) >= want, tree
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + GONE_S
    while (left := [p for p in tree if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in left:  # the test's own cleanup: nothing it started outlives it either
        os.kill(p, signal.SIGKILL)
    return left


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def _wait(ready, limit: float = 150.0) -> None:
    deadline = time.monotonic() + limit
    while not ready():
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_sigkill_of_validate_sim_leaves_nothing(tmp_path: Path) -> None:
    """The grid's torchrun and both its workers (measuring the rounds, after the profile) die with the script."""
    proc = _start([sys.executable, "experiments/validate_sim.py", "--tiny", "--no-dp", "--max-slow", "1000",
                   "--out", str(tmp_path / "v")])
    _wait(lambda: sum(b"real.rounds" in _cmdline(p) for p in descendants(proc.pid) if _running(p)) >= 3)
    assert _kill_and_watch(proc, 3) == []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _first_step(proc: subprocess.Popen) -> None:
    for line in proc.stdout:
        if re.match(r"^step +\d+ ", line):
            return
    pytest.fail("the run printed no step")


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["ps", "async-ps"])
def test_sigkill_of_schedlab_run_leaves_nothing(tmp_path: Path, mode: str) -> None:
    """torchrun, both trainers and the server (a straggler among the trainers) end with the launcher."""
    proc = _start([sys.executable, "-m", "analysis", "run", *PS, "--dp-mode", mode, "--steps", "100000",
                   "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2"])
    _first_step(proc)
    assert _kill_and_watch(proc, 4) == []


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_sigkill_of_a_live_replica_leaves_nothing(tmp_path: Path) -> None:
    """A live pipeline replica (torchrun and its 2 ranks) ends with its launcher; the lighthouse stays up."""
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100, quorum_tick_ms=10,
                                  heartbeat_timeout_ms=300)
    events = tmp_path / "ev.jsonl"
    try:
        proc = _start([sys.executable, "-m", "analysis", "run", "--elastic", "live", "--lighthouse",
                       lighthouse.address(), "--pp", "2", "--microbatches", "2", "--batch-size", "4", "--steps",
                       "100000", *SMALL, "--timeout", "30", "--events", str(events)])
        _wait(lambda: events.exists() and any(json.loads(x)["event"] == "step" for x in events.read_text().split(
            "\n") if x.strip().endswith("}")))
        assert _kill_and_watch(proc, 3) == []
    finally:
        lighthouse.shutdown()


def test_a_rank_told_by_another_that_the_quorum_is_late_names_the_real_limit() -> None:
    """A pipeline replica's ranks give up together: the rank whose own clock has not yet passed --quorum-timeout
    raises the same line as the one whose has (the limit as given, never a stand-in)."""
    import time as clock

    from real.faults.elastic import LiveConfig, check_quorum

    live = LiveConfig(lighthouse="http://127.0.0.1:1", min_replicas=2, wait_replicas=2, quorum_timeout_s=1.0)
    now = clock.monotonic()
    assert check_quorum(live, 1, False, now, now) is None  # its own clock: not late yet
    told = check_quorum(live, 1, False, now, now, late=True)
    assert str(told) == ("replica 0: 1 replica(s) in the quorum for 1 s, fewer than the 2 a step needs (are the "
                         "others running?); start them, or give fewer")
    waiting = check_quorum(live, 1, True, now, now, late=True)
    assert str(waiting) == "replica 0: 1 of the 2 replicas to wait for joined within 1 s (has the job ended?)"
