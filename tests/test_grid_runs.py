"""experiments/grid_runs.py: repeated validation grids side by side (analysis.validation.grid_runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.validation.grid_runs import RepeatRow, repeat_rows, run_summary

ROOT = Path(__file__).resolve().parents[1]


def _row(name: str, m: int, error: float, *, kind: str = "data-parallel", in_sample: bool = False,
         backward: tuple[float, float] = (0.060, 0.055), exposed: tuple[float, float] = (0.005, 0.004)) -> dict:
    parts = {"measured": {"forward": 0.03, "backward": backward[0], "exposed": exposed[0]},
             "predicted": {"forward": 0.03, "backward": backward[1], "exposed": exposed[1]}}
    return {"schedule": name, "microbatches": m, "kind": kind, "error": error, "in_sample": in_sample,
            "parts": parts}


def _run(rows: list[dict], noise: float = 0.03) -> dict:
    return {"schedules": rows, "noise_verdict": {"verdict": "judged", "noise": noise}, "command": "python x"}


RUNS = [
    _run([_row("1f1b", 4, 0.02, kind="pipeline"), _row("dp2-ddp", 4, -0.05), _row("dp2-zero3", 4, -0.20),
          _row("dp2-ddp", 8, 0.01, in_sample=True)]),
    _run([_row("dp2-ddp", 4, 0.09), _row("dp2-zero3", 4, -0.12, backward=(0.110, 0.080)),
          _row("dp2-ddp", 8, -0.02, in_sample=True)], noise=0.04),
]


def test_rows_hold_a_bound_only_when_every_run_does_and_the_worst_runs_largest_gap_is_named():
    rows = repeat_rows(RUNS, 0.10)
    assert rows == [
        RepeatRow("dp2-ddp", 4, False, (-0.05, 0.09), True, 1, "backward", 0.060, 0.055),
        RepeatRow("dp2-zero3", 4, False, (-0.20, -0.12), False, 0, "backward", 0.060, 0.055),
        RepeatRow("dp2-ddp", 8, True, (0.01, -0.02), True, 1, "backward", 0.060, 0.055),
    ]
    assert rows[1].mean_abs == pytest.approx(0.16)
    assert [r.within for r in repeat_rows(RUNS, 0.06)] == [False, False, True]


def test_a_row_missing_from_a_run_is_not_within_and_its_gap_comes_from_where_it_is():
    runs = [_run([_row("dp2-ps", 4, -0.01, exposed=(0.003, 0.015))]), _run([_row("dp2-ddp", 4, 0.0)])]
    rows = repeat_rows(runs, 0.10)
    assert rows[0] == RepeatRow("dp2-ps", 4, False, (-0.01, None), False, 0, "exposed", 0.003, 0.015)
    assert rows[1].errors == (None, 0.0) and not rows[1].within


def test_the_pipeline_rows_over_runs():
    rows = repeat_rows(RUNS, 0.10, "pipeline")
    assert rows == [RepeatRow("1f1b", 4, False, (0.02, None), False, 0, "backward", 0.060, 0.055)]
    runs = [_run([_row("1f1b", 4, e, kind="pipeline")]) for e in (0.02, -0.05, 0.09)]
    assert repeat_rows(runs, 0.10, "pipeline")[0].within and not repeat_rows(runs, 0.08, "pipeline")[0].within
    with pytest.raises(ValueError, match=r"^unknown row kind 'dp'; valid: data-parallel, pipeline$"):
        repeat_rows(runs, 0.10, "dp")


def test_a_run_summary_takes_out_of_sample_rows_by_kind():
    s = run_summary(RUNS[0])
    assert s["verdict"] == "judged" and s["noise"] == 0.03
    assert s["pipeline"] == (0.02, 1)
    assert s["data-parallel"][1] == 2 and s["data-parallel"][0] == pytest.approx(0.125)


@pytest.mark.parametrize(("runs", "message"), [
    ([RUNS[0]], "1 run(s): compare at least 2 runs of the grid"),
    ([_run([_row("1f1b", 4, 0.0, kind="pipeline")])] * 2, "no run has a data-parallel row: give runs of the grid that measured its data-parallel rows"),
])
def test_too_few_runs_or_no_data_parallel_row_is_one_line(runs, message):
    with pytest.raises(ValueError) as exc:
        repeat_rows(runs, 0.10)
    assert str(exc.value) == message


def test_the_command_writes_its_page_and_refuses_a_file_that_is_not_a_grid(tmp_path):
    paths = []
    for i, run in enumerate(RUNS):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    page = tmp_path / "runs.md"
    cmd = [sys.executable, "experiments/grid_runs.py", *map(str, paths), "--markdown", str(page)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert "| dp2-zero3 | 4 | -20.0% | -12.0% | no | run 1: backward 60.0 / 55.0 |" in text
    assert text.rstrip().endswith("1 of 2 held-out data-parallel rows are within 10% on every one of the 2 runs; "
                                  "the rest: dp2-zero3 m=4.")
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    proc = subprocess.run([sys.executable, "experiments/grid_runs.py", str(paths[0]), str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"error: python experiments/grid_runs.py: {str(bad)!r}: has no 'schedules' rows; "
                                   "give validate_sim.py's --out DIR/validation.json (see --help)")
