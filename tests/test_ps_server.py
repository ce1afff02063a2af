"""ps's server update under measured costs: the grid's closed form, and a trace's server rows read back.

The "real" trace is the simulator's own ps step (gpipe, pp 1, m 2, 3 buckets) for 2 trainers and 1 server:
the trainers' rows on ranks 0 and 1, the server's update ({s}OPTIM, collective stream) on rank 2, as
real.dp.ps records them. So every figure read back from it has a known true value.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from analysis.metrics import summarize
from analysis.validation.calibration import dp_graph, predict
from analysis.validation.dp_calibration import dp_replay_error, dp_self_costs
from schedules import Kind, Stream, build, lower
from schedules.dp.modes import add_data_parallel, server_update
from schedules.formats import PROFILE_SCHEMA
from sim import simulate
from sim.costs.profiled import ProfiledCosts, StageCosts
from sim.network import Network
from sim.replay import dp_replayable, replay, server_update_times, server_updates

F, B, UPDATE, ALPHA, STEP_OVERHEAD = 0.010, 0.020, 0.003, 0.004, 0.002
MESSAGE = 0.002  # a push or a pull: one p2p message of the bucket (p2p alpha 2 ms, the all-gather's beta infinite)


def _truth() -> ProfiledCosts:
    return ProfiledCosts(stages=(StageCosts(f=F, b=B, i=0.0, w=0.0, optim=UPDATE, param_bytes=3000),),
                         collectives=(("reduce_scatter", 3 * ALPHA, math.inf), ("all_gather", ALPHA / 2, math.inf)),
                         step_overhead=STEP_OVERHEAD, p2p_alpha=MESSAGE)


def test_the_grids_ps_step_is_the_pushes_the_servers_update_and_the_pulls():
    """Buckets ready 1/3, 2/3 and 3/3 into the last B; each push one message (2 ms, not the reduce-scatter's
    12 ms) on the rank's link, the last from the end of the passes, then the server's update (3 ms, on no link),
    then the three pulls (2 ms each): closed form."""
    graph = dp_graph("gpipe", "ps", 2, 3)
    (update,) = [t for t in graph.tasks if t.action.kind is Kind.OPTIM]
    assert update.stream is Stream.COLLECTIVE
    expected = 2 * F + 2 * B + MESSAGE + UPDATE + 3 * MESSAGE + STEP_OVERHEAD
    assert predict(graph, _truth()) == pytest.approx(expected, rel=1e-12)


def _trace(steps: int = 2, recorded_pulls: bool = True) -> pd.DataFrame:
    """``recorded_pulls``: the pulls as real.dp.ps records them, posted at the last pass's end and zero-length (else
    as simulated)."""
    result = simulate(dp_graph("gpipe", "ps", 2, 3), _truth())
    one = result.trace.copy()
    if recorded_pulls:
        pulls = one["kind"] == "ALL_GATHER"
        one.loc[pulls, ["start", "end"]] = one.loc[one["stream"] == "compute", "end"].max()
    server = one["kind"] == "OPTIM"
    parts, walls = [], {}
    for step in range(steps):
        for rank, rows in ((0, one[~server]), (1, one[~server]), (2, one[server])):
            df = rows.copy()
            df["rank"] = rank
            df[["start", "end"]] += step
            df["step"] = step
            parts.append(df)
        walls[str(step)] = result.makespan + STEP_OVERHEAD
    df = pd.concat(parts, ignore_index=True)
    df.attrs.update(source="real", schedule="gpipe", params={"pp": 1, "microbatches": 2, "chunks": 1},
                    step_times=walls, dp=2, dp_mode="ps")
    return df


@pytest.fixture
def profile(tmp_path):
    """The pair's profile: every time twice the truth (what is read from the trace must not come from it) but the
    p2p message's, which times ps's pushes and pulls (a ps trace's push and pull rows are no service times)."""
    path = tmp_path / "dp.json"
    path.write_text(json.dumps({
        "schema": PROFILE_SCHEMA, "partitions": [{"num_stages": 1, "stages": [
            {"stage": 0, "layers": [0, 2], "param_bytes": 3000, "F": 2 * F, "B": 2 * B, "I": 0.0, "W": 0.0,
             "OPTIM": 2 * UPDATE}]}],
        "p2p": {"alpha": MESSAGE, "beta": None},
        "collectives": {"reduce_scatter": {"alpha": 6 * ALPHA, "beta": None},
                        "all_gather": {"alpha": ALPHA, "beta": None}}}))
    return path


def test_a_ps_traces_server_rows_time_its_update_in_the_self_calibration_and_the_replay(profile):
    df = _trace()
    assert server_updates(df[df["step"] == 0], 2) == {0: pytest.approx(UPDATE, rel=1e-12)}
    assert server_update_times([df]) == pytest.approx([UPDATE, UPDATE], rel=1e-12)
    assert dp_replayable(df)
    assert [x.error for x in replay(df, _truth())] == pytest.approx([0.0, 0.0], abs=1e-12)
    assert dp_replay_error([df], profile) == (pytest.approx(0.0, abs=1e-12), pytest.approx(0.0, abs=1e-12))
    costs = dp_self_costs([df], profile)
    assert costs.stages[0].optim == pytest.approx(UPDATE, rel=1e-12)  # the server's, not the profile's 2x
    graph = dp_graph("gpipe", "ps", 2, 3)
    assert predict(graph, costs) == pytest.approx(predict(graph, _truth()), rel=1e-9)


def test_a_ps_trace_without_server_rows_has_no_replay(profile):
    """A trace recorded before the servers traced their updates: its graph's update has nothing to take."""
    df = _trace()
    df = df[df["kind"] != "OPTIM"].reset_index(drop=True)
    df.attrs.update(_trace().attrs)
    assert not dp_replayable(df)
    assert dp_replay_error([df], profile) == (None, None)


class _ServerOnly:
    """Passes of 1 s; every transfer free but the servers' updates (5 s each): whatever overlaps an update, the
    network says compute is slowed ``contention`` (fair) or ``comm_slowdown`` (fcfs) while its rank transfers."""

    def __init__(self, model: str, slowdown: float) -> None:
        self.model, self.slowdown = model, slowdown
        self.comm_slowdown = slowdown if model == "fcfs" else 1.0

    def durations(self, graph):
        return [5.0 if server_update(t) else 1.0 if t.stream is Stream.COMPUTE else 0.0 for t in graph.tasks]

    def network(self, graph, dur):
        n = len(graph.tasks)
        return Network(lag=[0.0] * n, links=[()] * n, latency=[0.0] * n, model=self.model, queue=[-1] * n,
                       contention=self.slowdown - 1.0 if self.model == "fair" else 0.0)

    def bytes(self, task, graph):
        return 0.0

    def activations(self, action, graph):
        return (0.0, 0.0)

    def describe(self):
        return {"model": "server-only"}


@pytest.mark.parametrize("model", ["fair", "fcfs"])
def test_the_servers_update_slows_no_compute_of_its_rank(model):
    """interleaved-1f1b, pp 2: stage 3's update (rank 1) runs while rank 1 still computes stage 1's backwards;
    those passes keep their 1 s (the servers do the update), with compute slowed 2x by a transfer."""
    graph = add_data_parallel(lower(build("interleaved-1f1b", pp=2, microbatches=4, chunks=2)), "ps", [1] * 4)
    result = simulate(graph, _ServerOnly(model, 2.0))
    tasks = graph.tasks
    compute = [t.id for t in tasks if t.stream is Stream.COMPUTE]
    updates = [t.id for t in tasks if server_update(t)]
    assert any(result.start[u] < result.end[c] and result.start[c] < result.end[u] and tasks[u].rank == tasks[c].rank
               for u in updates for c in compute)
    assert [result.end[c] - result.start[c] for c in compute] == [1.0] * len(compute)
    assert [result.end[u] - result.start[u] for u in updates] == [5.0] * len(updates)


def test_a_ps_traces_bubble_counts_the_trainers_not_the_server():
    df = _trace(steps=1, recorded_pulls=False)
    got = summarize(df)
    assert [r["rank"] for r in got["ranks"]] == [0, 1]
    assert got == summarize(df[df["rank"] < 2].reset_index(drop=True))


def test_a_simulated_ps_traces_bubble_counts_every_rank_its_updates_are_on():
    result = simulate(add_data_parallel(lower(build("1f1b", pp=2, microbatches=2)), "ps", [1, 1]), _ServerOnly("fair", 1.0))
    got = summarize(result.trace)
    assert [r["rank"] for r in got["ranks"]] == [0, 1]
    assert got["bubble_ratio"] == pytest.approx(result.bubble_ratio, rel=1e-12)
