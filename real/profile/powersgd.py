"""What PowerSGD's hook costs the trainer's thread per bucket, and a small all-reduce waited for alone.

The runtime (:mod:`real.dp.compress`) waits for each bucket's ``powerSGD_hook`` where the bucket is launched, on the
training thread, so each bucket's hook holds the pass that completes it for its whole length: its compute (the
error-feedback add and the clone of the bucket, the ``torch.cat`` of the vectors sent whole, the orthogonalization
of Q and P, the products ``M Q``, ``M^T P`` and ``P Q^T``, the copies back and the new error) and its three
all-reduces, each waited for before the next (the vectors sent whole, then P, then Q: a few to a few tens of KB
each). The profile's ``collectives.all_reduce.single`` is timed on buffers of a quarter and all of a stage's
gradients (MBs), so its fit says nothing of a message of 10 KB.

:func:`powersgd_section` measures, on the stages' own parameter shapes cut into the run's buckets
(:func:`real.dp.sync.make_buckets` at the run's ``bucket_mb``, padded to a multiple of the group as the runtime pads
them), for each ``powersgd:R`` of :data:`HOOK_SPECS`, every bucket in the runtime's order:

* ``compute``: the hook on a group of this process alone (its all-reduces move nothing), less three plain
  all-reduces of the bucket's messages on that group (so the collectives' own calls are not counted twice);
* ``wall``: the hook on the data-parallel group, waited for at once, as the runtime does it (compute and the
  three waited all-reduces together, every rank in step: no replica's lateness in it);

and the three messages' plain blocking all-reduces on the data-parallel group (``dist.all_reduce`` waited for
alone, after a barrier), whose medians are fitted as alpha + n / beta over the sizes PowerSGD sends
(``collectives.all_reduce.small``; the fit's guesses are logged and listed as the other fits' are).
Every rank of the group calls it at once; the samples are every rank's. The hooks as a run waits for them,
launched from inside a real backward, are timed by :mod:`real.profile.psgd_backward` (the section's
``in_backward``, what the simulator charges).
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

from real.dp.compress import Codec
from real.dp.sync import make_buckets
from real.profile.protocol import POWERSGD_RANK
from real.profile.stats import stat as _stat
from schedules.dp.codecs import parse_compression, powersgd_messages

__all__ = ["HOOK_SPECS", "powersgd_section"]

log = logging.getLogger(__name__)

# the hooks profiled: the validation grid's PowerSGD row's; each rank more costs about as much again (~1 s on the
# grid's model on a loaded machine)
HOOK_SPECS = (f"powersgd:{POWERSGD_RANK}",)


class _Bucket:
    """One bucket's flat gradient (padded to a multiple of ``world``) and its parameters' views of it."""

    def __init__(self, shapes: list[tuple[int, ...]], world: int, seed: int) -> None:
        n = sum(math.prod(s) for s in shapes)
        self.shapes, self.padded = shapes, -(-n // world) * world
        self.source = torch.randn(self.padded, generator=torch.Generator().manual_seed(seed))

    def fresh(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        flat, grads, offset = self.source.clone(), [], 0
        for s in self.shapes:
            grads.append(flat[offset:offset + math.prod(s)].view(s))
            offset += math.prod(s)
        return flat, grads


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _plain(group: Any, sizes: Sequence[int]) -> Callable[[], float]:
    """Seconds of blocking all-reduces of ``sizes`` elements (float32) on ``group``, one after another."""
    bufs = [torch.zeros(max(n, 1)) for n in sizes]
    return lambda: sum(_timed(lambda b=b: dist.all_reduce(b, group=group)) for b in bufs)


def _hook_samples(spec: str, buckets: list[_Bucket], group: Any, solo: Any, warmup: int, reps: int
                  ) -> tuple[list[list[float]], list[list[float]]]:
    """Per bucket: (the hook's compute samples, its wall samples on ``group``) (module doc)."""
    comp = parse_compression(spec)
    keys = {f"s0b{i}": b.padded for i, b in enumerate(buckets)}
    codecs = {"solo": Codec(comp, solo, keys), "group": Codec(comp, group, keys)}
    plain = [_plain(solo, powersgd_messages(b.shapes, comp.rank)) for b in buckets]
    compute: list[list[float]] = [[] for _ in buckets]
    wall: list[list[float]] = [[] for _ in buckets]
    for rep in range(warmup + reps):
        for name, codec in codecs.items():
            dist.barrier(group=group)
            for i, (key, b) in enumerate(zip(keys, buckets, strict=True)):
                flat, grads = b.fresh()
                t = _timed(lambda c=codec, k=key, f=flat, g=grads: c.allreduce(k, f, g).wait())
                if rep < warmup:
                    continue
                if name == "solo":
                    compute[i].append(max(t - plain[i](), 0.0))
                else:
                    wall[i].append(t)
    return compute, wall


def _small_all_reduce(group: Any, sizes: Sequence[int], warmup: int, reps: int,
                      gathered: Callable[[list[float]], list[float]],
                      fit: Callable[[Sequence[float], Sequence[float], str], tuple[float, float, list[str]]]
                      ) -> dict[str, Any]:
    """``collectives.all_reduce.small``: blocking all-reduces of ``sizes`` float32 elements on ``group``."""
    rows, fit_n, fit_t = [], [], []
    for n in sorted(set(sizes)):
        one = _plain(group, [n])

        def call(one=one) -> float:
            dist.barrier(group=group)
            return one()

        samples = gathered([call() for _ in range(warmup + reps)][warmup:])
        rows.append({"bytes": 4 * n, **_stat(samples)})
        fit_n.append(4.0 * n)
        fit_t.append(statistics.median(samples))
    alpha, beta, warned = fit(fit_n, fit_t, "collectives.all_reduce.small")
    return {"alpha": alpha, "beta": None if math.isinf(beta) else beta, "sizes": rows,
            **({"warnings": warned} if warned else {})}


def powersgd_section(stage_params: Sequence[Sequence[torch.nn.Parameter]], group: Any, bucket_mb: float,
                     warmup: int, reps: int, gathered: Callable[[list[float]], list[float]],
                     fit: Callable[[Sequence[float], Sequence[float], str], tuple[float, float, list[str]]]
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the cost file's ``powersgd`` section, ``collectives.all_reduce.small``) (module doc). ``stage_params``:
    each stage's parameters (the run's rank holds one stage: its buckets are that stage's); ``gathered``: every
    rank's samples; ``fit``: the profile's alpha + n / beta fit."""
    world = dist.get_world_size(group)
    solo = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
    shapes = [[tuple(p.shape) for p in b] for params in stage_params[:1]
              for b in make_buckets(list(params), bucket_mb * 2**20)]
    buckets = [_Bucket(s, world, seed=i) for i, s in enumerate(shapes)]
    section: dict[str, Any] = {}
    sizes: list[int] = []
    for spec in HOOK_SPECS:
        rank = parse_compression(spec).rank
        compute, wall = _hook_samples(spec, buckets, group, solo, warmup, reps)
        rows = []
        for b, c, w in zip(buckets, compute, wall, strict=True):
            sent = powersgd_messages(b.shapes, rank)
            sizes += [n for n in sent if n]
            rows.append({"elements": b.padded, "messages": [4 * n for n in sent],
                         "compute": _stat(gathered(c)), "wall": _stat(gathered(w))})
        section[spec] = {"bucket_bytes": [4 * b.padded for b in buckets], "buckets": rows,
                         "compute": sum(r["compute"]["median"] for r in rows),
                         "wall": sum(r["wall"]["median"] for r in rows)}
        log.info("%s hooks: %d buckets, compute %.3f ms, wall %.3f ms on the data-parallel group", spec,
                 len(rows), section[spec]["compute"] * 1e3, section[spec]["wall"] * 1e3)
    return section, _small_all_reduce(group, sizes, warmup, reps, gathered, fit)
