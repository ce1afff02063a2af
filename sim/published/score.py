"""Predict every published run with the simulator, score it, and fit the A100 GEMM curve.

Each row becomes a :class:`sim.plan.study.Study` (:func:`study_of`) run with the
same device models (sim.costs.devices); its prediction is the row's metric: the
step time, tokens per second per GPU (tokens of the step over step time and
GPUs), or model TFLOP/s per GPU (:meth:`StudyResult.model_flops_per_step`,
Megatron-LM's count: attention over the whole s x s, no recomputation). A
table's summary gives the rows that fitted a parameter and those that did not
as separate means (:func:`summarize`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from schedules import TaskGraph
from sim.costs.cluster import cluster_preset
from sim.costs.devices import DEVICE_MODELS
from sim.costs.gpu_model import DeviceModel, GemmEfficiency
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import model_preset
from sim.costs.transformer_costs import TransformerCosts
from sim.engine import activation_peaks, simulate
from sim.plan.study import Study, StudyResult, build_graph, run_study
from sim.published.runs import KORTHIKANTI_MEMORY, PublishedRun, suite_runs

__all__ = ["FIT_EVALUATIONS", "FIT_MOVES", "FIT_RESOLUTION", "FIT_STEPS", "command", "fit_gemm_efficiency", "fit_graphs",
           "fit_loss", "memory_rows", "predict", "score", "study_of", "summarize"]

GIB = 2**30


def study_of(run: PublishedRun, *, device_model: DeviceModel | None = None, recompute: str | None = None,
             sp: bool | None = None) -> Study:
    """The row's layout as a study (``recompute``/``sp`` override the row's, for the memory figures)."""
    costs = TransformerCosts(
        model=model_preset(run.model), cluster=cluster_preset(run.cluster),
        parallel=ParallelConfig(pp=run.pp, tp=run.tp, dp=run.dp, cp=run.cp, ep=run.ep, dp_mode=run.dp_mode,
                                bucket_mb=run.bucket_mb,
                                sp=run.sp if sp is None else sp, overlap_param_gather=run.overlap_param_gather),
        microbatch_size=run.microbatch_size, recompute=run.recompute if recompute is None else recompute,
        dtype=run.dtype, reduce_dtype=run.reduce_dtype, elementwise=run.elementwise, tp_overlap=run.tp_overlap,
        device_model=device_model, layers_per_stage=run.layers_per_stage, stack=run.run_stack,
        moe_dispatcher=run.moe_dispatcher)
    return Study(schedule=run.schedule, microbatches=run.microbatches, costs=costs,
                 chunks=run.chunks if run.chunks > 1 else None)


def command(run: PublishedRun) -> str:
    """The ``python -m sim`` line that simulates the row."""
    sched = f"{run.schedule} --chunks {run.chunks}" if run.chunks > 1 else run.schedule
    return (f"python -m sim --model {run.model} --cluster {run.cluster} --tp {run.tp} --pp {run.pp} --dp {run.dp}"
            f"{f' --cp {run.cp}' if run.cp > 1 else ''}{f' --ep {run.ep}' if run.ep > 1 else ''} "
            f"--dp-mode {run.dp_mode} --bucket-mb {run.bucket_mb:.12g} --schedule {sched} --microbatches {run.microbatches} "
            f"--microbatch-size {run.microbatch_size} --recompute {run.recompute}{' --sp' if run.sp else ''}"
            f"{' --dtype fp8' if run.dtype == 'fp8' else ''}{' --reduce-dtype fp32' if run.reduce_dtype == 'fp32' else ''}"
            f"{' --elementwise eager' if run.elementwise == 'eager' else ''}{' --tp-overlap' if run.tp_overlap else ''}"
            f"{' --overlap-param-gather' if run.overlap_param_gather else ''}"
            f"{f' --stack {run.run_stack}' if run.run_stack != 'none' else ''}"
            f"{f' --moe-dispatcher {run.moe_dispatcher}' if run.moe_dispatcher != 'alltoall' else ''}"
            " --json")


def metric_of(run: PublishedRun, result: StudyResult) -> float:
    world = result.study.parallel.world
    if run.metric == "step_s":
        return result.step_time
    if run.metric == "tokens_per_s_per_gpu":
        return result.tokens_per_step / result.step_time / world
    return result.model_flops_per_step / result.step_time / world / 1e12


def predict(run: PublishedRun, device_model: DeviceModel | None = None) -> float:
    return metric_of(run, run_study(study_of(run, device_model=device_model)))


def score(runs: Iterable[PublishedRun]) -> list[dict[str, Any]]:
    """One dict per row: the figure, its source, settings, assumptions, the prediction and its error."""
    rows = []
    for run in runs:
        row = {"suite": run.suite, "name": run.name, "metric": run.metric, "published": run.published,
               "source": run.source, "settings_source": run.settings_source, "assumed": list(run.assumed),
               "fit": run.fit, "scored": run.scored, "note": run.note, "command": command(run),
               "settings": {k: getattr(run, k) for k in ("model", "cluster", "tp", "pp", "dp", "cp", "microbatches",
                                                         "ep", "microbatch_size", "schedule", "chunks", "dp_mode",
                                                         "recompute", "sp", "dtype", "reduce_dtype",
                                                         "elementwise", "tp_overlap", "overlap_param_gather")},
               "stack": run.run_stack}
        if run.scored:
            result = run_study(study_of(run))
            predicted = metric_of(run, result)
            row.update(predicted=predicted, error=predicted / run.published - 1, mfu=result.mfu,
                       step_s=result.step_time,
                       peak_memory_gb=max(d.memory_bytes for d in result.devices()) / 1e9)
        else:
            row.update(predicted=None, error=None)
        rows.append(row)
    return rows


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and max |error| of the rows that fitted a parameter and of the held-out rows, apart (None: no row)."""
    out = {}
    for label, fit in (("fit", True), ("held_out", False)):
        errs = [abs(r["error"]) for r in rows if r["scored"] and r["fit"] is fit]
        out[label] = {"rows": len(errs), "mean_abs_error": _mean(errs), "max_abs_error": max(errs, default=None)}
    out["not_scored"] = sum(not r["scored"] for r in rows)
    return out


def memory_rows() -> list[dict[str, Any]]:
    """Korthikanti et al. 2022 Figures 1 and 7: the simulated activation peak of the first pipeline stage."""
    rows = []
    for run in suite_runs("megatron-2022")[1::2]:  # one layout per model
        (fig1_none, fig1_sel), fig7 = KORTHIKANTI_MEMORY[run.model]
        acts = {}
        for mode, (sp, rc) in {"none": (False, "none"), "sp": (True, "none"), "selective": (False, "selective"),
                               "sp+selective": (True, "selective"), "full": (False, "full")}.items():
            study = study_of(run, recompute=rc, sp=sp)
            acts[mode] = activation_peaks(build_graph(study), study.costs)[0]  # as run_study's, without the run
        for mode, published in (("none", fig1_none), ("sp+selective", fig1_sel)):
            got = acts[mode] / GIB
            rows.append({"model": run.model, "figure": "1", "mode": mode, "predicted": got, "published": published,
                         "unit": "GiB", "error": got / published - 1})
        for mode, published in zip(("sp", "selective", "sp+selective", "full"), fig7, strict=True):
            got = 100 * acts[mode] / acts["none"]
            rows.append({"model": run.model, "figure": "7", "mode": mode, "predicted": got, "published": published,
                         "unit": "% of baseline", "error": got / published - 1})
    return rows


#: The fit's pattern search (:func:`fit_gemm_efficiency`): steps in (peak_fraction, log10 half_flops), coarse to fine;
#: at each step the search moves to the best of the 3 x 3 points around it until the centre is the best.
FIT_STEPS = ((0.02, 0.2), (0.01, 0.1), (0.004, 0.04), (0.002, 0.02))
#: The last step: the fit's result is a point of this lattice no 3 x 3 neighbour of which has a lower loss.
FIT_RESOLUTION = FIT_STEPS[-1]
#: At most this many moves per step (each evaluates at most 5 new points).
FIT_MOVES = 12
#: Loss evaluations of :func:`fit_gemm_efficiency` at most: the 9 x 6 grid, then per step 8 neighbours and
#: 5 new points per move (the progress line's total; the fit of sim.costs.devices took 108).
FIT_EVALUATIONS = 9 * 6 + len(FIT_STEPS) * (8 + 5 * FIT_MOVES)


def fit_graphs(runs: Sequence[PublishedRun] | None = None) -> list[tuple[PublishedRun, TaskGraph]]:
    """The rows a GEMM fit uses (default: those marked ``fit``), each with its task graph, built once."""
    runs = [r for r in suite_runs("all") if r.fit] if runs is None else list(runs)
    return [(r, build_graph(study_of(r))) for r in runs]


def fit_loss(gemm: GemmEfficiency, graphs: Sequence[tuple[PublishedRun, TaskGraph]], device: str = "A100") -> float:
    """The fit's objective: the sum of squared relative errors of ``graphs``' rows with ``device``'s GEMM curve
    replaced by ``gemm``."""
    model = dataclasses.replace(DEVICE_MODELS[device], gemm=gemm)
    total = 0.0
    for r, graph in graphs:
        st = study_of(r, device_model=model)
        total += (metric_of(r, StudyResult(st, simulate(graph, st.costs, check=False))) / r.published - 1) ** 2
    return total


def fit_gemm_efficiency(runs: Sequence[PublishedRun] | None = None, device: str = "A100",
                        progress: Callable[[], object] | None = None) -> GemmEfficiency:
    """Least squares on the relative errors of ``runs`` (default: the rows marked ``fit``): a grid over
    (peak_fraction, log10 half_flops), then a pattern search (:data:`FIT_STEPS`) that stops at a point of the
    :data:`FIT_RESOLUTION` lattice with no lower 3 x 3 neighbour. Graphs are built once. ``progress()`` is called
    once per loss evaluation (at most :data:`FIT_EVALUATIONS`)."""
    graphs = fit_graphs(runs)
    seen: dict[tuple[float, float], float] = {}

    def loss(pf: float, lh: float) -> tuple[float, float, float]:
        key = (round(pf, 6), round(lh, 6))  # lattice points, free of float drift
        if key not in seen:
            if progress is not None:
                progress()
            seen[key] = fit_loss(GemmEfficiency(peak_fraction=min(key[0], 1.0), half_flops=10 ** key[1]), graphs, device)
        return seen[key], *key

    _, pf, lh = min(loss(0.60 + 0.05 * i, 9.0 + 0.5 * j) for i in range(9) for j in range(6))
    for step_pf, step_lh in FIT_STEPS:
        for _ in range(FIT_MOVES):
            best = min(loss(pf + i * step_pf, lh + j * step_lh) for i in (-1, 0, 1) for j in (-1, 0, 1))
            if best[1:] == (pf, lh):
                break
            _, pf, lh = best
        else:
            raise RuntimeError(f"GEMM fit: no minimum within {FIT_MOVES} moves of step {step_pf}, {step_lh}")
    return GemmEfficiency(peak_fraction=round(pf, 3), half_flops=float(f"{10 ** lh:.2g}"),
                          source=f"least squares on {len(graphs)} rows")
