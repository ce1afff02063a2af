"""Compute slowed by concurrent communication: a stage's passes timed alone and with a collective in flight.

gloo runs a collective on a thread of its own, which takes the rank's core
and memory bandwidth from the passes running beside it (NCCL kernels take SMs
the same way on a GPU). The runtime's ddp, zero and fsdp modes issue bucket
collectives asynchronously while the backward (or, for fsdp's gathers, the
forward) runs, so the passes they overlap run slower than the profile's
passes alone.

:func:`comm_slowdown` times, in alternating repetitions (so a drift of the
machine's speed shifts both alike), the passes F, B, I and W of every stage
given, once alone and once while a chain of asynchronous all-reduces of one
bucket's bytes is in flight over the data-parallel group, as the runtime
issues its buckets. The chain is sized from a first timing of one all-reduce
so that it outlasts the passes (twice over); a repetition whose chain ended
before the passes did is counted in ``short`` (and named in a warning).

The factor is the sum over the passes of the with-collective medians over the
sum of the alone medians; :mod:`sim.slowdown` stretches the simulated compute
that overlaps a transfer by it.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from real.profile.stats import stat as _stat

__all__ = ["comm_slowdown"]

log = logging.getLogger(__name__)

_PASSES = ("F", "B", "I", "W")


def _chain_length(buf: torch.Tensor, group: Any, passes_s: float, warmup: int) -> int:
    """All-reduces of ``buf`` to keep in flight: twice the passes' time over one all-reduce's, the same on
    every rank (the largest)."""
    times = []
    for _ in range(warmup + 3):
        dist.barrier(group=group)
        t = time.perf_counter()
        dist.all_reduce(buf, group=group)
        times.append(time.perf_counter() - t)
    one = max(statistics.median(times[warmup:]), 1e-6)
    n = torch.tensor([math.ceil(2 * passes_s / one) + 1], dtype=torch.int64)
    dist.all_reduce(n, op=dist.ReduceOp.MAX, group=group)
    return int(n.item())



def comm_slowdown(benches: Sequence[Any], group: Any, bucket_bytes: int, timed: Callable, warmup: int, reps: int,
                  gathered: Callable[[list[float]], list[float]]) -> dict[str, Any]:
    """The ``comm_slowdown`` section of the cost file (schema in :mod:`real.profile`); every rank of ``group``
    calls it at once. ``benches``: the stages to time (``real.profile.machine._StageBench``); ``gathered``: every
    rank's samples."""
    device = benches[0].device
    buf = torch.zeros(max(bucket_bytes // 4, 1), dtype=torch.float32, device=device)
    alone: dict[str, list[float]] = {k: [] for k in _PASSES}
    under: dict[str, list[float]] = {k: [] for k in _PASSES}
    first = [sum(b.one_rep(timed)) for b in benches for _ in range(max(warmup, 1))]
    chain = _chain_length(buf, group, max(first), warmup)
    short = 0
    for rep in range(warmup + reps):
        keep = rep >= warmup
        for bench in benches:
            dist.barrier(group=group)
            sample = bench.one_rep(timed)
            if keep:
                for k, v in zip(_PASSES, sample, strict=True):
                    alone[k].append(v)
            dist.barrier(group=group)
            works = [dist.all_reduce(buf, group=group, async_op=True) for _ in range(chain)]
            sample = bench.one_rep(timed)
            ended = works[-1].is_completed()
            for w in works:
                w.wait()
            if keep:
                short += ended
                for k, v in zip(_PASSES, sample, strict=True):
                    under[k].append(v)
    stats = {"alone": {k: _stat(gathered(v)) for k, v in alone.items()},
             "with_collective": {k: _stat(gathered(v)) for k, v in under.items()}}
    short = sum(int(x) for x in gathered([float(short)]))
    base = sum(stats["alone"][k]["median"] for k in _PASSES)
    slowed = sum(stats["with_collective"][k]["median"] for k in _PASSES)
    out: dict[str, Any] = {"factor": slowed / base, "bucket_bytes": int(buf.numel() * 4), "in_flight": chain,
                           "passes": list(_PASSES), **stats, "short": short}
    warned = []
    if short:
        warned.append(f"comm_slowdown: the all-reduces ended before the passes in {short} of "
                      f"{reps * len(benches) * len(gathered([0.0]))} repetitions (rank samples); the factor there "
                      "covers only part of the passes")
    if out["factor"] < 1:
        warned.append(f"comm_slowdown.factor: the passes ran faster with a collective in flight (x{out['factor']:.3f}):"
                      " the machine's noise is larger than the effect; kept as measured")
    if warned:
        out["warnings"] = warned
    for w in warned:
        log.warning("profile: %s", w)
    log.info("comm_slowdown %.3f (%d all-reduces of %d bytes in flight)", out["factor"], chain, bucket_bytes)
    return out
