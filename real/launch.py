"""Starting torchrun from Python: ``schedlab run``, the benchmark and the multi-process tests.

:func:`torchrun` runs ``python -m torch.distributed.run --standalone`` (a free
port on this host) with ``OMP_NUM_THREADS=1`` and :data:`KEEP_FREED_MEMORY` as
``GLIBC_TUNABLES``, each unless set. With a timeout it
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

__all__ = ["KEEP_FREED_MEMORY", "torchrun", "torchrun_command"]

KILL_GRACE = 10.0  # seconds torchrun gets, after a timeout, to stop its workers before it is SIGKILLed

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
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("GLIBC_TUNABLES", KEEP_FREED_MEMORY)
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
