"""Every figure the project writes, rendered from small inputs and checked for print (analysis.figures):
no text over another, no legend over data, no point label over a marker, a unit on every numeric axis."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest

from analysis.figures import (
    axes_without_units,
    figure_problems,
    has_unit,
    label_marker_overlaps,
    legend_data_overlaps,
    overlapping_texts,
    place_labels,
    place_legend,
    texts_outside,
    time_unit,
)

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _kept_open():
    """The figures a plotting function makes, kept open (plt.close is held back) for the checker."""
    before = set(plt.get_fignums())
    real_close, kept = plt.close, []
    plt.close = lambda *a, **k: None
    try:
        yield kept
    finally:
        plt.close = real_close
        kept += [plt.figure(n) for n in plt.get_fignums() if n not in before]


def _problems(fn, *args, **kwargs) -> list[str]:
    with _kept_open() as figs:
        fn(*args, **kwargs)
    assert figs, f"{fn.__name__} drew no figure"
    try:
        return [p for f in figs for p in figure_problems(f)]
    finally:
        for f in figs:
            plt.close(f)


def _experiment(name: str):
    spec = importlib.util.spec_from_file_location(f"_exp_{name}", ROOT / "experiments" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


# ---- the checker catches what it should --------------------------------------------------------------------


def test_checker_catches_a_deliberately_bad_figure():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1, 2, 3], [0, 1, 2, 3], "o-", label="data")
    ax.annotate("first label", (1, 1))
    ax.annotate("second label", (1, 1), xytext=(1, 1))  # the same spot: over the first
    ax.legend(loc="center")  # over the line through the middle
    ax.set_xlabel("time")  # no unit
    ax.set_ylabel("memory (GB)")
    ax.set_title("a title far too long for a figure four inches wide, cut off at its edge", loc="left")
    fig.tight_layout()
    assert ("first label", "second label") in overlapping_texts(fig)
    assert texts_outside(fig) == ["a title far too long for a figure four inches wide, cut off at its edge"]
    assert legend_data_overlaps(fig)
    assert label_marker_overlaps(fig)
    assert [p for p in axes_without_units(fig) if p.startswith("x axis")] == axes_without_units(fig)
    plt.close(fig)


def test_checker_passes_a_clean_figure_and_the_placer_unblobs_crowded_labels():
    fig, ax = plt.subplots(figsize=(5, 3.5))
    xs = [1.0, 1.02, 1.04, 1.06, 1.08, 2.0, 3.0, 3.0]
    ys = [5.0, 5.01, 4.99, 5.02, 5.0, 3.0, 1.0, 1.0]  # a blob of five, two at one point
    ax.scatter(xs, ys, s=20)
    ax.plot([0.5, 3.5], [4.0, 4.0], "-", label="a line")
    ax.set_xlabel("peak memory (GB)")
    ax.set_ylabel("throughput (tokens/s)")
    fig.tight_layout()
    place_legend(ax, fontsize=8)
    texts = place_labels(ax, xs, ys, [f"#{i}" for i in range(1, 9)])
    assert len(texts) == 7  # #7 and #8 share a point and a label
    assert any(t.get_text() == "#7, #8" for t in texts)
    assert figure_problems(fig) == []
    plt.close(fig)


def test_placer_falls_back_to_a_numbered_key_when_words_cannot_fit():
    fig, ax = plt.subplots(figsize=(3, 2.5))
    ax.scatter([0, 1], [0, 1], s=10)
    ax.set_xlabel("x (s)")
    ax.set_ylabel("y (s)")
    fig.tight_layout()
    texts = place_labels(ax, [0.5], [0.5], ["a label far too long to fit anywhere inside these small axes at all"])
    assert [t.get_text() for t in texts] == ["1"]
    assert ax.get_legend().get_texts()[0].get_text().startswith("1: a label far too long")
    plt.close(fig)


@pytest.mark.parametrize("label, ok", [("time (s)", True), ("time", False), ("step time (ms; bar: p10-p90)", True),
                                       ("peak activations (M_B)", True), ("bubble ratio (%)", True),
                                       ("tokens / s", False), ("time (unit)", True), ("microbatches (m)", False)])
def test_units_vocabulary(label, ok):
    assert has_unit(label) is ok


def test_time_unit_from_the_trace_attrs():
    from schedules import build, lower
    from sim import UniformCosts, simulate

    trace = simulate(lower(build("1f1b", pp=2, microbatches=2)), UniformCosts()).trace
    assert time_unit(trace) == "unit"
    real = trace.copy()
    real.attrs = {**trace.attrs, "source": "real"}
    real.attrs.pop("costs")
    assert time_unit(real) == "s"


# ---- every figure the project writes -----------------------------------------------------------------------


def _sim_trace(name="interleaved-1f1b", pp=4, **kw):
    from schedules import build, lower
    from sim import UniformCosts, simulate

    return simulate(lower(build(name, pp=pp, microbatches=8, **kw)), UniformCosts()).trace


def test_timeline_figures(tmp_path):
    from analysis.timeline import plot_timeline, plot_timelines

    sim = _sim_trace(chunks=2)
    real = sim.copy()
    real.attrs = {**sim.attrs, "source": "real"}
    real.attrs.pop("costs")
    assert _problems(plot_timeline, sim, tmp_path / "one.png") == []
    assert _problems(plot_timelines, [sim, _sim_trace("1f1b", pp=2), _sim_trace("zb-h1", pp=2)],
                     tmp_path / "all.png") == []
    assert _problems(plot_timelines, [sim, real], tmp_path / "pair.png", same_axis=False) == []


def _table():
    """The report's memory-vs-throughput points at p=4, m=8 (schedules that land together share a point)."""
    rows = [("gpipe", 8.0, 0.242), ("1f1b", 4.0, 0.242), ("interleaved-1f1b", 5.5, 0.281), ("zb-h1", 4.0, 0.296),
            ("zb-auto", 4.0, 0.296), ("zb-v", 4.0, 0.314), ("v-half", 3.0, 0.302), ("v-min", 2.0, 0.271),
            ("dualpipe-v", 4.5, 0.296), ("zb-h2", 8.0, 0.333), ("zb-2p", 7.0, 0.33)]
    return pd.DataFrame(rows, columns=["schedule", "peak_act_max", "throughput"])


def test_report_figures(tmp_path):
    from analysis import report

    table = _table()
    assert _problems(report._plot_pareto, table, report._pareto(table), tmp_path / "pareto.png") == []
    bubbles = {name: [(m, 3 / (m + 3), 3 / (m + 3) if name != "zb-v" else None) for m in (1, 2, 4, 8, 16)]
               for name in ("gpipe", "1f1b", "zb-h1", "zb-v", "v-half", "interleaved-1f1b")}
    assert _problems(report._plot_bubbles, bubbles, SimpleNamespace(pp=4), tmp_path / "bubbles.png") == []
    two = {k: bubbles[k] for k in ("gpipe", "zb-v")}
    assert _problems(report._plot_bubbles, two, SimpleNamespace(pp=4), tmp_path / "two.png") == []


def test_recompute_tradeoff_figure(tmp_path):
    from analysis.report import plot_recompute_tradeoff
    from sim.plan.sweep import RecomputePoint

    def pts(name, none, full, b1, b2, b3):
        return [RecomputePoint(name, "none", None, *none), RecomputePoint(name, "full", None, *full),
                RecomputePoint(name, "bubbles", 1.0, *b1), RecomputePoint(name, "bubbles", 2.0, *b2),
                RecomputePoint(name, "bubbles", 3.0, *b3)]

    points = (pts("1f1b", (33, 4), (41, 1), (39, 1), (35, 2), (34, 3))
              + pts("v-half", (26.5, 3), (34.5, 0.5), (32, 1), (29, 2), (26.5, 3))  # none = bubbles@3
              + pts("v-min", (29.5, 2), (37.5, 0.5), (33, 1), (29.5, 2), (29.5, 2))  # none = bubbles@2 = @3
              + pts("gpipe", (33, 8), (41, 1), (40, 1), (39, 2), (38, 3)))
    assert _problems(plot_recompute_tradeoff, points, tmp_path / "recompute.png") == []
    assert _problems(plot_recompute_tradeoff, points[:5], tmp_path / "one.png") == []  # one panel: the title fits


def test_plan_pareto_figure(tmp_path):
    from analysis.plan.report import plot_pareto

    def entry(mem_gb, tps):
        return SimpleNamespace(peak_memory_bytes=mem_gb * 1e9, tokens_per_s=tps)

    front = [(9.8, 1.035e6), (19, 1.185e6), (25, 1.25e6), (71.8, 1.46e6), (71.9, 1.477e6), (75, 1.568e6),
             (75.1, 1.588e6), (81.2, 1.608e6), (81.3, 1.625e6)]
    rest = [(10 + 7.3 * (i % 10), 0.75e6 + 0.03e6 * (i * 7 % 13)) for i in range(60)]
    rest += [(83.5, 1.585e6), (83.6, 1.57e6), (82.9, 1.5e6), (82.7, 1.47e6)]
    entries = [entry(*p) for p in front + rest]
    top = [entry(81.3, 1.625e6), entry(81.2, 1.608e6), entry(75.1, 1.588e6), entry(83.5, 1.585e6),
           entry(75, 1.568e6)]
    space = SimpleNamespace(capacity=85.5e9, model=SimpleNamespace(name="llama3-405b"),
                            cluster=SimpleNamespace(name="dgx-h100:1024"))
    result = SimpleNamespace(entries=tuple(entries), top=tuple(top), space=space)
    assert _problems(plot_pareto, result, tmp_path / "pareto.png") == []


def _curves():
    from analysis.time_to_loss import LossCurve, parse_mode

    out = []
    for k, name in enumerate(("ddp", "local-sgd:4", "local-sgd:16", "decentralized:ring", "decentralized:random")):
        steps = tuple(range(300))
        out.append(LossCurve(parse_mode(name), steps,
                             tuple(2.7 + 3 * math.exp(-s / (20 + 15 * k)) + 0.1 * math.sin(s) for s in steps)))
    return out


def test_time_to_loss_figure(tmp_path):
    from analysis.time_to_loss import plot_loss_vs_time

    times = {"ddp": 1.02, "local-sgd:4": 0.694, "local-sgd:16": 0.59, "decentralized:ring": 4.89,
             "decentralized:random": 2.45}
    assert _problems(plot_loss_vs_time, _curves(), times, 2.84, tmp_path / "ttl.png",
                     measured="a tiny GPT at dp 4", simulated="gpt-1.5b on 64 H100s at 10 Gb/s per GPU") == []


def test_validation_figure(tmp_path):
    from analysis.validation.scores import plot_validation

    rows = [{"schedule": s, "microbatches": m, "predicted_step_time": 0.01 * m * (1 + 0.03 * k),
             "measured_step_time": 0.01 * m, "measured_spread": (0.0097 * m, 0.0104 * m)}
            for k, s in enumerate(("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")) for m in (4, 8, 16)]
    data = {"schedules": rows, "kendall_tau_b": 0.9, "mean_abs_error": 0.04}
    assert _problems(plot_validation, data, tmp_path / "validation.png") == []


def test_dp_modes_figure(tmp_path):
    from analysis.dp_compare import CATEGORIES, DPModeRow, plot_dp_modes

    rows = []
    for k, mode in enumerate(("ddp", "zero1", "zero2", "fsdp")):
        for rank in range(2):
            mem = {c: (4 - k * (i < 3)) * 2**30 / (i + 1) for i, c in enumerate(CATEGORIES)}
            rows.append(DPModeRow(mode, rank, 0.5 + 0.1 * k, mem, measured_step_time=0.55 + 0.1 * k if k < 2 else None))
    assert _problems(plot_dp_modes, rows, tmp_path / "dp.png") == []


def test_goodput_figures(tmp_path):
    goodput = _experiment("goodput")
    sweep = [{"interval_min": m, "goodput_sync": 0.85 - abs(math.log(m / 19)) / 10,
              "goodput_async": 0.9 - abs(math.log(m / 8)) / 20} for m in goodput.INTERVALS_MIN]
    summary = {"sweep": sweep, "young_min": 19.3, "daly_min": 18.6, "job_mtbf_h": 3.09}

    def run(shrink):
        t, timeline = 0.0, []
        for i in range(40):
            timeline.append((t, 128 if i % 2 == 0 else (0 if not shrink else 127)))
            t += 3600 * (0.7 if shrink else 1.3)
        return SimpleNamespace(timeline=timeline, goodput=0.744 if shrink else 0.456)

    assert _problems(goodput._plot, summary, run(False), run(True), tmp_path) == []
    rows = [{"gpus": g, "restart_young": 1 - g / 2.2e5, "restart_daly": 1 - g / 2.2e5, "live_young": 1 - g / 1.1e6,
             "live_daly": 1 - g / 1.1e6} for g in goodput.CLUSTERS]
    assert _problems(goodput._plot_scale, {"rows": rows, "job_wide": 0.05}, tmp_path) == []


def test_bandwidth_sweep_figure(tmp_path):
    sweep = _experiment("bandwidth_sweep")
    labels = [label for label, _, _ in sweep.MODES]
    times = {label: [(200 + 1e4 * k / g) if k else 120 + 1000 / g for g in sweep.GBPS] for k, label in
             enumerate(labels)}
    assert _problems(sweep.plot, times, tmp_path / "bw.png", 2.841) == []


def test_every_figure_of_a_report_from_a_real_sweep(tmp_path):
    """write_report end to end (small sweep, a stand-in measured trace): each of its figures passes."""
    from analysis.report import write_report
    from schedules.trace import write_trace
    from sim.plan.sweep import SweepConfig, run_sweep

    real = _sim_trace("zb-h1", pp=2)
    real[["start", "end"]] *= 1.25
    real.attrs = {**real.attrs, "source": "real"}
    real.attrs.pop("costs")
    cfg = SweepConfig(pp=2, microbatches=4, schedules=("gpipe", "1f1b", "zb-h1", "zb-v"), sweep=(2, 4, 8),
                      real_traces=(write_trace(real, tmp_path / "real-zb-h1.csv"),))
    sweep = run_sweep(cfg)
    with _kept_open() as figs:
        write_report(tmp_path / "rep", sweep)
    try:
        assert len(figs) >= 8  # timelines, bubbles, memory vs throughput, recomputation, sim vs real, one per schedule
        assert [(f.texts[0].get_text() if f.texts else "", p) for f in figs for p in figure_problems(f)] == []
    finally:
        for f in figs:
            plt.close(f)
