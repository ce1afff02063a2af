"""Schedules side by side: tabulate the results of several simulations (bubble, step time, memory)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from analysis.theory import bubble_ratio as closed_form_bubble
from sim import SimResult
from sim.costs.cluster import GB

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["comparison_table", "format_comparison", "format_units_comparison"]


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
