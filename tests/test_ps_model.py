"""ps and async-ps in the profiled cost model: a push and a pull are one message of the bucket, closed forms.

gpipe at m = 2, 3 buckets of 4000 bytes, F = 10 ms, B = 20 ms, the servers' update 3 ms, a step overhead of 2 ms,
the p2p latency 1 ms and the all-gather's bandwidth 4 MB/s (each push and pull: 1 ms + 4000 / 4e6 s = 2 ms; the
all-reduce's 4 ms, the reduce-scatter's 12 ms and the all-gather's alpha 2 ms play no part). The buckets are ready
a third, two thirds and all the way into the last B (40 -> 60 ms): 46.67, 53.33 and 60 ms; each push takes 2 ms on
the trainer's link (48.67, 55.33, 62 ms); the update follows the last (62 -> 65 ms), the pulls one after the other
(67, 69, 71 ms); the step is 71 + 2 = 73 ms.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from analysis.validation.calibration import dp_graph
from analysis.validation.dp_calibration import dp_self_costs
from analysis.validation.dp_modes import predict_mode
from common.errors import CostFileError
from real.profile.server import server_update_samples
from schedules import Kind
from sim import simulate
from tests.test_async_grid import BULK, MESSAGE, P2P_ALPHA
from tests.test_async_grid import _costs as _ps_costs
from tests.test_dp_grid_modes import OPTIM, STEP_OVERHEAD, B, F

PUSHES = ((2 * F + B + B / 3, 2 * F + B + B / 3 + MESSAGE), (2 * F + B + 2 * B / 3, 2 * F + B + 2 * B / 3 + MESSAGE),
          (2 * F + 2 * B, 2 * F + 2 * B + MESSAGE))
UPDATE = (PUSHES[-1][1], PUSHES[-1][1] + OPTIM)
PULLS = tuple((UPDATE[1] + k * MESSAGE, UPDATE[1] + (k + 1) * MESSAGE) for k in range(3))


@pytest.fixture(scope="module")
def graph():
    return dp_graph("gpipe", "ps", 2, 3)


def _rows(res, kind: Kind) -> tuple[tuple[float, float], ...]:
    tasks = sorted((t for t in res.graph.tasks if t.action.kind is kind), key=lambda t: res.start[t.id])
    return tuple((round(res.start[t.id], 12), round(res.end[t.id], 12)) for t in tasks)


def _rounded(spans) -> tuple[tuple[float, float], ...]:
    return tuple((round(s, 12), round(e, 12)) for s, e in spans)


@pytest.mark.parametrize("mode", ["ps", "async-ps"])
def test_a_push_and_a_pull_are_one_message_of_the_bucket(mode):
    graph = dp_graph("gpipe", mode, 2, 3)
    costs = _ps_costs()
    assert costs.bucket_message_time(4000) == pytest.approx(P2P_ALPHA + 4000 / BULK, rel=1e-15) == MESSAGE
    for t in graph.tasks:
        if t.action.kind in (Kind.REDUCE_SCATTER, Kind.ALL_GATHER):
            assert costs.duration(t, graph) == pytest.approx(0.002, rel=1e-12)


def test_the_ps_step_is_its_passes_the_last_push_the_update_and_the_pulls(graph):
    res = simulate(graph, _ps_costs())
    assert _rows(res, Kind.REDUCE_SCATTER) == _rounded(PUSHES)
    assert _rows(res, Kind.OPTIM) == _rounded((UPDATE,))
    assert _rows(res, Kind.ALL_GATHER) == _rounded(PULLS)
    assert predict_mode("ps", graph, _ps_costs(), None)["step"] == pytest.approx(0.071 + STEP_OVERHEAD, rel=1e-12)


def test_the_ddp_graph_keeps_the_collectives_fit(graph):
    """Only ps's and async-ps's collectives are messages: ddp's all-reduce is still its op's alpha (4 ms)."""
    ddp = dp_graph("gpipe", "ddp", 2, 3)
    costs = _ps_costs()
    assert {costs.duration(t, ddp) for t in ddp.tasks if t.action.kind is Kind.ALLREDUCE} == {0.004}


def test_a_ps_graph_needs_a_p2p_timing(graph):
    with pytest.raises(CostFileError) as err:
        simulate(graph, replace(_ps_costs(), p2p_measured=False))
    assert str(err.value) == ("the cost file has no p2p timing (p2p is missing or null: profiled by one process) but "
                              "dp mode ps pushes and pulls its buckets as messages to the servers; profile with 2 "
                              "or more processes (real.profile)")


def test_a_ps_graph_needs_the_all_gather_bandwidth(graph):
    costs = replace(_ps_costs(), collectives=(("all_reduce", 0.004, float("inf")),))
    with pytest.raises(CostFileError) as err:
        simulate(graph, costs)
    assert str(err.value) == ("the cost file has no all_gather timing, which times ps's pushes and pulls; profile "
                              "with dp > 1 (real.profile) for data-parallel graphs")


def test_self_calibration_of_ps_keeps_the_profiles_collectives(graph, tmp_path):
    """A ps trace's push rows end at the trainer's wait after its last pass and its pull rows are zero-length at
    that pass's end (real.dp.ps): no service times. Its own costs keep the profile's collectives (the messages'
    bandwidth), the server's traced update is the update, and the step overhead is the wall time less the span
    (the server's update's end) less the pulls the simulator puts after it: 73 - 65 - 6 = 2 ms."""
    import json

    from schedules.formats import PROFILE_SCHEMA
    from tests.test_dp_grid_modes import ALPHA, PARAM_BYTES

    res = simulate(graph, _ps_costs())
    df = res.trace.copy()
    pushes, pulls = df["kind"] == "REDUCE_SCATTER", df["kind"] == "ALL_GATHER"
    df.loc[pushes, "end"] = df.loc[pushes, "start"].clip(lower=2 * F + 2 * B)  # as the runtime records them
    df.loc[pulls, ["start", "end"]] = 2 * F + 2 * B  # posted at the last pass's end, waited for when in
    assert sorted(round(e - s, 12) for s, e in zip(df.loc[pushes, "start"], df.loc[pushes, "end"], strict=True)) \
        == [0.0, round(B / 3, 12), round(2 * B / 3, 12)]
    optim = (df["kind"] == "OPTIM") & (df["stream"] == "collective")
    df.loc[optim, "rank"] = 2
    df["step"] = 0
    df = pd.DataFrame(df)
    df.attrs.update(source="real", schedule="gpipe", params={"pp": 1, "microbatches": 2, "chunks": 1},
                    step_times={"0": res.makespan + STEP_OVERHEAD}, dp=2, dp_mode="ps")
    profile = tmp_path / "dp.json"
    profile.write_text(json.dumps({
        "schema": PROFILE_SCHEMA,
        "partitions": [{"num_stages": 1, "stages": [
            {"stage": 0, "layers": [0, 2], "param_bytes": PARAM_BYTES, "F": F, "B": B, "I": 0.0, "W": 0.0,
             "OPTIM": 5 * OPTIM}]}],
        "p2p": {"alpha": P2P_ALPHA, "beta": None},
        "collectives": {"all_reduce": {"alpha": ALPHA, "beta": None},
                        "all_gather": {"alpha": ALPHA / 2, "beta": BULK}}}))
    own = dp_self_costs([df], profile)
    assert own.collectives == (("all_reduce", ALPHA, float("inf")), ("all_gather", ALPHA / 2, BULK))
    assert own.stages[0].optim == own.stages[0].server_update == pytest.approx(OPTIM, rel=1e-12)
    assert own.step_overhead == pytest.approx(STEP_OVERHEAD, rel=1e-9)
    assert predict_mode("ps", graph, own, None)["step"] == pytest.approx(0.073, rel=1e-9)


# -- the servers' update: the profile's SERVER_UPDATE ----------------------------------------------------------------

SERVER = 0.0015  # the profiled server update: half the optimizer step (OPTIM 3 ms)


def _profile(tmp_path, server: float | None):
    import json

    from schedules.formats import PROFILE_SCHEMA
    from tests.test_dp_grid_modes import ALPHA, PARAM_BYTES

    row = {"stage": 0, "layers": [0, 2], "param_bytes": PARAM_BYTES, "F": F, "B": B, "I": 0.0, "W": 0.0,
           "OPTIM": {"median": OPTIM}}
    if server is not None:
        row["SERVER_UPDATE"] = {"median": server, "p10": server, "p90": server, "n": 3}
    path = tmp_path / "dp.json"
    path.write_text(json.dumps({
        "schema": PROFILE_SCHEMA, "partitions": [{"num_stages": 1, "stages": [row]}],
        "p2p": {"alpha": P2P_ALPHA, "beta": None}, "step_overhead": STEP_OVERHEAD,
        "collectives": {"all_reduce": {"alpha": ALPHA, "beta": None}, "all_gather": {"alpha": ALPHA / 2, "beta": BULK}}}))
    return path


def test_the_servers_update_is_the_profiles_server_update_where_it_has_one(graph, tmp_path):
    """ps's OPTIM (the servers') takes SERVER_UPDATE, 1.5 ms: the step 73 - 1.5 ms; a ddp trainer's OPTIM keeps the
    optimizer step (3 ms); async-ps's update_s is the server update too. A file without it: the optimizer step."""
    from analysis.validation.async_grid import update_s
    from sim.costs.cost_file import load_profile

    costs = load_profile(_profile(tmp_path, SERVER), 1)
    assert (costs.stages[0].server_update, costs.stages[0].optim) == (SERVER, OPTIM)
    res = simulate(graph, costs)
    assert _rows(res, Kind.OPTIM) == _rounded(((UPDATE[0], UPDATE[0] + SERVER),))
    assert predict_mode("ps", graph, costs, None)["step"] == pytest.approx(0.073 - OPTIM + SERVER, rel=1e-12)
    ddp = dp_graph("gpipe", "ddp", 2, 3)
    assert [costs.duration(t, ddp) for t in ddp.tasks if t.action.kind is Kind.OPTIM] == [OPTIM]
    assert update_s(dp_graph("gpipe", "async-ps", 2, 3), costs) == SERVER
    without = load_profile(_profile(tmp_path, None), 1)
    assert without.stages[0].server_update == 0.0
    assert predict_mode("ps", graph, without, None)["step"] == pytest.approx(0.073, rel=1e-12)


def test_a_bad_server_update_in_the_cost_file_is_one_line(tmp_path):
    from sim.costs.cost_file import load_profile

    path = _profile(tmp_path, SERVER)
    import json

    data = json.loads(path.read_text())
    data["partitions"][0]["stages"][0]["SERVER_UPDATE"] = {"median": -1}
    path.write_text(json.dumps(data))
    with pytest.raises(CostFileError) as err:
        load_profile(path, 1)
    assert str(err.value) == (f"cost file {str(path)!r}: partitions[0].stages[0].SERVER_UPDATE must be a finite "
                              "time >= 0 s, got -1")


def test_the_profiler_times_the_update_on_flat_copies_and_leaves_the_stage_alone():
    """real.profile.server: reps samples (one process: it is rank 0), each the fold and the optimizer step over
    flat copies of the buckets; the stage's own parameters are not stepped."""
    import torch

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64)
    for p in layer.parameters():
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in layer.parameters()]
    calls = []

    def timed(fn):
        fn()
        calls.append(1)
        return 0.25

    samples = server_update_samples(list(layer.parameters()), "sgd", 1e-3, 0.01, 2, timed, 2, 3)
    assert samples == [0.25, 0.25, 0.25] and len(calls) == 5
    assert all(torch.equal(a, p) for a, p in zip(before, layer.parameters(), strict=True))


# -- experiments/rescore_dp.py: a saved grid's rows under today's model --------------------------------------------


def _rescore_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "experiments" / "rescore_dp.py"
    spec = importlib.util.spec_from_file_location("rescore_dp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rescore_reads_a_moved_grid_and_predicts_its_rows_as_the_calibration_does(tmp_path):
    """A grid written under out/validate and read from elsewhere: the pipeline run's trace and the pair's profile
    rebuild the calibration, and the ps row is predicted as dp_row predicts it (no data-parallel run: the costs
    carried from the pipeline run), its error against the saved measurement."""
    import json

    from analysis.validation.calibration import Calibration
    from real.config import ModelConfig
    from real.profile.protocol import dp_buckets
    from schedules import load_graph, validate
    from schedules.trace import write_trace
    from tests.test_calibrate import _as_recorded, _profile_file
    from tests.test_calibrate import _costs as pipeline_costs

    root = tmp_path / "grid"
    (root / "traces").mkdir(parents=True)
    (root / "profile.json").write_text(_profile_file(tmp_path).read_text())
    (root / "profile-dp2.json").write_text(_profile(tmp_path, SERVER).read_text())
    pipe = _as_recorded(simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), pipeline_costs(1.0)).trace,
                        1.0, 0, 0.0)
    pipe.attrs.update(source="real", schedule="1f1b", params={"pp": 2, "microbatches": 4, "chunks": 1},
                      step_times={"0": 1.0}, dp=1)
    write_trace(pipe, root / "traces" / "0-1f1b-m4-r0.csv")
    model = ModelConfig(layers=2, dim=16, heads=2, vocab=32, seq=8)
    measured = 0.1
    (root / "validation.json").write_text(json.dumps({
        "profile": "out/validate/profile.json", "grid": {"model": model.to_dict()},
        "calibrated_from": {"traces": ["out/validate/traces/0-1f1b-m4-r0.csv"]},
        "schedules": [{"schedule": "dp2-ps", "microbatches": 2, "dp_mode": "ps", "measured_step_time": measured,
                       "predicted_step_time": 0.12, "error": 0.2, "parts": {"measured": {"step": measured}}},
                      {"schedule": "dp2-ddp", "microbatches": 2, "dp_mode": "ddp"}]}))
    (row,) = _rescore_module().rescore(root, ["ps"])
    cal = Calibration.of(root / "profile.json", [str(root / "traces" / "0-1f1b-m4-r0.csv")], root / "profile-dp2.json")
    graph = dp_graph("gpipe", "ps", 2, dp_buckets(model))
    expected = predict_mode("ps", graph, cal.data_parallel("ps"), cal.dp_profile)["step"]
    assert row["predicted"] == pytest.approx(expected, rel=1e-12) == row["predicted_parts"]["step"]
    assert (row["row"], row["measured"], row["grid_predicted"], row["grid_error"]) == ("dp2-ps m=2", 0.1, 0.12, 0.2)
    assert row["error"] == pytest.approx((expected - measured) / measured, rel=1e-12)


@pytest.mark.parametrize(("argv", "message"), [
    (["{tmp}"], "'{tmp}' has no validation.json; give a validate_sim.py --out directory"),
    (["{tmp}", "--modes", "ps,bogus"], "--modes bogus: give comma-separated modes of ddp,sync,zero1,zero2,zero3,ps,"
     "decentralized,local-sgd,ddp+int8,ddp+fp16,ddp+bf16,ddp+powersgd:4,async-ps")])
def test_rescore_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        _rescore_module().main([a.format(tmp=tmp_path) for a in argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (f"error: python experiments/rescore_dp.py: {message.format(tmp=tmp_path)} "
                                       "(see --help)\n")
