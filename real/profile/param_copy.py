"""The CPU cost of decentralized's and local-sgd's parameter copies, per parameter byte.

:mod:`real.peer_sync` copies parameters on the training thread around its exchanges (where in the step, and how
the simulator charges them: :mod:`sim.param_copy`):

* decentralized, before the first pass: ``PeerSync._launch`` (each bucket flattened by ``torch.cat``, the
  receive buffers allocated, the isend/irecv to the neighbours posted);
* decentralized, after the last backward: ``PeerSync.finish`` (wait for the exchanges, then the neighbourhood's
  mean written into every parameter);
* local-sgd, after the OPTIM of an averaging step: ``PeerSync.after_step`` (per bucket torch's
  ``average_parameters``: flatten, divide, a blocking all-reduce, the parameters pointed at the result).

:func:`param_copy` builds the runtime's own :class:`real.peer_sync.PeerSync` on the stages' parameters, bucketed
at the run's ``bucket_mb``, over the data-parallel group, and times those three methods on the calling thread's
CPU clock (``time.thread_time``: the waits for the exchanges and the all-reduce, which gloo's threads do, are not
in it). Each ``*_ns_per_byte`` = the median over repetitions and ranks of (CPU seconds of one call) / (the
buckets' parameter bytes). The parameters keep their values (every rank's are the same, so every mean is).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from real.peer_sync import PeerSync
from real.profile.stats import stat as _stat

__all__ = ["param_copy"]

log = logging.getLogger(__name__)


def _cpu(fn: Callable[[], object]) -> float:
    c0 = time.thread_time()
    fn()
    return time.thread_time() - c0


def _reps(decentralized: PeerSync, local: PeerSync, group: Any, n: int, out: tuple[list[float], ...],
          warmup: int) -> None:
    """``n`` repetitions of the three calls, the samples after ``warmup`` appended to ``out``."""
    for rep in range(n):
        dist.barrier(group=group)
        samples = [_cpu(decentralized._launch), _cpu(decentralized.finish)]
        dist.barrier(group=group)
        local.step = 0  # an averaging step every time
        for b in local.buckets:
            b.averager.step = 0
        samples.append(_cpu(local.after_step))
        if rep >= warmup:
            for xs, x in zip(out, samples, strict=True):
                xs.append(x)


def param_copy(benches: Sequence[Any], group: Any, bucket_mb: float, warmup: int, reps: int,
               gathered: Callable[[list[float]], list[float]]) -> dict[str, Any]:
    """The ``param_copy`` section of the cost file (schema in :mod:`real.profile`); every rank of ``group`` calls
    it at once. ``benches``: the stages (``real.profile._StageBench``) whose parameters are copied; ``gathered``:
    every rank's samples."""
    stage_params = {s: list(bench.params) for s, bench in enumerate(benches)}
    common = {"group": group, "bucket_mb": bucket_mb, "stamp": lambda: 0.0, "record": lambda *a, **k: None}
    decentralized = PeerSync(stage_params, mode="decentralized", **common)
    local = PeerSync(stage_params, mode="local-sgd", sync_every=1, **common)
    nbytes = sum(b.nbytes for b in decentralized.buckets)
    params = [p for ps in stage_params.values() for p in ps]
    grads = [p.grad for p in params]
    for p in params:  # torch averages only the parameters with a gradient, as every one has after a backward
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flatten, average, local_sgd = [], [], []
    try:
        _reps(decentralized, local, group, warmup + reps, (flatten, average, local_sgd), warmup)
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
    flatten, average, local_sgd = gathered(flatten), gathered(average), gathered(local_sgd)
    out = {"flatten_ns_per_byte": statistics.median(flatten) / nbytes * 1e9,
           "average_ns_per_byte": statistics.median(average) / nbytes * 1e9,
           "local_sgd_ns_per_byte": statistics.median(local_sgd) / nbytes * 1e9,
           "bucket_bytes": [b.nbytes for b in decentralized.buckets],
           "cpu": {"flatten": _stat(flatten), "average": _stat(average), "local_sgd": _stat(local_sgd)}}
    log.info("param_copy: %.3f / %.3f / %.3f ns per parameter byte (decentralized flatten, average; local-sgd) on "
             "%d buckets, %d bytes", out["flatten_ns_per_byte"], out["average_ns_per_byte"],
             out["local_sgd_ns_per_byte"], len(decentralized.buckets), nbytes)
    return out
