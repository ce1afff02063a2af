"""The calibration protocol: profile the machine, calibrate from one real run, predict a step, build a grid's rows.

``experiments/validate_sim.py`` (how close is the simulator to the runtime?)
and ``experiments/plan_check.py`` (is the planner's ranking right?) both run
it; the protocol is written down in ``docs/validation-protocol.md``:

1. :func:`real.profile.protocol.profile_machine` runs ``real.profile`` once under
   torchrun (every stage count needed; for the data-parallel pair, pp=1 dp=2
   with its collectives); :mod:`real.profile.protocol` also makes the runs' configs.
2. One configuration, the calibration run, is measured and traced;
   :class:`Calibration` turns its traces into cost models:
   :meth:`Calibration.pipeline` for any stage count
   (:func:`sim.costs.calibrated.from_trace`), :meth:`Calibration.data_parallel` for
   the pair (its own profile, each pass scaled by the calibration run's
   in-run/profiled ratio).
3. :func:`predict` simulates a graph and reads off the step time the runtime
   would measure; :func:`grid_rows` puts prediction and measurement side by
   side, each row labelled ``kind`` (pipeline or data-parallel) and
   ``in_sample`` (the calibration configuration itself: its own traces fitted
   the model, so its error does not say how well the model transfers).
   :func:`analysis.validation.scores.score_grid` scores them.

Nothing here prints; the scripts do.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from schedules import TaskGraph
    from sim.costs.calibrated import TraceCalibration
    from sim.costs.profiled import ProfiledCosts

__all__ = ["ABLATIONS", "DP_ABLATIONS", "Calibration", "dp_graph", "grid_rows", "predict"]

log = logging.getLogger(__name__)

#: a real.measure.Measured (step_time, spread, round_medians, foreign_cores, traces); analysis does not import real
Measured = Any

# The mechanisms of the CPU testbed, each switched off in turn to show what it contributes to the error.
ABLATIONS: dict[str, dict[str, float]] = {"send_cpu": {"send_cpu": 0.0}, "task_overhead": {"task_overhead": 0.0},
                                          "step_overhead": {"step_overhead": 0.0}}
# The data-parallel rows also switch off compute slowed by concurrent communication and its converse (sim.slowdown).
# reduce_hook: zero2/zero3's per-bucket reduce-scatter hook on the training thread (sim.costs.profiled, measured by
# real.profile.hook); the other modes' predictions do not change without it.
DP_ABLATIONS: dict[str, dict[str, float]] = {**ABLATIONS, "comm_slowdown": {"comm_slowdown": 1.0},
                                             "max_inflight": {"max_inflight": 0}, "comm_stall": {"comm_stall": 1.0},
                                             "reduce_hook": {"reduce_hook_ns_per_byte": 0.0}}


def dp_graph(schedule: str, mode: str, m: int, buckets: int) -> TaskGraph:
    """The simulator's pp=1 data-parallel graph with ``buckets`` gradient buckets (as many as the runtime makes:
    :func:`real.profile.protocol.dp_buckets`).

    zero3 gathers on demand (prefetch 0), as the runtime does on a rank of one stage: its next pass reads the
    stage the running one holds, whose buffer is in use until that pass ends (``real.dp.zero``'s ``after_task``)."""
    from analysis.validation.dp_modes import split_mode
    from schedules import build, lower, validate
    from schedules.dp.modes import add_data_parallel

    mode = split_mode(mode)[0]  # ddp+int8: the codec is the costs' (analysis.validation.dp_modes.codec_costs), not the graph's
    prefetch = 0 if mode in ("zero3", "fsdp") else 1
    return validate(add_data_parallel(lower(build(schedule, pp=1, microbatches=m)), mode, [buckets],
                                      prefetch=prefetch))


def predict(graph: TaskGraph, costs: ProfiledCosts) -> float:
    """The step time the runtime would measure for ``graph`` under ``costs`` (:func:`sim.costs.profiled.step_time`)."""
    from analysis.validation.dp_modes import predict as simulated_step

    return simulated_step(graph, costs)


@dataclass(frozen=True)
class Calibration:
    """Cost models from one calibration run's traces and the machine's profile(s)."""

    profile: Path
    traces: tuple[str, ...]
    fit: TraceCalibration
    dp_profile: Path | None = None
    max_inflight: int = 0  # the runtime's bound on zero2/zero3's reduce-scatters in flight (real.dp.zero.MAX_INFLIGHT)
    dp_traces: tuple[str, ...] = ()  # the data-parallel calibration run's traces (analysis.validation.dp_transfer); () none
    dp_fit: ProfiledCosts | None = None  # their costs (analysis.validation.dp_transfer.dp_run_costs)
    dp_straggler: float = 1.0  # their straggler factor (analysis.validation.dp_transfer.straggler; reported, not applied)
    dp_skew: float = 0.0  # their replicas' skew over busy time (analysis.validation.dp_skew.skew_fraction), added to a step
    dp_shapes: tuple[tuple[int, ...], ...] = ()  # the model's parameter shapes (powersgd's bytes)
    dp_residual: float = 0.0  # seconds: the data-parallel run's measured step less its own prediction (closed_on)
    dp_zero3: Mapping[str, Any] | None = None  # the data-parallel profile's zero3 section (read once, in of)

    @classmethod
    def of(cls, profile: str | Path, traces: Sequence[str], dp_profile: str | Path | None = None,
           max_inflight: int = 0, dp_traces: Sequence[str] = (),
           dp_shapes: Sequence[Sequence[int]] = ()) -> Calibration:
        """``dp_traces``: a data-parallel run of ddp (validate_sim's: at the grid's middle microbatch count) that
        calibrates the data-parallel rows (:meth:`data_parallel`, :attr:`dp_skew`); without it they carry the
        pipeline run's. ``dp_shapes``: the model's parameter shapes, for a ``ddp+powersgd:R`` row."""
        import json

        from analysis.validation.dp_skew import skew_fraction
        from analysis.validation.dp_transfer import dp_run_costs, straggler
        from schedules.trace import read_trace
        from sim.costs.calibrated import trace_calibration

        fit, k, s, zero3 = None, 1.0, 0.0, None
        if dp_profile is not None:
            zero3 = json.loads(Path(dp_profile).read_text()).get("zero3")
        if dp_traces:
            if dp_profile is None:
                raise ValueError("a data-parallel calibration run needs the data-parallel profile; give dp_profile")
            frames = [read_trace(t) for t in dp_traces]
            fit, k, s = dp_run_costs(frames, dp_profile, max_inflight), straggler(frames), skew_fraction(frames)
        return cls(Path(profile), tuple(traces), trace_calibration(list(traces)),
                   Path(dp_profile) if dp_profile is not None else None, max_inflight, tuple(dp_traces), fit, k, s,
                   tuple(tuple(int(n) for n in shape) for shape in dp_shapes), dp_zero3=zero3)

    def closed_on(self, graph: TaskGraph, measured: float) -> Calibration:
        """This calibration with the data-parallel run's own gap closed: its step as measured (``measured``, the
        protocol's median) less as this calibration predicts it (ddp on ``graph``, the run's graph), kept as
        :attr:`dp_residual` and added to the fitted per-step overhead (not below 0), so every data-parallel row
        carries it. On the grids of 2026-12-02 the gap was -0.6 to -4.4% of the run's step, mostly its
        all-reduces' tail after the last backward (measured 3.7-6.2 ms, predicted 2.0-3.4). Fitted on the
        calibration run alone: its row stays in-sample, the others held out. No data-parallel run: unchanged."""
        from analysis.validation.dp_modes import predict_mode

        if self.dp_fit is None:
            return self
        predicted = predict_mode("ddp", graph, self.data_parallel("ddp"), self.dp_profile, 1, skew=self.dp_skew,
                                 shapes=self.dp_shapes)["step"]
        gap = measured - predicted
        fit = replace(self.dp_fit, step_overhead=max(self.dp_fit.step_overhead + gap, 0.0))
        return replace(self, dp_fit=fit, dp_residual=gap)

    def pipeline(self, num_stages: int, **off: float) -> ProfiledCosts:
        """The calibration run's costs for ``num_stages`` stages; ``off``: fields set (an ablation)."""
        from sim.costs.calibrated import from_trace

        costs = from_trace(list(self.traces), self.profile, num_stages=num_stages, calibration=self.fit)
        return replace(costs, **off) if off else costs

    def profile_only(self, num_stages: int) -> ProfiledCosts:
        """The profile alone, no trace: the second calibration source, reported beside the first."""
        from sim.costs.cost_file import load_profile

        return load_profile(self.profile, num_stages)

    def ratios(self) -> dict[str, float]:
        """In-run / profiled time of F and of B, summed over the calibration run's stages."""
        from schedules import Kind

        n = self.fit.num_stages
        base, scaled = self.profile_only(n), self.pipeline(n)
        return {k.value: sum(scaled.stages[s].of(k) for s in range(n)) / sum(base.stages[s].of(k) for s in range(n))
                for k in (Kind.F, Kind.B)}

    def data_parallel(self, mode: str = "ddp", **off: float) -> ProfiledCosts:
        """The costs of a data-parallel row of ``mode``: from the data-parallel calibration run
        (:mod:`analysis.validation.dp_transfer`: its costs, the optimizer step sharded for the ZeRO modes) when there is
        one, else :meth:`from_pipeline`; ``off``: fields set (an ablation)."""
        from analysis.validation.dp_transfer import ZERO3_MODES, mode_costs, zero3_costs

        if self.dp_fit is None:
            return self.from_pipeline(**off)
        costs = mode_costs(self.dp_fit, mode, 2)
        if mode.partition("+")[0] in ZERO3_MODES:
            costs = zero3_costs(costs, self.dp_zero3)
        return replace(costs, **off) if off else costs

    def from_pipeline(self, **off: float) -> ProfiledCosts:
        """The data-parallel rows' costs carried from the pipeline run: the pair's own profile, F and B scaled by
        :meth:`ratios`, the run's send_cpu and task_overhead, and the runtime's ``max_inflight``."""
        from sim.costs.cost_file import load_profile

        if self.dp_profile is None:
            raise ValueError("this calibration has no data-parallel profile; give dp_profile")
        ratio = self.ratios()
        own = load_profile(self.dp_profile, 1)
        st = own.stages[0]
        costs = replace(own, stages=(replace(st, f=st.f * ratio["F"], b=st.b * ratio["B"]),),
                        send_cpu=self.fit.send_cpu, task_overhead=self.fit.task_overhead,
                        max_inflight=self.max_inflight)
        return replace(costs, **off) if off else costs

    def warnings(self) -> list[str]:
        """The guesses in these cost models (each names its field): the profiles' fits and the calibration's."""
        from sim.costs.cost_file import load_profile

        out = list(self.pipeline(self.fit.num_stages).warnings)
        if self.dp_profile is not None:
            out += [f"{self.dp_profile.name}: {w}" for w in load_profile(self.dp_profile, 1).warnings]
        return out

    def describe(self) -> dict[str, Any]:
        from analysis.validation.dp_transfer import describe_fit

        out = {"traces": list(self.traces), "fit": {k: v for k, v in vars(self.fit).items() if k != "passes"},
               "passes": {f"{s}{k}": v for (s, k), v in self.fit.passes.items()}, "warnings": self.warnings()}
        if self.dp_fit is not None:
            out["data_parallel"] = {"traces": list(self.dp_traces),
                                    **describe_fit(self.dp_fit, self.dp_straggler, self.dp_skew),
                                    "residual": self.dp_residual}
        return out


def _measured_row(key: tuple[str, int], r: Measured) -> dict[str, Any]:
    from analysis.validation.scores import half_difference

    return {"schedule": key[0], "microbatches": key[1], "measured_step_time": r.step_time,
            "measured_spread": list(r.spread), "round_medians": list(r.round_medians),
            "foreign_cores": max(r.foreign_cores), "half_difference": half_difference(r.round_medians, r.step_time),
            "slowdown": max(getattr(r, "slowdowns", ()) or (1.0,)), "reruns": sum(getattr(r, "attempts", ())) -
            len(getattr(r, "attempts", ()))}


def _errors(row: dict[str, Any]) -> None:
    meas = row["measured_step_time"]
    row["error"] = (row["predicted_step_time"] - meas) / meas
    row["profile_error"] = (row["profile_predicted_step_time"] - meas) / meas


def pipeline_row(key: tuple[str, int], r: Measured, graph: TaskGraph, cal: Calibration) -> dict[str, Any]:
    """One pipeline configuration: predicted from the calibration and from the profile alone, each ablation,
    its self-calibrated error (from its own runs) and its replay error (each traced step with its own times)."""
    from schedules.trace import read_trace
    from sim.costs.calibrated import from_trace, trace_calibration
    from sim.replay import replay

    n = graph.schedule.num_stages
    row = {**_measured_row(key, r), "kind": "pipeline"}
    row["predicted_step_time"] = predict(graph, cal.pipeline(n))
    row["profile_predicted_step_time"] = predict(graph, cal.profile_only(n))
    row["without"] = {k: predict(graph, cal.pipeline(n, **v)) for k, v in ABLATIONS.items()}
    frames = [read_trace(t) for t in r.traces]  # read once: its own calibration and every step's replay
    own = from_trace(frames, cal.profile, num_stages=n)
    row["self_error"] = (predict(graph, own) - r.step_time) / r.step_time
    steps = [x.error for df in frames for x in replay(df, from_trace(df, calibration=trace_calibration(df)))]
    row["replay_error"] = statistics.median(steps)
    row["replay_abs_p90"] = sorted(abs(e) for e in steps)[int(0.9 * (len(steps) - 1))]
    _errors(row)
    return row


def dp_row(key: tuple[str, int], r: Measured, graph: TaskGraph, cal: Calibration) -> dict[str, Any]:
    """One data-parallel configuration (``key[0]`` is ``dp2-MODE``): predicted from its own profile scaled by
    the calibration run; its self-calibrated error (:func:`dp_self_costs`), its replay error (each traced step
    with its own task and collective times) and each mechanism, comm_slowdown included, switched off in turn.
    The modes of :mod:`analysis.validation.dp_modes` (ps, decentralized, local-sgd, MODE+CODEC) are predicted as it says;
    async-ps (its time per update, no replay) as :mod:`analysis.validation.async_grid` says."""
    from analysis.validation.async_grid import measured_parts as async_measured
    from analysis.validation.async_grid import predict_async
    from analysis.validation.async_grid import predicted_parts as async_parts
    from analysis.validation.dp_calibration import dp_replay_error, dp_self_costs
    from analysis.validation.dp_modes import predict_mode
    from analysis.validation.dp_skew import skew_fraction
    from analysis.validation.dp_transfer import measured_parts, predicted_parts
    from schedules.trace import read_trace
    from sim.costs.cost_file import load_profile
    from sim.costs.profiled import HOOKED_MODES

    mode = key[0].removeprefix("dp2-")
    every = r.config.sync.sync_every if mode == "local-sgd" else 1  # local-sgd's K: of the RunConfig measured
    bound = r.config.sync.staleness if mode == "async-ps" else 0  # async-ps's S: of the RunConfig measured

    def step(costs: ProfiledCosts, measured: bool = False, skew: float = cal.dp_skew) -> float:
        if mode == "async-ps":  # the time per update (analysis.validation.async_grid); its trainers wait for no one
            return predict_async(graph, costs, bound)
        return predict_mode(mode, graph, costs, cal.dp_profile, every, measured_collectives=measured, skew=skew,
                            shapes=cal.dp_shapes)["step"]

    def parts(costs: ProfiledCosts, skew: float = cal.dp_skew) -> dict[str, float]:
        if mode == "async-ps":
            return async_parts(graph, costs, bound)
        return predicted_parts(mode, graph, costs, cal.dp_profile, every, skew=skew, shapes=cal.dp_shapes)

    row = {**_measured_row(key, r), "kind": "data-parallel", "dp_mode": mode}
    if mode == "async-ps":
        row["staleness"] = bound
    frames = [read_trace(t) for t in r.traces]
    costs = cal.data_parallel(mode)
    if mode == "local-sgd":
        _amortize(row, r, frames, predict_mode(mode, graph, costs, cal.dp_profile, every, skew=cal.dp_skew))
    row["predicted_step_time"] = step(costs)
    # the profile alone and the pipeline run's transfer: no run of this pair, so no skew (as before it was modelled)
    row["profile_predicted_step_time"] = step(replace(load_profile(cal.dp_profile, 1), max_inflight=cal.max_inflight),
                                              skew=0.0)
    row["pipeline_predicted_step_time"] = step(cal.from_pipeline(), skew=0.0)
    row["without"] = {**{k: step(cal.data_parallel(mode, **v)) for k, v in DP_ABLATIONS.items()},
                      "skew": step(costs, skew=0.0)}
    own = dp_self_costs(frames, cal.dp_profile, cal.max_inflight)  # its own skew too (analysis.validation.dp_skew)
    row["self_error"] = (step(own, True, skew_fraction(frames)) - row["measured_step_time"]) / row["measured_step_time"]
    # async-ps: no replay (one lockstep step of the graph; its updates fold pushes of other steps) and the
    # trainers' rows taken apart (analysis.validation.async_grid)
    row["replay_error"], row["replay_abs_p90"] = (None, None) if mode == "async-ps" else \
        dp_replay_error(frames, cal.dp_profile)
    row["parts"] = {"measured": (async_measured if mode == "async-ps" else measured_parts)(frames),
                    "predicted": parts(costs), "from_pipeline": parts(cal.from_pipeline(), 0.0)}
    if costs.reduce_hook_ns_per_byte and mode in HOOKED_MODES:  # the prediction before the hook was charged
        row["parts"]["without_reduce_hook"] = parts(cal.data_parallel(mode, **DP_ABLATIONS["reduce_hook"]))
    _errors(row)
    row["pipeline_error"] = (row["pipeline_predicted_step_time"] - row["measured_step_time"]) / row["measured_step_time"]
    return row


def _amortize(row: dict[str, Any], r: Measured, frames: list[Any], predicted: dict[str, float]) -> None:
    """local-sgd: the row's measurement is the time per step amortized over K (analysis.validation.dp_modes), and its plain
    and averaging steps apart, measured and predicted."""
    from analysis.validation.dp_modes import amortized_measured, percentile, split_steps
    from analysis.validation.scores import half_difference

    step, means = amortized_measured(r.step_times)
    row.update(measured_step_time=step, round_medians=list(means), half_difference=half_difference(means, step),
               measured_spread=[percentile(means, 0.1), percentile(means, 0.9)])
    row["measured_local"], row["measured_averaging"] = split_steps(frames)
    row["predicted_local"], row["predicted_averaging"] = predicted["local"], predicted["averaging"]


def grid_rows(measured: Mapping[tuple[str, int], Measured], graphs: Mapping[tuple[str, int], TaskGraph],
              cal: Calibration, calibrated_from: tuple[str, int], data_parallel: Sequence[tuple[str, int]] = (),
              dp_calibrated_from: tuple[str, int] | None = None) -> list[dict[str, Any]]:
    """A row per measured configuration, in ``measured``'s order; ``data_parallel``: the keys of the pair.

    ``in_sample`` is True for ``calibrated_from`` and ``dp_calibrated_from`` (the data-parallel calibration run,
    whose traces are ``cal.dp_traces``) only."""
    rows = []
    fitted = {tuple(calibrated_from), *([tuple(dp_calibrated_from)] if dp_calibrated_from else [])}
    for key, r in measured.items():
        make = dp_row if key in data_parallel else pipeline_row
        row = make(key, r, graphs[key], cal)
        row["in_sample"] = key in fitted
        rows.append(row)
        log.info("%s m=%d: predicted %.2f ms, measured %.2f ms", key[0], key[1], row["predicted_step_time"] * 1e3,
                 row["measured_step_time"] * 1e3)
    return rows
