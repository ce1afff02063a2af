"""The data-parallel rows calibrated from one data-parallel run, and each step taken apart (analysis.validation.dp_transfer).

Hand-made traces and the simulator's own (tests.test_dp_grid: compute slowed 1.5x while a collective is in
flight), so every figure has a known true value.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest

from analysis.validation.calibration import dp_graph, predict
from analysis.validation.dp_modes import predict_mode
from analysis.validation.dp_transfer import (
    PARTS,
    dp_run_costs,
    fitted_slowdown,
    measured_parts,
    mode_costs,
    predicted_parts,
    step_parts,
    straggler,
)
from sim.costs.profiled import ProfiledCosts, StageCosts
from tests.test_dp_grid import ALPHA, FACTOR, STEP_OVERHEAD, _trace, _truth, profile  # noqa: F401 (a fixture)


def _step(step: int, rows: list[tuple[int, str, float, float]]) -> pd.DataFrame:
    return pd.DataFrame([(r, "compute", f"0{k}0", k, s, e, step) for r, k, s, e in rows],
                        columns=["rank", "stream", "action", "kind", "start", "end", "step"])


def _two_steps() -> pd.DataFrame:
    """Step 1: rank 0 F 10, B 20, OPTIM 5 ms; rank 1 F 12, B 24, OPTIM 5 ms; span 50 ms, wall 52 ms. Step 2: both
    ranks F 10, B 20 ms (no optimizer), span 40 ms, wall 41 ms."""
    one = _step(1, [(0, "F", 0.000, 0.010), (0, "B", 0.010, 0.030), (0, "OPTIM", 0.045, 0.050),
                    (1, "F", 0.000, 0.012), (1, "B", 0.012, 0.036), (1, "OPTIM", 0.040, 0.045)])
    two = _step(2, [(r, k, s + 1.0, e + 1.0) for r in (0, 1) for k, s, e in (("F", 0.0, 0.010), ("B", 0.020, 0.040))])
    df = pd.concat([one, two], ignore_index=True)
    df.attrs.update(step_times={"1": 0.052, "2": 0.041})
    return df


def test_a_step_taken_apart_adds_up_to_its_wall_time():
    """Means F 11, B 22, OPTIM 5 ms; the busier rank's 41 ms less the mean 38 ms is the skew; span 50 less 41 is
    exposed; wall 52 less span 50 is the overhead."""
    rows = [(0, "F", 0.010), (0, "B", 0.020), (0, "OPTIM", 0.005), (0, "ALLREDUCE", 0.004),
            (1, "F", 0.012), (1, "B", 0.024), (1, "OPTIM", 0.005)]
    parts = step_parts(rows, 0.050, 0.052)
    assert parts == pytest.approx({"forward": 0.011, "backward": 0.022, "optimizer": 0.005, "skew": 0.003,
                                   "exposed": 0.009, "overhead": 0.002}, rel=1e-9)
    assert sum(parts.values()) == pytest.approx(0.052, rel=1e-12) and tuple(parts) == PARTS


def test_measured_parts_are_the_mean_traced_step():
    """Step 1 as above; step 2: F 10, B 20, no skew, exposed 40 - 30 = 10, overhead 1 ms."""
    got = measured_parts([_two_steps()])
    assert got == pytest.approx({"forward": 0.0105, "backward": 0.021, "optimizer": 0.0025, "skew": 0.0015,
                                 "exposed": 0.0095, "overhead": 0.0015, "step": 0.0465}, rel=1e-9)
    df = _two_steps()
    df.attrs["step_times"] = {}
    with pytest.raises(ValueError, match=r"the traces have no step with a wall time \(attrs step_times\)"):
        measured_parts([df])


def test_straggler_is_the_busier_ranks_passes_over_the_mean():
    """Step 1: passes 30 and 36 ms, 36 / 33; step 2: equal, 1. A one-rank trace: 1."""
    assert straggler([_two_steps()]) == pytest.approx((36 / 33 + 1) / 2, rel=1e-12)
    assert straggler([_step(0, [(0, "F", 0.0, 0.01)])]) == 1.0


def test_zero_modes_step_a_shard_of_the_optimizer():
    costs = _truth()
    assert mode_costs(costs, "zero2", 2).stages[0].optim == pytest.approx(costs.stages[0].optim / 2, rel=1e-12)
    assert mode_costs(costs, "zero3", 4).stages[0].optim == pytest.approx(costs.stages[0].optim / 4, rel=1e-12)
    assert mode_costs(costs, "ddp+int8", 2) is costs and mode_costs(costs, "ps", 2) is costs
    assert mode_costs(costs, "sync", 2, calibrated_mode="zero1").stages[0].optim == pytest.approx(
        2 * costs.stages[0].optim, rel=1e-12)


def test_predicted_parts_add_up_to_the_prediction():
    """sync, gpipe m=2, one bucket: F 1 + 1, B 2 + 2, then the all-reduce (0.3), OPTIM 0.5, overhead 0.1."""
    costs = ProfiledCosts(stages=(StageCosts(f=1.0, b=2.0, i=0.0, w=0.0, optim=0.5, param_bytes=100),),
                          collectives=(("all_reduce", 0.3, math.inf),), step_overhead=0.1)
    got = predicted_parts("sync", dp_graph("gpipe", "sync", 2, 1), costs, None)
    assert got == pytest.approx({"forward": 2.0, "backward": 4.0, "optimizer": 0.5, "skew": 0.0, "exposed": 0.3,
                                 "overhead": 0.1, "step": 6.9}, rel=1e-12)
    truth = _truth()
    for mode in ("ddp", "zero2", "local-sgd"):
        graph = dp_graph("gpipe", mode, 2, 3)
        want = predict_mode(mode, graph, truth, None, 2)["step"]
        assert predicted_parts(mode, graph, truth, None, 2)["step"] == pytest.approx(want, rel=1e-12)


def test_a_ddp_run_calibrates_the_other_modes(profile):  # noqa: F811 (the fixture)
    """From the simulator's own ddp trace (both replicas alike: straggler 1): the true passes and overheads, the
    all-reduces' service time for every gradient reduction (the reduce-scatters too), the profile's all-gather;
    zero2 is then predicted as the truth with those collectives. A replica 10% slower scales every pass by
    the straggler factor, 1.1 / 1.05."""
    costs = dp_run_costs([_trace()], profile)
    st = costs.stages[0]
    assert (st.f, st.b, costs.step_overhead) == (pytest.approx(0.010, rel=1e-9), pytest.approx(0.020, rel=1e-9),
                                                 pytest.approx(STEP_OVERHEAD, rel=1e-9))
    assert dict((op, (a, b)) for op, a, b in costs.collectives) == {
        "all_reduce": (pytest.approx(ALPHA, rel=1e-9), math.inf),
        "reduce_scatter": (pytest.approx(ALPHA, rel=1e-9), math.inf), "all_gather": (ALPHA, math.inf)}
    assert costs.comm_slowdown == pytest.approx(FACTOR, rel=1e-9)
    graph = dp_graph("gpipe", "zero2", 2, 3)
    truth = replace(_truth(), collectives=(("all_reduce", ALPHA, math.inf), ("reduce_scatter", ALPHA, math.inf),
                                           ("all_gather", ALPHA, math.inf)), step_overhead=STEP_OVERHEAD)
    assert predict(graph, costs) == pytest.approx(predict(graph, truth), rel=1e-9)
    slow = _trace()
    late = (slow["rank"] == 1) & (slow["stream"] == "compute")
    slow.loc[late, "end"] = slow.loc[late, "start"] + (slow.loc[late, "end"] - slow.loc[late, "start"]) * 1.1
    assert straggler([slow]) == pytest.approx(1.1 / 1.05, rel=1e-9)


def _calibration(profile, tmp_path):  # noqa: F811 (the fixture's value)
    """A calibration from a simulated 1f1b run (pp 2, m 4) and the ddp run of :func:`_trace`; and that trace's path."""
    from analysis.validation.calibration import Calibration
    from schedules import load_graph, validate
    from schedules.trace import write_trace
    from sim import simulate
    from tests.test_calibrate import _as_recorded, _profile_file
    from tests.test_calibrate import _costs as pipeline_costs

    pipe = _as_recorded(simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), pipeline_costs(1.0)).trace,
                        1.0, 0, 0.0)
    pipe.attrs.update(source="real", schedule="1f1b", params={"pp": 2, "microbatches": 4, "chunks": 1},
                      step_times={"0": 1.0}, dp=1)
    ddp = str(write_trace(_trace(), tmp_path / "ddp.csv"))
    cal = Calibration.of(_profile_file(tmp_path), [str(write_trace(pipe, tmp_path / "1f1b.csv"))], profile,
                         dp_traces=[ddp])
    return cal, ddp


def test_grid_rows_calibrated_from_a_ddp_run(profile, tmp_path):  # noqa: F811 (the fixture)
    """The ddp run (in-sample) predicts itself exactly; zero2 (held out) is predicted from it, its step taken
    apart (the parts add up to its prediction, the measured ones to its mean traced step), and the pipeline run's
    prediction kept beside it."""
    from types import SimpleNamespace

    from analysis.validation.calibration import grid_rows
    from schedules.trace import write_trace
    from sim import simulate

    cal, ddp = _calibration(profile, tmp_path)
    graphs = {("dp2-ddp", 2): dp_graph("gpipe", "ddp", 2, 3), ("dp2-zero2", 2): dp_graph("gpipe", "zero2", 2, 3)}
    measured = {}
    for (name, m), graph in graphs.items():
        truth = simulate(graph, _truth()).makespan + STEP_OVERHEAD
        path = ddp if name == "dp2-ddp" else str(write_trace(_trace("zero2"), tmp_path / "zero2.csv"))
        measured[(name, m)] = SimpleNamespace(config=None, step_time=truth, spread=(truth, truth),
                                              round_medians=(truth, truth), foreign_cores=(0.0,), traces=(path,))
    rows = grid_rows(measured, graphs, cal, ("1f1b", 4), list(graphs), ("dp2-ddp", 2))
    assert [(r["schedule"], r["in_sample"]) for r in rows] == [("dp2-ddp", True), ("dp2-zero2", False)]
    assert abs(rows[0]["error"]) < 1e-9
    zero2 = rows[1]
    assert zero2["parts"]["predicted"]["step"] == pytest.approx(zero2["predicted_step_time"], rel=1e-12)
    assert zero2["parts"]["measured"]["step"] == pytest.approx(zero2["measured_step_time"], rel=1e-9)
    old = predict_mode("zero2", graphs[("dp2-zero2", 2)], cal.from_pipeline(), profile)["step"]
    assert zero2["pipeline_predicted_step_time"] == old and zero2["parts"]["from_pipeline"]["step"] == pytest.approx(
        old, rel=1e-12)
    assert zero2["pipeline_error"] == pytest.approx((old - zero2["measured_step_time"]) / zero2["measured_step_time"])
    assert (cal.describe()["data_parallel"]["straggler"], cal.describe()["data_parallel"]["skew"]) == (1.0, 0.0)
    assert zero2["without"]["skew"] == zero2["predicted_step_time"]  # both replicas alike: no skew to add


def test_validate_sim_runs_every_mode_at_two_counts_and_ddp_at_the_middle_one():
    from tests.test_dp_grid import _validate_sim

    keys = _validate_sim()._dp_keys
    assert keys(["zero2", "ddp"], [4, 8, 16]) == [("dp2-zero2", 4), ("dp2-ddp", 4), ("dp2-zero2", 8), ("dp2-ddp", 8)]
    assert keys(["zero2"], [4, 16]) == [("dp2-zero2", 4), ("dp2-zero2", 16), ("dp2-ddp", 16)]
    assert keys(["sync"], [4]) == [("dp2-sync", 4), ("dp2-ddp", 4)]
    assert keys([], [4, 8]) == []


def test_validate_sim_page_shows_each_data_parallel_step_taken_apart():
    from tests.test_dp_grid import _validate_sim

    parts = {k: {p: (i + 1) / 1000 for i, p in enumerate((*PARTS, "step"))} for k in ("measured", "predicted")}
    parts["from_pipeline"] = {p: v / 2 for p, v in parts["measured"].items()}
    rows = [{"schedule": "dp2-zero2", "microbatches": 8, "in_sample": False, "parts": parts}]
    (head, table) = _validate_sim()._parts_table({"schedules": [{"schedule": "1f1b"}, *rows]})
    assert head == ("Each data-parallel step taken apart (ms, the mean traced step): measured / predicted (from the "
                    "pipeline run) (docs/validation-protocol.md).")
    assert table.splitlines() == [
        "| row | m | sample | forward | backward | optimizer | skew | exposed | overhead | step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| dp2-zero2 | 8 | out | 1.0 / 1.0 (0.5) | 2.0 / 2.0 (1.0) | 3.0 / 3.0 (1.5) | 4.0 / 4.0 (2.0) "
        "| 5.0 / 5.0 (2.5) | 6.0 / 6.0 (3.0) | 7.0 / 7.0 (3.5) |"]


def test_the_run_measures_compute_slowed_by_its_collectives(profile):  # noqa: F811 (the fixture)
    """The trace's B0 ran alone (20 ms), its last B 20 + 8 (1 - 1/1.5) ms with two 4 ms all-reduces in service:
    (d - w) / o = 1/3, so the factor is 1.5, whatever the profile says; none without a pass run alone."""
    assert fitted_slowdown([_trace()]) == pytest.approx(FACTOR, rel=1e-9)
    path = profile.read_text().replace('"factor": 1.5', '"factor": 1.2')
    assert '"factor": 1.2' in path
    profile.write_text(path)
    assert dp_run_costs([_trace()], profile).comm_slowdown == pytest.approx(FACTOR, rel=1e-9)
    assert fitted_slowdown([_two_steps()]) is None


def _stalled(stall: float, alpha: float = 0.006) -> ProfiledCosts:
    return ProfiledCosts(stages=(StageCosts(f=0.010, b=0.020, i=0.0, w=0.0, optim=0.003, param_bytes=100),),
                         collectives=(("all_reduce", alpha, math.inf),), comm_stall=stall)


def test_collectives_stall_while_their_rank_computes():
    """gpipe m=1, two buckets: bucket 0 ready halfway through B (at 20 ms), bucket 1 at its end (30 ms). At stall 2
    bucket 0's 6 ms do 5 by 30 ms, the last 1 ms after: ends at 31; bucket 1 then 31-37; OPTIM 37-40. At stall 1:
    26 and 36, 39. A 2 ms bucket 0 ends at 24 (2 x 2 ms within the pass)."""
    from sim import simulate
    from sim.costs.profiled import step_time

    graph = dp_graph("gpipe", "ddp", 1, 2)
    for stall, alpha, want in ((2.0, 0.006, 0.040), (1.0, 0.006, 0.039), (2.0, 0.002, 0.035)):
        result = simulate(graph, _stalled(stall, alpha))
        assert step_time(result, _stalled(stall, alpha)) == pytest.approx(want, rel=1e-12), stall
    result = simulate(graph, _stalled(2.0, 0.002))
    ends = sorted(result.end[t.id] for t in graph.tasks if t.stream.value == "collective")
    assert ends == pytest.approx([0.024, 0.032], rel=1e-12)
    with pytest.raises(Exception, match=r"comm_stall must be a finite factor > 0 \(1.0: compute does not slow "
                                        r"communication\), got 0"):
        _stalled(0)


def test_the_run_measures_collectives_stalled_by_compute(profile):  # noqa: F811 (the fixture)
    """The simulator's own ddp trace at stall 4 (m=2, 3 buckets of 4 ms, compute slowed 1.5x): bucket 0 is issued
    20 ms before the last pass ends and its port stays busy, so the three did 12 - 7 = 5 ms of work in those
    20 ms: stall 4; bucket 2, served after the passes, took 4 ms alone. The costs fitted on it predict it."""
    from analysis.validation.dp_transfer import fitted_stall, idle_service

    truth = replace(_truth(), comm_stall=4.0, step_overhead=STEP_OVERHEAD)
    df = _trace(costs=truth)
    assert idle_service([df]) == pytest.approx([ALPHA, ALPHA] * 2, rel=1e-9)
    assert fitted_stall([df], ALPHA) == pytest.approx(4.0, rel=1e-9)
    assert fitted_stall([df], 10 * ALPHA) is None
    costs = dp_run_costs([df], profile)
    assert (costs.comm_stall, costs.comm_slowdown) == (pytest.approx(4.0, rel=1e-9), pytest.approx(FACTOR, rel=1e-9))
    graph = dp_graph("gpipe", "ddp", 2, 3)
    assert predict(graph, costs) == pytest.approx(predict(graph, truth), rel=1e-9)


def test_a_stalled_collective_runs_at_full_speed_while_its_rank_waits_for_it():
    """zero2, gpipe m=1, three 2 ms buckets, at most 1 reduce-scatter in flight, stall 1000: F 0-10 ms; bucket 0
    is ready at 20 ms and does 0.01 ms under the pass until bucket 1 (30 ms) stops the pass; alone, it ends at
    31.99, the pass resumes (10 ms left: to 41.99) while bucket 1 does 0.01 ms, and ends alone at 43.98;
    bucket 2 (ready at 41.99) 43.98-45.98; OPTIM 3 ms; the three 1 ms gathers after it: 51.98 ms."""
    from sim import simulate
    from sim.costs.profiled import step_time

    costs = ProfiledCosts(stages=(StageCosts(f=0.010, b=0.030, i=0.0, w=0.0, optim=0.003, param_bytes=300),),
                          collectives=(("reduce_scatter", 0.002, math.inf), ("all_gather", 0.001, math.inf)),
                          comm_stall=1000.0, max_inflight=1)
    result = simulate(dp_graph("gpipe", "zero2", 1, 3), costs)
    assert step_time(result, costs) == pytest.approx(0.05198, rel=1e-9)


def test_only_collectives_that_cannot_have_run_during_the_passes_time_one_alone():
    """Passes end at 10. a and b begin before; c begins at 11 but was issued at 4 and a (two before it) ended at 9,
    so on gloo's second thread it may have run since 9: left out; d's collective two before (b) ended at 11, and
    e was issued at 13: both kept. With one thread, c's predecessor b ended at 11: kept."""
    from analysis.validation.dp_transfer import GLOO_THREADS, wholly_after

    a, b, c, d, e = (2.0, 2.0, 9.0), (3.0, 9.0, 11.0), (4.0, 11.0, 12.0), (5.0, 12.0, 14.0), (13.0, 14.0, 15.0)
    assert GLOO_THREADS == 2
    assert wholly_after([a, b, c, d, e], 10.0) == [d, e]
    assert wholly_after([a, b, c, d, e], 10.0, threads=1) == [c, d, e]
    assert wholly_after([a, b], 10.0) == []


@pytest.mark.parametrize("gap", [0.004, -0.0005])
def test_closing_the_calibration_run_adds_its_gap_to_every_rows_step(profile, tmp_path, gap):  # noqa: F811
    """The ddp run's measured step less its own prediction goes on the per-step overhead: the run then predicts
    itself exactly, and a held-out zero2 row's step moves by the same seconds."""
    cal, _ = _calibration(profile, tmp_path)
    graph, zero2 = dp_graph("gpipe", "ddp", 2, 3), dp_graph("gpipe", "zero2", 2, 3)
    own = predict_mode("ddp", graph, cal.data_parallel("ddp"), profile)["step"]
    closed = cal.closed_on(graph, own + gap)
    assert closed.dp_residual == pytest.approx(gap, abs=1e-12)
    assert closed.dp_fit.step_overhead == pytest.approx(cal.dp_fit.step_overhead + gap, abs=1e-12)
    assert predict_mode("ddp", graph, closed.data_parallel("ddp"), profile)["step"] == pytest.approx(own + gap)
    assert predict_mode("zero2", zero2, closed.data_parallel("zero2"), profile)["step"] == pytest.approx(
        predict_mode("zero2", zero2, cal.data_parallel("zero2"), profile)["step"] + gap)
    assert closed.describe()["data_parallel"]["residual"] == closed.dp_residual


def test_only_zero3_rows_take_the_profiles_zero3_section(profile, tmp_path):  # noqa: F811 (the fixture)
    from tests.test_zero3_profile import SECTION

    cal, _ = _calibration(profile, tmp_path)
    assert cal.dp_zero3 is None  # the fixture's profile has no zero3 section: every row as before
    with_section = replace(cal, dp_zero3=SECTION)
    before, after = cal.data_parallel("zero3"), with_section.data_parallel("zero3")
    assert after.stages[0].f == pytest.approx(before.stages[0].f * SECTION["factor"]["F"])
    assert dict((op, a) for op, a, _ in after.collectives)["all_gather"] == pytest.approx(0.006 / 4)
    assert with_section.data_parallel("zero2") == cal.data_parallel("zero2")
