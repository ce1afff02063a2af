"""Stopping a run on SIGINT or SIGTERM: at a step boundary, every rank at the same step, within a bound.

:func:`handle_signals` replaces the default handlers of SIGINT and SIGTERM
(no ``KeyboardInterrupt`` mid-step, no death mid-save) while a run trains:
the handler only records the signal. The training loop folds "a signal
arrived" into the step's loss all-reduce, so every rank stops after the same
step, and raises :class:`Interrupted`. A rank that cannot reach a step
boundary (blocked in a collective whose peer is gone) is ended by a watcher
thread :data:`GRACE_S` seconds after the signal, with the same one line
(the C-level handler wakes the watcher through :func:`signal.set_wakeup_fd`,
even while the main thread is blocked inside torch). The exit status follows
the shell's convention, 128 + the signal's number: 130 for SIGINT, 143 for SIGTERM.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

__all__ = ["GRACE_S", "Interrupted", "exit_status", "handle_signals", "inject_fault", "leave", "message", "progress",
           "requested", "stopping"]

log = logging.getLogger(__name__)

GRACE_S = 5.0  # seconds a rank gets, after a signal, to reach a step boundary before it ends itself
SIGNALS = (signal.SIGINT, signal.SIGTERM)

_state: dict[str, int | None] = {"signal": None, "depth": 0}


class Interrupted(Exception):  # noqa: N818 - not an error: the user asked for it
    """A signal stopped training at a step boundary: ``step`` steps are done on every rank."""

    def __init__(self, signum: int, step: int, checkpoint: str | None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(message(step, checkpoint))


def message(step: int | None, checkpoint: str | None) -> str:
    """The one line a stopped run prints: where it stopped and what it can resume from."""
    where = f"interrupted at step {step}" if step is not None else "interrupted before training started"
    saved = f"the last complete checkpoint is {checkpoint}" if checkpoint else "no complete checkpoint was written"
    return f"{where}; {saved}"


def exit_status(signum: int) -> int:
    return 128 + signum


def inject_fault(rank: int, step: int, *, fail_rank: int, fail_at_step: int | None, fail_mode: str,
                 slow_rank: int | None = None, slow_s: float = 0.0) -> None:
    """``--fail-at-step``: on torchrun's first attempt only, rank ``fail_rank`` dies (SIGKILL, ``fail_mode`` kill)
    or stops answering (hang) at ``fail_at_step``. ``--slow-rank``: rank ``slow_rank`` sleeps ``slow_s`` seconds
    before every step (a straggler, e.g. for async-ps's staleness bound)."""
    if rank == slow_rank and slow_s:
        time.sleep(slow_s)
    if step != fail_at_step or rank != fail_rank or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0:
        return
    log.warning("rank %d: injected fault (%s) at step %d", rank, fail_mode, step)
    logging.shutdown()
    if fail_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        time.sleep(3600)


def requested() -> int | None:
    """The signal received since :func:`handle_signals` began, if any."""
    return _state["signal"]


_progress: dict[str, int | str | None] = {"step": None, "checkpoint": None}


def progress(step: int | None, checkpoint: str | None) -> None:
    """Where the run is (steps done, the last complete checkpoint's name), for the watcher's line."""
    _progress.update(step=step, checkpoint=checkpoint)


def stopping(exc: BaseException) -> Interrupted | None:
    """After a signal, what ``exc`` means: the run stopping (its peers leave at their own step boundaries, so a
    collective or a message to one of them fails), as :class:`Interrupted` at the steps :func:`progress` last
    recorded; None when no signal arrived (``exc`` is then a failure of its own)."""
    if isinstance(exc, Interrupted):
        return exc
    signum = requested()
    if signum is None:
        return None
    return Interrupted(signum, _progress["step"], _progress["checkpoint"])


def leave(status: int) -> NoReturn:
    """End a rank of a stopped multi-process run now, its output flushed: its process group is not torn down.

    A peer that has already gone leaves this rank's gloo threads waiting on it, and destroying the group
    then blocks or aborts the process (``terminate called without an active exception``)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def _watch(read_fd: int, stopped: threading.Event) -> None:
    """Wait for a signal's wakeup byte; end the process if the main thread has not stopped GRACE_S later."""
    try:
        data = os.read(read_fd, 1)
    except OSError:
        return
    if not data or stopped.is_set():
        return
    signum = data[0]
    if stopped.wait(GRACE_S):
        return
    line = message(_progress["step"], _progress["checkpoint"])
    if os.environ.get("RANK", "0") == "0":
        sys.stderr.write(f"{line} (a step did not finish within {GRACE_S:g} s)\n")
        sys.stderr.flush()
    os._exit(exit_status(signum))


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """Record SIGINT/SIGTERM instead of dying, for the duration (main thread only; elsewhere a no-op).

    The training loop reports where it is with :func:`progress`, for the line the watcher prints if it must
    end the process.
    """
    if threading.current_thread() is not threading.main_thread() or _state["depth"]:
        yield  # elsewhere than the main thread, or inside an outer handle_signals: that one records
        return
    _state["signal"] = None

    def record(signum: int, frame: object) -> None:
        if _state["signal"] is None:
            _state["signal"] = signum
            log.info("signal %d: stopping at the end of this step", signum)

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    stopped = threading.Event()
    progress(None, None)
    previous = {s: signal.signal(s, record) for s in SIGNALS}
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(read_fd, stopped), name="signal-watch", daemon=True)
    watcher.start()
    _state["depth"] = 1
    try:
        yield
    finally:
        _state["depth"] = 0
        stopped.set()
        signal.set_wakeup_fd(old_fd)
        for s, h in previous.items():
            signal.signal(s, h)
        with contextlib.suppress(OSError):
            os.write(write_fd, b"\0")  # wakes the watcher if no signal did; it sees `stopped` and returns
        os.close(write_fd)
        watcher.join(1.0)
        os.close(read_fd)
