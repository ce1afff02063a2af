"""Metrics where users look for them: TensorBoard event files (read back with TensorBoard's own reader) and JSON Lines."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

pytest.importorskip("tensorboard", reason="the metrics extra: pip install -e '.[metrics]'")
pytest.importorskip("torch")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from analysis.cli.progress import Progress, format_seconds
from analysis.cli.train import main as real_main
from real.metrics_log import JSONL_NAME, MetricsLog

SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _f32(x: float) -> float:
    return float(np.float32(x))


def test_the_log_writes_the_same_scalars_to_tensorboard_and_json_lines(tmp_path):
    with MetricsLog(tmp_path / "logs", run="r1") as m:
        m.log(0, {"loss": 2.5, "lr": 0.1, "tokens_per_s": None})
        m.log(1, {"loss": 1.25, "lr": 0.05})
        m.log(1, {"memory/rank1/peak_activation_bytes": 4096})
    assert _scalars(tmp_path / "logs") == {"loss": [(0, 2.5), (1, 1.25)], "lr": [(0, _f32(0.1)), (1, _f32(0.05))],
                                           "memory/rank1/peak_activation_bytes": [(1, 4096.0)]}
    lines = (tmp_path / "logs" / JSONL_NAME).read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"run": "r1", "step": 0, "loss": 2.5, "lr": 0.1},
                                              {"run": "r1", "step": 1, "loss": 1.25, "lr": 0.05},
                                              {"run": "r1", "step": 1, "memory/rank1/peak_activation_bytes": 4096.0}]


def test_a_run_with_log_dir_is_read_by_tensorboard(tmp_path, capsys):
    log_dir = tmp_path / "run"
    assert real_main(["--schedule", "1f1b", "--pp", "1", "--microbatches", "2", "--steps", "3", "--batch-size", "4",
                      *SMALL, "--lr", "0.01", "--json", "--log-dir", str(log_dir)]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    got = _scalars(log_dir)
    assert set(got) == {"loss", "step_time_s", "tokens_per_s", "lr", "memory/rank0/peak_activation_bytes"}
    assert got["loss"] == [(i, _f32(x)) for i, x in enumerate(result["losses"])]
    assert got["step_time_s"] == [(i, _f32(x)) for i, x in enumerate(result["step_times"])]
    assert got["tokens_per_s"] == [(i, _f32(4 * 8 / x)) for i, x in enumerate(result["step_times"])]
    assert got["lr"] == [(i, _f32(0.01)) for i in range(3)]
    assert got["memory/rank0/peak_activation_bytes"] == [(0, float(result["memory"][0]["peak_activation_bytes"]))]
    rows = [json.loads(x) for x in (log_dir / JSONL_NAME).read_text().splitlines()]
    assert [r["loss"] for r in rows if "loss" in r] == result["losses"]
    # without --json the steps go to stderr, each with the time left
    assert [line.split()[:4] for line in err.splitlines() if line.startswith("step ")] == [
        ["step", "0", "of", "3"], ["step", "1", "of", "3"], ["step", "2", "of", "3"]]
    assert err.splitlines()[-1].endswith("left 0 s")


def test_a_bad_log_dir_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit) as exc:
        real_main(["--schedule", "1f1b", "--pp", "1", "--microbatches", "2", *SMALL, "--log-dir", str(tmp_path / "f")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"log directory {str(tmp_path / 'f')!r} is a file; give a folder" in err


def test_progress_says_the_time_left_from_the_mean_time_per_item():
    now = [100.0]
    out = io.StringIO()
    p = Progress(5, "grid", out, clock=lambda: now[0])
    now[0] = 130.0
    p.advance(note="1f1b pp4")
    now[0] = 160.0
    p.advance()
    assert out.getvalue().splitlines() == ["grid 1/5  elapsed 30 s  left 2 min 00 s  1f1b pp4",
                                           "grid 2/5  elapsed 1 min 00 s  left 1 min 30 s"]
    quiet, now[0] = io.StringIO(), 0.0
    p = Progress(3, "fit", quiet, clock=lambda: now[0], every=10.0)
    for t in (1.0, 5.0, 12.0):
        now[0] = t
        p.advance()
    assert quiet.getvalue().splitlines() == ["fit 1/3  elapsed 1 s  left 2 s", "fit 3/3  elapsed 12 s  left 0 s"]
    assert [format_seconds(s) for s in (0.4, 59.6, 3599, 7620, float("inf"))] == ["0 s", "1 min 00 s", "59 min 59 s",
                                                                                   "2 h 07 min", "?"]


def test_a_results_table_is_logged_row_by_row(tmp_path):
    """The validation grid's and plan_check's --log-dir: numeric fields per row, then the scores (NaN left out)."""
    from real.checkpoint import run_id
    from real.metrics_log import JSONL_NAME, log_rows

    rows = [{"schedule": "1f1b", "microbatches": 4, "in_sample": True, "error": 0.05, "replay_error": float("nan")},
            {"schedule": "gpipe", "microbatches": 8, "in_sample": False, "error": -0.02}]
    log_rows(tmp_path / "log", rows, {"grid/mean_abs_error": 0.02, "grid/kendall_tau_b": float("nan")})
    lines = [json.loads(x) for x in (tmp_path / "log" / JSONL_NAME).read_text().splitlines()]
    assert {line.pop("run") for line in lines} == {run_id()}  # every line names its run
    assert lines == [{"step": 0, "row/microbatches": 4.0, "row/error": 0.05},
                     {"step": 1, "row/microbatches": 8.0, "row/error": -0.02},
                     {"step": 2, "grid/mean_abs_error": 0.02}]


def test_run_progress_feeds_one_line_per_run():
    import io

    from analysis.cli.progress import run_progress

    out = io.StringIO()
    on_run = run_progress("grid", out)
    on_run(1, 3, "round 1: 1f1b m=4")
    on_run(3, 3, "round 1: zb-h1 m=4")  # a poll may see two runs at once
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("grid 1/3  elapsed ") and lines[0].endswith("round 1: 1f1b m=4")
    assert lines[1].startswith("grid 3/3  elapsed ") and " left 0 s  round 1: zb-h1 m=4" in lines[1]
