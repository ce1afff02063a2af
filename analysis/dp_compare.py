"""Data-parallel modes side by side: per mode, the step time and each pipeline rank's memory by category.

Predicted by the simulator (one :class:`~sim.plan.study.Study` per mode, the same model, cluster, schedule and
layout, only ``dp_mode`` changed) and, where a real run of the mode is given, measured.

* **Predicted memory** per pipeline rank, bytes: the model states of its stages split by
  :func:`sim.memory.model_states` (parameters, gradients, optimizer state, and zero3's gathered stage) at
  :class:`StateBytes` per parameter (mixed-precision Adam by default, 2 + 2 + 12; the runtime's fp32 AdamW
  is 4 + 4 + 8), and the engine's activation peak.
* **Measured**: a JSON file of real runs, each the object ``schedlab run --json`` (``python -m real --json``)
  prints (``experiments/dp_memory.py --json`` writes those of its runs): ``dp_mode``, ``pp``, ``dp``,
  ``step_times`` and ``memory`` (per rank: ``pp_rank``, ``param_bytes``, ``grad_bytes``, ``optimizer_bytes``,
  ``gathered_param_bytes``, ``peak_activation_bytes``). The file holds one such object, a list of them, or
  ``{"runs": [...]}``. The measured step is the median of a run's step times after the first (warm-up); a
  pipeline rank's bytes are the largest over its dp replicas; runs of modes not compared are not used. A
  measured figure is set beside the predicted one only: it is the user's to run the configuration that was
  predicted (the pp and dp must match, or it is an error).

:func:`format_dp_modes` is the text table, :func:`plot_dp_modes` the figure, :func:`dp_section` the
report's Markdown; :meth:`DPModeRow.to_dict` / :func:`rows_from_json` the JSON between them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import parse
from common.errors import ConfigError, choice, find_name, quote
from schedules.dp.modes import DP_MODES
from sim.costs.transformer_costs import TransformerCosts
from sim.memory import model_states
from sim.plan.study import Study, StudyResult, run_study

__all__ = ["CATEGORIES", "DPModeRow", "StateBytes", "dp_section", "format_dp_modes", "load_measured",
           "parse_dp_modes", "plot_dp_modes", "predict_dp_modes", "rows_from_json"]

#: Memory categories, in table order; each is also a key of a run's ``memory`` entries (``RUN_KEYS``).
CATEGORIES = ("params", "grads", "optimizer", "gathered", "activations")
RUN_KEYS = {"params": "param_bytes", "grads": "grad_bytes", "optimizer": "optimizer_bytes",
            "gathered": "gathered_param_bytes", "activations": "peak_activation_bytes"}
_CANONICAL = {"fsdp": "zero3"}  # schedules.dp.modes's alias
MAX_RANKS = 2**20  # the most devices a cluster holds (sim.costs.cluster.MAX_DEVICES): pp and dp of a run


@dataclass(frozen=True, slots=True, kw_only=True)
class StateBytes:
    """Bytes per parameter held as weights, gradients and optimizer state (default: mixed-precision Adam,
    Rajbhandari et al. 2020, sec. 3.1)."""

    weight: float = 2.0
    grad: float = 2.0
    optimizer: float = 12.0

    def __post_init__(self) -> None:
        for name in ("weight", "grad", "optimizer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"dp compare: {name} bytes per parameter must be a finite number >= 0, got "
                                  f"{quote(value)}", field="state_bytes")


@dataclass(frozen=True, slots=True)
class DPModeRow:
    """One pipeline rank under one mode: predicted step and bytes, and the measured ones (None: not measured)."""

    mode: str
    rank: int
    step_time: float
    memory: dict[str, float]
    measured_step_time: float | None = None
    measured: dict[str, float] | None = None

    @property
    def total(self) -> float:
        return sum(self.memory.values())

    @property
    def measured_total(self) -> float | None:
        return None if self.measured is None else sum(self.measured.values())

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "rank": self.rank, "step_time": self.step_time, "memory": dict(self.memory),
                "total": self.total, "measured_step_time": self.measured_step_time,
                "measured": None if self.measured is None else dict(self.measured),
                "measured_total": self.measured_total}


def parse_dp_modes(modes: Sequence[str]) -> tuple[str, ...]:
    """Mode names in their canonical case, each once (``fsdp`` and ``zero3`` are one mode: the first spelling
    stays); an unknown one is a one-line error listing the valid names."""
    out: dict[str, str] = {}
    for m in modes:
        name = find_name(m, DP_MODES)
        if name is None:
            raise ConfigError(f"compare: unknown dp mode {quote(m)}; valid: {', '.join(DP_MODES)}", field="dp_modes")
        out.setdefault(_CANONICAL.get(name, name), name)
    return tuple(out.values())


def _mode_costs(costs: TransformerCosts, mode: str) -> TransformerCosts:
    p = costs.parallel
    extra = {} if mode == "async-ps" else {"staleness": 0, "trainer_speeds": ()}  # async-ps's own settings
    return dataclasses.replace(costs, parallel=dataclasses.replace(p, dp_mode=mode, **extra))


def _rank_memory(result: StudyResult, rank: int, state: StateBytes) -> dict[str, float]:
    costs, graph, p = result.study.costs, result.sim.graph, result.study.parallel
    n_st = graph.schedule.num_stages
    params = [costs.stage_params(s, n_st) for s in graph.schedule.stages_of(rank)]
    mode = p.dp_mode if p.dp > 1 else "none"
    try:
        st = model_states(sum(params), mode, p.dp, weight_bytes=state.weight, grad_bytes=state.grad,
                          optimizer_bytes=state.optimizer, stage_psi=max(params))
    except ValueError:  # a mode the simulator times but sim.memory does not split
        raise ConfigError(f"compare: dp mode {mode!r} has no memory model by category (sim.memory.model_states); "
                          "leave it out of the modes compared", field="dp_modes") from None
    return {"params": st.params, "grads": st.grads, "optimizer": st.optimizer, "gathered": st.gathered,
            "activations": float(result.sim.ranks[rank].peak_activations)}


def predict_dp_modes(modes: Sequence[str], *, schedule: str, microbatches: int, costs: TransformerCosts,
                     chunks: int | None = None, state: StateBytes | None = None,
                     measured: dict[str, dict[str, Any]] | None = None) -> list[DPModeRow]:
    """One row per (mode, pipeline rank): ``costs`` with each mode in turn (its other settings as given), and
    the measured figures of ``measured`` (:func:`load_measured`) where it has the mode."""
    state = state or StateBytes()
    modes = parse_dp_modes(modes)
    measured = measured or {}
    _check_measured(measured, modes, costs)
    rows = []
    for mode in modes:
        result = run_study(Study(schedule=schedule, microbatches=microbatches, chunks=chunks,
                                 costs=_mode_costs(costs, mode)))
        run = measured.get(_CANONICAL.get(mode, mode))
        for rank in range(costs.parallel.pp):
            step = result.step_time if result.async_ps is None else result.async_ps.time_per_step
            rows.append(DPModeRow(mode, rank, step, _rank_memory(result, rank, state),
                                  None if run is None else run["step_time"],
                                  None if run is None else run["memory"].get(rank)))
    return rows


def _check_measured(measured: dict[str, dict[str, Any]], modes: Sequence[str], costs: TransformerCosts) -> None:
    wanted = {_CANONICAL.get(m, m) for m in modes}
    p = costs.parallel
    for mode, run in measured.items():
        if mode in wanted and (run["pp"], run["dp"]) != (p.pp, p.dp):
            raise ConfigError(f"compare: the measured {mode} run has pp={run['pp']} dp={run['dp']}, the prediction "
                              f"pp={p.pp} dp={p.dp}; give runs of the predicted layout", field="measured")


# ------------------------------------------------------------------------------------------------ measured runs
def _runs_of(data: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(data, dict) and "runs" in data:
        data = data["runs"]
    runs = data if isinstance(data, list) else [data]
    for i, run in enumerate(runs):
        missing = [k for k in ("dp_mode", "pp", "dp", "step_times", "memory") if not isinstance(run, dict) or k not in run]
        if missing:
            raise ConfigError(f"{where}: run #{i + 1} has no {', '.join(missing)}; give the JSON of a real run "
                              "(real.trainer.RunResult.to_json: one object, a list, or {\"runs\": [...]})",
                              field="measured")
    return runs


def _measured_run(run: dict[str, Any], where: str) -> dict[str, Any]:
    what = f"{where}: the {run['dp_mode']} run's"
    times = run["step_times"]
    if not isinstance(times, list) or not times:
        raise ConfigError(f"{what} step_times must be a non-empty list of seconds, got {quote(times)}",
                          field="measured")
    times = [parse.number(t, f"{what} step_times[{i}]", low=0, field="measured") for i, t in enumerate(times)]
    entries = run["memory"]
    if entries is not None and not isinstance(entries, list):
        raise ConfigError(f"{what} memory must be a list of entries (pp_rank and the byte counts), got "
                          f"{quote(entries)}", field="measured")
    memory: dict[int, dict[str, float]] = {}
    for entry in entries or ():
        if not isinstance(entry, dict) or "pp_rank" not in entry:
            raise ConfigError(f"{what} memory entries need pp_rank and the byte counts, got {quote(entry)}",
                              field="measured")
        rank = parse.integer(entry["pp_rank"], f"{what} pp_rank", low=0, high=MAX_RANKS - 1, field="measured")
        mine = memory.setdefault(rank, dict.fromkeys(CATEGORIES, 0.0))
        for cat, key in RUN_KEYS.items():
            got = entry.get(key)
            if got is not None:
                mine[cat] = max(mine[cat], parse.number(got, f"{what} {key}", low=0, field="measured"))
    steady = times[1:] if len(times) > 1 else times  # the first step warms up
    layout = {k: parse.integer(run[k], f"{what} {k}", low=1, high=MAX_RANKS, field="measured") for k in ("pp", "dp")}
    return {**layout, "step_time": float(statistics.median(steady)), "memory": memory}


def _no_constant(name: str) -> float:
    """JSON's NaN and Infinity are not numbers of a run: refused (json would take them)."""
    raise ValueError(f"{name} is not a number")


def load_measured(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Canonical mode -> {pp, dp, step_time, memory: {pp rank: {category: bytes}}} from a file of real runs."""
    where = f"measured runs {str(path)!r}"
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"), parse_constant=_no_constant)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read ({exc.strerror or exc})", field="measured") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())
        raise ConfigError(f"{where}: not JSON ({why})", field="measured") from None
    out: dict[str, dict[str, Any]] = {}
    for run in _runs_of(data, where):
        mode = choice(where, "dp_mode", run["dp_mode"], DP_MODES)
        mode = _CANONICAL.get(mode, mode)
        if mode in out:
            raise ConfigError(f"{where}: two runs of mode {mode!r}; give one per mode", field="measured")
        out[mode] = _measured_run(run, where)
    return out


# ------------------------------------------------------------------------------------------------ output
def rows_from_json(data: Any) -> list[DPModeRow]:
    """The rows of a ``dp_modes.json`` that ``schedlab compare --dp-modes`` wrote (its ``dp_modes`` list)."""
    items = data.get("dp_modes") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ConfigError("data-parallel comparison: no 'dp_modes' list; give the dp_modes.json of a "
                          "data-parallel comparison (DPModeRow.to_dict rows)", field="dp_compare")
    try:
        return [DPModeRow(d["mode"], d["rank"], d["step_time"], d["memory"], d["measured_step_time"], d["measured"])
                for d in items]
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"data-parallel comparison: a row lacks {exc}; give the dp_modes.json of a "
                          "data-parallel comparison (DPModeRow.to_dict rows)", field="dp_compare") from None


def _size(n: float | None) -> str:
    if n is None:
        return ""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} B"


def _time(t: float | None) -> str:
    return "" if t is None else f"{t:.4g}"


_HEAD = ("mode", "rank", "step s", "measured", *(h for c in (*CATEGORIES, "total") for h in (c, "measured")))


def _cells(r: DPModeRow) -> list[str]:
    mem = [(r.memory[c], None if r.measured is None else r.measured[c]) for c in CATEGORIES]
    mem.append((r.total, r.measured_total))
    return [r.mode, str(r.rank), _time(r.step_time), _time(r.measured_step_time),
            *(s for pred, meas in mem for s in (_size(pred), _size(meas)))]


def format_dp_modes(rows: Sequence[DPModeRow]) -> str:
    """Aligned text: per mode and pipeline rank, predicted and measured step time and bytes by category."""
    table = [list(_HEAD), *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEAD))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True)))
             for line in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def dp_section(rows: Sequence[DPModeRow], out: Path, figure: str = "dp-modes.png") -> list[str]:
    """The report's data-parallel section (Markdown lines) with its figure written to ``out / figure``."""
    plot_dp_modes(rows, out / figure)
    body = ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD),
            *("| " + " | ".join(c or "-" for c in _cells(r)) + " |" for r in rows)]
    return ["## Data-parallel modes", "",
            "Per mode and pipeline rank: the step time and the bytes held, predicted by the simulator and, where a "
            "real run of the mode was given, measured (`-`: not measured). Activations: the peak.", "",
            f"![step time and memory per rank per data-parallel mode]({figure})", "", *body, ""]


def plot_dp_modes(rows: Sequence[DPModeRow], path: str | os.PathLike) -> Path:
    """Step time per mode (predicted bars, measured beside) and memory per rank per mode (stacked by
    category; a measured total is a black marker on its bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.figures import place_legend

    modes = list(dict.fromkeys(r.mode for r in rows))
    first = {m: next(r for r in rows if r.mode == m) for m in modes}
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    xs = range(len(modes))
    ax_t.bar([x - 0.2 for x in xs], [first[m].step_time for m in modes], 0.4, label="predicted")
    meas = [(x + 0.2, first[m].measured_step_time) for x, m in zip(xs, modes, strict=True)
            if first[m].measured_step_time is not None]
    if meas:
        ax_t.bar([x for x, _ in meas], [t for _, t in meas], 0.4, label="measured", hatch="//", fill=False)
    ax_t.set_xticks(list(xs), modes)
    ax_t.set_ylabel("step time (s)")
    ax_t.set_title("step time per mode (simulated; measured where run)", fontsize=10)
    highest = max([first[m].step_time for m in modes] + [t for _, t in meas], default=0.0)
    ax_t.set_ylim(0, highest * 1.3 or 1.0)  # room for the legend above the bars
    top = max((max(r.total, r.measured_total or 0.0) for r in rows), default=0.0)
    unit, scale = next(((u, f) for u, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if top >= f), ("B", 1))
    labels, bottom = [f"{r.mode}\nr{r.rank}" for r in rows], [0.0] * len(rows)
    for cat in CATEGORIES:
        heights = [r.memory[cat] / scale for r in rows]
        ax_m.bar(range(len(rows)), heights, bottom=bottom, label=cat)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    marks = [(i, r.measured_total / scale) for i, r in enumerate(rows) if r.measured_total is not None]
    if marks:
        ax_m.scatter([i for i, _ in marks], [v for _, v in marks], marker="_", s=400, color="black", zorder=3,
                     label="measured total")
    ax_m.set_xticks(range(len(rows)), labels, fontsize=7)
    ax_m.set_ylabel(f"memory per device ({unit})")
    ax_m.set_title("memory per pipeline rank per mode (simulated, stacked; measured total: marker)", fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.16, top=0.92, wspace=0.18)  # tight_layout: 1 s a figure
    place_legend(ax_t, fontsize=8, relayout=False)
    place_legend(ax_m, fontsize=7, relayout=False)
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
