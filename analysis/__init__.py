"""schedlab.analysis: WHAT IT MEANS. Metrics, timelines and comparisons of traces from sim or real."""

from analysis.metrics import summarize
from analysis.timeline import draw_timeline, plot_timeline, plot_timelines
from schedules.trace import TRACE_COLUMNS, read_trace, write_trace

__all__ = ["TRACE_COLUMNS", "draw_timeline", "plot_timeline", "plot_timelines", "read_trace", "summarize", "write_trace"]
