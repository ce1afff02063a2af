"""schedlab.sim: HOW LONG. A SimPy discrete-event simulator of lowered schedules (no torch needed).

    >>> from schedules import build, lower
    >>> from sim import UniformCosts, simulate
    >>> simulate(lower(build("gpipe", pp=4, microbatches=8)), UniformCosts()).bubble_ratio
    0.2727272727272727
"""

from sim.costs.uniform import CostModel, UniformCosts
from sim.engine import RankStats, SimResult, simulate

__all__ = ["CostModel", "RankStats", "SimResult", "UniformCosts", "simulate"]
