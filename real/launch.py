"""Starting torchrun from Python: ``schedlab run``, the benchmark and the multi-process tests.

:func:`torchrun` runs ``python -m torch.distributed.run --standalone`` (a free
port on this host) with ``OMP_NUM_THREADS=1`` and :data:`KEEP_FREED_MEMORY` as
``GLIBC_TUNABLES``, each unless set. With a timeout it
starts the launcher in its own session and, when time is up, stops it with
SIGTERM (torchrun then stops its workers, which run in sessions of their own)
and SIGKILLs its process group if needed, so a hung rank never outlives the call.
torchrun dies with its caller (``PR_SET_PDEATHSIG``: SIGTERM, after which it
stops its workers), and every worker that calls :func:`die_with_launcher` dies
with torchrun, so a SIGKILLed script leaves nothing running.

:func:`launch` is ``schedlab run``'s: SIGINT or SIGTERM to it goes to every
worker (they stop after the step in progress and rank 0 prints one line,
see :mod:`real.stop`); whatever is still running :data:`STOP_GRACE` seconds
later is SIGKILLed, and the status is 128 + the signal's number. torchrun's
own report of a failed worker (a ``ChildFailedError`` traceback and its log
lines) is left out of stderr: the worker's own message says what failed,
and the status is the worker's. torchrun dies with the launcher
(``PR_SET_PDEATHSIG``) should the launcher itself be SIGKILLed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from common.procs import die_with_parent
from real.stop import GRACE_S, exit_status, message

__all__ = ["KEEP_FREED_MEMORY", "STOP_GRACE", "descendants", "die_with_launcher", "launch", "torchrun",
           "torchrun_command"]

log = logging.getLogger(__name__)

KILL_GRACE = 10.0  # seconds torchrun gets, after a timeout, to stop its workers before it is SIGKILLed
STOP_GRACE = GRACE_S + 3.0  # seconds the run gets, after a signal, before everything left is SIGKILLed

#: glibc malloc keeps freed memory for reuse instead of handing it back to the OS, as CUDA's caching allocator
#: does: by default a freed tensor over 128 KiB is unmapped and the next one faults its pages in again (zeroed),
#: so a schedule that holds many microbatches' activations pays page faults in proportion (zb-h2 at pp=2, m=8 on
#: the validation model: about 2,100 minor faults a step, 80 with this; zb-h1 about 1,300 and 1).
#: 32 MiB is glibc's largest mmap threshold on 64-bit; the trim threshold keeps the heap's top.
KEEP_FREED_MEMORY = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group may have exited on its own meanwhile
        os.killpg(pgid, sig)


def torchrun_command(nproc: int, target: Sequence[str], launcher_args: Sequence[str] = ()) -> list[str]:
    """The command line: ``target`` is ``["-m", "real", ...]`` or ``["script.py", ...]``.

    ``launcher_args`` are extra torchrun flags (e.g. ``["--max-restarts=1"]``), placed before ``target``.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            *launcher_args, *target]


def torchrun(
    nproc: int,
    target: Sequence[str],
    *,
    timeout: float | None = None,
    capture: bool = False,
    env: Mapping[str, str] | None = None,
    launcher_args: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """Run ``target`` on ``nproc`` local processes; raises subprocess.TimeoutExpired (with the output so far)."""
    full_env = _environment(env)
    cmd = torchrun_command(nproc, target, launcher_args)
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, env=full_env,
                          start_new_session=timeout is not None, preexec_fn=_die_with_parent) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # torchrun starts every worker in a session of its own, so SIGKILL to torchrun's group alone
            # would leave a hung worker running, holding the pipes open. SIGTERM makes torchrun stop its
            # workers first; the group is SIGKILLed if that has not ended it within KILL_GRACE seconds.
            _killpg(proc.pid, signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                _killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("GLIBC_TUNABLES", KEEP_FREED_MEMORY)
    return full_env


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...), from /proc; workers run in sessions of their own."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[-1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launcher dies (:func:`common.procs.die_with_parent`)."""
    die_with_parent(signal.SIGTERM)


def die_with_launcher() -> None:
    """In a torchrun worker, first thing: SIGTERM when torchrun dies, even by SIGKILL (elsewhere nothing).

    torchrun stops its workers when it is itself stopped, but a SIGKILLed torchrun cannot; with this the
    worker stops as on Ctrl-C (:mod:`real.stop`: at a step boundary, within :data:`real.stop.GRACE_S`).
    torchrun's agent starts its workers from its main thread, which lives as long as torchrun.
    """
    if "TORCHELASTIC_RUN_ID" in os.environ:
        die_with_parent(signal.SIGTERM)


def _kill(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# torchrun's own report of a failed worker: glog-style lines of torch.distributed, and the ChildFailedError or
# SignalException traceback (a block ending with a rule of '=' after "Root Cause", or the exception's line).
_TORCH_LOG = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ .*torch/distributed/")
_TORCHRUN_ERRORS = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
                    "torch.distributed.elastic.multiprocessing.api.SignalException")
_EXITCODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")


class _StderrFilter:
    """Copies torchrun's stderr (its workers' too) line by line, leaving out torchrun's own failure report."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.traceback: list[str] = []  # a traceback being read: kept back until its exception says whose it is
        self.skipping = 0  # rules of '=' still to skip in torchrun's failure block
        self.in_root_cause = False
        self.root_exitcode: int | None = None
        self.interrupted_said = False  # rank 0 printed the "interrupted at step N" line

    def feed(self, line: str) -> None:
        self.interrupted_said |= line.startswith("interrupted ")
        if self.skipping:
            self._skip(line)
        elif self.traceback:
            self._traceback(line)
        elif line.startswith("Traceback (most recent call last):"):
            self.traceback = [line]
        elif not _TORCH_LOG.match(line):
            self.out.write(line)
            self.out.flush()

    def _traceback(self, line: str) -> None:
        if line[:1].isspace():
            self.traceback.append(line)
            return
        if line.startswith(_TORCHRUN_ERRORS):
            self.traceback = []
            self.skipping = 2 if line.startswith(_TORCHRUN_ERRORS[0]) else 0
            return
        self.out.write("".join(self.traceback) + line)
        self.out.flush()
        self.traceback = []

    def _skip(self, line: str) -> None:
        if line.startswith("Root Cause"):
            self.in_root_cause = True
        m = _EXITCODE.match(line)
        if m and self.in_root_cause and self.root_exitcode is None:
            self.root_exitcode = int(m[1])
        if line.strip() and set(line.strip()) == {"="}:
            self.skipping -= 1

    def close(self) -> None:
        if self.traceback:
            self.out.write("".join(self.traceback))
            self.out.flush()


class _Signals:
    """The signals the launcher received, as a list (the first decides the status)."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def __call__(self, signum: int, frame: object) -> None:
        self.received.append(signum)


def _stop(proc: subprocess.Popen, signals: _Signals) -> None:
    """Forward the first signal to every worker; SIGKILL whatever still runs STOP_GRACE seconds later
    (at once on a second signal)."""
    workers = descendants(proc.pid)
    _kill(workers, signal.Signals(signals.received[0]))
    deadline = time.monotonic() + STOP_GRACE
    while proc.poll() is None and time.monotonic() < deadline and len(signals.received) == 1:
        time.sleep(0.05)
    left = [p for p in [*workers, *descendants(proc.pid)] if _running(p)]
    if proc.poll() is None or left:
        log.warning("the run did not stop within %g s of the signal: killing %d processes", STOP_GRACE,
                    len(left) + (proc.poll() is None))
        _kill([*left, proc.pid], signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def launch(nproc: int, target: Sequence[str], *, env: Mapping[str, str] | None = None,
           launcher_args: Sequence[str] = (), checkpoint_dir: str | None = None) -> int:
    """``schedlab run``: torchrun ``target`` on ``nproc`` processes in the foreground; the exit status.

    See the module doc for signals and for what of torchrun's stderr is shown. A signal that stops the
    workers before they could say where (still starting) is reported here, with ``checkpoint_dir``'s newest
    complete checkpoint.
    """
    signals = _Signals()
    previous = {s: signal.signal(s, signals) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        proc = subprocess.Popen(torchrun_command(nproc, target, launcher_args), stderr=subprocess.PIPE, text=True,
                                env=_environment(env), start_new_session=True, preexec_fn=_die_with_parent)
        relay = _StderrFilter(sys.stderr)
        reader = threading.Thread(target=lambda: [relay.feed(line) for line in proc.stderr], daemon=True)
        reader.start()
        while proc.poll() is None and not signals.received:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
        if signals.received:
            _stop(proc, signals)
        proc.wait()
        reader.join(2.0)
        relay.close()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if signals.received:
        if not relay.interrupted_said:
            sys.stderr.write(f"{message(None, _newest(checkpoint_dir))}\n")
        return exit_status(signals.received[0])
    return _status(proc.returncode, relay.root_exitcode)


def _newest(checkpoint_dir: str | None) -> str | None:
    if checkpoint_dir is None:
        return None
    from real.checkpoint import latest_complete

    restored = latest_complete(checkpoint_dir)
    return restored.path.name if restored is not None else None


def _status(code: int, worker_code: int | None) -> int:
    """torchrun's status, or its failed worker's (torchrun says 1 for any): a killed worker is 128 + its signal."""
    if code == 0 or worker_code is None:
        return code
    if worker_code < 0:
        name = signal.Signals(-worker_code).name if -worker_code in signal.valid_signals() else str(-worker_code)
        sys.stderr.write(f"error: a worker was killed by {name}\n")
        return exit_status(-worker_code)
    return worker_code
