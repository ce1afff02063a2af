"""Goodput of live (per-step quorum) fault tolerance against checkpoint-restart, in closed form.

Two ways a data-parallel job of ``dp`` replicas survives a failed device:

* **checkpoint-restart**: every replica stops, the job restarts (``restart``
  seconds: detection, rescheduling, loading) and recomputes the steps since the
  last checkpoint. Expected goodput from Daly (2006, eq. 20, as in
  :func:`sim.faults.failures.daly_wall_time`) with the job's MTBF.
* **live** (torchft's per-step quorum, ``schedlab run --elastic live``): the
  failed replica drops out of the next quorum; the others pause for
  ``detection + quorum``, redo the interrupted step (half a step on average),
  and carry the failed replica's share of the global batch until its
  replacement joins (``replacement`` seconds, during which a step takes
  ``dp / (dp - 1)`` as long: ``replacement / dp`` seconds of the job lost);
  the replacement joins at a step boundary after a quorum and the transfer of
  one GPU's state from a live peer (``state_bytes * transfer_s_per_byte``).
  No step is lost and no checkpoint is read. A share ``job_wide`` of failures
  stops every replica at once (a switch, the lighthouse): those are
  checkpoint-restarts, with Daly's goodput at the MTBF of those alone, so the
  live mode's optimal checkpoint interval is much longer.

The two costs multiply (first order in the failure rate times a pause):
goodput = Daly's goodput at MTBF ``M / job_wide`` x (1 - rate of other failures
x cost of each). Valid while that product is well below 1; :func:`live_goodput`
returns 0 beyond it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import ConfigError, check_positive, check_positive_ints
from sim.faults.failures import daly_interval, daly_wall_time, young_interval

__all__ = ["LiveCosts", "checkpoint_interval", "live_failure_cost", "live_goodput", "restart_goodput"]

INTERVALS = ("young", "daly")


def checkpoint_interval(rule: str, checkpoint_cost: float, mtbf: float) -> float:
    """Young's or Daly's optimal compute time between checkpoints (``rule`` "young" or "daly"); inf for no failures."""
    if rule not in INTERVALS:
        raise ConfigError(f"checkpoint interval rule {rule!r} is unknown; valid rules are {', '.join(INTERVALS)}")
    if math.isinf(mtbf):
        return math.inf
    return young_interval(checkpoint_cost, mtbf) if rule == "young" else daly_interval(checkpoint_cost, mtbf)


def restart_goodput(mtbf: float, checkpoint_cost: float, restart: float, interval: float) -> float:
    """Daly's expected goodput (useful / wall time) checkpointing every ``interval`` s of compute, restart ``restart`` s.

    An infinite MTBF with an infinite interval (never checkpoint, never fail) is 1.
    """
    for name, value in (("mtbf", mtbf), ("interval", interval)):
        if not value > 0:
            raise ConfigError(f"restart goodput: {name} must be > 0 seconds (inf allowed), got {value!r}", field=name)
    if math.isinf(mtbf):
        return 1.0 if math.isinf(interval) else interval / (interval + checkpoint_cost)
    if math.isinf(interval):
        return 0.0  # never saved: a failure loses everything (the job never ends, in expectation)
    return interval / daly_wall_time(interval, interval, checkpoint_cost, restart, mtbf)


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveCosts:
    """What one failure costs a live job, in seconds (the measured parts from ``schedlab run --elastic live``)."""

    detection: float  # a replica's death to the survivors' failed collective
    quorum: float  # a new quorum at the lighthouse
    transfer_s_per_byte: float  # the state transfer to a joining replica (its wall time / bytes received)
    state_bytes: float  # bytes one GPU of the simulated replica receives when it joins (parameters + optimizer state)
    replacement: float  # a failed replica's death to its replacement asking to join (rescheduling, start)
    step_time: float
    job_wide: float = 0.0  # share of failures that stop every replica (then checkpoint-restart)

    def __post_init__(self) -> None:
        for name in ("detection", "quorum", "transfer_s_per_byte", "state_bytes", "replacement"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        check_positive("live costs", "step_time", self.step_time, " seconds")
        if not 0 <= self.job_wide <= 1:
            raise ConfigError(f"job_wide must be a share in [0, 1], got {self.job_wide!r}")

    @property
    def transfer(self) -> float:
        return self.state_bytes * self.transfer_s_per_byte


def live_failure_cost(costs: LiveCosts, dp: int) -> float:
    """Seconds of the whole job one survivable failure costs: the pause, the redone half step, the reduced
    throughput until the replacement joins, and its join (a quorum and the state transfer)."""
    check_positive_ints("live failure cost", dp=dp)
    if dp < 2:
        raise ConfigError(f"live fault tolerance needs dp >= 2 replicas (a survivor), got dp {dp}")
    pause = costs.detection + costs.quorum + costs.step_time / 2
    return pause + costs.replacement / dp + costs.quorum + costs.transfer


def live_goodput(mtbf: float, dp: int, costs: LiveCosts, *, checkpoint_cost: float, restart: float,
                 rule: str = "daly") -> tuple[float, float]:
    """(goodput, checkpoint interval s) of the live mode: see the module doc; ``mtbf`` is the job's (all devices).

    dp 1 has no survivor: every failure is a checkpoint-restart.
    """
    check_positive("live goodput", "mtbf", mtbf, " seconds")
    if dp < 2:
        interval = checkpoint_interval(rule, checkpoint_cost, mtbf)
        return restart_goodput(mtbf, checkpoint_cost, restart, interval), interval
    wide_mtbf = mtbf / costs.job_wide if costs.job_wide > 0 else math.inf
    interval = checkpoint_interval(rule, checkpoint_cost, wide_mtbf)
    survivable_rate = (1.0 - costs.job_wide) / mtbf
    degraded = max(0.0, 1.0 - survivable_rate * live_failure_cost(costs, dp))
    return restart_goodput(wide_mtbf, checkpoint_cost, restart, interval) * degraded, interval
