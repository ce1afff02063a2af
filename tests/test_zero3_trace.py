"""ZeRO-3's gathers: the IR's (schedules.dp.modes) and the runtime's (real.dp.zero) are the same, one for one, and replay.

The runtime reads its program with ``ShardedSync._program`` and gathers, per compute task, every stage the task
reads, traced with the microbatch of the task's pass of that stage; the IR adds the same gathers
(``one_buffer``: the runtime's single flat buffer per stage). A trace of such a run replays exactly when its
durations are the simulator's own (the real run's replay: tests/test_real_equality.py, zb-h1 pp 2 x dp 2 fsdp).
"""

from __future__ import annotations

import itertools
import math

import pandas as pd
import pytest

from schedules import Kind, Stream, build, lower
from schedules.dp.modes import ZERO3_READS, add_data_parallel
from schedules.library.recompute import recompute_full
from sim import simulate
from sim.costs.profiled import ProfiledCosts, StageCosts

torch = pytest.importorskip("torch")

from real.dp.zero import ShardedSync  # noqa: E402


def _gathers_of(graph, tid):
    """The (stage, microbatch, bucket) of the all-gathers compute task ``tid`` waits for."""
    tasks = graph.tasks
    return sorted((tasks[d].action.stage, tasks[d].action.microbatch, tasks[d].action.bucket)
                  for d in tasks[tid].deps if tasks[d].action.kind is Kind.ALL_GATHER)


def _compute(graph, rank):
    return [i for i in graph.programs[rank] if graph.tasks[i].stream is Stream.COMPUTE
            and graph.tasks[i].action.kind is not Kind.OPTIM]


@pytest.mark.parametrize(("schedule", "passes"), [("zb-h1", "FIW"), ("1f1b recompute", "FRB"),
                                                ("interleaved-1f1b", "FB"), ("dualpipe-v", "FIWB")])
def test_every_pass_waits_for_its_stages_gathers_w_and_r_included(schedule, passes):
    """F, I, W, B and R each wait for every bucket (2) of each stage they read, with their microbatch; and the
    runtime's program (real.dp.zero) reads exactly those stages and microbatches."""
    name, _, extra = schedule.partition(" ")
    sched = build(name, pp=2, microbatches=4, chunks=2 if name in ("interleaved-1f1b", "dualpipe-v") else 1)
    if extra == "recompute":
        sched = recompute_full(sched)
    graph = add_data_parallel(lower(sched), "zero3", [2] * sched.num_stages, one_buffer=True)
    kinds = set()
    for rank in range(2):
        reads, _ = ShardedSync._program(graph, rank)
        for tid in _compute(graph, rank):
            parts = graph.tasks[tid].action.parts()
            want = {}
            for p in parts:
                want.setdefault(p.stage, p.microbatch)
                kinds.add(p.kind)
            assert _gathers_of(graph, tid) == sorted((s, m, b) for s, m in want.items() for b in (0, 1))
            assert reads[tid] == want
    assert kinds == {Kind(k) for k in passes} and kinds <= set(ZERO3_READS)


def test_one_buffer_gathers_wait_for_the_pass_that_holds_the_buffer():
    """Interleaved 1F1B (two stages a rank): a gather of the stage the pass before reads is issued when that pass
    ends; of another stage, with the pass before (one pass ahead); the step's first with its pass."""
    base = lower(build("interleaved-1f1b", pp=2, microbatches=4, chunks=2))
    graph = add_data_parallel(base, "zero3", [1] * 4, one_buffer=True)
    plain = add_data_parallel(base, "zero3", [1] * 4)
    same = other = 0
    for rank in range(2):
        compute = _compute(graph, rank)
        first = [d for d in graph.tasks[compute[0]].deps if graph.tasks[d].action.kind is Kind.ALL_GATHER]
        assert [graph.tasks[d].deps for d in first] == [base.tasks[compute[0]].deps]
        for prev, tid in itertools.pairwise(compute):
            (gather,) = [d for d in graph.tasks[tid].deps if graph.tasks[d].action.kind is Kind.ALL_GATHER]
            if graph.tasks[prev].action.stage == graph.tasks[tid].action.stage:
                assert graph.tasks[gather].deps == (prev,)
                same += 1
            else:
                assert graph.tasks[gather].deps == graph.tasks[prev].deps
                other += 1
    assert same > 0 and other > 0
    assert [t.action for t in graph.tasks] == [t.action for t in plain.tasks]  # the same gathers, issued later


def test_w_reads_the_parameters():
    """Why W is gathered: its weight-gradient nodes read the weights (LayerNorm's backward reads its weight for
    any output), so a W of freed parameters fails; a Linear's alone does not."""
    from torch import nn

    from real.backward import backward_input, backward_weight

    def weight_pass(layer):
        x = torch.randn(4, 8, requires_grad=True)
        out = layer(x)
        _, work = backward_input(out, torch.ones_like(out), x, list(layer.parameters()))
        for p in layer.parameters():
            p.data.untyped_storage().resize_(0)  # ZeRO-3's freed parameters (real.dp.zero)
        backward_weight(work)

    weight_pass(nn.Linear(8, 4))
    with pytest.raises(RuntimeError, match="The tensor has a non-zero number of elements, but its data is not "
                                           "allocated yet"):
        weight_pass(nn.LayerNorm(8))


def _costs() -> ProfiledCosts:
    stage = StageCosts(f=0.010, b=0.020, i=0.009, w=0.008, optim=0.003, param_bytes=3000)
    return ProfiledCosts(stages=(stage, stage), collectives=(("reduce_scatter", 0.004, math.inf),
                                                             ("all_gather", 0.002, math.inf)))


def _trace(graph, steps: int = 2) -> pd.DataFrame:
    """The simulator's trace of ``graph`` as a real dp 2 run records it: both replicas alike, step by step."""
    result = simulate(graph, _costs())
    parts, walls = [], {}
    for step in range(steps):
        for replica in (0, 1):
            df = result.trace.copy()
            df["rank"] += 2 * replica
            df[["start", "end"]] += step
            df["step"] = step
            parts.append(df)
        walls[str(step)] = result.makespan
    df = pd.concat(parts, ignore_index=True)
    df.attrs.update(source="real", schedule="zb-h1", params={"pp": 2, "microbatches": 4, "chunks": 1},
                    step_times=walls, dp=2, dp_mode="fsdp")
    return df


def test_a_zero3_trace_maps_onto_the_graph_and_replays_exactly():
    """zb-h1, pp 2 x dp 2, fsdp, 2 buckets a stage: the replay's graph is the trace's one for one (12 passes x 2
    buckets gathered per rank and step, 4 W x 2 reduce-scatters) and each step replays to its span."""
    from sim.replay import dp_replayable, graph_of, replay

    graph = add_data_parallel(lower(build("zb-h1", pp=2, microbatches=4)), "zero3", [2, 2], one_buffer=True)
    df = _trace(graph)
    assert graph_of(df).to_text() == graph.to_text() and dp_replayable(df, graph)
    rows = df[(df["step"] == 0) & (df["rank"] == 1)]
    assert (rows["kind"] == "ALL_GATHER").sum() == 24 and (rows["kind"] == "REDUCE_SCATTER").sum() == 8
    steps = replay(df, _costs())
    assert [s.step for s in steps] == [0, 1] and all(abs(s.error) < 1e-9 for s in steps)
    bad = df[~((df["action"] == "1ALL_GATHER3_b0") & (df["rank"] == 1))].copy()  # W's gather of mb 3 not traced
    bad.attrs.update(df.attrs)
    assert not dp_replayable(bad, graph)


def test_local_sgd_steps_replay_each_on_its_own_graph():
    """local-sgd at K = 2: the averaging steps (odd) all-reduce 3 buckets after OPTIM, the local ones do not; no
    one graph is every step's, each step's own is, and each step replays to its span."""
    from sim.replay import dp_replayable, graph_of, replay
    from tests.test_dp_grid_modes import _costs as local_costs
    from tests.test_dp_grid_modes import _local_sgd_trace

    df, _, _ = _local_sgd_trace()
    parts = dict(list(df.groupby("step")))
    averaging = [sum(t.action.kind is Kind.ALLREDUCE for t in graph_of(df, parts[s]).tasks) for s in range(4)]
    assert averaging == [0, 3, 0, 3]
    assert not dp_replayable(df, graph_of(df)) and dp_replayable(df)
    steps = replay(df, local_costs())
    assert [s.step for s in steps] == [0, 1, 2, 3] and all(abs(s.error) < 1e-9 for s in steps)


def test_a_local_sgd_local_steps_span_is_the_first_replicas():
    """Replica 1 starts local step 2 5 ms early (it ended step 1 early): the step is replica 0's span, as
    simulated, not stretched by the skew."""
    from sim.replay import replay
    from tests.test_dp_grid_modes import _costs as local_costs
    from tests.test_dp_grid_modes import _local_sgd_trace

    df, _, _ = _local_sgd_trace()
    early = (df["step"] == 2) & (df["rank"] == 1)
    df.loc[early, ["start", "end"]] -= 0.005
    steps = replay(df, local_costs())
    assert [s.step for s in steps] == [0, 1, 2, 3] and all(abs(s.error) < 1e-9 for s in steps)


def test_a_zero3_gather_issued_inside_a_task_is_served_from_its_end():
    """real.dp.zero launches the next pass's gathers in after_task, before the task's row end is stamped: the
    gather issued at 8 ms inside 0F0 (0-10 ms) is served from 10 ms; one issued in a gap keeps its issue; other
    modes keep theirs."""
    from sim.replay import collective_service

    rows = [(0, "compute", "0F0", 0.000, 0.010), (0, "collective", "0ALL_GATHER1_b0", 0.008, 0.012),
            (0, "compute", "0F1", 0.012, 0.020), (0, "collective", "0ALL_GATHER0_b0", 0.021, 0.024),
            (0, "compute", "0B0", 0.024, 0.040)]
    part = pd.DataFrame(rows, columns=["rank", "stream", "action", "start", "end"])
    part.attrs.update(dp_mode="zero3")
    assert collective_service(part) == [(0, "0ALL_GATHER1_b0", 0, 0.010, 0.012), (0, "0ALL_GATHER0_b0", 0, 0.021, 0.024)]
    part.attrs.update(dp_mode="zero2")
    assert collective_service(part)[0] == (0, "0ALL_GATHER1_b0", 0, 0.008, 0.012)
