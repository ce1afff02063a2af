"""The data-parallel rows of the validation grid: self-calibration and replay from a data-parallel trace.

The "real" trace is the simulator's own, with compute slowed 1.5x while a collective is in flight, both
replicas alike; so every figure read back from it has a known true value.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pandas as pd
import pytest

from analysis.validation.calibration import dp_graph, predict
from analysis.validation.dp_calibration import dp_replay_error, dp_self_costs, unslowed_passes
from schedules.formats import PROFILE_SCHEMA
from sim import simulate
from sim.costs.param_copy import ParamCopy
from sim.costs.profiled import ProfiledCosts, StageCosts

F, B, OPTIM, ALPHA, FACTOR, STEP_OVERHEAD = 0.010, 0.020, 0.003, 0.004, 1.5, 0.002


def _truth(limit: int = 0) -> ProfiledCosts:
    return ProfiledCosts(stages=(StageCosts(f=F, b=B, i=0.0, w=0.0, optim=OPTIM, param_bytes=3000),),
                         collectives=(("all_reduce", ALPHA, math.inf), ("reduce_scatter", 3 * ALPHA, math.inf),
                                      ("all_gather", ALPHA / 2, math.inf)), comm_slowdown=FACTOR, max_inflight=limit)


def _trace(mode: str = "ddp", steps: int = 2, limit: int = 0, costs: ProfiledCosts | None = None) -> pd.DataFrame:
    graph = dp_graph("gpipe", mode, 2, 3)
    result = simulate(graph, costs or _truth(limit))
    parts, walls = [], {}
    for step in range(steps):
        for replica in (0, 1):
            df = result.trace.copy()
            df["rank"] += replica
            df[["start", "end"]] += step
            df["step"] = step
            parts.append(df)
        walls[str(step)] = result.makespan + STEP_OVERHEAD
    df = pd.concat(parts, ignore_index=True)
    df.attrs.update(source="real", schedule="gpipe", params={"pp": 1, "microbatches": 2, "chunks": 1},
                    step_times=walls, dp=2, dp_mode=mode)
    return df


@pytest.fixture
def profile(tmp_path):
    """The pair's profile: passes and collectives twice the truth (the self-calibration must not use them), the
    true factor."""
    path = tmp_path / "dp.json"
    path.write_text(json.dumps({
        "schema": PROFILE_SCHEMA, "partitions": [{"num_stages": 1, "stages": [
            {"stage": 0, "layers": [0, 2], "param_bytes": 3000, "F": 2 * F, "B": 2 * B, "I": 0.0, "W": 0.0,
             "OPTIM": 2 * OPTIM}]}],
        "collectives": {"all_reduce": {"alpha": 2 * ALPHA, "beta": None},
                        "reduce_scatter": {"alpha": 6 * ALPHA, "beta": None}, "all_gather": {"alpha": ALPHA, "beta": None}},
        "comm_slowdown": {"factor": FACTOR}}))
    return path


def test_self_calibration_takes_the_stretch_out_and_predicts_its_own_step(profile):
    """The last B ran 20 + 2 x 4 (1 - 1/1.5) ms with buckets 0 and 1 (ready 1/3 and 2/3 of the way through it)
    in service for 4 ms each; its work is 20 ms again."""
    df = _trace()
    raw = unslowed_passes([df], 1.0)["B"]
    assert sorted(raw)[-1] == pytest.approx(B + 2 * ALPHA * (1 - 1 / FACTOR), rel=1e-9)
    assert unslowed_passes([df], FACTOR)["B"] == pytest.approx([B] * len(raw), rel=1e-9)
    costs = dp_self_costs([df], profile)
    st = costs.stages[0]
    assert (st.f, st.b, st.optim) == (pytest.approx(F, rel=1e-9), pytest.approx(B, rel=1e-9),
                                      pytest.approx(OPTIM, rel=1e-9))
    assert (costs.task_overhead, costs.comm_slowdown) == (0.0, FACTOR)
    assert costs.step_overhead == pytest.approx(STEP_OVERHEAD, rel=1e-9)
    graph = dp_graph("gpipe", "ddp", 2, 3)
    truth = simulate(graph, _truth()).makespan + STEP_OVERHEAD
    assert predict(graph, costs) == pytest.approx(truth, rel=1e-9)


def test_zero2_self_calibration_takes_the_stretch_out_of_every_microbatchs_backward(profile):
    """zero2 reduce-scatters every microbatch's buckets (12 ms each) while its B runs: each B's work is 20 ms."""
    df = _trace("zero2")
    assert max(unslowed_passes([df], 1.0)["B"]) > B
    assert unslowed_passes([df], FACTOR)["B"] == pytest.approx([B] * 8, rel=1e-9)  # 2 microbatches x 2 ranks x 2
    costs = dp_self_costs([df], profile)
    graph = dp_graph("gpipe", "zero2", 2, 3)
    assert predict(graph, costs) == pytest.approx(simulate(graph, _truth()).makespan + STEP_OVERHEAD, rel=1e-9)


def test_a_zero2_runs_own_costs_do_not_charge_the_hook_twice(profile):
    """The profile's reduce-scatter hook (1 ms per 1000-byte bucket) is already in a zero2 trace's passes: its own
    costs leave it out and predict its step; a ddp run's costs (the grid's calibration) keep it for zero2's rows."""
    profile.write_text(json.dumps({**json.loads(profile.read_text()), "reduce_hook": {"ns_per_byte": 1000.0}}))
    own = dp_self_costs([_trace("zero2")], profile)
    assert own.reduce_hook_ns_per_byte == 0.0
    graph = dp_graph("gpipe", "zero2", 2, 3)
    assert predict(graph, own) == pytest.approx(simulate(graph, _truth()).makespan + STEP_OVERHEAD, rel=1e-9)
    assert dp_self_costs([_trace()], profile).reduce_hook_ns_per_byte == 1000.0


def test_a_local_sgd_runs_own_costs_do_not_charge_its_copies_twice(profile):
    """local-sgd's traced ALLREDUCE rows span torch's whole average_parameters (the copies included): its own costs
    drop the profile's local_sgd copy and keep decentralized's two; a ddp run's costs keep all three."""
    section = {"flatten_ns_per_byte": 1.0, "average_ns_per_byte": 2.0, "local_sgd_ns_per_byte": 3.0}
    profile.write_text(json.dumps({**json.loads(profile.read_text()), "param_copy": section}))
    assert dp_self_costs([_trace("local-sgd")], profile).param_copy == ParamCopy(1.0, 2.0, 0.0)
    assert dp_self_costs([_trace()], profile).param_copy == ParamCopy(1.0, 2.0, 3.0)


def test_waits_for_bounded_reduce_scatters_are_found_and_taken_out():
    """As the zero2 runtime records them (start = issue): with at most 2 in flight, the rank waits from the third's
    issue (2 ms) to the first's end (10 ms), and from the fourth's (12 ms) to the second's (20 ms). A B row over
    0-40 ms did 40 - 16 ms of work at full speed; at factor 2, with collectives in service the other 19 ms of it
    (35 ms in service, less the waits), 40 - 16 - 19 / 2 ms."""
    from analysis.validation.dp_calibration import blocked_spans

    rs = [(0.000, 0.010), (0.001, 0.020), (0.002, 0.030), (0.012, 0.035)]
    rows = [(0, "compute", "0B0", "B", 0.0, 0.040)] + [
        (0, "collective", f"0REDUCE_SCATTER0_b{k}", "REDUCE_SCATTER", s, e) for k, (s, e) in enumerate(rs)]
    df = pd.DataFrame(rows, columns=["rank", "stream", "action", "kind", "start", "end"])
    df.attrs.update(dp_mode="zero2")
    assert blocked_spans(df, 2) == {0: [(0.002, 0.010), (0.012, 0.020)]}
    assert blocked_spans(df, 0) == {} and blocked_spans(df, 4) == {}
    assert unslowed_passes([df], 1.0, 2)["B"] == pytest.approx([0.024], rel=1e-9)
    assert unslowed_passes([df], 2.0, 2)["B"] == pytest.approx([0.040 - 0.016 - 0.019 / 2], rel=1e-9)
    df.attrs.update(dp_mode="ddp")
    assert blocked_spans(df, 2) == {}


def test_replay_of_a_data_parallel_trace_is_exact_and_not_stretched_twice(profile):
    """Each step replayed with its own (already stretched) times is the step; a base model with the factor does
    not stretch them again."""
    from sim.costs.calibrated import from_trace
    from sim.replay import replay

    median, p90 = dp_replay_error([_trace()], profile)
    assert abs(median) < 1e-9 and p90 < 1e-9
    df = _trace()
    base = replace(from_trace(df), collectives=_truth().collectives, comm_slowdown=FACTOR)
    assert [abs(s.error) < 1e-9 for s in replay(df, base)] == [True, True]


def test_a_trace_whose_collectives_are_not_the_graphs_has_no_replay(profile):
    df = _trace()
    extra = df[(df["action"] == "0ALLREDUCE_b0") & (df["rank"] == 0)].copy()
    extra["action"] = "0ALL_GATHER_b0"  # as zero3's runtime adds gathers the IR does not have
    bad = pd.concat([df, extra], ignore_index=True)
    bad.attrs.update(df.attrs)
    assert dp_replay_error([bad], profile) == (None, None)


def _validate_sim():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / "validate_sim.py"
    spec = importlib.util.spec_from_file_location("validate_sim_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_VALID = "ddp,sync,zero1,zero2,zero3,ps,decentralized,local-sgd,ddp+int8,ddp+fp16,ddp+bf16,ddp+powersgd:4,async-ps"


@pytest.mark.parametrize(("flags", "message"), [
    (["--dp-modes", "ddp,zero9"], f"--dp-modes zero9: give comma-separated modes of {_VALID} (or --no-dp)"),
    (["--dp-modes", ","], f"--dp-modes '': give comma-separated modes of {_VALID} (or --no-dp)"),
    (["--dp-modes", "ddp+int4"], f"--dp-modes ddp+int4: give comma-separated modes of {_VALID} (or --no-dp)"),
])
def test_validate_sim_refuses_a_bad_dp_mode_before_anything_runs(flags, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        _validate_sim().main([*flags, "--tiny", "--out", str(tmp_path / "v")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err.splitlines() == [f"error: python experiments/validate_sim.py: {message} "
                                                        "(see --help)"]
    assert not (tmp_path / "v").exists()


def test_validate_sim_page_takes_the_data_parallel_rows_apart():
    from analysis.validation.scores import noise_verdict, score_grid
    from tests.test_validation_scores import GRID

    rows = [*GRID[:3], {**GRID[3], "schedule": "dp2-zero2", "self_error": -0.02, "replay_error": 0.01,
                        "without": {"send_cpu": 0.14, "comm_slowdown": 0.15}}]
    s = score_grid(rows)
    summary = {"schedules": rows, **s, "noise_verdict": noise_verdict(0.01, (0, 0, 0), (0, 0, 0), 0.05, 0.0),
               "calibrated_from": {"warnings": []}, "grid": {"dp_pair": ["dp2-zero2"]}, "seconds": 1.0,
               "comm_slowdown": 1.25}
    text = "\n\n".join(_validate_sim().sections(summary))
    assert ("| out-of-sample data-parallel rows | mean abs error |\n|---|---:|\n| all | 30.0% |\n"
            "| without send_cpu | 30.0% |\n| without comm_slowdown | 25.0% |") in text
    assert ("| out-of-sample data-parallel rows, taken apart | mean abs error |\n|---|---:|\n| replay | 1.0% |\n"
            "| self_calibrated | 2.0% |\n| transferred | 30.0% |\n") in text
    assert ("Compute slowed by concurrent communication (comm_slowdown, measured by the data-parallel profile): "
            "x1.250 while a bucket's collective is in flight.") in text


def test_grid_row_of_a_data_parallel_mode_is_taken_apart(profile, tmp_path):
    """dp_row on the known trace (measured = its true step): self-calibrated and replay errors 0; switching
    comm_slowdown off predicts less time (the passes no longer stretch)."""
    pytest.importorskip("torch")
    from analysis.validation.calibration import Calibration, grid_rows
    from real.measure import Measured
    from schedules import load_graph, validate
    from schedules.trace import write_trace
    from tests.test_calibrate import _as_recorded, _profile_file
    from tests.test_calibrate import _costs as pipeline_costs

    pipe = _as_recorded(simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), pipeline_costs(1.0)).trace,
                        1.0, 0, 0.0)
    pipe.attrs.update(source="real", schedule="1f1b", params={"pp": 2, "microbatches": 4, "chunks": 1},
                      step_times={"0": 1.0}, dp=1)
    cal = Calibration.of(_profile_file(tmp_path), [str(write_trace(pipe, tmp_path / "1f1b.csv"))], profile)
    graph = dp_graph("gpipe", "ddp", 2, 3)
    truth = simulate(graph, _truth()).makespan + STEP_OVERHEAD
    key = ("dp2-ddp", 2)
    measured = {key: Measured(None, truth, (truth * 0.99, truth * 1.01), (truth, truth), ((truth,), (truth,)),
                              (0.0, 0.0), (str(write_trace(_trace(), tmp_path / "ddp.csv")),))}
    (row,) = grid_rows(measured, {key: graph}, cal, ("1f1b", 4), [key])
    assert (row["kind"], row["in_sample"]) == ("data-parallel", False)
    assert abs(row["self_error"]) < 1e-9 and abs(row["replay_error"]) < 1e-9
    assert set(row["without"]) == {"send_cpu", "task_overhead", "step_overhead", "comm_slowdown", "max_inflight",
                                   "comm_stall", "reduce_hook", "skew"}
    assert row["without"]["reduce_hook"] == row["predicted_step_time"]  # ddp: no per-microbatch hook to charge
    assert row["without"]["comm_slowdown"] < row["predicted_step_time"]


def test_task_gaps_leave_out_the_waits_for_collectives():
    """Gaps after 0F0 (1 ms) and 0F1 (3 ms, in which a gather ended: a wait) and 0B0 (1 ms): the executor's gaps
    are the two 1 ms ones; rank 1's rows are its own."""
    from analysis.validation.dp_calibration import task_gaps

    rows = [(0, "compute", "0F0", 0.000, 0.010), (0, "compute", "0F1", 0.011, 0.020),
            (0, "collective", "0ALL_GATHER_b0", 0.012, 0.022), (0, "compute", "0B0", 0.023, 0.040),
            (0, "compute", "0OPTIM", 0.041, 0.045), (1, "collective", "0ALL_GATHER_b0", 0.040, 0.0405)]
    df = pd.DataFrame(rows, columns=["rank", "stream", "action", "start", "end"])
    assert task_gaps([df]) == pytest.approx([0.001, 0.001], rel=1e-9)


def test_zero3_rows_gather_on_demand_as_the_runtime_does_at_one_stage():
    """Each pass's gathers are issued when the pass before it ends (prefetch 0), not a pass ahead."""
    graph = dp_graph("gpipe", "zero3", 2, 1)
    tasks = graph.tasks
    compute = [t.id for t in tasks if t.stream.value == "compute" and t.action.kind.value in ("F", "B")]
    for prev, nxt in itertools.pairwise(compute):
        (gather,) = [d for d in tasks[nxt].deps if tasks[d].stream.value == "collective"]
        assert tasks[gather].deps == (prev,)


def test_validate_sim_page_shows_zero2_before_and_after_the_hook():
    """The table of the rows that charge the reduce-scatter hook: measured / without it -> with it, per part (ms)."""
    from analysis.validation.dp_transfer import PARTS

    def parts(x: float) -> dict[str, float]:
        return {**dict.fromkeys(PARTS, x / 1e3), "step": 6 * x / 1e3}

    row = {"schedule": "dp2-zero2", "microbatches": 4,
           "parts": {"measured": parts(3.0), "without_reduce_hook": parts(1.0), "predicted": parts(2.0)}}
    lines = _validate_sim()._hook_table({"schedules": [{"schedule": "dp2-ddp", "parts": {}}, row],
                                         "reduce_hook_ns_per_byte": 0.625})
    assert lines == [
        "The reduce-scatter hook of zero2/zero3 (measured by the data-parallel profile: 0.625 ns per gradient byte, "
        "per bucket per microbatch, on the pass that completes the bucket), each step taken apart (ms): measured / "
        "predicted without the hook -> with it (docs/validation-protocol.md).",
        "| row | m | forward | backward | optimizer | skew | exposed | overhead | step |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        "| dp2-zero2 | 4 | " + " | ".join(["3.0 / 1.0 -> 2.0"] * 6) + " | 18.0 / 6.0 -> 12.0 |"]


def test_the_grid_page_says_how_often_the_host_was_slow():
    machine_line = _validate_sim()._machine_line
    rows = [{"slowdown": 1.04, "reruns": 2}, {"slowdown": 1.09, "reruns": 0}, {"slowdown": 1.02, "reruns": 1}]
    assert machine_line({"schedules": rows, "grid": {"rounds": 5, "max_slow": 0.1}}) == [
        "The machine's speed, by a probe timed on each rank before and after every run (real.rounds): 3 run(s) "
        "made again of 15 kept (other processes' load, or the host slower than its fastest by over 10.0%); the "
        "slowest kept run's probe: x1.09."]
    assert machine_line({"schedules": [{"error": 0.1}], "grid": {"rounds": 5}}) == []  # a grid before the probe
