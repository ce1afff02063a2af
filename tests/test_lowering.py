"""The positive round trips the rejection paths of tests/test_validate.py are measured against: text and parse,
lowering against the inserted communication, whole lowered graphs, and the fast paths against the checked ones.
"""



import pytest
from conftest import accepts, chunk_choices
from test_validate import msg, ok_1f1b

from schedules import (
    Action,
    Kind,
    Schedule,
    ScheduleError,
    build,
    check_schedule,
    find_cycle,
    graph_from_programs,
    insert_comms,
    lower,
    names,
    validate,
)

S = Schedule.from_programs


SHAPES = [(1, 1), (1, 3), (2, 2), (2, 4), (3, 6), (4, 8), (4, 4)]


def built(name: str, pp: int, m: int) -> list[Schedule]:
    """The schedule at (pp, m) for each allowed chunks (2..3 if multi-chunk); none if it refuses the shape."""
    if not accepts(name, pp, m):
        return []
    return [build(name, pp=pp, microbatches=m, chunks=v) for v in chunk_choices(name)]


@pytest.mark.parametrize("pp, m", SHAPES)
@pytest.mark.parametrize("name", names())
def test_lowering_equals_graph_from_inserted_comms(name, pp, m):
    """lower(s) == graph_from_programs(s, insert_comms(s)) task for task, and validate accepts it."""
    for s in built(name, pp, m):
        graph = lower(s)
        again = graph_from_programs(s, insert_comms(s))
        assert again.tasks == graph.tasks
        assert again.programs == graph.programs
        assert validate(graph) is graph
        assert find_cycle(graph) is None
        assert validate(s).tasks == graph.tasks


@pytest.mark.parametrize("pp, m", SHAPES)
@pytest.mark.parametrize("name", names())
def test_action_text_round_trips(name, pp, m):
    """Action.parse(str(a)) == a for every compute and lowered comm action; to_text/from_text round trip."""
    for s in built(name, pp, m):
        for prog in s.programs:
            for a in prog:
                assert Action.parse(str(a)) == a
        for prog in insert_comms(s):
            for a in prog:
                assert Action.parse(str(a)) == a
        back = Schedule.from_text(s.to_text(), name=s.name, num_microbatches=s.num_microbatches)
        assert back.programs == s.programs
        assert back.stage_to_rank == s.stage_to_rank
        graph_back = Schedule.from_text(lower(s).to_text(), name=s.name)
        assert graph_back.programs == tuple(tuple(p) for p in insert_comms(s))


def test_overlap_action_round_trip():
    """The overlap notation parses into its two sub-actions and prints back identically."""
    a = Action.parse("(0F7;7B3)OVERLAP_F_B")
    assert a.kind is Kind.OVERLAP_F_B
    assert a.sub_actions == (Action(Kind.F, 0, 7), Action(Kind.B, 7, 3))
    assert a.parts() == a.sub_actions
    assert (a.stage, a.microbatch) == (-1, None)
    assert str(a) == "(0F7;7B3)OVERLAP_F_B"
    assert Action.parse(str(a)) == a
    assert Action.parse("(1I2;3F4)OVERLAP_F_B").sub_actions == (Action(Kind.I, 1, 2), Action(Kind.F, 3, 4))
    assert Action.parse(" 0SEND_F1 ") == Action(Kind.SEND_F, 0, 1)


def test_overlap_schedule_validates_and_lowers():
    """A 1F1B whose steady-state F/B pair is overlapped validates; its lowering round-trips."""
    s = S([["0F0", "0F1", "0B0", "0B1"], ["1F0", "(1F1;1B0)OVERLAP_F_B", "1B1"]], name="ov")
    graph = validate(s)
    assert [str(a) for a in graph.program_actions(1)] == [
        "1RECV_F0",
        "1F0",
        "1RECV_F1",
        "(1F1;1B0)OVERLAP_F_B",
        "1SEND_B0",
        "1B1",
        "1SEND_B1",
    ]
    for r in range(2):
        for a in graph.program_actions(r):
            assert Action.parse(str(a)) == a
    assert Schedule.from_text(s.to_text(), name="ov").programs == s.programs


# --------------------------------------------------------------------------- the lowered graph, whole
def _rows(graph) -> list[tuple]:
    return [(t.id, t.rank, t.stream.value, str(t.action), t.deps, t.peer) for t in graph.tasks]


def test_lowered_1f1b_graph_whole():
    """Every task of a 2-rank, 2-microbatch 1F1B: ids, ranks, streams, actions, dependency tuples (in order), peers."""
    graph = lower(ok_1f1b())
    assert graph.programs == ((0, 1, 2, 3, 4, 5, 6, 7), (8, 9, 10, 11, 12, 13, 14, 15))
    assert _rows(graph) == [
        (0, 0, "compute", "0F0", (), None),
        (1, 0, "send", "0SEND_F0", (0,), 1),
        (2, 0, "compute", "0F1", (0,), None),
        (3, 0, "send", "0SEND_F1", (2,), 1),
        (4, 0, "recv", "0RECV_B0", (2, 11), 1),  # posted after the compute before it; waits for the send
        (5, 0, "compute", "0B0", (2, 0, 4), None),  # previous compute, its forward, its gradient
        (6, 0, "recv", "0RECV_B1", (5, 15), 1),
        (7, 0, "compute", "0B1", (5, 2, 6), None),
        (8, 1, "recv", "1RECV_F0", (1,), 0),
        (9, 1, "compute", "1F0", (8,), None),
        (10, 1, "compute", "1B0", (9,), None),  # last stage: its forward is also the previous compute
        (11, 1, "send", "1SEND_B0", (10,), 0),
        (12, 1, "recv", "1RECV_F1", (10, 3), 0),
        (13, 1, "compute", "1F1", (10, 12), None),
        (14, 1, "compute", "1B1", (13,), None),
        (15, 1, "send", "1SEND_B1", (14,), 0),
    ]


def test_lowered_overlap_tasks_of_dualpipe_v():
    """The overlapped pairs of a small DualPipe-V: deps of both halves, in order, without repeats."""
    graph = lower(build("dualpipe-v", pp=2, microbatches=4))
    overlaps = [r for r in _rows(graph) if r[3].endswith("OVERLAP_F_B")]
    assert overlaps == [
        (13, 0, "compute", "(0F3;3B1)OVERLAP_F_B", (12,), None),  # 3F1 (12) is both previous compute and forward
        (18, 0, "compute", "(3F2;0B0)OVERLAP_F_B", (13, 16, 0, 17), None),
        (23, 0, "compute", "(3F3;0B1)OVERLAP_F_B", (19, 21, 2, 22), None),
        (44, 1, "compute", "(2F2;1B0)OVERLAP_F_B", (41, 33, 43), None),
        (49, 1, "compute", "(1F3;2B1)OVERLAP_F_B", (44, 47, 38, 48), None),
        (50, 1, "compute", "(2F3;1B1)OVERLAP_F_B", (49, 37), None),
    ]


def test_fast_object_makers_equal_the_constructors():
    """lower's fast makers of Actions and Tasks fill every field and give objects equal to the constructors'."""
    import dataclasses
    import sys

    from schedules.graph import Stream, Task

    lowering = sys.modules["schedules.lower"]
    assert lowering._A_FIELDS == tuple(f.name for f in dataclasses.fields(Action))
    assert lowering._T_FIELDS == tuple(f.name for f in dataclasses.fields(Task))
    made = lowering._message(Kind.SEND_B, 3, 7)
    assert made == Action(Kind.SEND_B, 3, 7) and hash(made) == hash(Action(Kind.SEND_B, 3, 7))
    assert made.sub_actions is None and made.bucket is None and str(made) == "3SEND_B7"
    graph = lower(ok_1f1b())
    again = [Task(t.id, t.rank, Stream(t.stream), t.action, t.deps, t.peer) for t in graph.tasks]
    assert list(graph.tasks) == again and [hash(t) for t in graph.tasks] == [hash(t) for t in again]


def test_validate_rechecks_a_graph_lower_did_not_return():
    """validate() skips re-checking the work only of the very graph lower() returned; a copy is checked anew."""
    import dataclasses

    graph = lower(ok_1f1b())
    assert validate(graph) is graph
    # The same tasks with rank 1's 1B0 dropped from its program: a copy, so its work is checked again.
    program = tuple(i for i in graph.programs[1] if str(graph.tasks[i].action) != "1B0")
    broken = dataclasses.replace(graph, programs=(graph.programs[0], program))
    with pytest.raises(ScheduleError, match=msg("schedule '1f1b', rank 1", "missing work", "has no backward")):
        validate(broken)


def _mutations(s: Schedule):
    """Schedules one edit away from ``s``: an action dropped, duplicated, or swapped with the next on its rank."""
    for r, prog in enumerate(s.programs):
        for i in range(len(prog)):
            edits = [prog[:i] + prog[i + 1:], prog[:i + 1] + prog[i:]]
            if i + 1 < len(prog):
                edits.append((*prog[:i], prog[i + 1], prog[i], *prog[i + 2:]))
            for p in edits:
                yield Schedule.from_programs([*s.programs[:r], p, *s.programs[r + 1:]], name=s.name,
                                             stage_to_rank=s.stage_to_rank, num_microbatches=s.num_microbatches)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "dualpipe-v"])
def test_fast_work_check_agrees_with_the_full_check(name, monkeypatch):
    """check._valid_fast says True exactly when the full check_schedule accepts, on schedules one edit from valid."""
    import sys

    checking = sys.modules["schedules.check"]
    fast = checking._valid_fast
    s = build(name, pp=2, microbatches=4)
    assert fast(s)
    monkeypatch.setattr(checking, "_valid_fast", lambda schedule: False)
    seen = set()
    for m in _mutations(s):
        try:
            check_schedule(m)
            ok = True
        except ScheduleError:
            ok = False
        assert fast(m) == ok, m.to_text()
        seen.add(ok)
    assert seen == {True, False}  # some edits keep a valid schedule (swaps of independent work), most do not
