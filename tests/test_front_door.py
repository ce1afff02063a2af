"""The Python front door: simulate() of a Schedule, build() by position, physical units from one import,
analysis.compare() with real traces predicted as the validation grid predicts, and the report's
predicted-against-measured section (``schedlab report --costs RUN.csv --costs-profile P.json --real B.csv``).

The "real" traces are the simulator's, recorded the way the runtime records them (tests/test_calibrate.py's
``_as_recorded``), so every figure is known; a noisy run alternates fast and slow steps.
"""

from __future__ import annotations

import json
import statistics

import pandas as pd
import pytest

from schedules import PipelineParams, ScheduleError, build, load_graph, lower, validate
from schedules.trace import write_trace
from schedules.util import percentile
from sim import simulate
from tests.test_calibrate import _as_recorded, _costs, _profile_file

QUIET = (1.0, 1.01, 0.99, 1.0)  # four traced steps within 1%: noise well under 5%
NOISY = (1.0, 1.5, 1.0, 1.5)  # alternating steps: the two halves differ by a third


def _run(name: str, m: int, scales: tuple[float, ...], overhead: float = 0.004) -> pd.DataFrame:
    """A 2-rank real run's trace of ``name`` at m microbatches, one traced step per scale."""
    graph = validate(load_graph(name, pp=2, microbatches=m))
    parts, walls = [], {}
    for k, scale in enumerate(scales):
        result = simulate(graph, _costs(scale))
        parts.append(_as_recorded(result.trace, scale, k, offset=2 * k))
        walls[str(k)] = result.makespan + overhead
    df = pd.concat(parts, ignore_index=True)
    peaks = [r.peak_activations for r in simulate(graph, _costs(1.0)).ranks]
    df.attrs.update(source="real", schedule=name, params={"pp": 2, "microbatches": m, "chunks": 1},
                    step_times=walls, dp=1,
                    memory=[{"rank": r, "pp_rank": r, "dp_rank": 0, "peak_activation_bytes": int(p * 1024),
                             "activation_bytes_per_microbatch": 1024, "peak_activations_mb": p}
                            for r, p in enumerate(peaks)])
    return df


@pytest.fixture
def runs(tmp_path):
    """A calibration run (1f1b m=4), a quiet run of gpipe m=4 and 1f1b m=8, a noisy one of gpipe m=4, a profile."""
    out = {"cal": write_trace(_run("1f1b", 4, QUIET), tmp_path / "cal.csv"),
           "gpipe": write_trace(_run("gpipe", 4, QUIET), tmp_path / "gpipe.csv"),
           "m8": write_trace(_run("1f1b", 8, QUIET), tmp_path / "m8.csv"),
           "noisy": write_trace(_run("gpipe", 4, NOISY), tmp_path / "noisy.csv"),
           "profile": _profile_file(tmp_path)}
    return {k: str(v) for k, v in out.items()}


# -- simulate and build ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,pp,m", [("gpipe", 4, 8), ("1f1b", 4, 8), ("interleaved-1f1b", 2, 4), ("zb-h1", 3, 6)])
def test_simulate_takes_a_schedule_as_its_lowered_graph(name, pp, m):
    from sim import UniformCosts

    s = build(name, pp, m)
    costs = UniformCosts(tf=1.0, tb=1.5, tw=0.5, tcomm=0.1)
    got, want = simulate(s, costs), simulate(lower(s), costs)
    assert got.to_dict() == want.to_dict() and (got.start, got.end) == (want.start, want.end)
    assert simulate(s).to_dict() == simulate(lower(s), UniformCosts()).to_dict()
    assert simulate(s, costs, check=False).to_dict() == want.to_dict()


def test_simulate_refuses_what_is_not_a_schedule():
    with pytest.raises(ScheduleError, match=r"simulate: graph must be a Schedule or a TaskGraph .*got str"):
        simulate("1f1b")


def test_build_by_position():
    assert build("1f1b", 4, 8) == build("1f1b", pp=4, microbatches=8) == build("1f1b", PipelineParams(pp=4, microbatches=8))
    assert build("interleaved-1f1b", 4, 8, 2) == build("interleaved-1f1b", pp=4, microbatches=8, chunks=2)
    assert build("zb-auto", 2, 4, mem_limit=4, time_limit=0.0) == build("zb-auto", pp=2, microbatches=4, mem_limit=4,
                                                                         time_limit=0.0)
    with pytest.raises(TypeError, match=r"build\('1f1b', ...\) got pp both by position and as a keyword"):
        build("1f1b", 4, 8, pp=4)
    with pytest.raises(TypeError, match=r"up to three ints \(pp, microbatches, chunks\) after the name, got '4'"):
        build("1f1b", "4", 8)
    with pytest.raises(TypeError, match="up to three ints"):
        build("1f1b", 4, 8, 1, 1)


def test_physical_units_from_one_import_equal_the_long_way():
    from sim import ParallelConfig, Study, TransformerCosts, cluster_preset, model_preset, run_study
    from sim.costs import cluster, parallel, transformer, transformer_costs
    from sim.plan import study

    short = run_study(Study(schedule="1f1b", microbatches=16, costs=TransformerCosts(
        model=model_preset("gpt-6.2b"), cluster=cluster_preset("dgx-h100:2"),
        parallel=ParallelConfig(pp=8, dp=2, dp_mode="ddp"))))
    long = study.run_study(study.Study(schedule="1f1b", microbatches=16, costs=transformer_costs.TransformerCosts(
        model=transformer.model_preset("gpt-6.2b"), cluster=cluster.cluster_preset("dgx-h100:2"),
        parallel=parallel.ParallelConfig(pp=8, dp=2, dp_mode="ddp"))))
    assert short.to_dict() == long.to_dict()
    assert short.step_time == long.step_time > 0


def test_the_packages_export_what_a_user_reaches_for():
    import analysis
    import sim
    from analysis.compare import comparison_table
    from analysis.report import write_report
    from sim.plan.sweep import SweepConfig, units_comparison

    assert (analysis.comparison_table, analysis.write_report, analysis.SweepConfig, analysis.units_comparison) == (
        comparison_table, write_report, SweepConfig, units_comparison)
    assert (sim.SweepConfig, sim.units_comparison) == (SweepConfig, units_comparison)
    assert callable(analysis.compare)


# -- analysis.compare -------------------------------------------------------------------------------------------


def test_compare_alone_is_the_comparison_table(tmp_path):
    from analysis import compare, comparison_table
    from sim.plan.sweep import simulate_many

    c = compare(["gpipe", "1f1b"], pp=4, microbatches=8)
    assert c.table.equals(comparison_table(simulate_many(["gpipe", "1f1b"], pp=4, microbatches=8)))
    assert c.against is None and c.files == ()
    c = compare(["gpipe", "1f1b"], pp=4, microbatches=8, out=tmp_path / "out")
    assert sorted(p.name for p in c.files) == ["comparison.csv", "timeline-1f1b.png", "timeline-gpipe.png",
                                               "timelines.png"]


def test_compare_in_physical_units_is_units_comparison(tmp_path):
    from analysis import compare
    from common.errors import ConfigError
    from sim import ParallelConfig, TransformerCosts, cluster_preset, model_preset, units_comparison

    costs = TransformerCosts(model=model_preset("gpt-6.2b"), cluster=cluster_preset("dgx-h100:2"),
                             parallel=ParallelConfig(pp=8, dp=2, dp_mode="ddp"))
    c = compare(["1f1b", "zb-h1"], costs, microbatches=16, out=tmp_path / "u")
    rows = units_comparison(["1f1b", "zb-h1"], microbatches=16, costs=costs)
    assert json.dumps(list(c.units), sort_keys=True) == json.dumps(rows, sort_keys=True) and c.results == ()
    assert list(c.table["step_time"]) == [d["step_time"] for d in rows]
    assert list(c.table["peak_memory_bytes"]) == [max(x["memory_bytes"] for x in d["devices"]) for d in rows]
    assert [p.name for p in c.files] == ["comparison.csv"]
    with pytest.raises(ConfigError, match="pp=4 but the costs' parallel layout has pp=8") as exc:
        compare(["1f1b"], costs, pp=4)
    assert exc.value.field == "pp"
    with pytest.raises(ConfigError, match="costs must be UniformCosts, TransformerCosts, or the path of a cost "
                                          "file or trace, got 3") as exc:
        compare(["1f1b"], 3)
    assert exc.value.field == "costs"


def _grid(runs, held_out):
    """The validation grid's own functions on the same traces: Calibration.of, grid_rows, score_grid."""
    from analysis.validation.calibration import Calibration, grid_rows
    from analysis.validation.scores import decomposition, noise_verdict, score_grid
    from analysis.validation.traces import TracedRun
    from schedules.trace import read_trace
    from sim.plan.sweep import trace_graph

    measured, graphs = {}, {}
    for path in [runs["cal"], *held_out]:
        df = read_trace(path)
        steps = [float(v) for _, v in sorted(df.attrs["step_times"].items(), key=lambda kv: int(kv[0]))]
        key = (df.attrs["schedule"], df.attrs["params"]["microbatches"])
        measured[key] = TracedRun(statistics.median(steps), (percentile(steps, 0.1), percentile(steps, 0.9)),
                                  tuple(steps), (path,))
        graphs[key] = trace_graph(df.attrs)
    rows = grid_rows(measured, graphs, Calibration.of(runs["profile"], [runs["cal"]]), ("1f1b", 4))
    return rows, score_grid(rows), noise_verdict(decomposition(rows)["noise"], (), ())


def test_compare_predicts_real_traces_as_the_validation_grid_does(runs):
    from analysis import compare

    c = compare(["1f1b", "gpipe"], runs["cal"], pp=2, microbatches=4, profile=runs["profile"],
                real=[runs["gpipe"], runs["m8"]])
    rows, scores, verdict = _grid(runs, [runs["gpipe"], runs["m8"]])
    a = c.against
    assert json.dumps(a["rows"], sort_keys=True) == json.dumps(rows, sort_keys=True)
    assert [(r["schedule"], r["microbatches"], r["in_sample"]) for r in a["rows"]] == [
        ("1f1b", 4, True), ("gpipe", 4, False), ("1f1b", 8, False)]
    assert a["noise_verdict"] == verdict and verdict["verdict"] == "judged" and verdict["noise"] < 0.05
    assert json.dumps(a["scores"], sort_keys=True) == json.dumps(scores, sort_keys=True)
    assert a["predictor"] == "calibrated" and a["scores"]["out_of_sample"] == ["gpipe m=4", "1f1b m=8"]
    # the traces ran the calibration's passes, so a held-out row is predicted within the steps' wobble
    assert all(abs(r["error"]) < 0.02 for r in a["rows"])
    assert a["memory"]["gpipe"] == [
        {"rank": r, "measured_peak_activation_bytes": 4 * 1024, "measured_peak_activations_mb": 4.0,
         "simulated_peak_activations_mb": 4.0} for r in (0, 1)]


def test_compare_withholds_errors_when_the_runs_are_too_noisy(runs):
    from analysis import compare
    from analysis.validation.traces import format_rows

    c = compare(["1f1b"], runs["cal"], pp=2, microbatches=4, profile=runs["profile"], real=[runs["noisy"]])
    a = c.against
    v = a["noise_verdict"]
    # the halves of the noisy run, steps at 1.0 and at 1.5 of the pass times, differ by about 40% of its median
    # step; with the quiet calibration run's, the expected |error| of a perfect prediction is about 10%
    from analysis.validation.scores import half_difference

    walls = [r["round_medians"] for r in a["rows"]]
    assert walls[1][0] == walls[1][2] and walls[1][1] == walls[1][3]
    halves = [abs(half_difference(w, statistics.median(w))) for w in walls]
    assert v["noise"] == statistics.fmean(halves) / 2 and halves[1] > 0.35 > 0.01 > halves[0]
    assert v["verdict"] == "too noisy to judge" and not v["judged"]
    assert a["scores"] is None
    assert [cells[-1] for cells in format_rows(a)] == ["too noisy", "too noisy"]


def test_compare_from_a_cost_file_alone_is_the_profile_predictor(runs):
    from analysis import compare
    from analysis.validation.calibration import predict
    from sim.costs.cost_file import load_profile

    c = compare(["gpipe"], runs["profile"], pp=2, microbatches=4, real=[runs["gpipe"]])
    (row,) = c.against["rows"]
    graph = validate(load_graph("gpipe", pp=2, microbatches=4))
    assert c.against["predictor"] == "profile alone"
    assert row["predicted_step_time"] == predict(graph, load_profile(runs["profile"], 2))
    steps = [simulate(graph, _costs(x)).makespan + 0.004 for x in QUIET]
    assert row["measured_step_time"] == statistics.median(steps) and row["measured_spread"] == [
        percentile(steps, 0.1), percentile(steps, 0.9)]
    assert row["error"] == (row["predicted_step_time"] - row["measured_step_time"]) / row["measured_step_time"]


def test_compare_refuses_real_traces_without_seconds(runs):
    from analysis import compare
    from common.errors import ConfigError

    with pytest.raises(ConfigError, match="real traces are predicted in seconds") as exc:
        compare(["1f1b"], pp=2, microbatches=4, real=[runs["gpipe"]])
    assert exc.value.field == "costs"
    with pytest.raises(ConfigError, match="needs the machine's profile") as exc:
        compare(["1f1b"], runs["cal"], pp=2, microbatches=4, real=[runs["gpipe"]])
    assert exc.value.field == "profile"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``schedlab ARGV`` in-process: (exit status, stdout, stderr)."""
    from conftest import run_schedlab

    return run_schedlab(capsys, *argv)


# -- schedlab report --------------------------------------------------------------------------------------------


def test_report_calibrated_from_a_trace_and_a_profile(runs, tmp_path, capsys):
    out = tmp_path / "report"
    code, _, err = run_cli(capsys, "report", "--out", str(out), "--schedules", "1f1b,gpipe", "--pp", "2",
                                "--microbatches", "4", "--costs", runs["cal"], "--costs-profile", runs["profile"],
                                "--real", runs["gpipe"], runs["m8"], "--no-progress")
    assert code == 0, err
    md = (out / "report.md").read_text()
    rows, scores, _ = _grid(runs, [runs["gpipe"], runs["m8"]])
    assert "**Noise verdict: judged: measured noise" in md and "calibrated from the run" in md
    for r in rows:
        assert (f"| {r['schedule']} | {r['microbatches']} | {'in-sample' if r['in_sample'] else 'held out'} | "
                f"{r['predicted_step_time'] * 1e3:.2f} | {r['measured_step_time'] * 1e3:.2f} |") in md
        assert f"{r['error']:+.1%} |" in md
    assert f"mean |error| {scores['mean_abs_error']:.1%}" in md
    assert "| gpipe | 0 | 0.00391 | 4 | 4 |" in md  # measured 4 KiB = 4 M_B beside the simulated 4 M_B


def test_report_says_too_noisy_instead_of_errors(runs, tmp_path, capsys):
    out = tmp_path / "report"
    code, _, err = run_cli(capsys, "report", "--out", str(out), "--schedules", "1f1b", "--pp", "2",
                                "--microbatches", "4", "--costs", runs["cal"], "--costs-profile", runs["profile"],
                                "--real", runs["noisy"], "--no-progress")
    assert code == 0, err
    md = (out / "report.md").read_text()
    assert "**Noise verdict: too noisy to judge" in md and "Errors not reported" in md
    assert "too noisy |" in md and "%" not in md.split("| p10-p90 ms | error |")[1].split("Errors not")[0]


def test_report_calibration_trace_needs_the_profile(runs, tmp_path, capsys):
    code, _, err = run_cli(capsys, "report", "--out", str(tmp_path / "r"), "--pp", "2", "--microbatches", "4",
                                "--costs", runs["cal"], "--real", runs["gpipe"], "--no-progress")
    assert code == 2 and "needs the machine's profile" in err and "--costs-profile" in err
    assert len(err.strip().splitlines()) == 1
