"""Median and spread of timing samples: the one summary every section of a cost file uses."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["stat"]


def stat(samples: Sequence[float]) -> dict[str, float]:
    """Median and spread (10th / 90th percentile) of samples."""
    xs = sorted(samples)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return {"median": statistics.median(xs), "p10": q[0], "p90": q[-1], "n": len(xs)}
