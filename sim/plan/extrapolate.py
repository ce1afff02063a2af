"""A long step from three short ones: the steady phase of a schedule, simulated over two periods and extended.

Every registered schedule runs a warm-up, a steady phase that repeats the
same pattern every ``P`` microbatches, and a cool-down; data parallelism adds
collectives per microbatch (zero2, fsdp) and a tail after the last pass. Once
the warm-up's transient has died out, one more period of microbatches adds
nearly the same time to every figure the planner reports: the step, the makespan,
the compute-busy time of every rank and the communication every rank leaves
exposed. So a configuration of ``m`` microbatches is simulated at

    m1 = 2 pp + (m - 2 pp) mod P,   m2 = m1 + P,   m3 = m1 + 2 P   (P = pp)

(on Llama 3 405B, pp 32, m 1024: 64 + 96 + 128 microbatches, 6 s of
simulation for the whole step's 24 s) and, where the two differences agree,
each figure at m is f(m3) + (m - m3) / P x (f(m3) - f(m2)). Where they do not
(a transient longer than 2 pp microbatches), the caller simulates the whole step.

"Agree" is :data:`TOLERANCE` of the step's own increment per period, not
rounding: a steady phase is not always periodic to the last digit. Compute
slowed while its rank communicates (the fair links' ``contention``) makes it
converge to its period geometrically (the 405B plan above with zero1: the
second difference of the step is 3e-13 s at 2 pp, the busy time's 3e-6 s); a
reduce-scatter per microbatch on the links the pipeline's sends use (zero2)
keeps it quasi-periodic (the same plan with zero2: its periods differ by 1e-3
to 1e-2 s in 5.1 s, at every m tried up to 8 pp, and its period itself drifts by 0.25% after 6 pp). An
extended figure is then off by the remaining periods times that disagreement and drift: on the small models
of ``tests/test_plan_extrapolate.py``, every family, within 3.5e-5 of the whole step; on the 405B plans on
64 nodes, zero1 within 1e-13 s, zero2 0.21% and 0.25% slow (``experiments/bench_plan.py --check``).
That is why the planner's exact mode
(``plan(..., extrapolate=False)``, ``schedlab plan --exact``) simulates every
step whole. Memory is not extrapolated: it comes from the schedule's activation
rows at m (:func:`sim.plan.bounds.memory_rows`), the simulation's own
accounting.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.plan.space import PlanConfig, shape_ok
from sim.plan.study import StudyResult, exposed_comm

__all__ = ["TOLERANCE", "StepFigures", "extend", "short_sizes"]

#: The largest disagreement of the two periods' increments of a figure, relative to the step's increment per period
#: (the busy time's: to its own), that still counts as steady (module docstring).
TOLERANCE = 1e-3
_WARM = 2  # the first short run's microbatches: _WARM x pp (the transient of the warm-up)
_SHORT = 3  # periods of saving the extrapolation must bring at least (else the whole step is simulated)


@dataclass(frozen=True, slots=True)
class StepFigures:
    """What the planner reads of a simulated step (``PlanEntry``'s time figures)."""

    step: float
    makespan: float
    busy: float  # summed over ranks
    exposed: tuple[float, ...]  # per rank
    ranks: int

    @classmethod
    def of(cls, result: StudyResult) -> StepFigures:
        sim = result.sim
        return cls(result.step_time, sim.makespan, sum(r.busy for r in sim.ranks), tuple(exposed_comm(sim)),
                   len(sim.ranks))

    @property
    def bubble_ratio(self) -> float:
        return 0.0 if self.makespan <= 0 else 1.0 - self.busy / (self.ranks * self.makespan)

    @property
    def exposed_comm(self) -> float:
        return max(self.exposed, default=0.0)

    def values(self) -> tuple[float, ...]:
        return (self.step, self.makespan, self.busy, *self.exposed)


def short_sizes(c: PlanConfig) -> tuple[int, int, int] | None:
    """The microbatch counts (m1, m2, m3) ``c`` is extrapolated from, or None when its whole step is simulated
    (too few microbatches for it to pay, or a shape the schedule does not take)."""
    period, m = c.pp, c.microbatches
    if c.pp < 2 or m < _WARM * c.pp + (2 + _SHORT) * period:
        return None
    m1 = _WARM * c.pp + (m - _WARM * c.pp) % period
    sizes = (m1, m1 + period, m1 + 2 * period)
    if not all(shape_ok(c.schedule, c.pp, k, c.chunks) for k in sizes):
        return None
    return sizes


def extend(c: PlanConfig, sizes: tuple[int, int, int], short: tuple[StepFigures, ...]) -> StepFigures | None:
    """``c``'s figures at its own m from the simulations at ``sizes``; None if the two periods' differences do not
    agree (the steady phase has not been reached)."""
    a, b, d = (f.values() for f in short)
    period = d[0] - b[0]  # the step's increment over the last period
    steps = []
    for i, (x, y, z) in enumerate(zip(a, b, d, strict=True)):
        first, second = y - x, z - y
        if abs(second - first) > TOLERANCE * abs(second if i == 2 else period):
            return None
        steps.append(second)
    k = (c.microbatches - sizes[2]) // c.pp
    step, makespan, busy, *exposed = (z + k * s for z, s in zip(d, steps, strict=True))
    return StepFigures(step, makespan, busy, tuple(exposed), short[2].ranks)
