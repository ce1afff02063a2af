"""ZeRO-3's gathers and the passes that read what they gathered, timed as the runtime runs them.

zero3 (:mod:`real.dp.zero`) keeps each bucket's flat parameters freed (their storage resized to 0) and, before
every task that reads the stage, all-gathers them: every bucket's gather launched at once, the task waiting for
all of them, the storage freed again after the task. The simulator charged each gather the all-gather fit of
the ``collectives`` section (alpha + bytes / beta over two sizes, the stage's whole parameters and a quarter of
them), one after the other. On the grid's model that fit's alpha came out 0, 0.17 and 0.75 ms in three profiles
of the same machine, and a zero3 step at m = 4 has 48 gathers: the zero3 rows' prediction moved by a quarter
between grids whose measurements agreed within 4%. The passes themselves ran about a third longer than the
same passes of a ddp run (the forward 7.8 against 5.7 ms), with no collective in flight beside them.

:func:`zero3_section` times what zero3 does, on the stage's own parameters cut into the run's buckets
(:func:`real.dp.sync.make_buckets`, each padded to a multiple of the group, the parameters views of the flat
buffer, as :class:`real.dp.zero.ShardedSync` lays them out), every rank of the data-parallel group at once, in
alternating repetitions:

* ``alone``: a forward (F) and its full backward (B), the parameters whole;
* ``gathered``: every bucket's storage freed and gathered (``all_gather_single`` of this rank's shard,
  every bucket launched at once, all waited for: the ``burst``), then F; freed, gathered again, then B; freed.

The section's ``burst`` is the median burst (seconds for every bucket's gather, launched together), and
``factor`` per pass the gathered median over the alone median. :meth:`analysis.validation.calibration.Calibration.
data_parallel` charges a zero3 row's gathers ``burst`` / buckets each, and its passes the factors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from real.backward import backward_full
from real.dp.sync import make_buckets
from real.profile.stats import stat as _stat

__all__ = ["MAX_REPS", "zero3_section"]

log = logging.getLogger(__name__)

MAX_REPS = 15  # repetitions at most (after one warm-up): each is 2 forwards and 2 full backwards, ~0.1 s


class _Flat:
    """One bucket: a flat buffer its parameters are views of, and this rank's shard of it (a copy)."""

    def __init__(self, params: list[nn.Parameter], world: int, rank: int) -> None:
        n = sum(p.numel() for p in params)
        n += -n % world
        self.flat = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)
        self.params, self.saved = params, [p.data for p in params]
        off = 0
        for p in params:
            self.flat[off:off + p.numel()].copy_(p.data.reshape(-1))
            p.data = self.flat[off:off + p.numel()].view(p.shape)
            off += p.numel()
        self.shard = self.flat[rank * (n // world):(rank + 1) * (n // world)].clone()
        self.nbytes = self.flat.numel() * self.flat.element_size()

    def free(self) -> None:
        self.flat.untyped_storage().resize_(0)

    def gather(self, group: Any) -> Any:
        self.flat.untyped_storage().resize_(self.nbytes)
        return dist.all_gather_single(self.flat, self.shard, group=group, async_op=True)

    def restore(self) -> None:
        """The parameters as they were: their own storage, untouched."""
        for p, data in zip(self.params, self.saved, strict=True):
            p.data = data


def zero3_section(bench: Any, group: Any, bucket_mb: float, reps: int,
                  gathered: Callable[[list[float]], list[float]]) -> dict[str, Any]:
    """The ``zero3`` section of the cost file (module doc); every rank of ``group`` calls it at once. ``bench``:
    the stage (``real.profile.machine._StageBench``); ``gathered``: every rank's samples."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    flats = [_Flat(b, world, rank) for b in make_buckets(bench.params, bucket_mb * 2**20)]

    def burst() -> float:
        """Every bucket freed, then gathered at once and waited for: seconds."""
        for f_ in flats:
            f_.free()
        t = time.perf_counter()
        for w in [f_.gather(group) for f_ in flats]:
            w.wait()
        return time.perf_counter() - t

    def passes(gathered_first: bool) -> tuple[float, float, list[float]]:
        """(F, B, bursts): a forward and its full backward, each right after a burst if ``gathered_first``."""
        bursts, inp = [], bench._input()
        if gathered_first:
            bursts.append(burst())
        t = time.perf_counter()
        out = bench._forward(inp)
        tf = time.perf_counter() - t
        if gathered_first:
            bursts.append(burst())
        t = time.perf_counter()
        backward_full(out, bench.grad)
        tb = time.perf_counter() - t
        for p in bench.params:
            p.grad = None
        return tf, tb, bursts

    samples: dict[str, list[float]] = {k: [] for k in ("F", "B", "gathered_F", "gathered_B", "burst")}
    try:
        for rep in range(1 + min(reps, MAX_REPS)):  # the first a warm-up
            dist.barrier(group=group)
            f, b, _ = passes(False)
            dist.barrier(group=group)
            gf, gb, bursts = passes(True)  # the parameters stay whole (the last burst's) for the next repetition
            if rep >= 1:
                for k, v in (("F", f), ("B", b), ("gathered_F", gf), ("gathered_B", gb)):
                    samples[k].append(v)
                samples["burst"] += bursts
    finally:
        for f_ in flats:
            f_.restore()
    stats = {k: _stat(gathered(v)) for k, v in samples.items()}
    out = {"buckets": len(flats), "bytes": [f_.nbytes for f_ in flats], "burst": stats["burst"],
           "alone": {"F": stats["F"], "B": stats["B"]},
           "gathered": {"F": stats["gathered_F"], "B": stats["gathered_B"]},
           "factor": {k: stats[f"gathered_{k}"]["median"] / stats[k]["median"] for k in ("F", "B")}}
    log.info("zero3: %d buckets gathered in %.2f ms; passes after a gather x%.3f (F) x%.3f (B)", len(flats),
             out["burst"]["median"] * 1e3, out["factor"]["F"], out["factor"]["B"])
    return out
