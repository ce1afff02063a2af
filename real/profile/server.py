"""A stage's ``SERVER_UPDATE`` (dp mode ps): the parameter server's update of the stage, timed as a server runs it.

A ps server (:class:`real.dp.ps.ParamServer`) folds each bucket's pushes as they arrive and, once the stage's last
bucket is in, steps the stage's optimizer over its shards of the stage's buckets: one flat tensor per bucket, not
the model's parameter tensors, and alone: the trainers wait for it (in the step's loss all-reduce). Its traced
``{s}OPTIM`` row is the last bucket's fold and that step. So the profiler times the same: the fold of the last
bucket's ``dp`` pushes (copy, add, divide) and the optimizer over flat copies of the stage's buckets
(:func:`real.dp.sync.make_buckets` of ``bucket_mb``), on rank 0 while every other rank waits at a barrier. On the CPU
testbed a server's update took 3.0 ms in-run where a ddp trainer's optimizer step over the same model took 6.3
(docs/dp-modes.md, "What a ps step costs").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from real.dp.sync import make_buckets
from real.models import make_optimizer

__all__ = ["server_update_samples"]


def _flat(bucket: Sequence[nn.Parameter]) -> nn.Parameter:
    """A flat copy of the bucket's parameters, its gradient a flat copy of theirs (zeros where they have none)."""
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in bucket]))
    flat.grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                           for p in bucket])
    return flat


def server_update_samples(params: Sequence[nn.Parameter], optimizer: str, lr: float, bucket_mb: float, dp: int,
                          timed: Callable[[Callable[[], object]], float], warmup: int, reps: int) -> list[float]:
    """Seconds of the server's update of the stage holding ``params`` (module doc), ``reps`` samples on rank 0
    (none on the others: they wait)."""
    flats = [_flat(b) for b in make_buckets(list(params), bucket_mb * 2**20)]
    opt = make_optimizer(optimizer, flats, lr)
    last = flats[-1].grad
    pushes = [last.clone() for _ in range(max(dp, 1))]

    @torch.no_grad()
    def update() -> None:
        last.copy_(pushes[0])
        for push in pushes[1:]:
            last.add_(push)
        last.div_(len(pushes))
        opt.step()

    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    mine = not distributed or dist.get_rank() == 0
    samples = []
    for rep in range(warmup + reps):
        if distributed:
            dist.barrier()
        if mine:
            t = timed(update)
            if rep >= warmup:
                samples.append(t)
        if distributed:
            dist.barrier()
    return samples
