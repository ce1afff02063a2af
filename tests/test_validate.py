"""Rejection paths of the schedule IR, the registry, lowering and validation.

Every bad input must raise :class:`ScheduleError` with a one-line message that
names the offending schedule, rank and action where the code knows them, and
says what would be valid. The round trips (text, parse, lowering) that the error paths are measured against
are tests/test_lowering.py.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest

from schedules import (
    Action,
    Kind,
    PipelineParams,
    Schedule,
    ScheduleError,
    build,
    check_schedule,
    find_cycle,
    graph_from_programs,
    insert_comms,
    lower,
    names,
    spec,
    validate,
)
from sim import UniformCosts

S = Schedule.from_programs


def msg(*fragments: str) -> str:
    """A ``match=`` pattern: the literal fragments, in this order, anywhere in the message."""
    return ".*".join(re.escape(f) for f in fragments)


def ok_1f1b() -> Schedule:
    """A valid 2-rank 1F1B with 2 microbatches (the base the bad schedules are edited from)."""
    return build("1f1b", pp=2, microbatches=2)


def comm_programs() -> list[list[str]]:
    """``insert_comms`` of :func:`ok_1f1b`, as editable strings (asserted in a test below)."""
    return [
        ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
        ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"],
    ]


def parsed(programs: list[list[str]]) -> list[list[Action]]:
    return [[Action.parse(a) for a in prog] for prog in programs]


def comm_edit(remove=(), insert=()) -> list[list[str]]:
    """:func:`comm_programs` with ``(rank, action)`` removed, then ``(rank, position, action)`` inserted."""
    progs = comm_programs()
    for rank, action in remove:
        progs[rank].remove(action)
    for rank, position, action in insert:
        progs[rank].insert(position, action)
    return progs


def _graph(programs):
    return graph_from_programs(ok_1f1b(), parsed(programs))


def _none_microbatch() -> Schedule:
    """A schedule built in Python with an Action that has no microbatch (the parser would refuse it)."""
    return Schedule("bad", num_ranks=1, num_stages=1, num_microbatches=1, stage_to_rank=(0,),
                    programs=((Action(Kind.F, 0, None), Action(Kind.F, 0, 0), Action(Kind.B, 0, 0)),))


# Each row: (a call that must raise ScheduleError, the one-line message it must match), one section per
# layer. Parametrized families of cases keep their own tests below; ``test_rejected`` runs these rows.

# --------------------------------------------------------------------------- build / registry

BUILD_REJECTED = [
    # An unknown name is rejected and the message lists every registered name.
    pytest.param(lambda: build("nope", pp=2, microbatches=2),
                 msg("unknown schedule 'nope'", "valid: ", ", ".join(names())), id="unknown-name-build"),
    pytest.param(lambda: spec("nope"), msg("unknown schedule 'nope'"), id="unknown-name-spec"),
    # chunks=0 is rejected for single- and multi-chunk schedules alike, saying what is valid.
    pytest.param(lambda: build("1f1b", pp=2, microbatches=2, chunks=0),
                 msg("schedule '1f1b'", "one stage per rank (chunks=1)", "got chunks=0"), id="zero-chunks-1f1b"),
    pytest.param(lambda: build("looped-bfs", pp=2, microbatches=2, chunks=0),
                 msg("schedule 'looped-bfs'", "chunks (v) >= 2", "got 0"), id="zero-chunks-looped-bfs"),
    # interleaved-1f1b with m not a multiple of pp names pp, m and suggests valid m.
    pytest.param(lambda: build("interleaved-1f1b", pp=4, microbatches=6, chunks=2),
                 msg("interleaved-1f1b", "multiple of pp=4", "got 6", "try 4 or 8"), id="interleaved-m6-pp4"),
    pytest.param(lambda: build("interleaved-1f1b", pp=4, microbatches=2, chunks=2),
                 msg("multiple of pp=4", "got 2", "try 4"), id="interleaved-m2-pp4"),
]

# --------------------------------------------------------------------------- Action.parse

PARSE_REJECTED = [
    # '(;0F1;;0B2)OVERLAP_F_B' is not silently read as a pair: the empty part is an invalid action.
    pytest.param(lambda: Action.parse("(;0F1;;0B2)OVERLAP_F_B"), msg("invalid action ''"), id="overlap-empty-parts"),
    # A malformed action string inside from_programs is reported with its text.
    pytest.param(lambda: S([["0F0", "F0"], ["1F0", "1B0"]], name="bad"), msg("invalid action 'F0'"),
                 id="parse-error-in-from-programs"),
    # '0F' has no microbatch: the parser says so and shows the fix.
    pytest.param(lambda: S([["0F", "0F0", "0B0"], ["1F0", "1B0"]], name="bad", num_microbatches=1),
                 msg("invalid action '0F'", "F needs a microbatch index, e.g. '0F0'"), id="parse-no-microbatch-F"),
    pytest.param(lambda: Action.parse("0B"), msg("invalid action '0B'"), id="parse-no-microbatch-B"),
]

# --------------------------------------------------------------------------- Schedule construction

CONSTRUCTION_REJECTED = [
    # Placement inference refuses a stage that two ranks' programs mention.
    pytest.param(lambda: S([["0F0", "0B0", "1F0"], ["1F0", "1B0"]], name="bad"),
                 msg("schedule 'bad'", "stage 1 appears on rank 0 and on rank 1", "(1F0)", "exactly one rank"),
                 id="stage-on-two-ranks"),
    # Inferred stages must be numbered without gaps.
    pytest.param(lambda: S([["0F0", "0B0"], ["2F0", "2B0"]], name="bad"),
                 msg("schedule 'bad'", "no rank runs stage(s) [1]", "0..2 without gaps"), id="stage-gap"),
    # Placement length, program count and placement ranks must agree with the schedule's sizes.
    pytest.param(lambda: Schedule("bad", num_ranks=2, num_stages=2, num_microbatches=1, stage_to_rank=(0,),
                                  programs=((), ())),
                 msg("schedule 'bad'", "stage_to_rank places 1 stage(s)", "has 2; give one rank per stage"),
                 id="shape-placement-length"),
    pytest.param(lambda: Schedule("bad", num_ranks=2, num_stages=2, num_microbatches=1, stage_to_rank=(0, 1),
                                  programs=((),)),
                 msg("schedule 'bad'", "got programs for 1 ranks, the schedule has 2", "one program per rank"),
                 id="shape-program-count"),
    pytest.param(lambda: S([["0F0", "0B0"], ["1F0", "1B0"]], name="bad", stage_to_rank=[0, 2]),
                 msg("schedule 'bad'", "stage 1 is placed on rank 2", "valid ranks are 0..1"), id="shape-placement-rank"),
]

# --------------------------------------------------------------------------- check_schedule / validate / lower

WORK_REJECTED = [
    # A schedule needs at least one rank, one stage and one microbatch.
    pytest.param(lambda: validate(S([], name="empty")),
                 msg("schedule 'empty'", "needs >= 1 rank, stage and microbatch", "0 ranks"), id="empty-schedule"),
    pytest.param(lambda: check_schedule(S([["0F0", "0B0"], ["1F0", "1B0"]], name="bad", num_microbatches=0)),
                 msg("schedule 'bad'", "needs >= 1 rank", "0 microbatches"), id="zero-microbatches"),
    # A (stage, microbatch) without F is reported with its rank and the missing action.
    pytest.param(lambda: validate(S([["0F0", "0B0"], ["1B0"]], name="bad")),
                 msg("schedule 'bad', rank 1", "missing work 1F0", "stage 1 microbatch 0 has no forward"),
                 id="missing-forward"),
    # A (stage, microbatch) without B or I+W is reported, naming both valid options.
    pytest.param(lambda: validate(S([["0F0", "0B0"], ["1F0"]], name="bad")),
                 msg("schedule 'bad', rank 1", "missing work", "stage 1 microbatch 0 has no backward",
                     "(1B0 or 1I0+1W0)"),
                 id="missing-backward"),
    # With num_microbatches=2 every stage must run microbatch 1 too.
    pytest.param(lambda: lower(S([["0F0", "0B0"], ["1F0", "1B0"]], name="bad", num_microbatches=2)),
                 msg("schedule 'bad', rank 0", "missing work 0F1"), id="missing-microbatch-explicit-count"),
    # The same action twice on one rank names both positions.
    pytest.param(lambda: validate(S([["0F0", "0B0", "0F0"], ["1F0", "1B0"]], name="bad")),
                 msg("schedule 'bad', rank 0, action 0F0", "duplicate work, runs twice", "at positions 0 and 2"),
                 id="duplicate-on-one-rank"),
    # The same work on two ranks is reported as the stage running on a rank it is not placed on
    # (check_schedule checks placement before duplicates, so a cross-rank copy is a misplaced stage).
    pytest.param(lambda: validate(S([["0F0", "0B0"], ["1F0", "1B0", "0F0"]], name="bad", stage_to_rank=[0, 1])),
                 msg("schedule 'bad', rank 1, action 0F0", "stage 0 is placed on rank 0", "cannot run on two ranks"),
                 id="duplicate-across-ranks"),
    # With an explicit stage_to_rank, a rank running another rank's stage is named ...
    pytest.param(lambda: lower(S([["0F0", "0B0", "1F0"], ["1B0"]], name="bad", stage_to_rank=[0, 1])),
                 msg("schedule 'bad', rank 0, action 1F0", "stage 1 is placed on rank 1", "cannot run on two ranks"),
                 id="stage-on-wrong-rank"),
    # ... also when the whole stage is on the wrong rank: placement says rank 1, rank 0 runs it.
    pytest.param(lambda: check_schedule(S([["0F0", "1F0", "1B0", "0B0"], []], name="bad", stage_to_rank=[0, 1])),
                 msg("schedule 'bad', rank 0, action 1F0", "stage 1 is placed on rank 1"),
                 id="whole-stage-on-wrong-rank"),
    # B before its F on the rank names both actions and their positions, and says to move it.
    pytest.param(lambda: validate(S([["0B0", "0F0"], ["1F0", "1B0"]], name="bad")),
                 msg("schedule 'bad', rank 0, action 0B0", "runs before 0F0", "(position 0 < 1)", "move it after"),
                 id="backward-before-forward"),
    # I before its F is rejected the same way.
    pytest.param(lambda: validate(S([["0F0", "0B0"], ["1I0", "1F0", "1W0"]], name="bad")),
                 msg("schedule 'bad', rank 1, action 1I0", "runs before 1F0"), id="input-backward-before-forward"),
    # W must come after its I.
    pytest.param(lambda: validate(S([["0F0", "0W0", "0I0"], ["1F0", "1B0"]], name="bad")),
                 msg("schedule 'bad', rank 0, action 0W0", "runs before 0I0", "(position 1 < 2)", "move it after"),
                 id="w-before-i"),
    # Each I needs its W.
    pytest.param(lambda: validate(S([["0F0", "0I0"], ["1F0", "1B0"]], name="bad")),
                 msg("schedule 'bad', rank 0, action 0I0", "missing work 0W0", "each I needs its W"),
                 id="i-without-w"),
    # A W without its I is rejected.
    pytest.param(lambda: validate(S([["0F0", "0W0"], ["1F0", "1B0"]], name="bad")),
                 msg("schedule 'bad', rank 0, action 0W0", "has no 0I0", "W needs its I"), id="w-without-i"),
    # B and I/W for the same work is rejected, offering both valid forms.
    pytest.param(lambda: validate(S([["0F0", "0B0", "0I0", "0W0"], ["1F0", "1B0"]], name="bad")),
                 msg("schedule 'bad', rank 0, action 0B0", "mixes a full backward with I/W",
                     "run either 0B0 or 0I0 and 0W0"),
                 id="b-then-i-and-w"),
    pytest.param(lambda: validate(S([["0F0", "0I0", "0B0"], ["1F0", "1B0"]], name="bad")),
                 msg("action 0B0", "mixes a full backward with I/W"), id="i-then-b"),
    # A microbatch beyond num_microbatches names the valid range.
    pytest.param(lambda: validate(S([["0F0", "0B0", "0F1", "0B1"], ["1F0", "1B0"]], name="bad", num_microbatches=1)),
                 msg("schedule 'bad', rank 0, action 0F1", "microbatch 1 out of range", "valid are 0..0"),
                 id="microbatch-out-of-range"),
    # An Action built in Python without a microbatch is caught by the work check.
    pytest.param(lambda: validate(_none_microbatch()),
                 msg("schedule 'bad', rank 0, action 0F", "microbatch None out of range"), id="microbatch-none"),
    # A stage beyond num_stages names the valid range.
    pytest.param(lambda: validate(S([["0F0", "0B0"], ["1F0", "1B0", "2F0"]], name="bad", stage_to_rank=[0, 1])),
                 msg("schedule 'bad', rank 1, action 2F0", "stage 2 out of range", "valid stages are 0..1"),
                 id="stage-out-of-range"),
    # An overlapped pair of a pass and its own forward can never run.
    pytest.param(lambda: validate(S([["(0F0;0B0)OVERLAP_F_B"], ["1F0", "1B0"]], name="bad")),
                 msg("schedule 'bad', rank 0, action 0B0", "overlapped with its own forward 0F0"),
                 id="overlap-with-own-forward"),
    # With two stages on one rank, running the later stage's F first is a (same-rank) deadlock cycle.
    pytest.param(lambda: validate(S([["1F0", "0F0", "1B0", "0B0"]], name="bad", stage_to_rank=[0, 0])),
                 msg("schedule 'bad'", "deadlock", "rank 0 1F0", "rank 0 0F0"), id="same-rank-stage-order-deadlock"),
]

# --------------------------------------------------------------------------- graph_from_programs with comms

COMM_REJECTED = [
    # A SEND whose peer has no RECV names the rank, the action and the missing counterpart.
    pytest.param(lambda: _graph(comm_edit(remove=[(1, "1RECV_F0")])),
                 msg("schedule '1f1b', rank 0, action 0SEND_F0", "is unmatched", "rank 1 has no 1RECV_F0"),
                 id="unmatched-send"),
    # A RECV whose peer has no SEND is reported on the receiving rank.
    pytest.param(lambda: _graph(comm_edit(remove=[(0, "0SEND_F0")])),
                 msg("schedule '1f1b', rank 1, action 1RECV_F0", "is unmatched", "rank 0 has no 0SEND_F0"),
                 id="unmatched-recv"),
    # Without the RECV a cross-rank consumer names the RECV it needs.
    pytest.param(lambda: _graph(comm_edit(remove=[(0, "0SEND_F0"), (1, "1RECV_F0")])),
                 msg("schedule '1f1b', rank 1, action 1F0", "needs 1RECV_F0 on rank 1", "which no rank runs"),
                 id="missing-send-and-recv"),
    # A SEND placed before the compute that produces its value is rejected.
    pytest.param(lambda: _graph(comm_edit(remove=[(0, "0SEND_F0")], insert=[(0, 0, "0SEND_F0")])),
                 msg("schedule '1f1b', rank 0, action 0SEND_F0", "comes before the action that produces the value"),
                 id="send-before-its-producer"),
    # A SEND_B whose backward is missing says nothing produces the value.
    pytest.param(lambda: _graph(comm_edit(remove=[(1, "1B0")])),
                 msg("rank 1, action 1SEND_B0", "sends a value that no action on this rank produces"),
                 id="send-without-producer"),
    # A SEND/RECV on a rank that does not hold its stage names the owning rank.
    pytest.param(lambda: _graph(comm_edit(remove=[(0, "0SEND_F0")], insert=[(1, 0, "0SEND_F0")])),
                 msg("schedule '1f1b', rank 1, action 0SEND_F0", "stage 0 lives on rank 0, not on rank 1"),
                 id="send-on-wrong-rank"),
    pytest.param(lambda: _graph(comm_edit(remove=[(1, "1RECV_F0")], insert=[(0, 0, "1RECV_F0")])),
                 msg("rank 0, action 1RECV_F0", "stage 1 lives on rank 1, not on rank 0"), id="recv-on-wrong-rank"),
    # graph_from_programs names a duplicated action and the other rank that runs it.
    pytest.param(lambda: _graph(comm_edit(insert=[(1, 8, "0F0")])),  # appended to rank 1's 8 actions
                 msg("schedule '1f1b', rank 1, action 0F0", "appears twice (also on rank 0)", "each runs once"),
                 id="graph-duplicate-across-ranks"),
    # graph_from_programs wants one program per rank of the schedule.
    pytest.param(lambda: graph_from_programs(ok_1f1b(), parsed(comm_programs())[:1]),
                 msg("schedule '1f1b'", "got programs for 1 ranks, the schedule has 2"), id="graph-program-count"),
    # validate(TaskGraph) also runs the compute checks: the graph without 0B1 builds (0RECV_B1 is matched),
    # and validating it reports the missing work.
    pytest.param(lambda: validate(_graph(comm_edit(remove=[(0, "0B1")]))),
                 msg("schedule '1f1b', rank 0", "missing work", "stage 0 microbatch 1 has no backward"),
                 id="validate-graph-rechecks-compute-work"),
]


@pytest.mark.parametrize(
    ("make", "message"), [*BUILD_REJECTED, *PARSE_REJECTED, *CONSTRUCTION_REJECTED, *WORK_REJECTED, *COMM_REJECTED]
)
def test_rejected(make, message):
    """Each bad input raises ScheduleError with its one-line message (the fragments, in order)."""
    with pytest.raises(ScheduleError, match=message):
        make()


# --------------------------------------------------------------------------- build / registry (families)

@pytest.mark.parametrize("name", ["1f1b", "looped-bfs"])
@pytest.mark.parametrize(
    "kwargs, flag, value",
    [
        ({"pp": 0, "microbatches": 4}, "pp", "0"),
        ({"pp": -1, "microbatches": 4}, "pp", "-1"),
        ({"pp": 2, "microbatches": 0}, "microbatches", "0"),
    ],
)
def test_build_rejects_nonpositive_pp_and_microbatches(name, kwargs, flag, value):
    """pp=0 / microbatches=0 are rejected, naming the flag, the bad value and the valid range."""
    with pytest.raises(ScheduleError, match=msg(f"{flag} must be an integer >= 1, got {value}")):
        build(name, **kwargs)


@pytest.mark.parametrize("name", [n for n in names() if not spec(n).takes_chunks])
def test_single_chunk_schedule_rejects_chunks_2(name):
    """A one-stage-per-rank schedule given chunks=2 says so and lists the multi-chunk schedules."""
    multi = ", ".join(n for n in names() if spec(n).multi_chunk)
    with pytest.raises(
        ScheduleError, match=msg(f"schedule {name!r}", "one stage per rank (chunks=1), got chunks=2", multi)
    ):
        build(name, pp=2, microbatches=4, chunks=2)


@pytest.mark.parametrize("name", [n for n in names() if spec(n).multi_chunk and spec(n).fixed_chunks is None])
def test_multi_chunk_schedule_rejects_chunks_1(name):
    """A multi-chunk schedule given chunks=1 asks for v >= 2 and points at gpipe/1f1b."""
    with pytest.raises(ScheduleError, match=msg(f"schedule {name!r}", "chunks (v) >= 2", "got 1", "gpipe or 1f1b")):
        build(name, pp=2, microbatches=4, chunks=1)


@pytest.mark.parametrize(
    "kwargs, flag, value",
    [
        ({"pp": 0, "microbatches": 1}, "pp", "0"),
        ({"pp": 1, "microbatches": -3}, "microbatches", "-3"),
        ({"pp": 1, "microbatches": 1, "chunks": 0}, "chunks", "0"),
        ({"pp": True, "microbatches": 1}, "pp", "True"),
        ({"pp": 2.0, "microbatches": 1}, "pp", "2.0"),
        ({"pp": 1, "microbatches": "4"}, "microbatches", "'4'"),
    ],
)
def test_pipeline_params_rejects_non_positive_or_non_int(kwargs, flag, value):
    """PipelineParams wants ints >= 1 (bools and floats are not ints here)."""
    with pytest.raises(ScheduleError, match=msg(f"{flag} must be an integer >= 1, got {value}")):
        PipelineParams(**kwargs)


@pytest.mark.parametrize("field", ["tf", "tb", "tw", "tcomm"])
@pytest.mark.parametrize("value", [-1.0, -1e-12, math.nan, math.inf])
def test_uniform_costs_rejects_negative_or_nan_times(field, value):
    """Every time of UniformCosts must be finite and >= 0 (NaN and inf rejected too)."""
    with pytest.raises(ScheduleError, match=msg(f"{field} must be a finite time >= 0, got {value!r}")):
        UniformCosts(**{field: value})


@pytest.mark.parametrize("value", [-0.1, 1.5, math.nan])
def test_uniform_costs_rejects_mw_outside_unit_interval(value):
    """mw is a fraction of M_B in [0, 1]."""
    with pytest.raises(ScheduleError, match=msg(f"uniform costs: mw must be a fraction of M_B in [0, 1], got {value!r}")):
        UniformCosts(mw=value)


# --------------------------------------------------------------------------- Action.parse (families)


@pytest.mark.parametrize("text", ["F0", "0X1", "", "x", "-1F0", "0F-1", "0SEND1", "0 F 1"])
def test_parse_rejects_malformed_plain_actions(text):
    """A plain action that is not <stage><kind><microbatch> is rejected, quoting it and the grammar."""
    with pytest.raises(
        ScheduleError, match=msg(f"invalid action {text!r}", "expected <stage><kind><microbatch>", "e.g. '2F0'")
    ):
        Action.parse(text)


@pytest.mark.parametrize("text", ["(0F1;0B2)", "(0F1;0B2", "(0F1;0B2)OVERLAP", "(0F1;0B2)OVERLAP_F_BX"])
def test_parse_rejects_bad_bracketed_actions(text):
    """A bracket must close and be followed by exactly OVERLAP_F_B."""
    with pytest.raises(ScheduleError, match=msg(f"invalid action {text!r}", "'(<action>;<action>)OVERLAP_F_B'")):
        Action.parse(text)


@pytest.mark.parametrize(
    "text",
    [
        "(0F1;0F2)OVERLAP_F_B",
        "(0B1;0B2)OVERLAP_F_B",
        "(0F1;0W2)OVERLAP_F_B",
        "(0F1)OVERLAP_F_B",
        "(0F1;0B2;0F3)OVERLAP_F_B",
    ],
)
def test_parse_rejects_overlap_not_one_forward_one_backward(text):
    """OVERLAP_F_B pairs exactly one F with one B or I."""
    with pytest.raises(ScheduleError, match=msg(f"invalid action {text!r}", "one forward with one backward (B or I)")):
        Action.parse(text)


# --------------------------------------------------------------------------- validate (families)


@pytest.mark.parametrize("comm", ["0SEND_F0", "0RECV_B0", "0ALLREDUCE"])
def test_communication_inside_schedule(comm):
    """A Schedule holds compute only; SEND/RECV (or collectives) are added by lower()."""
    with pytest.raises(
        ScheduleError,
        match=msg(
            f"schedule 'bad', rank 0, action {comm}", "compute actions only", "communication is added by lower()"
        ),
    ):
        validate(S([["0F0", comm, "0B0"], ["1F0", "1B0"]], name="bad"))


# --------------------------------------------------------------------------- deadlocks


def _check_cycle(graph, cycle):
    assert cycle is not None and len(cycle) >= 3
    assert cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1
    for before, after in itertools.pairwise(cycle):
        assert before in graph.tasks[after].deps  # each waits for the one before


def test_deadlock_cross_rank_cycle():
    """1F1B on 2 ranks where rank 0 runs B0 before F1 but rank 1 needs F1 before B0: a deadlock.

    rank 0: 0F0 0B0 0F1 0B1 -- 0B0 waits for 1B0's gradient;
    rank 1: 1F0 1F1 1B0 1B1 -- 1B0 comes after 1F1, which waits for 0F1,
    which rank 0 only runs after 0B0. The message names the cycle.
    """
    bad = S([["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B0", "1B1"]], name="bad")
    check_schedule(bad)  # the work itself is fine
    graph = lower(bad)  # lowering does not look for deadlocks
    _check_cycle(graph, find_cycle(graph))
    with pytest.raises(ScheduleError, match=msg("schedule 'bad', rank", "deadlock", "a cycle of waits")) as info:
        validate(bad)
    text = str(info.value)
    steps = text.split(": ", 2)[-1].split(" -> ")
    assert steps[0] == steps[-1], text  # a closed cycle
    for step in [
        "rank 0 0B0",
        "rank 0 0F1",
        "rank 0 0SEND_F1",
        "rank 1 1RECV_F1",
        "rank 1 1F1",
        "rank 1 1B0",
        "rank 1 1SEND_B0",
        "rank 0 0RECV_B0",
    ]:
        assert step in steps, (step, text)


def test_out_of_order_forwards_are_not_a_deadlock():
    """Rank 1 running 1F1 before 1F0 while rank 0 runs 0F0, 0F1 just waits; no cycle."""
    sched = S([["0F0", "0F1", "0B0", "0B1"], ["1F1", "1F0", "1B0", "1B1"]], name="ok")
    graph = validate(sched)
    assert find_cycle(graph) is None


# --------------------------------------------------------------------------- graph_from_programs (families)


def test_comm_programs_fixture_matches_insert_comms():
    """The hand-written comm programs the tests below edit are insert_comms' output."""
    assert [[str(a) for a in p] for p in insert_comms(ok_1f1b())] == comm_programs()


def test_recv_after_its_consumer_is_a_deadlock():
    """A RECV posted after the compute that consumes it builds, but validate reports a deadlock."""
    progs = comm_programs()
    progs[1][0:2] = ["1F0", "1RECV_F0"]
    graph = _graph(progs)
    cycle = find_cycle(graph)
    _check_cycle(graph, cycle)
    assert {str(graph.tasks[i].action) for i in cycle} == {"1F0", "1RECV_F0"}
    with pytest.raises(
        ScheduleError, match=msg("schedule '1f1b', rank 1", "deadlock", "rank 1 1F0", "rank 1 1RECV_F0")
    ):
        validate(graph)


@pytest.mark.parametrize(
    "rank, action, why",
    [
        (0, "0RECV_F0", "has no peer: stage 0 is the first stage"),
        (1, "1SEND_F0", "has no peer: stage 1 is the last stage"),
        (0, "5SEND_F0", "names stage 5; valid stages are 0..1"),
        (0, "0ALLREDUCE", "is not a pipeline compute or send/recv action"),
    ],
)
def test_comm_without_peer_or_out_of_range(rank, action, why):
    """Comm actions with no peer stage, an out-of-range stage, or a non-pipeline kind are rejected."""
    progs = comm_programs()
    progs[rank].append(action)
    with pytest.raises(ScheduleError, match=msg(f"schedule '1f1b', rank {rank}, action {action}", why)):
        _graph(progs)
