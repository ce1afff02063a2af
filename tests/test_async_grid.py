"""The validation grid's async-ps row (analysis.validation.async_grid): the time per update from known costs, closed forms.

Under tests/test_dp_grid_modes.py's costs with a p2p latency of 1 ms and an all-gather bandwidth of 4 MB/s (a push
or a pull is one message of the bucket, sim.costs.profiled.ProfiledCosts.bucket_message_time: 1 ms + 4000 bytes / 4 MB/s
= 2 ms), gpipe at m = 2 with 3 buckets: the passes end at 2F + 2B = 60 ms; the buckets are ready a third, two
thirds and all the way into the last B (46.7, 53.3, 60 ms) and each push takes 2 ms, the last to 62 ms; the
server's update (OPTIM, 3 ms) to 65 ms; the 3 pulls (2 ms each) to 71 ms. A trainer's cycle is compute 60 + 2 (step
overhead), push 2 exposed, pull 6: 70 ms. At staleness 1 neither trainer waits for the update (it is shorter than a
cycle): 70 ms per update; at staleness 0 every step waits for it: 73 ms, sync ps's step at pp 1 (its makespan 71 +
the step overhead).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis.validation.async_grid import predict_async, predicted_parts
from analysis.validation.calibration import dp_graph
from analysis.validation.dp_modes import predict_mode
from schedules import Kind
from schedules.formats import PROFILE_SCHEMA
from sim import simulate
from tests.test_dp_grid_modes import ALPHA, OPTIM, PARAM_BYTES, STEP_OVERHEAD, B, F
from tests.test_dp_grid_modes import _costs as _dp_costs

P2P_ALPHA, BULK = 0.001, 4e6  # the p2p latency and the all-gather's bandwidth (bytes/s)
MESSAGE = P2P_ALPHA + PARAM_BYTES / 3 / BULK  # one push or pull of a bucket: 2 ms
CYCLE = 2 * F + 2 * B + STEP_OVERHEAD + MESSAGE + 3 * MESSAGE  # 70 ms


def _costs():
    """tests/test_dp_grid_modes.py's costs with the p2p latency and the all-gather's bandwidth above."""
    from dataclasses import replace

    costs = _dp_costs()
    return replace(costs, p2p_alpha=P2P_ALPHA, collectives=tuple(
        (op, a, BULK if op == "all_gather" else b) for op, a, b in costs.collectives))


@pytest.fixture(scope="module")
def graph():
    return dp_graph("gpipe", "async-ps", 2, 3)


def test_the_time_per_update_is_the_cycle_at_staleness_1_and_adds_the_update_at_0(graph):
    assert (MESSAGE, CYCLE) == pytest.approx((0.002, 0.070), rel=1e-12)
    assert predict_async(graph, _costs(), 1) == pytest.approx(CYCLE, rel=1e-12)
    assert predict_async(graph, _costs(), 0) == pytest.approx(CYCLE + OPTIM, rel=1e-12)
    ps = dp_graph("gpipe", "ps", 2, 3)
    assert predict_mode("ps", ps, _costs(), None)["step"] == pytest.approx(CYCLE + OPTIM, rel=1e-12)


def test_an_update_longer_than_the_cycle_paces_the_trainers(graph):
    """The update (150 ms) outlasts a cycle: after the first cycle each step waits for the previous step's update,
    whatever the bound, so the N steps of the loop end at cycle + (N - 1) update."""
    from dataclasses import replace

    from sim.costs.async_ps import STEPS

    slow = _costs()
    slow = replace(slow, stages=(replace(slow.stages[0], optim=0.150),))
    assert predict_async(graph, slow, 1) == pytest.approx((CYCLE + (STEPS - 1) * 0.150) / STEPS, rel=1e-12)


def test_the_predicted_update_taken_apart_puts_what_the_loop_changes_in_exposed(graph):
    parts = predicted_parts(graph, _costs(), 1)
    assert {k: round(v, 12) for k, v in parts.items()} == {
        "forward": round(2 * F, 12), "backward": round(2 * B, 12), "optimizer": 0.0, "skew": 0.0,
        "exposed": round(CYCLE - 2 * F - 2 * B - STEP_OVERHEAD, 12), "overhead": STEP_OVERHEAD,
        "step": round(CYCLE, 12)}


def _server_trace(graph) -> tuple[pd.DataFrame, float]:
    """Both trainers' traced step of the graph under _costs() at staleness 0 (ranks 0, 1), the server's update as
    the runtime traces it (rank 2, real.dp.ps_async), and the step's wall time."""
    res = simulate(graph, _costs())
    parts = []
    for replica in (0, 1):
        df = res.trace.copy()
        optim = (df["kind"] == "OPTIM") & (df["stream"] == "collective")
        df = df[~optim] if replica else df.assign(rank=df["rank"].where(~optim, 2))
        df["rank"] += replica * (df["rank"] < 2)
        df["step"] = 0
        parts.append(df)
    df = pd.concat(parts, ignore_index=True)
    wall = res.makespan + STEP_OVERHEAD
    df.attrs.update(source="real", schedule="gpipe", params={"pp": 1, "microbatches": 2, "chunks": 1},
                    step_times={"0": wall}, dp=2, dp_mode="async-ps")
    return df, wall


def test_grid_row_of_async_ps_is_self_calibrated_from_its_servers_trace(graph, tmp_path):
    """dp_row on the trace of a staleness-0 run under known costs, measured = its wall: the self-calibrated costs
    (the server's traced update its optimizer step) predict it exactly; the row says its staleness."""
    from types import SimpleNamespace

    from analysis.validation.calibration import Calibration, grid_rows
    from schedules import load_graph, validate
    from schedules.trace import write_trace
    from tests.test_calibrate import _as_recorded, _profile_file
    from tests.test_calibrate import _costs as pipeline_costs

    df, wall = _server_trace(graph)
    assert sorted(df.loc[df["kind"] == "OPTIM", "rank"]) == [2]
    assert wall == pytest.approx(CYCLE + OPTIM, rel=1e-12)
    dp_profile = tmp_path / "dp.json"
    dp_profile.write_text(json.dumps({
        "schema": PROFILE_SCHEMA,
        "partitions": [{"num_stages": 1, "stages": [
            {"stage": 0, "layers": [0, 2], "param_bytes": PARAM_BYTES, "F": 2 * F, "B": 2 * B, "I": 0.0,
             "W": 0.0, "OPTIM": 2 * OPTIM}]}],
        "p2p": {"alpha": P2P_ALPHA, "beta": None},
        "collectives": {"all_reduce": {"alpha": 2 * ALPHA, "beta": None},
                        "reduce_scatter": {"alpha": 6 * ALPHA, "beta": None},
                        "all_gather": {"alpha": ALPHA, "beta": BULK}}}))
    pipe = _as_recorded(simulate(validate(load_graph("1f1b", pp=2, microbatches=4)), pipeline_costs(1.0)).trace,
                        1.0, 0, 0.0)
    pipe.attrs.update(source="real", schedule="1f1b", params={"pp": 2, "microbatches": 4, "chunks": 1},
                      step_times={"0": 1.0}, dp=1)
    cal = Calibration.of(_profile_file(tmp_path), [str(write_trace(pipe, tmp_path / "1f1b.csv"))], dp_profile)
    key = ("dp2-async-ps", 2)
    measured = {key: SimpleNamespace(  # a real.measure.Measured's fields, its config a RunConfig's staleness
        config=SimpleNamespace(sync=SimpleNamespace(staleness=0)), step_time=wall, spread=(wall, wall),
        round_medians=(wall, wall), step_times=((wall,), (wall,)), foreign_cores=(0.0, 0.0),
        traces=(str(write_trace(df, tmp_path / "aps.csv")),))}
    (row,) = grid_rows(measured, {key: graph}, cal, ("1f1b", 4), [key])
    assert (row["dp_mode"], row["staleness"], row["kind"]) == ("async-ps", 0, "data-parallel")
    assert abs(row["self_error"]) < 1e-9 and row["replay_error"] is None
    assert row["parts"]["predicted"]["step"] == pytest.approx(row["predicted_step_time"], rel=1e-12)
    assert row["parts"]["measured"]["step"] == pytest.approx(wall, rel=1e-12)
    assert row["error"] == pytest.approx((row["predicted_step_time"] - wall) / wall, rel=1e-12)
    assert len([t for t in graph.tasks if t.action.kind is Kind.OPTIM]) == 1


def test_validate_sim_page_says_how_async_ps_is_scored():
    from tests.test_dp_grid import _validate_sim

    rows = [{"schedule": "dp2-async-ps", "microbatches": 4, "dp_mode": "async-ps", "staleness": 1},
            {"schedule": "dp2-ddp", "dp_mode": "ddp"}]
    assert _validate_sim()._async_lines({"schedules": rows}) == [
        "dp2-async-ps m=4: scored on the time per update (dp / the sum of the trainers' rates; measured: the "
        "trainers' median step), predicted by sim.costs.async_ps's loop over the step at staleness 1; its parts' exposed "
        "holds what the loop adds to the graph's step; no replay (the graph's step is one lockstep step, the "
        "servers' updates fold pushes of other steps)."]
