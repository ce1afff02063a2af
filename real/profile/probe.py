"""The machine's speed now: a fixed piece of work timed on this core.

The project's machine is a virtual machine on a shared host, which slows both
cores by about a quarter for seconds to minutes at a time; no process of the
guest shows it (docs/validation-protocol.md, "The host's slow spells"). The
measurement protocol (:mod:`real.rounds`) and the profile (:mod:`real.profile`)
time :func:`probe_seconds` around what they measure and compare it with the
fastest probe they saw: a run or a profile taken in a slow spell is taken again.
"""

from __future__ import annotations

import math
import time

import torch

__all__ = ["PROBE_ITERS", "PROBE_REPEATS", "probe_seconds", "spell"]

PROBE_ITERS = 8  # the probe's fixed work: ~4 ms of one core of the project's machine, timed PROBE_REPEATS times
PROBE_REPEATS = 3  # the probe is the fastest of these: a spell of seconds slows all, an interruption one


def probe_seconds(iters: int = PROBE_ITERS, repeats: int = PROBE_REPEATS) -> float:
    """Seconds this process takes for a fixed piece of work shaped like the grid model's layers (a 128 x 128
    activation through a 128 -> 512 -> 128 MLP with a tanh, ``iters`` times, one thread as the runs have), the
    fastest of ``repeats`` timings: the speed the host gives this core now. Deterministic inputs, so every call
    does the same work."""
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(128, 128, generator=g)
    w1, w2 = torch.randn(128, 512, generator=g) / 11.0, torch.randn(512, 128, generator=g) / 22.0
    best = math.inf
    for _ in range(repeats):
        x, t0 = x0, time.perf_counter()
        for _ in range(iters):
            x = torch.tanh(x @ w1) @ w2
        best = min(best, time.perf_counter() - t0)
    return best


def spell(probes: list[float]) -> float:
    """The slowest of ``probes`` over the fastest (1.0 for none): how much slower the machine ran at its
    slowest than at its fastest while they were taken."""
    kept = [p for p in probes if p > 0]
    return max(kept) / min(kept) if kept else 1.0
