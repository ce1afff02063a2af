"""Published training runs and the simulator's predictions of them (``python experiments/published.py``)."""

from sim.published.runs import KORTHIKANTI_MEMORY, METRICS, RUNS, SUITES, PublishedRun, suite_runs
from sim.published.score import command, fit_gemm_efficiency, memory_rows, predict, score, study_of, summarize

__all__ = ["KORTHIKANTI_MEMORY", "METRICS", "RUNS", "SUITES", "PublishedRun", "command", "fit_gemm_efficiency",
           "memory_rows", "predict", "score", "study_of", "suite_runs", "summarize"]
