"""Starting torchrun from Python: ``schedlab run``, the benchmark and the multi-process tests.

:func:`torchrun` runs ``python -m torch.distributed.run --standalone`` (a free
port on this host) with ``OMP_NUM_THREADS=1`` unless set. With a timeout it
starts the launcher in its own session and, when time is up, stops it with
SIGTERM (torchrun then stops its workers, which run in sessions of their own)
and SIGKILLs its process group if needed, so a hung rank never outlives the call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["torchrun", "torchrun_command"]

KILL_GRACE = 10.0  # seconds torchrun gets, after a timeout, to stop its workers before it is SIGKILLed


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
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    cmd = torchrun_command(nproc, target, launcher_args)
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, env=full_env,
                          start_new_session=timeout is not None) as proc:
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
