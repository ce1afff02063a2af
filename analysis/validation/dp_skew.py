"""The skew between the replicas of a data-parallel step, measured in the calibration run and added to a row.

The simulator runs one replica, so a simulated data-parallel step has no skew:
every rank is the mean replica. A real step waits for the slower one: taken
apart (:func:`analysis.validation.dp_transfer.step_parts`), its ``skew`` part is the busier
rank's busy time (its passes and optimizer step) less the ranks' mean, 2-9 ms
per step in the grid's runs (docs/validation-protocol.md).

**How it grows.** On the quiet grid's dp2-ddp m = 8 traces (the data-parallel
calibration run), the busier rank is rank 0 in 44% of the steps and rank 1 in
the rest: no replica is slower by construction. Within a step, the gap between
the two replicas after their first j passes grows about linearly in the busy
time (|sum of the j differences| / 2: 0.43 ms after one pass of 8 ms, 3.2 ms
after 8 passes, 7.4 ms after 15; a log-log slope of 0.93 over the 16 passes):
a replica that is slow in a step is slow for all of it (the machine's other
work takes its core), not slow in one pass by chance (that would grow as the
square root). So the skew is modelled as a fraction of the step's busy time:

    skew = s x (forward + backward + optimizer of the simulated step),

with ``s`` (:func:`skew_fraction`) the calibration run's sum over its traced
steps of the skew part over the sum of the ranks' mean busy time; nothing is
fitted on another row. It is added to the step of the modes whose replicas wait
for each other every step (:func:`waits_each_step`): every mode but async-ps,
and local-sgd's averaging steps only (its plain steps do not wait).

This replaces the old ``straggler`` scaling of every pass (the busier rank's pass
time over the mean, folded into the passes), which also charged async-ps and
local-sgd's plain steps and showed the skew as forward and backward time.
Nothing here runs anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from sim.engine import SimResult

__all__ = ["BUSY_KINDS", "busy_skew", "simulated_busy", "skew_fraction", "waits_each_step"]

BUSY_KINDS = ("F", "B", "I", "W", "OPTIM")  # a rank's busy time, as analysis.validation.dp_transfer.step_parts counts it
NO_WAIT = ("async-ps",)  # trainers that never wait for each other (local-sgd waits only when it averages)


def waits_each_step(mode: str, averaging: bool = True) -> bool:
    """Whether a step of ``mode`` (``MODE+CODEC``: the mode) waits for the slower replica: not async-ps, and
    local-sgd only in its averaging step (``averaging``)."""
    dp_mode = mode.partition("+")[0]
    if dp_mode in NO_WAIT:
        return False
    return averaging or dp_mode != "local-sgd"


def busy_skew(rows: Iterable[tuple[int, str, float]]) -> tuple[float, float]:
    """(skew, mean busy) of one step from its compute rows (rank, kind, seconds): the busier rank's busy time
    less the ranks' mean, and that mean (busy: :data:`BUSY_KINDS`). (0, 0) without a busy row."""
    busy: dict[int, float] = {}
    for rank, kind, d in rows:
        if kind in BUSY_KINDS:
            busy[rank] = busy.get(rank, 0.0) + d
    if not busy:
        return 0.0, 0.0
    mean = sum(busy.values()) / len(busy)
    return max(busy.values()) - mean, mean


def skew_fraction(frames: Sequence[pd.DataFrame]) -> float:
    """``s`` of the module doc: over every traced step of ``frames`` (a data-parallel run), the sum of the skews
    over the sum of the ranks' mean busy times (0.0 for traces with no busy row)."""
    from schedules.trace import trace_steps

    skew = busy = 0.0
    for df in frames:
        for part in trace_steps(df).values():
            comp = part[part["stream"] == "compute"]
            k, b = busy_skew(zip(comp["rank"].astype(int), comp["kind"].astype(str), comp["end"] - comp["start"],
                                 strict=True))
            skew, busy = skew + k, busy + b
    return skew / busy if busy > 0 else 0.0


def simulated_busy(result: SimResult) -> float:
    """The simulated step's mean busy time over its ranks (passes and optimizer steps, :data:`BUSY_KINDS`)."""
    from schedules import Stream

    rows = [(t.rank, t.action.kind.value, result.end[t.id] - result.start[t.id])
            for t in result.graph.tasks if t.stream is Stream.COMPUTE]
    return busy_skew(rows)[1]
