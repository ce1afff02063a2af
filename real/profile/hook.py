"""The CPU cost of zero2/zero3's per-bucket reduce-scatter hook, per gradient byte.

In zero2 and zero3 (:class:`real.zero.ShardedSync`) every bucket is reduce-scattered once per microbatch: when
the bucket's last gradient of a backward is in, the hook (``ShardedSync._reduce``) runs on the training thread,
inside the pass. Its work beside the collective itself is:

* the bucket's gradients copied into one flat buffer and the parameters' ``.grad`` dropped
  (:func:`real.zero._flatten_grads`, one ``torch.cat``);
* the reduce-scatter's output allocated and the collective launched (``dist.reduce_scatter_tensor``,
  ``async_op``: gloo queues it for its own threads);
* once it completes, its output added into the bucket's shard of the gradient (``ShardedSync._fold``) and
  the flat buffer and output freed.

ddp and zero1 do none of this per microbatch: autograd accumulates into views of one flat buffer, launched
once a step (:mod:`real.dp`), so a ddp calibration run never sees it (docs/dp-modes.md, "What a zero3 pass
costs on the CPU testbed", measured 0.7-0.9 ms of one core per 1.3 MB bucket with ``experiments/pass_cpu.py``).

:func:`reduce_hook` runs exactly those calls over the data-parallel group on the run's own buckets (the
stage's parameters cut by :func:`real.dp.make_buckets` at the run's ``bucket_mb``), each gradient freshly
allocated as autograd leaves it, and times them on the calling thread's CPU clock (``time.thread_time``:
gloo's threads, which move the bytes, and a loaded machine's waits are not in it). The wait for the
collective is not timed. ``ns_per_byte`` = the median over repetitions and ranks of (CPU seconds of one
pass's hooks over all buckets) / (their flat bytes); the simulator charges bytes x it to the pass that runs
the hook of each per-microbatch reduce-scatter (:class:`sim.profiled.ProfiledCosts`
``reduce_hook_ns_per_byte``).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from real.dp import make_buckets
from real.zero import _flatten_grads

__all__ = ["reduce_hook"]

log = logging.getLogger(__name__)


class _HookBucket:
    """What :func:`real.zero._flatten_grads` reads of a bucket: its parameters, flat size and shard dtype."""

    def __init__(self, params: list[nn.Parameter], world: int) -> None:
        n = sum(p.numel() for p in params)
        padded = -(-n // world) * world
        self.params = params
        self.data = torch.empty(padded, dtype=params[0].dtype)
        self.shard = torch.empty(padded // world, dtype=params[0].dtype)
        self.shard_grad = torch.zeros(padded // world, dtype=params[0].dtype)

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


def _one_pass(buckets: Sequence[_HookBucket], grads: Sequence[Sequence[torch.Tensor]], group: Any
              ) -> tuple[float, float]:
    """Every bucket's hook once, as one backward runs them: (thread CPU seconds, wall seconds) of the hook work."""
    cpu = wall = 0.0
    for b, gs in zip(buckets, grads, strict=True):
        for p, g in zip(b.params, gs, strict=True):
            p.grad = g.clone()  # a fresh gradient, as autograd leaves it when .grad was dropped
        c0, w0 = time.thread_time(), time.perf_counter()
        flat = _flatten_grads(b)
        out = torch.empty_like(b.shard_grad)
        work = dist.reduce_scatter_tensor(out, flat, group=group, async_op=True)
        cpu += time.thread_time() - c0
        wall += time.perf_counter() - w0
        work.wait()  # the collective itself: not the hook's
        c0, w0 = time.thread_time(), time.perf_counter()
        b.shard_grad.add_(out)
        del flat, out
        cpu += time.thread_time() - c0
        wall += time.perf_counter() - w0
    return cpu, wall


def _stat(xs: Sequence[float]) -> dict[str, float]:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return {"median": statistics.median(xs), "p10": q[0], "p90": q[-1], "n": len(xs)}


def reduce_hook(stages: Sequence[Sequence[nn.Parameter]], group: Any, bucket_mb: float, warmup: int, reps: int,
                gathered: Callable[[list[float]], list[float]]) -> dict[str, Any]:
    """The ``reduce_hook`` section of the cost file (schema in :mod:`real.profile`); every rank of ``group``
    calls it at once. ``stages``: each stage's parameters (copied: they are not touched), bucketed per stage
    as the runtime does; ``gathered``: every rank's samples."""
    world = dist.get_world_size(group)
    buckets = [_HookBucket(b, world) for params in stages
               for b in make_buckets([nn.Parameter(p.detach().clone()) for p in params], bucket_mb * 2**20)]
    gen = torch.Generator().manual_seed(0)
    grads = [[torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in b.params] for b in buckets]
    nbytes = sum(b.nbytes for b in buckets)
    cpu, wall = [], []
    for rep in range(warmup + reps):
        dist.barrier(group=group)
        c, w = _one_pass(buckets, grads, group)
        if rep >= warmup:
            cpu.append(c)
            wall.append(w)
    cpu, wall = gathered(cpu), gathered(wall)
    out = {"ns_per_byte": statistics.median(cpu) / nbytes * 1e9, "bucket_bytes": [b.nbytes for b in buckets],
           "cpu": _stat(cpu), "wall": _stat(wall)}
    log.info("reduce_hook: %.3f ns per gradient byte (%.3f ms of CPU for %d buckets, %d bytes)",
             out["ns_per_byte"], out["cpu"]["median"] * 1e3, len(buckets), nbytes)
    return out
