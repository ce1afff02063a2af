"""PowerSGD's hooks timed the way a run waits for them: launched from inside a real backward pass.

:func:`real.profile.powersgd.powersgd_section` times each bucket's hook back to back, the ranks in lockstep after a
barrier, nothing between them. In a run (:class:`real.dp.sync.GradSync` with a ``powersgd:R`` codec) each bucket's hook
is called from autograd's post-accumulate-grad hook of its last parameter, on the training thread, inside the
last microbatch's backward, after the slice of backward compute that completes the bucket; its three all-reduces
are each waited for before the next. So every bucket's first all-reduce waits for the later replica (the ranks
drift apart over the compute between buckets), and the hook's future callbacks hand work between gloo's and the
training thread while autograd's engine is in the pass.

:func:`hooks_in_backward` reproduces that: the stage's own parameters cut into the run's buckets
(:func:`real.dp.sync.make_buckets`, padded to a multiple of the group), ``p.grad`` views of each bucket's flat buffer
as the runtime sets them, a post-accumulate-grad hook per parameter that calls the runtime's codec
(:meth:`real.dp.compress.Codec.allreduce`, waited for at once) when its bucket is complete, inside the stage's real
forward and full backward, every rank of the data-parallel group at once (a barrier before each repetition only).
Per repetition it records:

* ``hooks``: the seconds the training thread spent in the backward's hook calls (``time.perf_counter`` around
  each, summed), as the runtime's ``codec compute`` log line counts them: the figure the simulator charges;
* ``extra``: the backward's wall time less the median wall time of the same backward without the hooks
  (timed in the same loop, alternating), a check of ``hooks`` that also holds what the hooks do to the pass
  around them.

Both are medians over repetitions (the profile's ``reps``, at most :data:`MAX_REPS`, after one warm-up) and
every rank's samples (:func:`real.profile.stats.stat`).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from real.backward import backward_full
from real.dp.compress import Codec
from real.dp.sync import make_buckets
from real.profile.stats import stat as _stat
from schedules.dp.codecs import parse_compression

__all__ = ["hooks_in_backward"]

log = logging.getLogger(__name__)

# repetitions at most (after one warm-up): each is two forward + full backward passes of the stage, ~0.1 s on
# the grid's model, so the section adds ~1 s to a profile
MAX_REPS = 10


class _Bucket:
    """A bucket's flat gradient buffer, its parameters' ``.grad`` views of it (as :class:`real.dp.sync.GradSync`)."""

    def __init__(self, params: list[nn.Parameter], world: int) -> None:
        n = sum(p.numel() for p in params)
        self.params = params
        self.flat = torch.zeros(-(-n // world) * world, dtype=params[0].dtype, device=params[0].device)
        self.ready = 0

    def attach(self) -> None:
        offset = 0
        for p in self.params:
            p.grad = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()


class _PsgdHooks:
    """The runtime's per-bucket PowerSGD call on a stage's parameters; ``seconds``: this backward's hook calls."""

    def __init__(self, spec: str, buckets: list[_Bucket], group: Any, lockstep: bool = False) -> None:
        self.buckets, self.group, self.lockstep = buckets, group, lockstep
        self.keys = [f"s0b{i}" for i in range(len(buckets))]
        self.codec = Codec(parse_compression(spec), group, {k: b.flat.numel() for k, b in zip(self.keys, buckets, strict=True)})
        self.seconds = 0.0
        self.active = False
        self.handles = [p.register_post_accumulate_grad_hook(lambda q, i=i: self._on_grad(i))
                        for i, b in enumerate(buckets) for p in b.params]

    def _on_grad(self, i: int) -> None:
        if not self.active:
            return
        b = self.buckets[i]
        b.ready += 1
        if b.ready == len(b.params):
            if self.lockstep:  # the ranks aligned before each hook (untimed): no drift in it
                dist.barrier(group=self.group)
            t = time.perf_counter()
            self.codec.allreduce(self.keys[i], b.flat, [p.grad for p in b.params]).wait()
            self.seconds += time.perf_counter() - t

    def begin(self) -> None:
        self.seconds = 0.0
        for b in self.buckets:
            b.flat.zero_()
            b.ready = 0
            b.attach()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _backward(bench: Any) -> float:
    out = bench._forward(bench._input())
    t = time.perf_counter()
    backward_full(out, bench.grad)
    return time.perf_counter() - t


def hooks_in_backward(spec: str, bench: Any, group: Any, bucket_mb: float, warmup: int, reps: int,
                      gathered: Callable[[list[float]], list[float]], lockstep: bool = False) -> dict[str, Any]:
    """The ``in_backward`` entry of the cost file's ``powersgd.<spec>`` (module doc); every rank of ``group`` calls
    it at once. ``bench``: the stage (``real.profile.machine._StageBench``) whose forward and full backward run; its
    parameters' ``.grad`` are left None. ``lockstep``: a barrier (not timed) before each hook, so the replicas'
    drift is out of ``hooks`` (experiments/psgd_hooks.py; the profile leaves it False)."""
    t_start = time.perf_counter()
    reps, warmup = min(reps, MAX_REPS), min(warmup, 1)
    world = dist.get_world_size(group)
    buckets = [_Bucket(b, world) for b in make_buckets(bench.params, bucket_mb * 2**20)]
    hooks: list[float] = []
    with_hooks: list[float] = []
    plain: list[float] = []
    psgd = _PsgdHooks(spec, buckets, group, lockstep)
    try:
        for rep in range(warmup + reps):
            dist.barrier(group=group)
            psgd.begin()
            psgd.active = False
            t_plain = _backward(bench)
            psgd.begin()
            psgd.active = True
            dist.barrier(group=group)
            t_hooks = _backward(bench)
            psgd.active = False
            if rep >= warmup:
                plain.append(t_plain)
                with_hooks.append(t_hooks)
                hooks.append(psgd.seconds)
    finally:
        psgd.remove()
        for p in bench.params:
            p.grad = None
    plain_median = statistics.median(gathered(plain))
    extra = gathered([t - plain_median for t in with_hooks])
    out = {"buckets": len(buckets), "hooks": _stat(gathered(hooks)), "extra": _stat(extra)}
    log.info("%s hooks inside a backward: %d buckets, %.3f ms in the hook calls, the backward %.3f ms longer "
             "than without them (%d reps, %.2f s)", spec, len(buckets), out["hooks"]["median"] * 1e3,
             out["extra"]["median"] * 1e3, reps, time.perf_counter() - t_start)
    return out
