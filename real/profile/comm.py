"""The profile's communication sections: point-to-point messages and the data-parallel collectives, fitted.

Each is timed over a few sizes and fitted as alpha + n / beta (least squares; a fit that had to guess says so
in its ``warnings``): ``p2p`` from a ping-pong of ranks 0 and 1 (one way = half the round trip) with the cost
of posting one activation-sized send on the sender's core, and each collective over this rank's
data-parallel group in bursts of :data:`BURST`, one at a time and at a small size. The cost file's schema is
:mod:`real.profile.machine`'s.
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

__all__ = ["BURST", "fit_warnings"]

log = logging.getLogger(__name__)


# -- statistics ------------------------------------------------------------------------------------------------


def _fit_alpha_beta(sizes: Sequence[float], times: Sequence[float], field: str) -> tuple[float, float, list[str]]:
    """Least squares t = alpha + n / beta, and the guesses it had to make (logged, each naming ``field``):

    * time does not grow with n (slope <= 0: noise larger than the per-byte time, or one size only): beta is
      inf ("size does not matter") and alpha the fastest time measured;
    * a negative intercept: alpha is clipped at 0.
    """
    mx, my = statistics.fmean(sizes), statistics.fmean(times)
    sxx = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, times, strict=True)) / sxx if sxx else 0.0
    span = f"{len(sizes)} size(s), {min(sizes):.0f}-{max(sizes):.0f} bytes, {min(times):.3g}-{max(times):.3g} s"
    if slope <= 0:
        alpha, beta = max(min(times), 0.0), float("inf")
        warned = [f"{field}.beta: the time did not grow with the size (slope {slope:.3g} s/byte over {span}); "
                  f"bandwidth taken as infinite (null) and {field}.alpha as the fastest time, {alpha:.3g} s"]
    else:
        alpha, beta, warned = my - slope * mx, 1.0 / slope, []
        if alpha < 0:
            warned = [f"{field}.alpha: the fit's intercept is negative ({alpha:.3g} s over {span}); taken as 0"]
            alpha = 0.0
    for w in warned:
        log.warning("profile: %s", w)
    return alpha, beta, warned


def _json_bandwidth(beta: float) -> float | None:
    """A fitted bandwidth as the cost file stores it: ``null`` for inf ("size does not matter"; JSON has no inf)."""
    return None if math.isinf(beta) else beta


def _gathered(samples: list[float]) -> list[float]:
    """Every rank's samples (all ranks call this with the same count)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return samples
    out: list[list[float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, samples)
    return [x for part in out for x in part]


def _repeat(fn: Callable[[], float], warmup: int, reps: int) -> list[float]:
    for _ in range(warmup):
        fn()
    return [fn() for _ in range(reps)]


# -- communication ------------------------------------------------------------------------------------------------


def _p2p(activation_bytes: int, warmup: int, reps: int) -> dict[str, Any] | None:
    """Ranks 0 and 1 ping-pong messages of a few sizes; one way = half the round trip."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    rank = dist.get_rank()
    sizes = sorted({max(4, activation_bytes // 4), activation_bytes, 4 * activation_bytes})
    rows, fit_n, fit_t = [], [], []
    for n in sizes:
        buf = torch.zeros(n // 4, dtype=torch.float32)
        samples = []
        for rep in range(warmup + reps):
            dist.barrier()
            t = time.perf_counter()
            if rank == 0:
                dist.send(buf, dst=1)
                dist.recv(buf, src=1)
            elif rank == 1:
                dist.recv(buf, src=0)
                dist.send(buf, dst=0)
            one_way = (time.perf_counter() - t) / 2
            if rep >= warmup:
                samples.append(one_way)
        samples = _gathered(samples if rank == 0 else [])
        rows.append({"bytes": n, **_stat(samples)})
        fit_n.append(float(n))
        fit_t.append(statistics.median(samples))
    alpha, beta, warned = _fit_alpha_beta(fit_n, fit_t, "p2p")
    # The sender's own core: posting one activation-sized isend (gloo copies it on the caller's thread).
    buf = torch.zeros(activation_bytes // 4, dtype=torch.float32)
    posts = []
    for rep in range(warmup + reps):
        dist.barrier()
        if rank == 0:
            t = time.perf_counter()
            work = dist.isend(buf, dst=1)
            posted = time.perf_counter() - t
            work.wait()
            if rep >= warmup:
                posts.append(posted)
        elif rank == 1:
            dist.recv(buf, src=0)
    posts = _gathered(posts)
    return {"alpha": alpha, "beta": _json_bandwidth(beta), "sizes": rows, "send_cpu": _stat(posts),
            **({"warnings": warned} if warned else {})}


BURST = 4  # collectives in flight at once when timing them: a bucketed backward or a step's end issues several


def _dp_group(pp: int, dp: int) -> Any:
    """This rank's data-parallel group (the ranks with equal ``rank % pp``); every rank creates all of them."""
    rank, group = dist.get_rank(), None
    for i in range(pp):
        g = dist.new_group([d * pp + i for d in range(dp)])
        if rank % pp == i:
            group = g
    return group


def _collectives(pp: int, dp: int, param_bytes: int, warmup: int, reps: int) -> dict[str, Any] | None:
    """all_reduce, reduce_scatter and all_gather over this rank's data-parallel group, alpha + n / beta, per
    collective of a burst of BURST (see the module doc), and one at a time (``single``)."""
    if dp < 2:
        return None
    group = _dp_group(pp, dp)
    sizes = sorted({max(4 * dp, param_bytes // 4 // dp * dp), max(4 * dp, param_bytes // dp * dp)})
    out: dict[str, Any] = {}
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        fits = {}
        for burst in (1, BURST):
            rows, fit_n, fit_t = [], [], []
            for n in sizes:
                fulls = [torch.zeros(n // 4, dtype=torch.float32) for _ in range(burst)]
                shards = [torch.zeros(n // 4 // dp, dtype=torch.float32) for _ in range(burst)]

                def call(op=op, fulls=fulls, shards=shards) -> float:
                    dist.barrier(group=group)
                    t = time.perf_counter()
                    if op == "all_reduce":
                        works = [dist.all_reduce(f, group=group, async_op=True) for f in fulls]
                    elif op == "reduce_scatter":
                        works = [dist.reduce_scatter_single(sh, f, group=group, async_op=True)
                                 for sh, f in zip(shards, fulls, strict=True)]
                    else:
                        works = [dist.all_gather_single(f, sh, group=group, async_op=True)
                                 for sh, f in zip(shards, fulls, strict=True)]
                    for w in works:
                        w.wait()
                    return (time.perf_counter() - t) / len(works)

                samples = _gathered(_repeat(call, warmup, reps))
                rows.append({"bytes": n, **_stat(samples)})
                fit_n.append(float(n))
                fit_t.append(statistics.median(samples))
            field = f"collectives.{op}" + ("" if burst == BURST else ".single")
            alpha, beta, warned = _fit_alpha_beta(fit_n, fit_t, field)
            fits[burst] = {"alpha": alpha, "beta": _json_bandwidth(beta), "sizes": rows,
                           **({"warnings": warned} if warned else {})}
        out[op] = {**fits[BURST], "burst": BURST, "single": fits[1]}
    return out


def fit_warnings(p2p: dict[str, Any] | None, collectives: dict[str, Any] | None,
                 slowdown: dict[str, Any] | None = None) -> list[str]:
    """Every fit's guesses (``warnings`` of p2p, of each collective, burst, single then small, and of comm_slowdown),
    for the file's top."""
    sections = [p2p or {}] + [x for c in (collectives or {}).values()
                              for x in (c, c.get("single", {}), c.get("small", {}))]
    return [w for sec in (*sections, slowdown or {}) for w in sec.get("warnings", [])]

