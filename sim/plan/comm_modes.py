"""A data-parallel mode's time per step, amortized over the steps that communicate and those that do not.

Every mode but ``local-sgd`` runs the same program every step: its step time
is the simulated step's. ``local-sgd`` averages the parameters on one step in
``sync_every`` (K) and steps alone on the others, so its time per step is

    t = ((K - 1) t_local + t_averaging) / K

with t_local the step without the parameter all-reduce and t_averaging the
step with it (:func:`schedules.dp.modes.add_data_parallel`, ``averaging``), both
simulated. ``async-ps``'s time per step is one update's (a global batch):
dp / the sum of the trainers' steps per second, from :mod:`sim.costs.async_ps`
(the trainers' speeds and the staleness bound), not the one-trainer step.
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules import load_graph, validate
from schedules.dp.modes import add_data_parallel
from sim.engine import simulate
from sim.plan.study import Study, StudyResult, dp_options, run_study

__all__ = ["ModeStepTime", "amortized", "mode_step_time"]


@dataclass(frozen=True, slots=True)
class ModeStepTime:
    """Seconds of a step without and with the mode's averaging, K, and the amortized time per step."""

    mode: str
    local_s: float  # a step that does not average (every step of the other modes)
    averaging_s: float  # a step that averages (local-sgd) or the one step of the other modes
    sync_every: int

    @property
    def per_step(self) -> float:
        return amortized(self.local_s, self.averaging_s, self.sync_every)


def amortized(local_s: float, averaging_s: float, sync_every: int) -> float:
    """((K - 1) t_local + t_averaging) / K."""
    return ((sync_every - 1) * local_s + averaging_s) / sync_every


def mode_step_time(study: Study) -> ModeStepTime:
    """Simulate ``study``'s step (and, for local-sgd with K > 1, its step without the averaging)."""
    p = study.parallel
    result = run_study(study)
    if p.dp_mode == "async-ps":  # every trainer over many steps under the bound: seconds per update
        t = result.async_ps.time_per_step
        return ModeStepTime(p.dp_mode, t, t, 1)
    averaging = result.step_time
    if p.dp_mode != "local-sgd" or p.sync_every == 1 or p.dp == 1:
        return ModeStepTime(p.dp_mode, averaging, averaging, p.sync_every if p.dp_mode == "local-sgd" else 1)
    costs = study.costs
    graph = validate(load_graph(study.schedule, study.pipeline(), study.schedule_options()))
    local = validate(add_data_parallel(graph, "local-sgd", costs.buckets(graph.schedule.num_stages),
                                       **{**dp_options(costs), "averaging": False}))
    local_s = StudyResult(study, simulate(local, costs, check=False)).step_time
    return ModeStepTime(p.dp_mode, local_s, averaging, p.sync_every)
