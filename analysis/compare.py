"""Schedules side by side: tabulate the results of several simulations (bubble, step time, memory), and
:func:`compare`, the one call that simulates them, writes their figures and sets real runs against predictions.

    >>> from analysis import compare
    >>> compare(["gpipe", "1f1b"], pp=4, microbatches=8).table  # doctest: +SKIP
    >>> compare(["1f1b", "zb-h1"], "run.csv", profile="profile.json", real=["zb.csv"]).against  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.theory import bubble_ratio as closed_form_bubble
from common.errors import ConfigError, quote
from sim import SimResult, UniformCosts
from sim.costs.cluster import GB

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Comparison", "compare", "comparison_table", "format_comparison", "format_units_comparison"]

_TRACE_SUFFIXES = (".csv", ".parquet")


@dataclass(frozen=True, eq=False)
class Comparison:
    """What :func:`compare` returns: the table (:func:`comparison_table`, or in physical units one row per
    schedule of step time, throughput, MFU, bubble, exposed communication and peak memory), the simulations, real
    runs against their predictions (:func:`analysis.validation.traces.predict_traces`; None without real traces)
    and the files written (none without ``out``)."""

    table: pd.DataFrame
    results: tuple[SimResult, ...] = field(repr=False)
    against: dict[str, Any] | None = field(default=None, repr=False)
    files: tuple[Path, ...] = ()
    units: tuple[dict[str, Any], ...] = field(default=(), repr=False)  # physical units: sim.units_comparison's result dicts (results is empty)


def _schedule_names(schedules: Iterable[str] | str | None, pp: int, microbatches: int, chunks: int) -> list[str]:
    from schedules import names
    from sim.plan.sweep import applicable

    if schedules is None or (isinstance(schedules, str) and schedules.lower() == "all"):
        return applicable(names(by_family=True), pp=pp, microbatches=microbatches, chunks=chunks)[0]
    if isinstance(schedules, str):
        return [schedules]
    return list(schedules)


def compare(schedules: Iterable[str] | str | None = None, costs: Any = None, *, pp: int | None = None,
            microbatches: int = 8, chunks: int = 2, profile: str | os.PathLike | None = None,
            real: Sequence[str | os.PathLike] = (), out: str | os.PathLike | None = None) -> Comparison:
    """Simulate ``schedules`` (names; None or "all": every schedule that takes the shape) at one shape and compare.

    ``costs``: :class:`sim.UniformCosts` (the default), a cost file of real.profile (JSON), a calibration run's
    trace (CSV or Parquet), scaled to other stage counts and passes by ``profile`` (a cost file), or
    :class:`sim.TransformerCosts` (physical units: the table is :func:`sim.units_comparison`'s, its pp the
    layout's). ``pp``: pipeline ranks (default 4). ``real``: real runs' traces, predicted as the validation grid
    predicts (:func:`analysis.validation.traces.predict_traces`): from the calibration trace and ``profile`` (the
    calibration run is an in-sample row), or from a cost file alone; with the noise verdict, and no scores when
    the runs were too noisy to judge. ``out``: a folder for comparison.csv, and for timelines.png and
    timeline-<schedule>.png (not in physical units) and against.json (with ``real``), written whole.
    """
    from sim import TransformerCosts
    from sim.plan.sweep import simulate_many

    if isinstance(costs, TransformerCosts):
        return _units(schedules, costs, pp, microbatches, chunks, profile, real, out)
    if costs is not None and not isinstance(costs, UniformCosts | str | os.PathLike):
        raise ConfigError("compare: costs must be UniformCosts, TransformerCosts, or the path of a cost file or "
                          f"trace, got {quote(costs)}", field="costs")
    pp = 4 if pp is None else pp
    source = Path(costs) if isinstance(costs, str | os.PathLike) else None
    calibrated = source is not None and source.suffix in _TRACE_SUFFIXES
    if profile is not None and not calibrated:
        raise ConfigError("compare: profile scales a calibration trace given as costs (a .csv or .parquet trace); "
                          f"got costs={quote(None if source is None else str(source))}", field="profile")
    if real and source is None:
        raise ConfigError("compare: real traces are predicted in seconds: give costs a calibration trace (with "
                          "profile) or a cost file of real.profile", field="costs")
    if real and calibrated and profile is None:
        raise ConfigError(f"compare: predicting real traces from the calibration trace {str(source)!r} needs the "
                          "machine's profile (real.profile's cost file); give profile", field="profile")
    chosen = _schedule_names(schedules, pp, microbatches, chunks)
    folder = _check_out(out, chosen, bool(real), timelines=True) if out is not None else None
    results = simulate_many(chosen, pp=pp, microbatches=microbatches, chunks=chunks,
                            costs=costs if source is None else None, profile=source, costs_profile=profile)
    table = comparison_table(results)
    against = None
    if real:
        from analysis.validation.traces import predict_traces

        against = (predict_traces(real, profile, [source]) if calibrated else predict_traces(real, source))
    files = () if folder is None else tuple(_write(folder, results, table, against))
    return Comparison(table, tuple(results), against, files)


def _units(schedules: Iterable[str] | str | None, costs: Any, pp: int | None, microbatches: int, chunks: int,
           profile: Any, real: Sequence[Any], out: str | os.PathLike | None) -> Comparison:
    """:func:`compare` in physical units: one row per schedule of :func:`sim.units_comparison`."""
    import pandas as pd

    from sim import units_comparison

    layout = costs.parallel.pp
    if pp is not None and pp != layout:
        raise ConfigError(f"compare: pp={quote(pp)} but the costs' parallel layout has pp={layout}; leave pp out or "
                          "make them equal", field="pp")
    if profile is not None or real:
        raise ConfigError("compare: profile and real traces go with costs in seconds measured on this machine (a "
                          "cost file or a calibration trace), not with TransformerCosts",
                          field="profile" if profile is not None else "real")
    chosen = _schedule_names(schedules, layout, microbatches, chunks)
    folder = _check_out(out, chosen, False, timelines=False) if out is not None else None
    rows = units_comparison(chosen, chunks=chunks, microbatches=microbatches, costs=costs)
    table = pd.DataFrame([{
        "schedule": d["schedule"], "pp": d["pp"], "microbatches": d["microbatches"], "chunks": d["chunks"],
        "step_time": d["step_time"], "tokens_per_s": d["tokens_per_s"], "mfu": d["mfu"],
        "bubble_ratio": d["bubble_ratio"], "exposed_comm": d["exposed_comm"],
        "peak_memory_bytes": max(x["memory_bytes"] for x in d["devices"]),
        "overflow_ranks": ",".join(str(x["rank"]) for x in d["devices"] if x["overflow"]),
    } for d in rows])
    files = () if folder is None else tuple(_write(folder, (), table, None))
    return Comparison(table, (), None, files, tuple(rows))


def _check_out(out: str | os.PathLike, chosen: Sequence[str], real: bool, *, timelines: bool) -> Path:
    from common.outputs import check_output_dir, check_output_file
    from schedules import spec

    folder = check_output_dir(out, "output folder")
    pictures = ("timelines.png", *(f"timeline-{spec(s).name}.png" for s in chosen)) if timelines else ()
    for name in ("comparison.csv", *(("against.json",) if real else ()), *pictures):
        check_output_file(folder / name, "output file")
    return folder


def _write(folder: Path, results: Sequence[SimResult], table: pd.DataFrame, against: dict[str, Any] | None
           ) -> list[Path]:
    import json

    from analysis.timeline import plot_timeline, plot_timelines
    from common.outputs import write_files_into

    def fill(stage: Path) -> None:
        if results:
            plot_timelines([r.trace for r in results], stage / "timelines.png")
        for r in results:
            plot_timeline(r.trace, stage / f"timeline-{r.schedule}.png")
        table.to_csv(stage / "comparison.csv", index=False)
        if against is not None:
            (stage / "against.json").write_text(json.dumps(_json_safe(against), indent=1) + "\n")

    return sorted(write_files_into(folder, fill, "output folder"))


def _json_safe(value: Any) -> Any:
    """NaN as null (JSON has no NaN), tuples as lists, nested."""
    if isinstance(value, float):
        return None if value != value else value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def comparison_table(results: Sequence[SimResult]) -> pd.DataFrame:
    """One row per result: shape, makespan, bubble (simulated and closed form), memory, throughput."""
    import pandas as pd

    rows = []
    for r in results:
        d = r.to_dict()
        c = d["costs"]
        closed = None
        if c.get("model") == "uniform" and c.get("tcomm", 0) == 0:
            closed = closed_form_bubble(d["schedule"], d["pp"], d["microbatches"], d["chunks"], c["tf"], c["tb"], c["tw"])
        rows.append({
            "schedule": d["schedule"],
            "pp": d["pp"],
            "microbatches": d["microbatches"],
            "chunks": d["chunks"],
            "makespan": d["makespan"],
            "bubble_ratio": d["bubble_ratio"],
            "bubble_closed_form": closed,
            # Idle inside a rank's own span (first start to last end), the busiest rank's: the
            # zero-bubble papers' measure, which leaves out the warm-up offset of later ranks.
            "span_idle": max(x["last_end"] - x["first_start"] - x["busy"] for x in d["ranks"]),
            "peak_act_max": d["peak_activations"],
            "peak_act_min": min(x["peak_activations"] for x in d["ranks"]),
            "throughput": d["microbatches"] / d["makespan"] if d["makespan"] > 0 else float("nan"),
        })
    return pd.DataFrame(rows)


def format_comparison(table: pd.DataFrame) -> str:
    """The table as aligned text, bubble ratios as percentages."""
    header = (
        f"{'schedule':<18} {'p':>3} {'m':>4} {'v':>3} {'makespan':>10} {'bubble':>8} {'closed form':>11} "
        f"{'span idle':>9} {'peak act (M_B) max/min':>22} {'mb per time':>11}"
    )
    lines = [header, "-" * len(header)]
    for row in table.itertuples(index=False):
        closed = "-" if row.bubble_closed_form is None or row.bubble_closed_form != row.bubble_closed_form else f"{row.bubble_closed_form:.2%}"
        peak = f"{row.peak_act_max:.4g} / {row.peak_act_min:.4g}"
        lines.append(
            f"{row.schedule:<18} {row.pp:>3} {row.microbatches:>4} {row.chunks:>3} {row.makespan:>10.5g} "
            f"{row.bubble_ratio:>8.2%} {closed:>11} {row.span_idle:>9.4g} {peak:>22} {row.throughput:>11.4g}"
        )
    return "\n".join(lines)


def format_units_comparison(rows: Sequence[dict]) -> str:
    """Step time, throughput, MFU, exposed communication and peak memory per schedule."""
    header = (f"{'schedule':<18} {'step s':>8} {'tokens/s':>10} {'MFU':>6} {'bubble':>7} {'exposed comm s':>14} "
              f"{'peak mem GB':>11} {'overflow':>8}")
    lines = [header, "-" * len(header)]
    for d in rows:
        peak = max(x["memory_bytes"] for x in d["devices"]) / GB
        over = ",".join(str(x["rank"]) for x in d["devices"] if x["overflow"]) or "-"
        lines.append(f"{d['schedule']:<18} {d['step_time']:>8.4f} {d['tokens_per_s']:>10,.0f} {d['mfu']:>6.1%} "
                     f"{d['bubble_ratio']:>7.1%} {d['exposed_comm']:>14.4f} {peak:>11.2f} {over:>8}")
    return "\n".join(lines)
