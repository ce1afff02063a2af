"""Many simulations at once: schedules side by side, bubble against microbatches, predictions for real traces.

The analysis package reads what these return (tables, plots, reports); it
does not simulate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedules import (
    Schedule,
    ScheduleError,
    TaskGraph,
    ZBAutoOptions,
    load_schedule,
    lower,
    names,
    schedule_spec,
    validate,
)
from schedules.library.recompute import place_recompute
from schedules.trace import median_step, read_trace
from sim.costs.calibrated import load_costs
from sim.costs.uniform import CostModel, UniformCosts
from sim.engine import SimResult, simulate
from sim.plan.study import Study, run_study

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "RecomputePoint", "Sweep", "SweepConfig", "applicable", "bubble_sweep", "predict_for_trace", "recompute_tradeoff",
    "run_sweep", "simulate_many", "trace_graph", "units_comparison",
]

SWEEP_MICROBATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
RECOMPUTE_LIMITS = (2.0,)  # M_B: the memory limits the report gives the recompute-in-the-bubbles pass


# Comparisons and sweeps build zb-auto many times: they take its heuristic alone (reproducible, well under a
# second) rather than 10 s of exact search per build; `schedlab simulate --schedule zb-auto` searches.
SWEEP_TIME_LIMIT = 0.0


def _quick(name: str, c: UniformCosts | None = None) -> ZBAutoOptions | None:
    """An adaptive schedule's options for a sweep: the heuristic alone, with ``c``'s pass times if given."""
    sp = schedule_spec(name)
    if sp is None or not sp.adaptive:
        return None
    times = {} if c is None else {"tf": c.tf, "tb": c.tb, "tw": c.tw, "tcomm": c.tcomm}
    return ZBAutoOptions(**times, time_limit=SWEEP_TIME_LIMIT)


def _chunks_for(name: str, chunks: int) -> int | None:
    """``chunks`` for multi-chunk schedules (and torch's classes), 1 for the others; None for a csv: file (its own)."""
    if name.startswith("csv:"):
        return None
    sp = schedule_spec(name)
    return chunks if sp is None or sp.takes_chunks else 1


def _display(ref: str) -> str:
    """The name a table shows for a reference: a user's registered or function name, a built-in's own case."""
    sp = schedule_spec(ref)
    return sp.name if sp is not None else ref


def _build(name: str, pp: int, microbatches: int, chunks: int, c: UniformCosts | None = None) -> Schedule:
    """Any schedule reference (a registered name, torch:, csv:, the user's file.py:NAME) at one shape."""
    return load_schedule(name, None, _quick(name, c), pp=pp, microbatches=microbatches,
                         chunks=_chunks_for(name, chunks))


def simulate_many(
    names: Iterable[str], *, pp: int, microbatches: int, chunks: int = 2, costs: UniformCosts | None = None,
    profile: str | Path | None = None, costs_profile: str | Path | None = None,
) -> list[SimResult]:
    """Simulate each named schedule at the same shape; multi-chunk ones get ``chunks`` stages per rank.

    ``profile``: a cost file (real.profile) or a real trace (:func:`sim.costs.calibrated.load_costs`, scaled with
    ``costs_profile``); each schedule gets its partition's measured costs.
    """
    graphs = []
    for name in names:  # build and validate all first: a bad name fails before any simulation
        graphs.append(validate(_build(name, pp, microbatches, chunks)))
    if profile is None:
        return [simulate(g, costs or UniformCosts(), check=False) for g in graphs]
    return [simulate(g, load_costs(profile, g.schedule.num_stages, costs_profile), check=False) for g in graphs]


def applicable(names: Iterable[str], *, pp: int, microbatches: int, chunks: int = 2) -> tuple[list[str], dict[str, str]]:
    """The schedules that take this shape, and why each other one does not."""
    ok, skipped = [], {}
    for name in names:
        try:
            _build(name, pp, microbatches, chunks)
        except ScheduleError as exc:
            skipped[name] = str(exc)
        else:
            ok.append(name)
    return ok, skipped


def bubble_sweep(
    names: Iterable[str], *, pp: int, chunks: int = 2, costs: UniformCosts | None = None,
    microbatches: Sequence[int] = SWEEP_MICROBATCHES, progress: Any = None,
) -> dict[str, list[tuple[int, int, float]]]:
    """(m, chunks, simulated bubble ratio) per schedule, for every m in ``microbatches`` the schedule accepts.

    ``progress``: an optional wrapper over the job list (e.g. tqdm).
    """
    c = costs or UniformCosts()
    names = list(names)
    jobs = [(n, m) for n in names for m in microbatches]
    shown = {n: _display(n) for n in names}
    out: dict[str, list[tuple[int, int, float]]] = {shown[n]: [] for n in names}
    for name, m in (progress(jobs) if progress else jobs):
        try:
            graph = lower(_build(name, pp, m, chunks, c))
        except ScheduleError:
            continue  # a shape this schedule does not take (e.g. m not a multiple of p)
        out[shown[name]].append((m, graph.schedule.chunks, simulate(graph, c, check=False).bubble_ratio))
    return out


def units_comparison(names: Iterable[str], *, chunks: int = 2, microbatches: int, costs: Any) -> list[dict[str, Any]]:
    """Each named schedule as a physical-units study on the same :class:`TransformerCosts`; result dicts."""
    studies = [Study(schedule=n, microbatches=microbatches, chunks=_chunks_for(n, chunks), costs=costs) for n in names]
    return [run_study(s).to_dict() for s in studies]


@dataclass(frozen=True, slots=True)
class RecomputePoint:
    """One schedule with one placement of R actions: its step time and its busiest rank's peak (M_B)."""

    schedule: str
    placement: str  # none, full, bubbles (schedules.library.recompute.RECOMPUTE_PLACEMENTS)
    limit: float | None  # the bubbles pass's memory limit
    makespan: float
    peak_activations: float

    @property
    def label(self) -> str:
        return self.placement if self.limit is None else f"{self.placement}@{self.limit:g}"


def recompute_tradeoff(names: Iterable[str], *, pp: int, microbatches: int, chunks: int = 2,
                       costs: UniformCosts | None = None, limits: Sequence[float] = RECOMPUTE_LIMITS
                       ) -> list[RecomputePoint]:
    """Per schedule: no recomputation, R before every backward, and R's moved into the bubbles at each limit."""
    c = costs or UniformCosts()
    times = (c.tf, c.tb, c.tw, c.tcomm, c.mw)
    out = []
    for name in names:
        base = _build(name, pp, microbatches, chunks)
        for placement, limit in (("none", None), ("full", None), *(("bubbles", x) for x in limits)):
            r = simulate(lower(place_recompute(base, placement, limit, times)), c, check=False)
            out.append(RecomputePoint(name, placement, limit, r.makespan, r.peak_activations))
    return out


def trace_graph(attrs: Mapping[str, Any]) -> TaskGraph:
    """The validated graph of the schedule a trace ran (its ``attrs``: schedule, params, recomputation)."""
    name, params = str(attrs.get("schedule")), attrs.get("params", {})
    try:
        pp, m = int(params["pp"]), int(params["microbatches"])
    except (KeyError, TypeError, ValueError):
        raise ScheduleError(f"trace of {name!r} does not record its pp and microbatches (attrs params={params!r})") from None
    if attrs.get("programs") is not None:  # the run's own order, R actions included: any schedule, a user's too
        schedule = Schedule.from_programs(attrs["programs"], name=name, stage_to_rank=attrs.get("stage_to_rank"),
                                          num_microbatches=m, params=params)
    else:  # a trace written before traces recorded their programs: a registered schedule, rebuilt
        sp = schedule_spec(name)
        chunks = int(params.get("chunks") or (sp.default_chunks if sp is not None else 1))
        schedule = load_schedule(name, pp=pp, microbatches=m, chunks=chunks)
        if params.get("recompute") in ("full", "bubbles"):  # placed as the run placed them (unit pass times)
            schedule = place_recompute(schedule, params["recompute"], params.get("recompute_mem_limit"))
    return validate(schedule)


def predict_for_trace(attrs: Mapping[str, Any], costs: CostModel | None = None, profile: str | Path | None = None,
                      costs_profile: str | Path | None = None) -> SimResult:
    """Simulate the schedule a trace ran (its ``attrs``: schedule, params) with ``costs``, or ``profile``'s: a cost
    file, or a calibration run's trace scaled to other stage counts with ``costs_profile``
    (:func:`sim.costs.calibrated.load_costs`)."""
    graph = trace_graph(attrs)
    if profile is not None:
        costs = load_costs(profile, graph.schedule.num_stages, costs_profile)
    return simulate(graph, costs or UniformCosts(), check=False)


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    """What a report simulates: the schedules at one shape, a bubble sweep over m, and predictions for real traces.

    ``profile``: a cost file (real.profile), or a calibration run's trace, to predict the real traces in
    seconds; without it they are predicted with ``costs``. ``costs_profile``: the cost file that scales a
    calibration trace to other stage counts and passes (:func:`sim.costs.calibrated.load_costs`).
    """

    pp: int = 4
    microbatches: int = 8
    chunks: int = 2
    schedules: tuple[str, ...] = ()  # empty: every registered schedule
    costs: UniformCosts = field(default_factory=UniformCosts)
    sweep: tuple[int, ...] = SWEEP_MICROBATCHES
    real_traces: tuple[Path, ...] = ()
    profile: Path | None = None
    costs_profile: Path | None = None
    recompute_limits: tuple[float, ...] = RECOMPUTE_LIMITS  # empty: no recomputation section

    def __post_init__(self) -> None:
        for name in self.schedules:
            schedule_spec(name)  # unknown names and missing user functions fail here, before anything runs
        for path in self.real_traces:
            if not Path(path).is_file():
                raise ScheduleError(f"trace file {str(path)!r} not found")
        if self.costs_profile is not None and self.profile is None:
            raise ScheduleError("costs_profile scales a calibration trace given as profile; give profile too",
                                field="costs_profile")
        if self.profile is not None:  # a missing or malformed file fails here, before anything runs
            load_costs(self.profile, None, self.costs_profile)
        if self.real_traces and self.calibrated and self.costs_profile is None:
            raise ScheduleError(f"predicting real traces from the calibration trace {str(self.profile)!r} needs "
                                "the machine's profile (real.profile's cost file), as the validation grid does; "
                                "give costs_profile", field="costs_profile")

    @property
    def calibrated(self) -> bool:
        """``profile`` is a calibration run's trace (the real traces are predicted from it), not a cost file."""
        return self.profile is not None and Path(self.profile).suffix in (".csv", ".parquet")


@dataclass(frozen=True, eq=False)
class Sweep:
    """What :func:`run_sweep` simulated; :func:`analysis.report.write_report` turns it into a report."""

    config: SweepConfig
    results: tuple[SimResult, ...]  # one per schedule at the config's shape
    bubbles: Mapping[str, list[tuple[int, int, float]]]  # schedule -> (m, chunks, bubble ratio)
    predictions: tuple[tuple[Path, pd.DataFrame, pd.DataFrame], ...]  # (path, measured, predicted)
    recompute: tuple[RecomputePoint, ...] = ()  # the recomputation trade-off at the config's shape


def run_sweep(cfg: SweepConfig, progress: Callable[[Sequence], Iterable] | None = None) -> Sweep:
    chosen = list(cfg.schedules) or names(by_family=True)
    results = simulate_many(chosen, pp=cfg.pp, microbatches=cfg.microbatches, chunks=cfg.chunks, costs=cfg.costs)
    bubbles = bubble_sweep(chosen, pp=cfg.pp, chunks=cfg.chunks, costs=cfg.costs, microbatches=cfg.sweep,
                           progress=progress)
    predictions = []
    for path in cfg.real_traces:
        real = median_step(read_trace(path))
        if real.attrs.get("source") != "real":
            raise ScheduleError(f"trace {str(path)!r} is not a real run's trace (attrs source={real.attrs.get('source')!r})")
        predicted = predict_for_trace(real.attrs, cfg.costs if cfg.profile is None else None, cfg.profile,
                                      cfg.costs_profile).trace
        predictions.append((Path(path), real, predicted))
    recompute = recompute_tradeoff(chosen, pp=cfg.pp, microbatches=cfg.microbatches, chunks=cfg.chunks,
                                   costs=cfg.costs, limits=cfg.recompute_limits) if cfg.recompute_limits else []
    return Sweep(cfg, tuple(results), bubbles, tuple(predictions), tuple(recompute))
