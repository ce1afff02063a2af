"""Threads of one process sharing its core: a forward timed in a thread beside a backward, against the two in turn.

The runtime runs an overlapped pair (``OVERLAP_F_B``: DualPipe's, combined-1f1b's) with its forward in a thread
beside its backward (:class:`real.executor.Executor`), so that one part's all-to-all hides behind the other's
compute. On a CPU rank with one core the two parts' compute then shares that core, and sharing it costs more than
the parts one after the other: the threads switch, take turns at the interpreter lock between kernels, and evict
each other's working set from the caches. Measured here on this testbed the pair of the grid's MoE GPT took 1.07-2x
its two parts in turn (a combined-1f1b trace, docs/moe.md), which a model of perfect sharing predicts as 1x.

:func:`pair_share` times, in alternating repetitions (a drift of the machine's speed shifts both alike), each
stage's forward of one microbatch with the backward of another, once one after the other and once as the executor
runs a pair (the forward in a thread, the backward in the caller, then a join). The factor is the sum over the
stages of the paired medians over the sum of the one-after-the-other medians; :func:`sim.costs.moe.threaded_pair_time`
stretches the compute that two parts run at once by it.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence
from typing import Any

from real.backward import backward_full

__all__ = ["pair_share"]


def _serial(bench: Any, timed: Callable[[Callable[[], object]], float]) -> float:
    inp_b = bench._input()
    out_b = bench._forward(inp_b)
    inp_f = bench._input()
    return timed(lambda: (bench._forward(inp_f), backward_full(out_b, bench.grad)))


def _threaded(bench: Any, timed: Callable[[Callable[[], object]], float]) -> float:
    inp_b = bench._input()
    out_b = bench._forward(inp_b)
    inp_f = bench._input()

    def pair() -> None:
        thread = threading.Thread(target=bench._forward, args=(inp_f,), name="profile pair forward", daemon=True)
        thread.start()
        try:
            backward_full(out_b, bench.grad)
        finally:
            thread.join()

    return timed(pair)


def pair_share(benches: Sequence[Any], timed: Callable[[Callable[[], object]], float], warmup: int,
               reps: int) -> dict[str, Any]:
    """The cost file's ``pair_threads`` section: ``factor`` (paired / one after the other, summed over the
    stages' medians), and per stage the medians in seconds (``serial``, ``paired``)."""
    serial: list[list[float]] = [[] for _ in benches]
    paired: list[list[float]] = [[] for _ in benches]
    for rep in range(warmup + reps):
        for s, bench in enumerate(benches):
            if rep % 2:  # alternate which goes first
                a = _serial(bench, timed)
                b = _threaded(bench, timed)
            else:
                b = _threaded(bench, timed)
                a = _serial(bench, timed)
            if rep >= warmup:
                serial[s].append(a)
                paired[s].append(b)
    alone = [statistics.median(x) for x in serial]
    both = [statistics.median(x) for x in paired]
    return {"factor": sum(both) / sum(alone), "serial": alone, "paired": both, "reps": reps}
