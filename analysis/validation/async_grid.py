"""The validation grid's async-ps row: its time per update predicted from profiled costs.

The runtime's async-ps (:mod:`real.dp.ps_async`) has no step in lockstep: each
trainer computes, pushes, asks the server for the next step's parameters and
goes on once the staleness bound S lets it. One simulated step of the graph
(ps's: passes, pushes, the servers' update, pulls) is not what it measures, so
the row is predicted as :mod:`sim.plan.study` predicts the mode: the graph's step
cut into a cycle (:func:`sim.costs.async_ps.cycle_of`: compute, the push left exposed
after it, the pull) and the server's update, run over many steps by both
trainers under the bound in :func:`sim.costs.async_ps.simulate_async_ps`; its time per
update (dp / the sum of the trainers' rates) is the prediction.

From :class:`sim.costs.profiled.ProfiledCosts` (the data-parallel calibration run's,
or the row's own trace's, :func:`analysis.validation.dp_calibration.dp_self_costs`):

* the update is every stage's optimizer step (the server's update, as ps's
  OPTIM on the collective stream costs it; from the row's own trace the
  servers' traced ``{s}OPTIM`` rows, :func:`sim.replay.server_update_times`);
* the compute is the simulated step's passes plus ``step_overhead`` (each
  trainer's own per-step time outside the tasks: zero_grad, the loop; the
  runtime's async-ps trainers skip the loss all-reduce).

The measured side is the trainers' median step time: under the bound no
trainer runs more than S steps ahead of the other, so over a round of equal
trainers each one's time per step is the time per update.

The row's step taken apart: measured (:func:`measured_parts`), the first trainer's traced steps alone (the
trainer whose step times are measured, rank 0): the trainers are not in lockstep (at S = 1 one may be a step
ahead of the other) and a server's update k, traced as step k, folds whichever pushes came, so with their rows
a step's span would run past its wall time (on a loaded run by 0.2 s of 0.5 s). Its skew is therefore 0, as
the prediction's. Predicted
(:func:`predicted_parts`), the graph's simulated
step's forward, backward and overhead, its optimizer 0 (the trainers step
nothing); what the loop adds or removes against the graph's step (the update
and pull waited for, or not, under the bound) is in ``exposed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

    from schedules import TaskGraph
    from sim.costs.async_ps import AsyncPSResult
    from sim.costs.profiled import ProfiledCosts
    from sim.engine import SimResult

__all__ = ["async_loop", "measured_parts", "predict_async", "predicted_parts", "trainer_rows", "update_s"]


def update_s(graph: TaskGraph, costs: ProfiledCosts) -> float:
    """The servers' whole update of a step: every stage's update on the servers (ps's OPTIM on the collective
    stream: the profile's SERVER_UPDATE, else the optimizer step; :meth:`sim.costs.profiled.StageCosts.update_on_server`)."""
    return sum(costs.stages[s].update_on_server() for s in range(graph.schedule.num_stages))


def async_loop(result: SimResult, costs: ProfiledCosts, staleness: int, dp: int) -> AsyncPSResult:
    """``dp`` equal trainers running ``result``'s step under ``staleness`` (module doc)."""
    from sim.costs.async_ps import cycle_of, simulate_async_ps

    cycle = cycle_of(SimpleNamespace(sim=result), update_s(result.graph, costs))
    cycle = replace(cycle, compute_s=cycle.compute_s + costs.step_overhead)
    return simulate_async_ps(cycle, (1.0,) * dp, staleness)


def predict_async(graph: TaskGraph, costs: ProfiledCosts, staleness: int, dp: int = 2) -> float:
    """Seconds per update of async-ps's row: :func:`async_loop` of the simulated graph."""
    from sim import simulate

    return async_loop(simulate(graph, costs, check=False), costs, staleness, dp).time_per_step


def predicted_parts(graph: TaskGraph, costs: ProfiledCosts, staleness: int, dp: int = 2) -> dict[str, float]:
    """The predicted update taken apart (module doc; :data:`analysis.validation.dp_transfer.PARTS` and ``step``)."""
    from analysis.validation.dp_transfer import _simulated
    from sim import simulate

    result = simulate(graph, costs, check=False)
    out = _simulated(result, costs)
    step = async_loop(result, costs, staleness, dp).time_per_step
    out["exposed"] += step - sum(out.values())
    return {**out, "step": step}


def trainer_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The first trainer's rows of a trace (ranks below pp: the first pipeline), its attrs kept."""
    out = df[df["rank"] < int(df.attrs["params"]["pp"])].copy()
    out.attrs.update(df.attrs)
    return out


def measured_parts(frames: Sequence[pd.DataFrame]) -> dict[str, float]:
    """:func:`analysis.validation.dp_transfer.measured_parts` of the first trainer's rows (module doc)."""
    from analysis.validation.dp_transfer import measured_parts as parts

    return parts([trainer_rows(df) for df in frames])
