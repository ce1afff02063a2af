"""The validation grid's rows of ps, decentralized, local-sgd and ddp with a gradient codec (analysis.validation.dp_modes).

As in tests/test_dp_grid.py, the "real" traces are the simulator's own under known costs, so every figure read
back from them has a known true value.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.validation.calibration import dp_graph, predict
from analysis.validation.dp_modes import (
    amortized_measured,
    codec_costs,
    codec_ns,
    local_graph,
    percentile,
    predict_mode,
    split_mode,
    split_steps,
)
from schedules import Kind
from schedules.formats import PROFILE_SCHEMA
from sim import simulate
from sim.costs.profiled import ProfiledCosts, StageCosts

F, B, OPTIM, ALPHA, BETA, STEP_OVERHEAD = 0.010, 0.020, 0.003, 0.004, 4e6, 0.002
PARAM_BYTES = 12000  # 3 buckets of 1000 float32 gradients


def _costs(beta: float = math.inf) -> ProfiledCosts:
    return ProfiledCosts(stages=(StageCosts(f=F, b=B, i=0.0, w=0.0, optim=OPTIM, param_bytes=PARAM_BYTES),),
                         collectives=(("all_reduce", ALPHA, beta), ("reduce_scatter", 3 * ALPHA, beta),
                                      ("all_gather", ALPHA / 2, beta)), step_overhead=STEP_OVERHEAD)


def test_split_mode_and_codec_costs_charge_the_codecs_bytes_and_time():
    """int8 over 2 ranks: 1000 one-byte elements + 2 four-byte scales = 1008 of 4000 bytes; 50 ns per element
    is 50 us more latency; the all-gather (no gradient) is untouched. fp16: half the bytes."""
    assert split_mode("ddp+int8") == ("ddp", "int8") and split_mode("local-sgd") == ("local-sgd", "none")
    got = codec_costs(_costs(BETA), "int8", 50.0, 3).collectives
    assert got == (("all_reduce", pytest.approx(ALPHA + 50e-6, rel=1e-12), pytest.approx(BETA / 0.252, rel=1e-12)),
                   ("reduce_scatter", pytest.approx(3 * ALPHA + 50e-6, rel=1e-12),
                    pytest.approx(BETA / 0.252, rel=1e-12)), ("all_gather", ALPHA / 2, BETA))
    assert codec_costs(_costs(BETA), "fp16", 0.0, 3).collectives[0] == ("all_reduce", ALPHA, BETA / 0.5)
    assert codec_costs(_costs(BETA), "none", 50.0, 3) == _costs(BETA)


def test_a_codec_rows_prediction_is_ddps_with_the_codec_and_the_profiles_codec_time(tmp_path):
    """ddp's last bucket all-reduce is exposed after the last B: 1000 elements x 4 B / BETA = 1 ms uncompressed,
    fp16 0.5 ms plus 1000 x 100 ns = 0.1 ms of codec: the step is 0.4 ms shorter (the buckets before it
    overlap the B)."""
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"codecs": {"fp16": 100.0, "int8": 250.0}}))
    assert (codec_ns(path, "fp16"), codec_ns(path, "powersgd:1")) == (100.0, 0.0)
    graph = dp_graph("gpipe", "ddp+fp16", 2, 3)
    assert graph.plan.mode == "ddp"
    plain = predict_mode("ddp", graph, _costs(BETA), path)["step"]
    assert plain == pytest.approx(predict(graph, _costs(BETA)), rel=1e-12)
    fp16 = predict_mode("ddp+fp16", graph, _costs(BETA), path)["step"]
    assert fp16 == pytest.approx(predict(graph, codec_costs(_costs(BETA), "fp16", 100.0, 3)), rel=1e-12)
    assert plain - fp16 == pytest.approx(0.001 - 0.0006, rel=1e-9)
    assert predict_mode("ddp+fp16", graph, _costs(BETA), path, measured_collectives=True)["step"] == plain


def test_local_sgd_is_predicted_per_step_amortized_over_k():
    """The averaging step all-reduces the 3 buckets after OPTIM (3 x ALPHA, one link); the plain step has no
    collective; K = 2: their mean; K = 1: the averaging step."""
    graph = dp_graph("gpipe", "local-sgd", 2, 3)
    local = local_graph(graph)
    assert not [t for t in local.tasks if t.action.kind is Kind.ALLREDUCE]
    assert len([t for t in graph.tasks if t.action.kind is Kind.ALLREDUCE]) == 3
    got = predict_mode("local-sgd", graph, _costs(), None, 2)
    assert got["averaging"] - got["local"] == pytest.approx(3 * ALPHA, rel=1e-9)
    assert got["local"] == pytest.approx(2 * (F + B) + OPTIM + STEP_OVERHEAD, rel=1e-9)
    assert got["step"] == pytest.approx((got["local"] + got["averaging"]) / 2, rel=1e-12)
    assert predict_mode("local-sgd", graph, _costs(), None, 1)["step"] == pytest.approx(got["averaging"], rel=1e-12)


def test_amortized_measurement_and_percentile():
    step, means = amortized_measured([(1.0, 3.0), (2.0, 4.0), (1.0, 1.0)])
    assert (step, means) == (2.0, (2.0, 3.0, 1.0))
    assert percentile([3.0, 1.0, 2.0], 0.1) == pytest.approx(1.2) and percentile([5.0], 0.9) == 5.0


def _local_sgd_trace(steps: int = 4) -> tuple[pd.DataFrame, float, float]:
    """Both replicas' steps under _costs(), averaging on the odd steps (K = 2), as a real trace records them."""
    graph = dp_graph("gpipe", "local-sgd", 2, 3)
    results = {True: simulate(graph, _costs()), False: simulate(local_graph(graph), _costs())}
    parts, walls, t = [], {}, 0.0
    for step in range(steps):
        res = results[step % 2 == 1]
        for replica in (0, 1):
            df = res.trace.copy()
            df["rank"] += replica
            df[["start", "end"]] += t
            df["step"] = step
            parts.append(df)
        walls[str(step)] = res.makespan + STEP_OVERHEAD
        t += res.makespan + STEP_OVERHEAD
    df = pd.concat(parts, ignore_index=True)
    df.attrs.update(source="real", schedule="gpipe", params={"pp": 1, "microbatches": 2, "chunks": 1},
                    step_times=walls, dp=2, dp_mode="local-sgd")
    return df, results[False].makespan + STEP_OVERHEAD, results[True].makespan + STEP_OVERHEAD


def test_split_steps_tells_the_averaging_steps_from_the_plain_ones():
    df, local, averaging = _local_sgd_trace()
    assert split_steps([df]) == (pytest.approx(local, rel=1e-12), pytest.approx(averaging, rel=1e-12))


def test_grid_row_of_local_sgd_is_scored_amortized_and_taken_apart(tmp_path):
    """dp_row on the known trace, measured = its true steps: the amortized measurement and prediction agree
    with the self-calibrated costs (error 0), both steps are reported apart, measured and predicted."""
    from analysis.validation.calibration import Calibration, grid_rows
    from schedules import load_graph, validate
    from schedules.trace import write_trace
    from tests.test_calibrate import _as_recorded, _profile_file
    from tests.test_calibrate import _costs as pipeline_costs

    dp_profile = tmp_path / "dp.json"
    dp_profile.write_text(json.dumps({
        "schema": PROFILE_SCHEMA,
        "partitions": [{"num_stages": 1, "stages": [
            {"stage": 0, "layers": [0, 2], "param_bytes": PARAM_BYTES, "F": 2 * F, "B": 2 * B, "I": 0.0,
             "W": 0.0, "OPTIM": 2 * OPTIM}]}],
        "collectives": {"all_reduce": {"alpha": 2 * ALPHA, "beta": None},
                        "reduce_scatter": {"alpha": 6 * ALPHA, "beta": None},
                        "all_gather": {"alpha": ALPHA, "beta": None}}}))
    pipe = _as_recorded(simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), pipeline_costs(1.0)).trace,
                        1.0, 0, 0.0)
    pipe.attrs.update(source="real", schedule="1f1b", params={"pp": 2, "microbatches": 4, "chunks": 1},
                      step_times={"0": 1.0}, dp=1)
    cal = Calibration.of(_profile_file(tmp_path), [str(write_trace(pipe, tmp_path / "1f1b.csv"))], dp_profile)
    df, local, averaging = _local_sgd_trace()
    graph = dp_graph("gpipe", "local-sgd", 2, 3)
    key = ("dp2-local-sgd", 2)
    steps = ((local, averaging), (local, averaging))
    measured = {key: SimpleNamespace(  # a real.measure.Measured's fields, its config a RunConfig's sync_every
        config=SimpleNamespace(sync=SimpleNamespace(sync_every=2)), step_time=averaging, spread=(local, averaging),
        round_medians=(averaging, averaging), step_times=steps, foreign_cores=(0.0, 0.0),
        traces=(str(write_trace(df, tmp_path / "ls.csv")),))}
    (row,) = grid_rows(measured, {key: graph}, cal, ("1f1b", 4), [key])
    truth = (local + averaging) / 2
    assert (row["dp_mode"], row["kind"]) == ("local-sgd", "data-parallel")
    assert row["measured_step_time"] == pytest.approx(truth, rel=1e-12)
    assert row["measured_spread"] == [pytest.approx(truth, rel=1e-12)] * 2
    assert (row["measured_local"], row["measured_averaging"]) == (pytest.approx(local, rel=1e-12),
                                                                  pytest.approx(averaging, rel=1e-12))
    assert row["predicted_averaging"] - row["predicted_local"] == pytest.approx(3 * 2 * ALPHA, rel=1e-9)
    assert abs(row["self_error"]) < 1e-9
    assert row["error"] == pytest.approx((row["predicted_step_time"] - truth) / truth, rel=1e-12)


def test_grid_configs_of_the_extra_modes():
    pytest.importorskip("torch")
    from real.config import ModelConfig
    from real.profile.protocol import GRID_DP_MODES, GRID_EXTRA_DP_MODES, MODEL_SHAPE, STALENESS, SYNC_EVERY, dp_config

    assert GRID_DP_MODES == ("ddp", "sync", "zero1", "zero2", "zero3", "ps", "decentralized", "local-sgd", "ddp+int8",
                             "ddp+fp16", "ddp+bf16", "ddp+powersgd:4", "async-ps")
    model = ModelConfig(**MODEL_SHAPE)
    got = {m: dp_config(model, "gpipe", 4, 4, m) for m in GRID_EXTRA_DP_MODES}
    assert {m: (c.world_size, c.sync.dp_mode, c.sync.servers, c.sync.sync_every, c.sync.grad_compression,
                c.sync.staleness) for m, c in got.items()} == {
        "ps": (3, "ps", 1, 1, "none", 0), "decentralized": (2, "decentralized", 0, 1, "none", 0),
        "local-sgd": (2, "local-sgd", 0, SYNC_EVERY, "none", 0), "ddp+int8": (2, "ddp", 0, 1, "int8", 0),
        "ddp+fp16": (2, "ddp", 0, 1, "fp16", 0), "ddp+bf16": (2, "ddp", 0, 1, "bf16", 0),
        "ddp+powersgd:4": (2, "ddp", 0, 1, "powersgd:4", 0),
        "async-ps": (3, "async-ps", 1, 1, "none", STALENESS)}
    assert replace(got["ddp+int8"].sync, grad_compression="none") == dp_config(model, "gpipe", 4, 4, "ddp").sync


def test_decentralized_self_calibration_reads_the_exchanges_as_p2p_messages(tmp_path):
    """Each bucket's exchange with the ring neighbour took 5 ms (a p2p message, the profile says 1 ms): the
    self-calibrated costs time it so, and predict the traced step exactly."""
    from analysis.validation.dp_calibration import dp_self_costs

    truth = replace(_costs(), p2p_alpha=0.005)
    graph = dp_graph("gpipe", "decentralized", 2, 3)
    assert len([t for t in graph.tasks if t.action.kind is Kind.EXCHANGE]) == 3
    res = simulate(graph, truth)
    parts = []
    for replica in (0, 1):
        df = res.trace.copy()
        df["rank"] += replica
        df["step"] = 0
        parts.append(df)
    df = pd.concat(parts, ignore_index=True)
    df.attrs.update(source="real", schedule="gpipe", params={"pp": 1, "microbatches": 2, "chunks": 1},
                    step_times={"0": res.makespan + STEP_OVERHEAD}, dp=2, dp_mode="decentralized")
    profile = tmp_path / "dp.json"
    profile.write_text(json.dumps({
        "schema": PROFILE_SCHEMA, "partitions": [{"num_stages": 1, "stages": [
            {"stage": 0, "layers": [0, 2], "param_bytes": PARAM_BYTES, "F": F, "B": B, "I": 0.0, "W": 0.0,
             "OPTIM": OPTIM}]}],
        "p2p": {"alpha": 0.001, "beta": None},
        "collectives": {"all_reduce": {"alpha": ALPHA, "beta": None}}}))
    own = dp_self_costs([df], profile)
    assert (own.p2p_alpha, own.p2p_beta) == (pytest.approx(0.005, rel=1e-9), math.inf)
    assert [op for op, _a, _b in own.collectives] == ["all_reduce"]
    assert predict_mode("decentralized", graph, own, profile)["step"] == pytest.approx(
        res.makespan + STEP_OVERHEAD, rel=1e-9)


def test_validate_sim_page_says_how_local_sgd_is_scored():
    from tests.test_dp_grid import _validate_sim

    rows = [{"schedule": "dp2-local-sgd", "predicted_local": 0.1804, "measured_local": 0.19,
             "predicted_averaging": 0.2, "measured_averaging": None}, {"schedule": "dp2-ddp"}]
    assert _validate_sim()._local_sgd_lines({"schedules": rows}) == [
        "dp2-local-sgd: scored on the time per step amortized over K; the plain step predicted 180.4 ms, measured "
        "190.0 ms; the averaging step predicted 200.0 ms, measured - ms."]


def test_validate_sim_measures_ps_in_a_process_group_of_its_own(monkeypatch, tmp_path):
    """The 2-process configurations in one measure_interleaved call, ps's 3 in another (traces under world3); the
    results come back in the grid's order."""
    pytest.importorskip("torch")
    import real.measure
    from tests.test_dp_grid import _validate_sim

    calls = []

    def fake(configs, **kw):
        calls.append(([c.world_size for c in configs], kw["trace_dir"]))
        return [f"measured {c.sync.dp_mode}" for c in configs]

    monkeypatch.setattr(real.measure, "measure_interleaved", fake)
    v = _validate_sim()
    a = SimpleNamespace(rounds=1, steps=1, warmup=0, attempts=1, max_foreign=0.1, max_slow=0.1, timeout=1.0)
    configs = {(f"dp2-{m}", 4): v.dp_config(v.MODEL, "gpipe", 4, 4, m) for m in ("ddp", "ps", "local-sgd")}
    got = v._measure(configs, a, tmp_path)
    assert calls == [([2, 2], str(tmp_path / "traces")), ([3], str(tmp_path / "traces" / "world3"))]
    assert list(got.items()) == [(("dp2-ddp", 4), "measured ddp"), (("dp2-ps", 4), "measured ps"),
                                 (("dp2-local-sgd", 4), "measured local-sgd")]
