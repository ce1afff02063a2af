"""The published-results tables as text or Markdown (the figures of docs/results/published.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.published.score import summarize

__all__ = ["markdown", "text"]

_UNIT = {"step_s": "s/step", "tokens_per_s_per_gpu": "tok/s/GPU", "tflops_per_gpu": "TFLOP/s/GPU"}


def _fmt(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if metric == "step_s" else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _err(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _mean(s: dict[str, Any]) -> str:
    m = s["mean_abs_error"]
    return "no rows" if m is None else f"{s['rows']} rows, mean |error| {m:.1%}, max {s['max_abs_error']:.1%}"


def _suites(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["suite"] for r in rows))


def text(rows: Sequence[dict[str, Any]], memory: Sequence[dict[str, Any]] = ()) -> str:
    lines = []
    for suite in _suites(rows):
        part = [r for r in rows if r["suite"] == suite]
        lines.append(f"\n{suite}")
        lines.append(f"{'row':<42} {'unit':<12} {'published':>10} {'predicted':>10} {'error':>7}  fit")
        for r in part:
            lines.append(f"{r['name']:<42} {_UNIT[r['metric']]:<12} {_fmt(r['published'], r['metric']):>10} "
                         f"{_fmt(r['predicted'], r['metric']):>10} {_err(r['error']):>7}  "
                         f"{'fit' if r['fit'] else 'held out' if r['scored'] else 'not scored'}")
        s = summarize(part)
        lines.append(f"fit rows: {_mean(s['fit'])}; held-out rows: {_mean(s['held_out'])}"
                     + (f"; {s['not_scored']} not scored" if s["not_scored"] else ""))
    if memory:
        lines.append("\nKorthikanti et al. 2022 activation memory, first stage (Figure 1 GiB, Figure 7 % of baseline)")
        for m in memory:
            lines.append(f"{m['model']:<13} fig {m['figure']} {m['mode']:<13} {m['predicted']:>8.2f} "
                         f"{m['published']:>8.2f} {m['error']:>+7.1%}")
    return "\n".join(lines).lstrip("\n")


def markdown(rows: Sequence[dict[str, Any]], memory: Sequence[dict[str, Any]]) -> str:
    """The results page's body (analysis.results_page puts the command, date and machine above it)."""
    out = ["Written by `experiments/published.py --markdown`; the suites, their sources and assumed settings are "
           "described in [the published suites page](../published.md), the device models in "
           "[devices](../devices.md). Rows marked *fit* fitted a parameter; their mean is kept apart from the "
           "held-out rows'.", ""]
    for suite in _suites(rows):
        part = [r for r in rows if r["suite"] == suite]
        s = summarize(part)
        out += [f"## {suite}", "", f"- fit rows: {_mean(s['fit'])}", f"- held-out rows: {_mean(s['held_out'])}", "",
                "| row | unit | published | predicted | error | fit | source | assumed |",
                "|---|---|---:|---:|---:|---|---|---|"]
        for r in part:
            role = "fit" if r["fit"] else "held out" if r["scored"] else f"not scored: {r['note']}"
            out.append(f"| {r['name']} | {_UNIT[r['metric']]} | {_fmt(r['published'], r['metric'])} | "
                       f"{_fmt(r['predicted'], r['metric'])} | {_err(r['error'])} | {role} | {r['source']} | "
                       f"{'; '.join(r['assumed']) or '-'} |")
        out.append("")
    if memory:
        out += ["## megatron-2022 activation memory", "",
                "| model | figure | mode | predicted | published | error |", "|---|---|---|---:|---:|---:|"]
        out += [f"| {m['model']} | {m['figure']} | {m['mode']} | {m['predicted']:.2f} | {m['published']:.2f} | "
                f"{m['error']:+.1%} |" for m in memory]
        out.append("")
    return "\n".join(out)
