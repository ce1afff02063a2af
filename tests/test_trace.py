"""Trace schema, file round trips, metrics from the trace alone, and the timeline drawing."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from analysis import TRACE_COLUMNS, draw_timeline, read_trace, summarize, write_trace
from schedules import ScheduleError, build, lower
from sim import UniformCosts, simulate


@pytest.fixture(scope="module")
def result():
    return simulate(lower(build("interleaved-1f1b", pp=2, microbatches=4, chunks=2)), UniformCosts(tcomm=0.125, tb=2.0))


def test_whole_trace_of_a_small_1f1b():
    """Every row of 1F1B at p=2, m=2 with t_comm=0.5 (B costs t_b + t_w = 2): the whole trace.

    Messages fly on the SEND (0.5); a RECV is posted when its rank reaches it in
    program order and completes when the message has landed.
    """
    r = simulate(lower(build("1f1b", pp=2, microbatches=2)), UniformCosts(tcomm=0.5))
    rows = [(t.rank, t.stream, t.action, t.start, t.end) for t in r.trace.itertuples(index=False)]
    assert rows == [
        (0, "compute", "0F0", 0.0, 1.0),
        (0, "send", "0SEND_F0", 1.0, 1.5),
        (0, "compute", "0F1", 1.0, 2.0),
        (0, "send", "0SEND_F1", 2.0, 2.5),
        (0, "recv", "0RECV_B0", 5.0, 5.0),
        (0, "compute", "0B0", 5.0, 7.0),
        (0, "recv", "0RECV_B1", 8.0, 8.0),
        (0, "compute", "0B1", 8.0, 10.0),
        (1, "recv", "1RECV_F0", 1.5, 1.5),
        (1, "compute", "1F0", 1.5, 2.5),
        (1, "compute", "1B0", 2.5, 4.5),
        (1, "send", "1SEND_B0", 4.5, 5.0),
        (1, "recv", "1RECV_F1", 4.5, 4.5),
        (1, "compute", "1F1", 4.5, 5.5),
        (1, "compute", "1B1", 5.5, 7.5),
        (1, "send", "1SEND_B1", 7.5, 8.0),
    ]
    assert r.makespan == (2 + 2 - 1) * 3 + 2 * (2 - 1) * 0.5


def test_schema(result):
    df = result.trace
    assert tuple(df.columns) == TRACE_COLUMNS
    assert df.attrs["source"] == "sim" and df.attrs["schedule"] == "interleaved-1f1b"
    assert df.attrs["params"] == {"pp": 2, "microbatches": 4, "chunks": 2}
    assert df.attrs["costs"]["tcomm"] == 0.125
    assert set(df["stream"]) == {"compute", "send", "recv"}
    assert (df["end"] >= df["start"]).all()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_file_round_trip(tmp_path, result, suffix):
    path = write_trace(result.trace, tmp_path / f"trace{suffix}")
    back = read_trace(path)
    pd.testing.assert_frame_equal(back, result.trace)
    assert back.attrs == result.trace.attrs
    assert not list(tmp_path.glob("*.tmp"))


def test_read_plain_csv_without_metadata(tmp_path, result):
    path = tmp_path / "plain.csv"
    result.trace.to_csv(path, index=False)
    back = read_trace(path)
    assert back.attrs == {} and len(back) == len(result.trace)


def test_read_rejects_a_csv_without_the_columns(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ScheduleError, match=r"lacks columns \['rank', 'stream'"):
        read_trace(path)


def test_summarize_agrees_with_the_simulator(result):
    s = summarize(result.trace)
    assert s["makespan"] == result.makespan
    assert s["bubble_ratio"] == pytest.approx(result.bubble_ratio, abs=1e-12)
    assert [(x["rank"], x["busy"], x["first_start"], x["last_end"]) for x in s["ranks"]] == [
        (x.rank, x.busy, x.first_start, x.last_end) for x in result.ranks
    ]


def test_simulation_is_deterministic():
    g = lower(build("interleaved-1f1b", pp=4, microbatches=8, chunks=3))
    a = simulate(g, UniformCosts(tf=0.7, tb=1.3, tw=0.4, tcomm=0.05)).trace
    b = simulate(g, UniformCosts(tf=0.7, tb=1.3, tw=0.4, tcomm=0.05)).trace
    assert a.equals(b)


def test_timeline_draws_one_box_per_compute_task(result):
    fig, ax = plt.subplots()
    draw_timeline(ax, result.trace, title="t")
    n_ranks, n_compute = 2, 2 * 2 * 4 * 2
    boxes = [c for c in ax.collections]
    assert len(boxes) == n_ranks + n_compute  # a grey idle background per rank, then the boxes
    labels = sorted(t.get_text() for t in ax.texts if t.get_text().isdigit())
    assert labels == sorted(str(mb) for mb in [0, 1, 2, 3] * 8)  # every box wide enough to carry its microbatch
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    plt.close(fig)


def test_batch_durations_equal_per_task_durations():
    """UniformCosts.durations (the engine's fast path) answers exactly what duration() does, overlaps included."""
    from schedules import Schedule

    ov = Schedule.from_programs([["0F0", "0F1", "0B0", "0B1"], ["1F0", "(1F1;1B0)OVERLAP_F_B", "1B1"]], name="ov")
    costs = UniformCosts(tf=0.7, tb=1.3, tw=0.4, tcomm=0.05)
    for graph in (lower(build("interleaved-1f1b", pp=4, microbatches=8, chunks=3)), lower(ov)):
        assert costs.durations(graph) == [costs.duration(t, graph) for t in graph.tasks]
