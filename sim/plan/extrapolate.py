"""A long step from three short ones: the steady phase of a schedule, simulated over two periods and extended.

Every registered schedule runs a warm-up, a steady phase that repeats the
same pattern every ``P`` microbatches, and a cool-down; data parallelism adds
collectives per microbatch (zero2, fsdp) and a tail after the last pass. Once
the warm-up's transient has died out, one more period of microbatches adds
nearly the same time to every figure the planner reports: the step, the makespan,
the compute-busy time of every rank and the communication every rank leaves
exposed. So a configuration of ``m`` microbatches is simulated at

    m1 = 4 pp + (m - 4 pp) mod P,   m2 = m1 + P,   m3 = m1 + 2 P   (P = pp)

and, where the two differences agree, each figure at m is f(m3) + (m - m3) / P
x (f(m3) - f(m2)). Where they do not (a transient longer than 4 pp
microbatches), the caller simulates the whole step.

It is not exact, which is why the planner does not do it unless asked
(``plan(..., extrapolate=True)``). Compute slowed while its rank communicates
(the fair links' ``contention``) makes the steady phase converge to its period
geometrically, not reach it: on the Llama 3 405B plan on 64 nodes (tp 8, pp
16, interleaved-zb v8, zero1) the step's second difference falls from 4e-9 to
0 (to rounding) between 4 pp and 6 pp microbatches, but the busy time's only to
6e-10 by 7 pp, and on small models the step's own transient outlasts 4 pp
(``tests/test_plan_extrapolate.py``: where the differences agree to
:data:`TOLERANCE` the extended step is within 1e-9 of the whole one, not equal
to it). Memory is not extrapolated: it comes from the schedule's activation
rows at m (:func:`sim.plan.bounds.memory_rows`), the simulation's own
accounting.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.plan.space import PlanConfig, shape_ok
from sim.plan.study import StudyResult, exposed_comm

__all__ = ["BUSY_TOLERANCE", "TOLERANCE", "StepFigures", "extend", "short_sizes"]

#: The largest disagreement of the two periods' differences, relative to the step, that still counts as steady.
TOLERANCE = 1e-9
BUSY_TOLERANCE = 1e-7  # the busy time's, relative to itself (module docstring)
_WARM = 4  # the first short run's microbatches: _WARM x pp (the transient of the warm-up)
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
    steps = []
    for i, (x, y, z) in enumerate(zip(a, b, d, strict=True)):
        first, second = y - x, z - y
        if abs(second - first) > (BUSY_TOLERANCE * abs(z) if i == 2 else TOLERANCE * abs(d[0])):
            return None
        steps.append(second)
    k = (c.microbatches - sizes[2]) // c.pp
    step, makespan, busy, *exposed = (z + k * s for z, s in zip(d, steps, strict=True))
    return StepFigures(step, makespan, busy, tuple(exposed), short[2].ranks)
