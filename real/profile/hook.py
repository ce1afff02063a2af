"""The CPU cost of zero2/zero3's per-bucket reduce-scatter hook, per gradient byte.

In zero2 and zero3 (:class:`real.dp.zero.ShardedSync`) every bucket is reduce-scattered once per microbatch: when
the bucket's last gradient of a backward is in, the hook (``ShardedSync._reduce``) runs on the training thread,
inside the pass. Its work beside the collective itself is:

* the bucket's gradients copied into one flat buffer and the parameters' ``.grad`` dropped
  (:func:`real.dp.zero._flatten_grads`, one ``torch.cat``);
* the reduce-scatter's output allocated and the collective launched (``dist.reduce_scatter_single``,
  ``async_op``: gloo queues it for its own threads);
* once it completes, its output added into the bucket's shard of the gradient (``ShardedSync._fold``) and
  the flat buffer and output freed.

ddp and zero1 do none of this per microbatch: autograd accumulates into views of one flat buffer, launched
once a step (:mod:`real.dp.sync`), so a ddp calibration run never sees it (docs/dp-modes.md, "What a zero3 pass
costs on the CPU testbed", measured 0.7-0.9 ms of one core per 1.3 MB bucket with ``experiments/pass_cpu.py``).

:func:`reduce_hook` runs that hook (the same calls, :data:`real.dp.zero.MAX_INFLIGHT` reduce-scatters in flight
at most) on the stage's own parameters, cut into the run's buckets by :func:`real.dp.sync.make_buckets` at the
run's ``bucket_mb``, inside the stage's real forward and full backward (so the gradients are autograd's and
the caches hold what a backward leaves in them), over the data-parallel group, every rank at once; and times
each hook call on the calling thread's CPU clock (``time.thread_time``: gloo's threads, which move the bytes,
the waits for a collective and a loaded machine's waits for the core are not in it). ``ns_per_byte`` = the
median over repetitions and ranks of (CPU seconds of one backward's hooks) / (its buckets' flat bytes); the
simulator charges bytes x it to the pass that runs the hook of each per-microbatch reduce-scatter
(:class:`sim.costs.profiled.ProfiledCosts` ``reduce_hook_ns_per_byte``).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from real.backward import backward_full
from real.dp.sync import make_buckets
from real.dp.zero import MAX_INFLIGHT, _flatten_grads
from real.profile.stats import stat as _stat

__all__ = ["reduce_hook"]

log = logging.getLogger(__name__)


class _HookBucket:
    """What :func:`real.dp.zero._flatten_grads` reads of a bucket (its parameters, flat size, shard dtype), and the
    shard its reduce-scatters are added into."""

    def __init__(self, params: list[nn.Parameter], world: int) -> None:
        n = sum(p.numel() for p in params)
        padded = -(-n // world) * world
        self.params = params
        self.data = torch.empty(padded, dtype=params[0].dtype, device=params[0].device)
        self.shard = torch.empty(padded // world, dtype=params[0].dtype, device=params[0].device)
        self.shard_grad = torch.zeros_like(self.shard)
        self.ready: set[int] = set()

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


class _Hooks:
    """The runtime's hook on a stage's parameters, each call's thread CPU time added to ``cpu``."""

    def __init__(self, buckets: list[_HookBucket], group: Any) -> None:
        self.buckets, self.group = buckets, group
        self.pending: deque[tuple[_HookBucket, Any, torch.Tensor, torch.Tensor]] = deque()
        self.cpu = self.wall = 0.0
        self.handles = [p.register_post_accumulate_grad_hook(lambda q, b=b: self._on_grad(b, q))
                        for b in buckets for p in b.params]

    def _on_grad(self, b: _HookBucket, p: nn.Parameter) -> None:
        b.ready.add(id(p))
        if len(b.ready) == len(b.params):
            b.ready = set()
            self._timed(self._reduce, b)

    def _timed(self, fn: Callable[..., None], *args: Any) -> None:
        c0, w0 = time.thread_time(), time.perf_counter()
        fn(*args)
        self.cpu += time.thread_time() - c0
        self.wall += time.perf_counter() - w0

    def _reduce(self, b: _HookBucket) -> None:
        """``real.dp.zero.ShardedSync._reduce``'s work: flatten, launch, fold all but the newest MAX_INFLIGHT."""
        flat = _flatten_grads(b)
        out = torch.empty_like(b.shard_grad)
        work = dist.reduce_scatter_single(out, flat, group=self.group, async_op=True)
        self.pending.append((b, work, out, flat))
        self._fold(MAX_INFLIGHT)

    def _fold(self, keep: int) -> None:
        while len(self.pending) > keep:
            b, work, out, _flat = self.pending.popleft()
            work.wait()  # blocked, not on the CPU clock
            b.shard_grad.add_(out)

    def finish(self) -> None:
        self._timed(self._fold, 0)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()



def reduce_hook(benches: Sequence[Any], group: Any, bucket_mb: float, warmup: int, reps: int,
                gathered: Callable[[list[float]], list[float]]) -> dict[str, Any]:
    """The ``reduce_hook`` section of the cost file (schema in :mod:`real.profile`); every rank of ``group``
    calls it at once. ``benches``: the stages (``real.profile.machine._StageBench``) whose forward and full backward
    run, the hook on their parameters bucketed per stage as the runtime does (removed after); ``gathered``:
    every rank's samples."""
    world = dist.get_world_size(group)
    buckets = [_HookBucket(b, world) for bench in benches for b in make_buckets(bench.params, bucket_mb * 2**20)]
    nbytes = sum(b.nbytes for b in buckets)
    hooks = _Hooks(buckets, group)
    cpu, wall = [], []
    try:
        for rep in range(warmup + reps):
            dist.barrier(group=group)
            hooks.cpu = hooks.wall = 0.0
            for bench in benches:
                backward_full(bench._forward(bench._input()), bench.grad)
            hooks.finish()
            if rep >= warmup:
                cpu.append(hooks.cpu)
                wall.append(hooks.wall)
    finally:
        hooks.remove()
    cpu, wall = gathered(cpu), gathered(wall)
    out = {"ns_per_byte": statistics.median(cpu) / nbytes * 1e9, "bucket_bytes": [b.nbytes for b in buckets],
           "cpu": _stat(cpu), "wall": _stat(wall)}
    log.info("reduce_hook: %.3f ns per gradient byte (%.3f ms of CPU for %d buckets, %d bytes)",
             out["ns_per_byte"], out["cpu"]["median"] * 1e3, len(buckets), nbytes)
    return out
