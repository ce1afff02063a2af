"""Calibration from a real trace, replay, and the measurement protocol.

The exact tests build "real" traces from the simulator itself, recorded the
way the runtime records them: a compute row covers only the pass (the
executor's gap and a message's posting follow it), a receive row runs from the
moment the rank waits (the end of its previous task) to the arrival. So
every figure the calibration reads has a known true value.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from schedules import CostFileError, Kind, load_graph, validate
from schedules.trace import work_span
from sim import simulate
from sim.costs.calibrated import from_trace, trace_calibration
from sim.costs.profiled import PROFILE_SCHEMA, ProfiledCosts, StageCosts, step_time
from sim.replay import replay
from tests.conftest import run_sim

PASSES = {0: {"F": 0.010, "B": 0.020}, 1: {"F": 0.011, "B": 0.024}}
ALPHA, OVERHEAD, SEND_CPU = 0.001, 0.0002, 0.0005


def _costs(scale: float) -> ProfiledCosts:
    return ProfiledCosts(stages=tuple(StageCosts(f=PASSES[s]["F"] * scale, b=PASSES[s]["B"] * scale, i=0.0, w=0.0)
                                      for s in (0, 1)),
                         activation_bytes=4096, p2p_alpha=ALPHA, task_overhead=OVERHEAD, send_cpu=SEND_CPU)


def _as_recorded(sim_trace: pd.DataFrame, scale: float, step: int, offset: float) -> pd.DataFrame:
    """A simulated step as the runtime records it (see the module doc), shifted by ``offset`` seconds."""
    df = sim_trace.sort_values(["rank", "start"], kind="stable").reset_index(drop=True)
    starts, ends, nbytes = list(df["start"]), list(df["end"]), list(df["bytes"])
    order = sorted(range(len(df)), key=lambda i: (df["rank"][i], starts[i], df["stream"][i] == "compute"))
    free: dict[int, float] = {}
    body: dict[tuple[int, float], float] = {}  # (rank, simulated end) -> the pass's own end
    for i in order:
        rank, stream = df["rank"][i], df["stream"][i]
        if stream == "compute":
            free[rank] = ends[i]  # the task, its posts and the executor's gap end here
            body[(rank, ends[i])] = ends[i] = starts[i] + PASSES[df["stage"][i]][df["kind"][i]] * scale
        elif stream == "send":  # posted as soon as the pass ends
            starts[i] = body[(rank, starts[i])]
        elif stream == "recv":
            starts[i] = min(free.get(rank, 0.0), ends[i])
            ends[i] = max(ends[i], starts[i])
            nbytes[i] = 4096.0
    df["start"] = [s + offset for s in starts]
    df["end"] = [e + offset for e in ends]
    df["bytes"] = nbytes
    df["step"] = step
    return df


SCALES = (1.0, 1.2, 0.8)  # three steps; the mean (and median) of each pass is the unscaled one


@pytest.fixture
def recorded() -> pd.DataFrame:
    graph = validate(load_graph("1f1b", pp=2, microbatches=4))
    parts, walls = [], {}
    for k, scale in enumerate(SCALES):
        result = simulate(graph, _costs(scale))
        parts.append(_as_recorded(result.trace, scale, k, offset=k))
        walls[str(k)] = result.makespan + 0.003 * (k + 1)  # step overheads 3, 6, 9 ms: median 6
    df = pd.concat(parts, ignore_index=True)
    df.attrs.update(source="real", schedule="1f1b", params={"pp": 2, "microbatches": 4, "chunks": 1},
                    step_times=walls, dp=1)
    return df


def test_trace_calibration_recovers_every_parameter(recorded):
    cal = trace_calibration(recorded)
    assert cal.num_stages == 2 and cal.steps == 3 and cal.activation_bytes == 4096
    assert cal.passes == {k: pytest.approx(v, rel=1e-9) for k, v in
                          {(0, "B"): 0.020, (0, "F"): 0.010, (1, "B"): 0.024, (1, "F"): 0.011}.items()}
    assert cal.latency == pytest.approx(ALPHA, rel=1e-9)
    assert cal.task_overhead == pytest.approx(OVERHEAD, rel=1e-9)
    assert cal.send_cpu == pytest.approx(SEND_CPU, rel=1e-9)
    assert cal.step_overhead == pytest.approx(0.006, rel=1e-9)


def test_calibrated_model_predicts_the_runs_it_came_from(recorded):
    """Round trip: the trace's model predicts the unscaled costs' step time, and other microbatch counts too."""
    costs = from_trace(recorded)
    assert costs.missing == ("I", "W")
    for m in (4, 8):
        graph = validate(load_graph("1f1b", pp=2, microbatches=m))
        truth = simulate(graph, _costs(1.0))
        predicted = simulate(graph, costs)
        assert predicted.makespan == pytest.approx(truth.makespan, rel=1e-9)
        assert step_time(predicted, costs) == pytest.approx(truth.makespan + 0.006, rel=1e-9)
    with pytest.raises(CostFileError, match="no measurement of I, W passes, which schedule 'zb-h1' runs"):
        simulate(validate(load_graph("zb-h1", pp=2, microbatches=4)), costs)
    with pytest.raises(CostFileError, match="the trace runs 2 stages, the schedule 4; give a profile"):
        from_trace(recorded, num_stages=4)


def test_replay_is_exact_on_a_consistent_trace(recorded):
    steps = replay(recorded)
    assert [s.step for s in steps] == [0, 1, 2]
    for s, scale in zip(steps, SCALES, strict=True):
        truth = simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), _costs(scale)).makespan
        assert s.measured_span == pytest.approx(truth - OVERHEAD, rel=1e-9)  # ends with the last pass's body
        assert s.predicted_span == pytest.approx(s.measured_span, rel=1e-9) and abs(s.error) < 1e-9


def test_a_slower_message_in_one_step_is_replayed(recorded):
    """Replay uses each step's own waits: a message that arrived 5 ms late is replayed 5 ms late."""
    df = recorded.copy()
    late = (df["step"] == 1) & (df["action"] == "0RECV_B3")
    df.loc[late, "end"] += 0.005
    df.loc[(df["step"] == 1) & (df["action"] == "0B3"), ["start", "end"]] += 0.005
    step1 = replay(df)[1]
    assert step1.measured_span == pytest.approx(replay(recorded)[1].measured_span + 0.005, rel=1e-9)
    assert abs(step1.error) < 1e-9


def test_an_early_receive_is_no_work(recorded):
    """A rank that starts its step 2 ms early and posts a receive waits: no part of the programs' span, so the
    replay and the step overhead are as if it had posted the receive with the others."""
    df = recorded.copy()
    early = (df["step"] == 2) & (df["stream"] == "recv") & (df["action"] == "1RECV_F0")
    df.loc[early, "start"] -= 0.002
    part = df[df["step"] == 2]
    assert work_span(part) == pytest.approx(float(part["end"].max() - part["start"].min()) - 0.002, rel=1e-9)
    assert [s.measured_span for s in replay(df)] == pytest.approx([s.measured_span for s in replay(recorded)])
    assert abs(replay(df)[2].error) < 1e-9
    assert trace_calibration(df).step_overhead == pytest.approx(0.006, rel=1e-9)


def _profile_file(tmp_path):
    def stage(s, n, f, b):
        return {"stage": s, "layers": [s, s + 1], "F": f, "B": b, "I": b * 0.6, "W": b * 0.5}
    data = {"schema": PROFILE_SCHEMA, "activation_bytes": 4096, "p2p": {"alpha": 0.002, "beta": None},
            "partitions": [{"num_stages": 2, "stages": [stage(0, 2, 0.005, 0.010), stage(1, 2, 0.005, 0.012)]},
                           {"num_stages": 4, "stages": [stage(s, 4, 0.002 + 0.001 * s, 0.004 + 0.001 * s)
                                                        for s in range(4)]}]}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(data))
    return path


def test_other_stage_counts_and_passes_scale_from_the_profile(recorded, tmp_path):
    """The trace ran F 0.021 s and B 0.044 s over its two stages where the profile has 0.010 and 0.022: every
    pass of the profile is scaled by 2.1 (F) or 2 (B; I and W as B); the 2-stage passes the trace has are its own."""
    profile = _profile_file(tmp_path)
    four = from_trace(recorded, profile, num_stages=4)
    for s in range(4):
        st = four.stages[s]
        f, b = 0.002 + 0.001 * s, 0.004 + 0.001 * s
        assert (st.f, st.b, st.i, st.w) == pytest.approx((f * 2.1, b * 2.0, b * 0.6 * 2.0, b * 0.5 * 2.0), rel=1e-9)
    assert four.missing == () and four.p2p_alpha == pytest.approx(ALPHA) and math.isinf(four.p2p_beta)
    two = from_trace(recorded, profile)
    assert (two.stages[1].f, two.stages[1].b, two.stages[1].i) == pytest.approx((0.011, 0.024, 0.012 * 0.6 * 2.0))


def test_cli_costs_from_a_trace(recorded, tmp_path, capsys):
    from schedules.trace import write_trace

    path = write_trace(recorded, tmp_path / "run.csv")
    code, out, err = run_sim(capsys, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs", str(path),
                             "--json")
    assert code == 0, err
    d = json.loads(out)
    truth = simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), _costs(1.0)).makespan
    assert d["step_time"] == pytest.approx(truth + 0.006, rel=1e-9) and d["costs"]["send_cpu"] == pytest.approx(SEND_CPU)
    code, out, err = run_sim(capsys, "--schedule", "zb-v", "--pp", "2", "--microbatches", "4", "--costs", str(path),
                             "--costs-profile", str(_profile_file(tmp_path)), "--json")
    assert code == 0, err
    assert json.loads(out)["stages"] == 4
    code, out, err = run_sim(capsys, "--schedule", "zb-v", "--pp", "2", "--microbatches", "4", "--costs", str(path))
    assert code == 2 and "the trace runs 2 stages, the schedule 4" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_sim(capsys, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs-profile",
                             "p.json")
    assert code == 2 and "--costs-profile scales a real trace given as --costs" in err


def test_send_cpu_delays_the_producer_only():
    """send_cpu is added once per message to the compute task that produced it: 1F1B m=1 at pp=2 has one
    forward and one backward message, so the makespan grows by exactly 2 x send_cpu."""
    graph = validate(load_graph("1f1b", pp=2, microbatches=1))
    base = ProfiledCosts(stages=(StageCosts(f=1.0, b=2.0, i=1.0, w=1.0),) * 2, p2p_alpha=0.1)
    with_cpu = ProfiledCosts(stages=base.stages, p2p_alpha=0.1, send_cpu=0.25)
    assert simulate(graph, with_cpu).makespan == pytest.approx(simulate(graph, base).makespan + 0.5)
    durations = with_cpu.durations(graph)
    producers = {str(t.action) for t in graph.tasks if durations[t.id] != base.durations(graph)[t.id]}
    assert producers == {"0F0", "1B0"}
    assert all(t.action.kind in (Kind.F, Kind.B) for t in graph.tasks if str(t.action) in producers)


@pytest.mark.slow
@pytest.mark.timeout(90)  # real runs, with room for 2 busy cores
def test_protocol_runs_configs_interleaved_and_traces_every_step(tmp_path):
    """Two configs x 2 rounds in one torchrun group: per round the measured steps, their median, every step traced;
    the traces calibrate a model and replay."""
    from real import ModelConfig, RunConfig
    from real.measure import measure_interleaved
    from schedules.trace import read_trace, trace_steps

    model = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=32, seq=8)
    cfgs = [RunConfig.of(schedule=s, pp=2, microbatches=4, batch_size=8, model=model, backend="gloo")
            for s in ("1f1b", "zb-h1")]
    seen = []
    out = measure_interleaved(cfgs, rounds=2, steps=3, warmup=1, trace_dir=str(tmp_path), max_foreign=100.0,
                              timeout=80, on_run=lambda *x: seen.append(x))
    assert [m.config.layout.schedule for m in out] == ["1f1b", "zb-h1"]
    assert seen == [(1, 4, "round 1: 1f1b pp=2 m=4"), (2, 4, "round 1: zb-h1 pp=2 m=4"),
                    (3, 4, "round 2: 1f1b pp=2 m=4"), (4, 4, "round 2: zb-h1 pp=2 m=4")]  # the progress line's feed: each run as it finishes
    for m in out:
        assert len(m.step_times) == 2 and all(len(t) == 3 for t in m.step_times)
        medians = sorted(sorted(t)[1] for t in m.step_times)
        assert list(m.round_medians) == [sorted(t)[1] for t in m.step_times]
        assert m.step_time == pytest.approx(sum(medians) / 2) and m.spread[0] <= m.step_time <= m.spread[1]
        assert len(m.traces) == 2
        for path in m.traces:
            df = read_trace(path)
            assert list(trace_steps(df)) == [1, 2, 3] and sorted(df.attrs["step_times"]) == ["1", "2", "3"]
    costs = from_trace(list(out[1].traces))
    assert costs.missing == ("B",) and all(s.f > 0 and s.i > 0 and s.w > 0 for s in costs.stages)  # zb-h1 splits B
    assert all(math.isfinite(s.error) for s in replay(out[0].traces[0]))


def test_protocol_rejects_bad_input_before_running():
    from real import RunConfig
    from real.measure import measure_interleaved
    from schedules import ConfigError

    one = RunConfig.of(schedule="1f1b", pp=2, microbatches=4, batch_size=8)
    two = RunConfig.of(schedule="1f1b", pp=2, dp=2, microbatches=4, batch_size=16)
    with pytest.raises(ConfigError, match=r"world sizes \[2, 4\] cannot share one process group"):
        measure_interleaved([one, two])
    with pytest.raises(ConfigError, match="rounds must be an integer >= 1, got 0"):
        measure_interleaved([one], rounds=0)
    with pytest.raises(ConfigError, match="no configurations to measure"):
        measure_interleaved([])


def test_traces_of_different_runs_do_not_mix(recorded):
    other = recorded.copy()
    other.attrs.update(recorded.attrs)
    other.attrs["params"] = {"pp": 2, "microbatches": 8, "chunks": 1}
    with pytest.raises(CostFileError, match="ran 2 different configurations"):
        trace_calibration([recorded, other])
    sim_trace = recorded.copy()
    sim_trace.attrs.update(recorded.attrs, source="sim")
    with pytest.raises(CostFileError, match="is not a real run's trace"):
        trace_calibration(sim_trace)


@pytest.mark.parametrize("mode,makespan", [
    # F 0-1, B 1-3; ddp: bucket 0 ready half-way through B (2.0) and all-reduced 2.0-2.6, bucket 1 at B's end
    # 3.0-3.6 (one link per rank), OPTIM 3.6-3.85. sync: both buckets after B, 3.0-3.6-4.2, OPTIM 4.2-4.45.
    ("ddp", 3.85), ("sync", 4.45)])
def test_data_parallel_buckets_overlap_as_the_runtime_does(mode, makespan):
    from schedules import build, lower
    from schedules.dp.modes import add_data_parallel

    graph = validate(add_data_parallel(lower(build("gpipe", pp=1, microbatches=1)), mode, [2]))
    costs = ProfiledCosts(stages=(StageCosts(f=1.0, b=2.0, i=1.0, w=1.0, optim=0.25, param_bytes=1000),),
                          collectives=(("all_reduce", 0.1, 1000.0),))
    result = simulate(graph, costs)
    assert result.makespan == pytest.approx(makespan)
    assert sorted(b for b in result.bytes_moved if b) == [500.0, 500.0]


def test_a_finer_partition_shares_each_traced_stage_as_the_profile_does(recorded, tmp_path):
    """The traced run's stages hold layers 0-3 and 4-7; the profile's 4-stage partition splits each in two. Each
    traced stage's in-run time is shared in the profile's proportions (its own speed cancels), and I and W
    take their profiled share of the traced B."""
    df = recorded.copy()
    df.attrs.update(recorded.attrs, layers_per_stage=[4, 4])

    def stage(s, first, stop, f, b, i, w):
        return {"stage": s, "layers": [first, stop], "F": f, "B": b, "I": i, "W": w}
    data = {"schema": PROFILE_SCHEMA, "activation_bytes": 4096, "p2p": {"alpha": 0.002, "beta": None},
            "partitions": [{"num_stages": 2, "stages": [stage(0, 0, 4, 9.0, 9.0, 9.0, 9.0),
                                                        stage(1, 4, 8, 9.0, 9.0, 9.0, 9.0)]},
                           {"num_stages": 4, "stages": [stage(0, 0, 2, 1.0, 2.0, 0.5, 2.0),
                                                        stage(1, 2, 4, 3.0, 6.0, 4.0, 3.0),
                                                        stage(2, 4, 6, 2.0, 3.0, 2.0, 2.0),
                                                        stage(3, 6, 8, 2.0, 1.0, 1.0, 1.0)]}]}
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(data))
    four = from_trace(df, profile, num_stages=4)
    f0, b0, f1, b1 = 0.010, 0.020, 0.011, 0.024  # the traced stages' medians
    expected = [(f0 / 4, b0 / 4, b0 * 0.5 / 8, b0 * 2 / 8), (f0 * 3 / 4, b0 * 6 / 8, b0 * 4 / 8, b0 * 3 / 8),
                (f1 / 2, b1 * 3 / 4, b1 * 2 / 4, b1 * 2 / 4), (f1 / 2, b1 / 4, b1 / 4, b1 / 4)]
    for st, (f, b, i, w) in zip(four.stages, expected, strict=True):
        assert (st.f, st.b, st.i, st.w) == pytest.approx((f, b, i, w), rel=1e-12)
    same = from_trace(df, profile)  # the same partition: the trace's own passes, I and W as B's share
    assert (same.stages[0].f, same.stages[0].b, same.stages[0].i) == pytest.approx((f0, b0, b0))


# -- guesses the user must see: warnings naming the field, never a silent 0 -------------------------------------

WHY_NO_LATENCY = "p2p_alpha: no receive in the trace waited for its message, so the trace times no message"
NO_IW = ("stages[].i/w: no time for stage 0 I, stage 0 W, stage 1 I, stage 1 W in the trace; a graph that runs I/W "
         "passes is refused (calibrate from a run that has them, or give a profile)")


def test_a_trace_where_no_receive_waited_times_no_message(recorded, tmp_path):
    """Every message arrived before its receiver waited: the trace has no latency to fit. Without a profile the
    costs time no message (a graph that sends is refused); with one, the profile's p2p fit is used. Either way
    a warning says so (the latency was 0 before, and the simulation ran on it)."""
    df = recorded.copy()
    recv = df["stream"] == "recv"
    df.loc[recv, "start"] = df.loc[recv, "end"]
    assert trace_calibration(df).latency is None
    costs = from_trace(df)
    assert costs.p2p_measured is False
    assert costs.warnings == (NO_IW, f"{WHY_NO_LATENCY}; a graph that sends messages is refused (give a profile "
                                     "with p2p, real.profile)")
    assert costs.describe()["warnings"] == list(costs.warnings)
    with pytest.raises(CostFileError, match=r"has no p2p timing .* but schedule '1f1b' sends 8 messages"):
        simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), costs)
    scaled = from_trace(df, _profile_file(tmp_path))
    assert (scaled.p2p_measured, scaled.p2p_alpha, scaled.warnings) == (
        True, 0.002, (f"{WHY_NO_LATENCY}; the profile's p2p fit is used (alpha 0.002 s)",))


def test_a_pass_one_stage_lacks_is_refused_or_scaled_never_zero(recorded, tmp_path):
    """Stage 1's B rows gone: without a profile B (and I, W) are missing, so 1F1B is refused (it ran on B = 0
    before, with ``missing`` empty); with one, stage 1's B is its profiled 0.012 s scaled by the in-run/profiled
    ratio of the stage that has B (0.020 / 0.010; it was diluted by the absent stage to 0.020 / 0.022)."""
    df = recorded[~((recorded["stage"] == 1) & (recorded["kind"] == "B") & (recorded["stream"] == "compute"))]
    df.attrs = dict(recorded.attrs)
    costs = from_trace(df)
    assert (costs.missing, costs.stages[1].b) == (("B", "I", "W"), 0.0)
    assert costs.warnings[0] == ("stages[].b/i/w: no time for stage 0 I, stage 0 W, stage 1 B, stage 1 I, stage 1 W "
                                 "in the trace; a graph that runs B/I/W passes is refused (calibrate from a run that "
                                 "has them, or give a profile)")
    with pytest.raises(CostFileError, match="no measurement of B passes, which schedule '1f1b' runs"):
        simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), costs)
    scaled = from_trace(df, _profile_file(tmp_path))
    assert scaled.missing == () and scaled.stages[1].b == pytest.approx(0.012 * 2.0, rel=1e-9)


def test_profile_fit_guesses_are_warnings_in_the_cost_file(recorded, tmp_path, caplog):
    """real.profile's alpha/beta fit names each guess; the cost file keeps them under "warnings"; loading it
    logs them and the costs carry them (into every result's "costs")."""
    import logging

    from real.profile.comm import _fit_alpha_beta, fit_warnings
    from sim.costs.cost_file import load_profile

    with caplog.at_level(logging.WARNING, logger="real.profile"):
        alpha, beta, warned = _fit_alpha_beta([1e3, 2e3], [1e-5, 3e-5], "collectives.all_reduce")
    assert (alpha, beta) == (0.0, pytest.approx(5e7))
    assert warned == ["collectives.all_reduce.alpha: the fit's intercept is negative (-1e-05 s over 2 size(s), "
                      "1000-2000 bytes, 1e-05-3e-05 s); taken as 0"]
    assert caplog.messages == ["profile: " + warned[0]]
    assert _fit_alpha_beta([1e3, 2e3], [1e-5, 2e-5], "p2p")[2] == []
    colls = {"all_reduce": {"warnings": ["collectives.all_reduce.beta: y"],
                            "single": {"warnings": ["collectives.all_reduce.single.alpha: z"]},
                            "small": {"warnings": ["collectives.all_reduce.small.beta: w"]}},
             "all_gather": {"single": {}}}
    assert fit_warnings({"warnings": ["p2p.beta: x"]}, colls) == [
        "p2p.beta: x", "collectives.all_reduce.beta: y", "collectives.all_reduce.single.alpha: z",
        "collectives.all_reduce.small.beta: w"]
    assert fit_warnings(None, None) == []
    data = json.loads(_profile_file(tmp_path).read_text())
    data["warnings"] = ["p2p.beta: x"]
    path = tmp_path / "warned.json"
    path.write_text(json.dumps(data))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sim.costs.profiled"):
        costs = load_profile(path, 2)
    assert costs.warnings == ("p2p.beta: x",) and costs.describe()["warnings"] == ["p2p.beta: x"]
    assert caplog.messages == [f"cost file {str(path)!r}: p2p.beta: x"]
    assert from_trace(recorded, path).warnings[0] == "p2p.beta: x"  # a calibration keeps its profile's
    data["warnings"] = "p2p.beta: x"
    path.write_text(json.dumps(data))
    with pytest.raises(CostFileError, match=r"warnings must be a list of strings \(the profiler's guesses\), got"):
        load_profile(path, 2)


def test_the_calibration_protocol_library(recorded, tmp_path):
    """analysis.validation.calibration on a known trace: the in-run/profiled ratios (F 0.021 / 0.010, B 0.044 / 0.022), the
    data-parallel pair's profile scaled by them, and grid rows labelled by kind and sample."""
    pytest.importorskip("torch")
    from analysis.validation.calibration import Calibration, grid_rows, predict
    from real.measure import Measured
    from schedules.trace import write_trace

    dp = tmp_path / "dp.json"
    dp.write_text(json.dumps({"schema": PROFILE_SCHEMA, "activation_bytes": 4096, "p2p": None, "partitions": [
        {"num_stages": 1, "stages": [{"stage": 0, "F": 0.1, "B": 0.2, "I": 0.12, "W": 0.1, "OPTIM": 0.01}]}]}))
    path = write_trace(recorded, tmp_path / "run.csv")
    cal = Calibration.of(_profile_file(tmp_path), [str(path)], dp)
    assert cal.ratios() == pytest.approx({"F": 2.1, "B": 2.0}, rel=1e-9)
    st = cal.data_parallel().stages[0]
    assert (st.f, st.b, st.i, st.w) == pytest.approx((0.21, 0.4, 0.12, 0.1), rel=1e-9)
    assert (cal.data_parallel().send_cpu, cal.data_parallel(send_cpu=0.0).send_cpu) == (pytest.approx(SEND_CPU), 0.0)
    graphs = {(s, 4): validate(load_graph(s, pp=2, microbatches=4)) for s in ("1f1b", "gpipe")}
    truth = predict(graphs[("1f1b", 4)], cal.pipeline(2))
    measured = {k: Measured(None, truth, (truth * 0.99, truth * 1.01), (truth, truth), ((truth,), (truth,)), (0.0, 0.0),
                            (str(path),)) for k in graphs}
    rows = grid_rows(measured, graphs, cal, ("1f1b", 4))
    assert [(r["schedule"], r["kind"], r["in_sample"]) for r in rows] == [("1f1b", "pipeline", True),
                                                                          ("gpipe", "pipeline", False)]
    assert rows[0]["error"] == pytest.approx(0.0, abs=1e-12) and rows[0]["half_difference"] == 0.0
    assert cal.describe()["warnings"] == [] and cal.warnings() == []
