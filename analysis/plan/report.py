"""What a plan says: the top-K table, why the winner beats the runner-up, and the memory-against-throughput Pareto plot."""

from __future__ import annotations

import os
from pathlib import Path

from schedules.util import atomic_write
from sim.plan.search import PlanEntry, PlanResult

__all__ = ["format_plan", "pareto_front", "plot_pareto", "why_against", "why_beats", "why_winner"]

GB = 1e9


def format_plan(result: PlanResult) -> str:
    """The summary line and the top-K table, fastest first."""
    s = result.space
    w = max([17, *(len(e.schedule_label) + 1 for e in result.top)])  # a merged row's names widen the column
    merged = f", {result.merged:,} exact ties merged (the same order under another name)" if result.merged else ""
    lines = [
        f"plan: {s.model.name} (seq {s.model.seq_len}) on {s.cluster.name} ({s.devices} x {s.cluster.spec.name}), "
        f"global batch {s.global_batch}, memory limit {s.capacity / GB:g} GB per device",
        f"{result.candidates:,} candidates, {result.feasible:,} fit in memory, {result.simulated:,} simulated, "
        f"{result.pruned_bound:,} dropped by the lower bound{merged}, in {result.seconds:.1f} s",
        "",
        f"{'#':>2} {'tp':>3} {'sp':>3} {'pp':>3} {'dp':>4} {'schedule':<{w}}{'v':>2} {'mb x b':>9} {'dp mode':<6} "
        f"{'recomp':<9} {'step s':>8} {'tokens/s':>11} {'MFU':>6} {'mem GB':>7} {'bubble':>7} {'exp comm s':>10}",
    ]
    for i, e in enumerate(result.top, 1):
        c = e.config
        lines.append(
            f"{i:>2} {c.tp:>3} {'on' if c.sp else '-':>3} {c.pp:>3} {c.dp:>4} {e.schedule_label:<{w}}{c.chunks:>2} "
            f"{f'{c.microbatches}x{c.microbatch_size}':>9} {c.dp_mode:<6} {c.recompute:<9} {e.step_time:>8.3f} "
            f"{e.tokens_per_s:>11,.0f} {e.mfu:>6.1%} {e.peak_memory_bytes / GB:>7.1f} {e.bubble_ratio:>7.1%} "
            f"{e.exposed_comm:>10.4f}")
    rows: dict[str, list[str]] = {}  # one line per reason, naming its rows
    for i, e in enumerate(result.top, 1):
        if e.same_as:
            rows.setdefault(e.tie_reason(), []).append(f"#{i}")
    ties = [f"  {', '.join(where)}: {why}" for why, where in rows.items()]
    return "\n".join(lines + (["", "merged rows (exact ties):", *ties] if ties else []))


def why_winner(result: PlanResult) -> str:
    """The winner against the runner-up, in seconds per step: bubble, exposed communication, recomputation."""
    if len(result.top) < 2:
        return "only one configuration was simulated: nothing to compare"
    return why_beats(result.top[0], result.top[1])


def why_beats(a: PlanEntry, b: PlanEntry, name: str = "#2") -> str:
    """The planner's #1 (``a``) against ``b`` (the runner-up, or a named layout), in seconds per step."""
    gap = b.step_time - a.step_time
    rows = [("step time", a.step_time, b.step_time),
            ("bubble (idle per rank)", a.bubble_time, b.bubble_time),
            ("exposed communication", a.exposed_comm, b.exposed_comm),
            ("recomputation (busiest rank)", a.recompute_time, b.recompute_time),
            ("compute without recomputation", _compute(a), _compute(b))]
    head = (f"why #1 beats {name} ({gap:.4f} s per step, {gap / b.step_time:.2%} of {name}'s step):" if gap >= 0 else
            f"{name} beats #1 ({-gap:.4f} s per step, {-gap / a.step_time:.2%} of #1's step):")
    w = max(10, len(name) + 7)  # the columns of a longer name widen
    out = [head, f"  #1 {_label(a)}", f"  {name} {_label(b)}",
           f"  {'':<32}{'#1 s':>10}{name + ' s':>{w}}{name + ' - #1':>{w}}"]
    out += [f"  {row:<32}{x:>10.4f}{y:>{w}.4f}{y - x:>+{w}.4f}" for row, x, y in rows]
    if gap == 0:
        out.append("  a tie: the two differ only where the model sees no cost (e.g. how dp=1 is named)")
    return "\n".join(out)


def why_against(a: PlanEntry, b: PlanEntry, capacity: float, untried: list[str]) -> str:
    """The #1 against a named layout (``schedlab plan --against``): the decomposition, then whether it fits."""
    if a.config == b.config:
        return f"LAYOUT is the planner's #1: {a.config.label()}"
    if b.config in a.tied_configs():
        return (f"LAYOUT is the planner's #1: {b.config.label()} runs the same order as #1's {a.config.schedule} "
                f"({a.tie_reason()})")
    out = [why_beats(a, b, "LAYOUT")]
    fits = b.peak_memory_bytes <= capacity
    out.append(f"  LAYOUT {'fits' if fits else 'does NOT fit'}: peak memory {b.peak_memory_bytes / GB:.3g} GB per device "
               f"{'<=' if fits else '>'} the limit {capacity / GB:.3g} GB (#1: {a.peak_memory_bytes / GB:.3g} GB)")
    if untried:
        out.append(f"  LAYOUT is outside the searched space ({', '.join(untried)})")
    return "\n".join(out)


def _label(e: PlanEntry) -> str:
    """The row's label, with the schedules a merged row stands for."""
    return e.config.label() + (f" (= {e.schedule_label})" if e.same_as else "")


def _compute(e: PlanEntry) -> float:
    """Busy time per rank that is neither bubble nor recomputation (step - bubble - recompute)."""
    return e.step_time - e.bubble_time - e.recompute_time


def pareto_front(entries: list[PlanEntry] | tuple[PlanEntry, ...]) -> list[PlanEntry]:
    """Simulated configurations no other beats on both memory (less) and throughput (more), by memory."""
    front: list[PlanEntry] = []
    best = -1.0
    for e in sorted(entries, key=lambda e: (e.peak_memory_bytes, -e.tokens_per_s)):
        if e.tokens_per_s > best:
            front.append(e)
            best = e.tokens_per_s
    return front


def plot_pareto(result: PlanResult, path: str | os.PathLike) -> Path:
    """Peak memory per device against tokens/s for every simulated configuration; the front joined, the top K marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.figures import place_labels, place_legend

    entries = list(result.entries)
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter([e.peak_memory_bytes / GB for e in entries], [e.tokens_per_s / 1e6 for e in entries], s=10,
               alpha=0.4, label=f"simulated ({len(entries)})")
    front = pareto_front(entries)
    ax.plot([e.peak_memory_bytes / GB for e in front], [e.tokens_per_s / 1e6 for e in front], "-o", color="C1",
            ms=4, label="Pareto front")
    ax.axvline(result.space.capacity / GB, color="gray", ls="--", lw=1, label="memory limit")
    ax.set_xlabel("peak memory per device (GB)")
    ax.set_ylabel("throughput (M tokens/s)")
    ax.set_title(f"{result.space.model.name} on {result.space.cluster.name}, simulated: memory against throughput "
                 f"(#1-#{min(5, len(result.top))}: the fastest)", fontsize=10)
    ax.margins(0.08)
    fig.tight_layout()
    place_legend(ax, fontsize=8)
    top = result.top[:5]
    place_labels(ax, [e.peak_memory_bytes / GB for e in top], [e.tokens_per_s / 1e6 for e in top],
                 [f"#{i}" for i in range(1, len(top) + 1)], fontsize=8)

    def save(tmp: Path) -> None:
        fig.savefig(tmp, dpi=120, format="png", bbox_inches="tight")  # a numbered key may sit right of the axes

    try:
        return atomic_write(path, save, "Pareto plot")
    finally:
        plt.close(fig)
