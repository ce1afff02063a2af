"""Published training runs and the simulator's predictions of them (``python experiments/published.py``)."""

from sim.published.runs import KORTHIKANTI_MEMORY, METRICS, RUNS, SUITES, PublishedRun, suite_runs
from sim.published.score import (
           FIT_EVALUATIONS,
           command,
           fit_gemm_efficiency,
           memory_rows,
           predict,
           score,
           study_of,
           summarize,
)

__all__ = ["FIT_EVALUATIONS", "KORTHIKANTI_MEMORY", "METRICS", "RUNS", "SUITES", "PublishedRun", "command", "fit_gemm_efficiency",
           "memory_rows", "predict", "score", "study_of", "suite_runs", "summarize"]
