"""Starting torchrun from Python: ``schedlab run``, the benchmark and the multi-process tests.

:func:`torchrun` runs ``python -m torch.distributed.run --standalone`` (a free
port on this host) with ``OMP_NUM_THREADS=1`` unless set. With a timeout it
starts the launcher in its own session and, when time is up, kills the whole
process group, so a hung rank never outlives the call.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

__all__ = ["torchrun", "torchrun_command"]


def torchrun_command(nproc: int, target: Sequence[str]) -> list[str]:
    """The command line: ``target`` is ``["-m", "real", ...]`` or ``["script.py", ...]``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *target]


def torchrun(
    nproc: int,
    target: Sequence[str],
    *,
    timeout: float | None = None,
    capture: bool = False,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``target`` on ``nproc`` local processes; raises subprocess.TimeoutExpired (with the output so far)."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    cmd = torchrun_command(nproc, target)
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, env=full_env,
                          start_new_session=timeout is not None) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
