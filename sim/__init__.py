"""schedlab.sim: HOW LONG. A SimPy discrete-event simulator of lowered schedules (no torch needed).

    >>> from schedules import build
    >>> from sim import simulate
    >>> simulate(build("gpipe", 4, 8)).bubble_ratio  # a Schedule is lowered and validated; uniform costs by default
    0.2727272727272727

Physical units, from one import: a model preset on a cluster preset in a parallel layout, one schedule
(:mod:`sim.plan.study`), or several side by side (:func:`units_comparison`):

    >>> from sim import ParallelConfig, Study, TransformerCosts, cluster_preset, model_preset, run_study
    >>> costs = TransformerCosts(model=model_preset("gpt-6.2b"), cluster=cluster_preset("dgx-h100:2"),
    ...                          parallel=ParallelConfig(pp=8, dp=2, dp_mode="ddp"))
    >>> r = run_study(Study(schedule="1f1b", microbatches=32, costs=costs))  # doctest: +SKIP
    >>> r.step_time, r.tokens_per_step / r.step_time, max(d.memory_bytes for d in r.devices())  # doctest: +SKIP
"""

from sim.costs.cluster import cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.costs.uniform import CostModel, UniformCosts
from sim.engine import RankStats, SimResult, simulate
from sim.plan.study import Study, StudyResult, run_study
from sim.plan.sweep import SweepConfig, run_sweep, simulate_many, units_comparison

__all__ = [
    "CostModel", "ParallelConfig", "RankStats", "SimResult", "Study", "StudyResult", "SweepConfig", "TransformerCosts",
    "UniformCosts", "cluster_preset", "model_preset", "run_study", "run_sweep", "simulate", "simulate_many",
    "units_comparison",
]
