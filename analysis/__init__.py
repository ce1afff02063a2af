"""schedlab.analysis: WHAT IT MEANS. Metrics, timelines and comparisons of traces from sim or real.

    >>> from analysis import compare
    >>> compare(["gpipe", "1f1b"], pp=4, microbatches=8).table  # doctest: +SKIP

:func:`compare` simulates schedules side by side and sets real runs against their predictions;
:func:`write_report` writes what :func:`sim.run_sweep` simulated (a :class:`SweepConfig`) as a report.
"""

from analysis.compare import Comparison, compare, comparison_table, format_comparison, format_units_comparison
from analysis.metrics import summarize
from analysis.report import write_report
from analysis.timeline import draw_timeline, plot_timeline, plot_timelines
from schedules.trace import TRACE_COLUMNS, read_trace, write_trace
from sim.plan.sweep import SweepConfig, run_sweep, units_comparison

__all__ = [
    "TRACE_COLUMNS", "Comparison", "SweepConfig", "compare", "comparison_table", "draw_timeline", "format_comparison",
    "format_units_comparison", "plot_timeline", "plot_timelines", "read_trace", "run_sweep", "summarize",
    "units_comparison", "write_report", "write_trace",
]
