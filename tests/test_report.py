"""Perfetto export, prediction-vs-measurement figures, Kendall tau, and the report."""

from __future__ import annotations

import json
import math

import pytest

from analysis.cli import main as schedlab
from analysis.perfetto import to_chrome_trace, write_chrome_trace
from analysis.report import write_report
from analysis.validation.scores import compare_pair, decomposition, half_difference, kendall_tau, validation_summary
from schedules import OutputError, build, lower
from schedules.trace import write_trace
from sim import UniformCosts, simulate
from sim.plan.sweep import SweepConfig, run_sweep


def small_trace(tcomm=0.5, name="1f1b"):
    return simulate(lower(build(name, pp=2, microbatches=2)), UniformCosts(tcomm=tcomm)).trace


def test_chrome_trace_processes_threads_events_and_flows():
    """Ranks are processes, streams threads, tasks complete events (us), each SEND flows to its RECV."""
    t = small_trace()
    ev = to_chrome_trace(t)["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {(0, "compute"), (0, "send"), (0, "recv"), (1, "compute"), (1, "send"), (1, "recv")}
    x = [e for e in ev if e["ph"] == "X"]
    assert len(x) == len(t)
    b0 = next(e for e in x if e["name"] == "0B0")
    assert (b0["ts"], b0["dur"], b0["pid"], b0["tid"]) == (5.0e6, 2.0e6, 0, 0)
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert len(starts) == len(ends) == 4  # two activations forward, two gradients back
    first = starts[1], ends[1]  # 0SEND_F0 at t=1 -> 1RECV_F0 landing at t=1.5
    assert (first[0]["pid"], first[0]["ts"], first[1]["pid"], first[1]["ts"]) == (0, 1.0e6, 1, 1.5e6)


def test_write_chrome_trace(tmp_path):
    path = write_chrome_trace(small_trace(), tmp_path / "t.json")
    assert json.loads(path.read_text())["otherData"]["schedule"] == "1f1b"
    with pytest.raises(OutputError, match=r"use a name ending in \.json"):
        write_chrome_trace(small_trace(), tmp_path / "t.txt")


def test_kendall_tau():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)


def test_compare_pair_and_summary():
    """A 'measurement' 10% slower than the prediction: error -1/11, bubbles compared too."""
    pred = small_trace(0.0)
    meas = pred.copy()
    meas[["start", "end"]] *= 1.1
    meas.attrs = {**pred.attrs, "source": "real"}
    row = compare_pair(pred, meas)
    assert row["error"] == pytest.approx(-1 / 11)
    assert row["predicted_bubble"] == pytest.approx(row["measured_bubble"])
    assert row["kinds"]["F"]["measured"] == pytest.approx(1.1)
    s = validation_summary([row, {**row, "schedule": "x", "predicted_step_time": 1.0, "measured_step_time": 2.0, "error": -0.5}])
    assert s["mean_abs_error"] == pytest.approx((1 / 11 + 0.5) / 2)


def test_report_writes_markdown_and_figures(tmp_path):
    """The report names the fastest schedule and links figures that exist; a real trace adds a section."""
    real = small_trace(0.0, "zb-h1")
    real[["start", "end"]] *= 1.25  # stands in for a measurement
    real.attrs = {**real.attrs, "source": "real"}
    real_path = write_trace(real, tmp_path / "real-zb-h1.csv")
    cfg = SweepConfig(pp=2, microbatches=4, schedules=("gpipe", "1f1b", "zb-h1", "zb-v"), sweep=(2, 4, 8),
                      real_traces=(real_path,))
    path = write_report(tmp_path / "rep", run_sweep(cfg))
    md = path.read_text()
    assert "**Fastest:** `zb-v`" in md
    for line in md.splitlines():
        if line.startswith("!["):
            assert (path.parent / line.split("(")[-1].rstrip(")")).is_file()
    assert "## Prediction against measurement" in md and "| zb-h1 |" in md and "-20.0%" in md
    assert (tmp_path / "rep" / "traces" / "zb-v.csv").is_file()
    # Recomputation at p=2, m=4: R before every B costs a forward per microbatch on the last rank's path
    # (15 -> 19) for 1 M_B; at 2 M_B (1F1B's own peak) the pass needs no R at all.
    assert "| schedule | none | full | bubbles@2 |" in md and "| 1f1b | 15 / 2 | 19 / 1 | 15 / 2 |" in md


def test_report_cli_and_errors(tmp_path, capsys):
    assert schedlab(["report", "--out", str(tmp_path / "r"), "--pp", "2", "--microbatches", "2",
                     "--schedules", "gpipe,1f1b", "--no-progress"]) == 0
    assert "wrote report:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        schedlab(["report", "--out", str(tmp_path / "r2"), "--schedules", "nope"])
    assert exc.value.code == 2 and "unknown schedule 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()


def test_perfetto_cli(tmp_path, capsys):
    src = write_trace(small_trace(), tmp_path / "t.csv")
    assert schedlab(["perfetto", str(src)]) == 0
    assert (tmp_path / "t.perfetto.json").is_file()
    with pytest.raises(SystemExit):
        schedlab(["perfetto", str(tmp_path / "missing.csv")])
    assert "not found" in capsys.readouterr().err


def test_kendall_tau_counts_rounding_in_predictions_as_ties():
    # two configurations with the same step time, summed in different orders (plan_check's gpipe and 1f1b at pp=1)
    xs, ys = [203.5358350973342, 203.53583509733429, 98.3], [189.4, 189.0, 99.7]
    assert xs[0] != xs[1]
    assert kendall_tau(xs, ys) == pytest.approx(2 / (2 * 3) ** 0.5)  # one tie in x, two concordant pairs
    assert kendall_tau(xs, ys, x_rel_tol=0) == pytest.approx(1 / 3)  # as an order, the last bit disagrees


def test_kendall_tau_counts_overlapping_spreads_as_ties():
    # Without spreads: 2 of 3 pairs concordant, 1 discordant -> 1/3. The discordant pair (x 2 vs 3, y 21 vs 20)
    # has overlapping p10-p90 intervals, so it is a tie in y: tau_b = (2 - 0) / sqrt(3 * 2).
    xs, ys = [1, 2, 3], [10, 21, 20]
    spread = [(9, 11), (19, 23), (18, 22)]
    assert kendall_tau(xs, ys) == pytest.approx(1 / 3)
    assert kendall_tau(xs, ys, spread) == pytest.approx(2 / 6 ** 0.5)
    assert kendall_tau(xs, ys, [(10, 10), (21, 21), (20, 20)]) == pytest.approx(1 / 3)  # no overlap: as before


def test_decomposition_of_the_error():
    assert half_difference([0.10, 0.12, 0.11, 0.13, 0.09], 0.11) == pytest.approx((0.10 - 0.125) / 0.11)
    assert math.isnan(half_difference([0.10], 0.10))
    rows = [{"error": 0.04, "self_error": -0.02, "replay_error": 0.01, "half_difference": 0.06},
            {"error": -0.10, "self_error": 0.04, "replay_error": -0.03, "half_difference": -0.02},
            {"error": 0.2, "replay_error": None, "half_difference": 0.04}]  # the dp pair: no replay, noise only
    assert decomposition(rows) == pytest.approx({"replay": 0.02, "self_calibrated": 0.03, "transferred": 0.07,
                                                 "noise": 0.02})


VALIDATION = {
    "schedules": [
        {"schedule": "1f1b", "microbatches": 4, "predicted_step_time": 0.100, "measured_step_time": 0.104,
         "measured_spread": [0.102, 0.107], "error": -0.0385, "profile_error": -0.1, "replay_error": -0.004},
        {"schedule": "zb-v", "microbatches": 4, "predicted_step_time": 0.090, "measured_step_time": 0.088,
         "measured_spread": [0.086, 0.091], "error": 0.0227, "profile_error": 0.05, "replay_error": 0.01},
    ],
    "mean_abs_error": 0.0306, "kendall_tau_b": 1.0, "calibrated_from": {"schedule": "1f1b", "microbatches": 4},
    "mechanisms": {"all": 0.0306, "without send_cpu": 0.05},
    "decomposition": {"replay": 0.007, "self_calibrated": 0.021, "transferred": 0.0306, "noise": 0.0125},
}


def test_report_with_validation(tmp_path, capsys):
    path = tmp_path / "v.json"
    path.write_text(json.dumps(VALIDATION))
    assert schedlab(["report", "--out", str(tmp_path / "r"), "--pp", "2", "--microbatches", "2",
                     "--schedules", "gpipe,1f1b", "--no-progress", "--validation", str(path)]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert (tmp_path / "r" / "validation.png").stat().st_size > 0
    assert "| 1f1b | 4 | 100.0 | 104.0 | 102.0-107.0 | -3.9% | -10.0% | -0.4% |" in md
    assert "| without send_cpu | 5.0% |" in md
    assert "| self_calibrated | 2.1% |" in md and "| noise | 1.2% |" in md
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schedules": [{"schedule": "x"}]}))
    for target, message in ((bad, "schedules[0] lacks microbatches, predicted_step_time"),
                            (tmp_path / "none.json", "not found; write one with experiments/validate_sim.py")):
        with pytest.raises(SystemExit) as exc:
            schedlab(["report", "--out", str(tmp_path / "r3"), "--validation", str(target)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err and "(flag --validation)" in err
        assert not (tmp_path / "r3").exists()
