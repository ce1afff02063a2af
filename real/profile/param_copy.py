"""The CPU cost of decentralized's and local-sgd's parameter copies, per parameter byte.

:mod:`real.dp.peer_sync` copies parameters on the training thread around its exchanges (where in the step, and how
the simulator charges them: :mod:`sim.costs.param_copy`):

* decentralized, before the first pass: ``PeerSync._launch`` (each bucket flattened by ``torch.cat``, the
  receive buffers allocated, the isend/irecv to the neighbours posted);
* decentralized, after the last backward: ``PeerSync.finish`` (wait for the exchanges, then the neighbourhood's
  mean written into every parameter);
* local-sgd, after the OPTIM of an averaging step: ``PeerSync.after_step`` (per bucket torch's
  ``average_parameters``: flatten, divide, a blocking all-reduce, the parameters pointed at the result).

:func:`param_copy` builds the runtime's own :class:`real.dp.peer_sync.PeerSync` on the stages' parameters, bucketed
at the run's ``bucket_mb``, over the data-parallel group, and times those three methods on the calling thread's
clock (``time.perf_counter``) and CPU clock (``time.thread_time``). Each ``*_ns_per_byte`` = the median over
repetitions and ranks of (seconds of one call) / (the buckets' parameter bytes), in:

* wall for decentralized's two. ``_launch``'s wall is what the step waits for before its first pass: posting the
  isend/irecv makes gloo's threads copy on the same cores while the trainer flattens the next bucket (measured on
  the 2-core testbed, grid model, 1 MB buckets: 2.9 ms wall, 1.0 ms CPU; the runs' traces show 2.8-3.6 ms from
  the first EXCHANGE row to the first F). ``finish`` is timed after the exchanges were awaited (untimed), so its
  wall is the averaging alone (1.36 ms wall, 1.32 ms CPU);
* thread CPU for local-sgd's ``after_step``: its wall holds the blocking all-reduce, which the model times as the
  ALLREDUCE's alpha + n / beta (gloo's threads move the bytes; the trainer's thread waits, off its CPU clock).

Both clocks' statistics are in the section (``cpu``, ``wall``). The parameters keep their values (every rank's
are the same, so every mean is).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from real.dp.peer_sync import PeerSync
from real.profile.stats import stat as _stat

__all__ = ["param_copy"]

log = logging.getLogger(__name__)


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(thread CPU seconds, wall seconds) of ``fn()``."""
    c0, w0 = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - c0, time.perf_counter() - w0


def _exchanged(sync: PeerSync) -> None:
    """Wait (untimed) for the exchanges ``sync._launch`` posted, so that ``finish`` then times the averaging only."""
    sync.works.drain()
    if sync._watcher is not None:
        sync._watcher.join()


def _reps(decentralized: PeerSync, local: PeerSync, group: Any, n: int, warmup: int) -> dict[str, list[float]]:
    """``n`` repetitions of the three calls: each one's CPU and wall samples after ``warmup``."""
    out: dict[str, list[float]] = {}
    for rep in range(n):
        dist.barrier(group=group)
        flatten = _timed(decentralized._launch)
        _exchanged(decentralized)
        average = _timed(decentralized.finish)
        dist.barrier(group=group)
        local.step = 0  # an averaging step every time
        for b in local.buckets:
            b.averager.step = 0
        local_sgd = _timed(local.after_step)  # its wall holds the all-reduce: CPU only
        if rep >= warmup:
            for key, x in (("flatten", flatten[0]), ("average", average[0]), ("local_sgd", local_sgd[0]),
                           ("flatten_wall", flatten[1]), ("average_wall", average[1])):
                out.setdefault(key, []).append(x)
    return out


def param_copy(benches: Sequence[Any], group: Any, bucket_mb: float, warmup: int, reps: int,
               gathered: Callable[[list[float]], list[float]]) -> dict[str, Any]:
    """The ``param_copy`` section of the cost file (schema in :mod:`real.profile`); every rank of ``group`` calls
    it at once. ``benches``: the stages (``real.profile.machine._StageBench``) whose parameters are copied; ``gathered``:
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
    try:
        samples = _reps(decentralized, local, group, warmup + reps, warmup)
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
    samples = {k: gathered(v) for k, v in samples.items()}
    # decentralized's two: wall (the posting's gloo work and the waits for the core are what the step waits for;
    # nothing else runs then); local-sgd's: CPU (its wall holds the all-reduce, which the model times already)
    out = {f"{k}_ns_per_byte": statistics.median(samples[key]) / nbytes * 1e9
           for k, key in (("flatten", "flatten_wall"), ("average", "average_wall"), ("local_sgd", "local_sgd"))}
    out.update({"bucket_bytes": [b.nbytes for b in decentralized.buckets],
                "cpu": {k: _stat(samples[k]) for k in ("flatten", "average", "local_sgd")},
                "wall": {k: _stat(samples[f"{k}_wall"]) for k in ("flatten", "average")}})
    log.info("param_copy: %.3f / %.3f / %.3f ns per parameter byte (decentralized flatten, average; local-sgd) on "
             "%d buckets, %d bytes", out["flatten_ns_per_byte"], out["average_ns_per_byte"],
             out["local_sgd_ns_per_byte"], len(decentralized.buckets), nbytes)
    return out
