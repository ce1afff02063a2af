"""Published training runs and the simulator's predictions of them (``python experiments/published.py``)."""

from sim.published.breakdown import breakdown, breakdown_markdown
from sim.published.runs import KORTHIKANTI_MEMORY, METRICS, RUNS, SUITES, PublishedRun, suite_runs
from sim.published.score import (
           FIT_EVALUATIONS,
           FIT_RESOLUTION,
           command,
           fit_gemm_efficiency,
           fit_graphs,
           fit_loss,
           memory_rows,
           predict,
           score,
           study_of,
           summarize,
)

__all__ = [
           "FIT_EVALUATIONS",
           "FIT_RESOLUTION",
           "KORTHIKANTI_MEMORY",
           "METRICS",
           "RUNS",
           "SUITES",
           "PublishedRun",
           "breakdown",
           "breakdown_markdown",
           "command",
           "fit_gemm_efficiency",
           "fit_graphs",
           "fit_loss",
           "memory_rows",
           "predict",
           "score",
           "study_of",
           "suite_runs",
           "summarize",
]
