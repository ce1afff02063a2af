"""No process outlives its parent: the one helper every child process schedlab starts calls first.

:func:`die_with_parent` asks Linux (``prctl(PR_SET_PDEATHSIG)``) to send this
process a signal when its parent dies, SIGKILL included, and exits at once if
the parent is already gone (the race between ``fork`` and the ``prctl``). It is
a ``preexec_fn`` for :class:`subprocess.Popen` and an ``initializer`` for a
process pool. The signal is sent when the *thread* that forked the child ends,
so start children from a thread that lives as long as they should (the main
thread). Elsewhere than Linux it does nothing: the caller's own cleanup (its
``finally`` and signal handlers) is then all there is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

__all__ = ["PR_SET_PDEATHSIG", "die_with_parent"]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM, parent: int | None = None) -> None:
    """Receive ``sig`` when the parent dies; exit now (status 128 + ``sig``) if it already has.

    ``parent``: the parent's pid as the caller knew it before forking (default: this process's parent now, which
    cannot detect a parent that died before the call).
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    if parent is not None and os.getppid() != parent:
        os._exit(128 + int(sig))
