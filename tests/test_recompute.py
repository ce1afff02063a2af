"""Recomputation as an action: R(stage, mb) in the IR, the checks, the simulator, and the two placement passes."""

from __future__ import annotations

import pytest
from conftest import run_sim

from schedules import Action, Kind, Schedule, ScheduleError, build, lower, validate
from schedules.recompute import recompute_full, recompute_in_bubbles
from schedules.timing import evaluate
from sim import UniformCosts, simulate

SHAPES = [("1f1b", {}), ("gpipe", {}), ("zb-h1", {}), ("interleaved-1f1b", {"chunks": 2}), ("zb-v", {}),
          ("dualpipe-v", {}), ("v-half", {}), ("v-min", {})]


def test_r_parses_and_prints():
    assert str(Action.parse("2R0")) == "2R0" and Action.parse("2R0").kind is Kind.R


@pytest.mark.parametrize(("programs", "message"), [
    ([["0R0", "0F0", "0B0"]], r"0R0: recomputes before its forward 0F0"),
    ([["0F0", "0B0", "0R0"]], r"0R0: comes after its backward 0B0"),
    ([["0F0", "0I0", "0R0", "0W0"]], r"0R0: comes after its backward 0I0"),
])
def test_r_must_lie_between_its_forward_and_backward(programs, message):
    with pytest.raises(ScheduleError, match=message):
        lower(Schedule.from_programs(programs))


def test_1f1b_full_recompute_exact():
    """p=4, m=8, unit times: an R (a forward) before each B. Busy 8 x (F + R + B) = 32 per rank; the critical
    path grows by one forward per microbatch of the last rank's steady state: 33 -> 41. The recomputed F keeps
    only its input (0 M_B here), so a rank holds one microbatch's activations, from its R to its B."""
    r = simulate(validate(recompute_full(build("1f1b", pp=4, microbatches=8))), UniformCosts())
    assert r.makespan == 41.0
    assert [x.busy for x in r.ranks] == [32.0] * 4
    assert [x.peak_activations for x in r.ranks] == [1.0] * 4


@pytest.mark.parametrize(("name", "kw"), SHAPES)
def test_full_recompute_on_every_schedule(name, kw):
    """Valid everywhere; peak one microbatch's share; the evaluator and the simulator agree."""
    s = recompute_full(build(name, pp=4, microbatches=8, **kw))
    r = simulate(validate(s), UniformCosts(tcomm=0.1))
    e = evaluate(s, 1.0, 1.0, 1.0, 0.1)
    assert r.makespan == pytest.approx(e.makespan, rel=1e-12)
    assert tuple(x.peak_activations for x in r.ranks) == e.peaks
    share = 1 / s.chunks
    assert r.peak_activations <= 2 * share  # an overlapped pair may hold its own R and its partner's


@pytest.mark.parametrize(("name", "kw"), SHAPES)
@pytest.mark.parametrize("limit", [1.0, 2.0, 3.0])
def test_recompute_in_bubbles_trades_memory_for_time(name, kw, limit):
    """The Mario-style pass keeps every rank within the limit and never lengthens the full-recompute step."""
    base = build(name, pp=4, microbatches=8, **kw)
    full = simulate(validate(recompute_full(base)), UniformCosts())
    moved = simulate(validate(recompute_in_bubbles(base, limit)), UniformCosts())
    assert moved.peak_activations <= max(limit, full.peak_activations) + 1e-9
    assert moved.makespan <= full.makespan + 1e-9


def test_v_half_recompute_in_bubbles_is_faster():
    """v-half, p=4, m=8: R's hidden in bubbles take the step from 34.5 (R before B) to 33.5 at 2 M_B."""
    base = build("v-half", pp=4, microbatches=8)
    assert simulate(lower(recompute_full(base)), UniformCosts()).makespan == 34.5
    r = simulate(lower(recompute_in_bubbles(base, 2.0)), UniformCosts())
    assert (r.makespan, r.peak_activations) == (33.5, 2.0)


def test_cli_recompute_full(capsys):
    import json

    code, out, _ = run_sim(capsys, "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--recompute", "full",
                           "--json")
    d = json.loads(out)
    assert code == 0 and d["makespan"] == 41.0 and d["peak_activations"] == 1.0
