"""Recomputation as an action: R(stage, mb) in the IR, the checks, the simulator, and the two placement passes."""

from __future__ import annotations

import pytest
from conftest import run_sim

from schedules import Action, Kind, Schedule, ScheduleError, build, lower, validate
from schedules.library.recompute import recompute_full, recompute_in_bubbles
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
    """Valid everywhere; the evaluator and the simulator agree; never more than without R. Counting an I as
    freeing its microbatch (mw 0), the peak is one microbatch's share; in the runtime's accounting (the default)
    a schedule that defers its W's holds every R'd microbatch until that W (zb-h1: 4 M_B, as without R)."""
    base = build(name, pp=4, microbatches=8, **kw)
    s = recompute_full(base)
    r = simulate(validate(s), UniformCosts(tcomm=0.1))
    e = evaluate(s, 1.0, 1.0, 1.0, 0.1)
    assert r.makespan == pytest.approx(e.makespan, rel=1e-12)
    assert tuple(x.peak_activations for x in r.ranks) == e.peaks
    assert r.peak_activations <= simulate(validate(base), UniformCosts(tcomm=0.1)).peak_activations
    share = 1 / s.chunks
    freed_at_i = simulate(validate(s), UniformCosts(tcomm=0.1, mw=0.0))
    assert freed_at_i.peak_activations <= 2 * share  # an overlapped pair may hold its own R and its partner's


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
    """v-half, p=4, m=8 at 2 M_B, counting an I as freeing its microbatch (mw 0, asked for): R before B takes
    34.5; dropping the R's the limit does not need gives 29.5, moving the rest into bubbles 29.0. At 3 M_B
    (v-half's own peak there) no R is left: 26.5, no recomputation. In the runtime's accounting (the default:
    held until W) v-half with an R before every backward still holds 6 M_B, so at 2 M_B the pass keeps them all."""
    from schedules.library.recompute import _drop

    base = build("v-half", pp=4, microbatches=8)
    assert simulate(lower(recompute_full(base)), UniformCosts()).makespan == 34.5
    assert evaluate(_drop(recompute_full(base), 2.0, (1.0, 1.0, 1.0, 0.0, 0.0)), 1, 1, 1, 0.0, 0.0).makespan == 29.5
    r = simulate(lower(recompute_in_bubbles(base, 2.0, mw=0.0)), UniformCosts(mw=0.0))
    assert (r.makespan, r.peak_activations) == (29.0, 2.0)
    assert evaluate(recompute_in_bubbles(base, 3.0, mw=0.0), 1, 1, 1, 0.0, 0.0).makespan == 26.5
    held = simulate(lower(recompute_in_bubbles(base, 2.0)), UniformCosts())
    assert (held.makespan, held.peak_activations) == (34.5, 6.0)


def test_1f1b_recomputes_only_where_the_limit_needs():
    """1F1B, p=4, m=8 (rank r holds 4 - r microbatches without R): at L M_B only ranks with 4 - r > L keep
    R's; the last rank (1 microbatch) never recomputes, and it is the critical path."""
    base = build("1f1b", pp=4, microbatches=8)
    got = {}
    for limit in (1.0, 2.0, 4.0):
        s = recompute_in_bubbles(base, limit)
        t = evaluate(s, 1, 1, 1)
        got[limit] = (t.makespan, max(t.peaks), [sum(a.kind is Kind.R for a in p) for p in s.programs])
    assert got == {1.0: (39.0, 1.0, [7, 7, 7, 0]), 2.0: (35.0, 2.0, [4, 3, 0, 0]), 4.0: (33.0, 4.0, [0, 0, 0, 0])}


def test_cli_recompute_full(capsys):
    import json

    code, out, _ = run_sim(capsys, "--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--recompute", "full",
                           "--json")
    d = json.loads(out)
    assert code == 0 and d["makespan"] == 41.0 and d["peak_activations"] == 1.0


def test_place_recompute_modes_and_errors():
    from schedules import ConfigError
    from schedules.library.recompute import place_recompute

    base = build("1f1b", pp=2, microbatches=4)
    assert place_recompute(base, "none") is base
    assert place_recompute(base, "full") == recompute_full(base)
    assert place_recompute(base, "bubbles", 2.0) == recompute_in_bubbles(base, 2.0)
    with pytest.raises(ConfigError, match="already has R actions; run it with recompute none"):
        place_recompute(recompute_full(base), "full")
    with pytest.raises(ConfigError, match="recompute bubbles needs recompute_limit"):
        place_recompute(base, "bubbles")


def test_r_round_trips_through_the_csv(tmp_path):
    """R is schedlab's extension of torch's CSV: written and read back, compute-only or with SEND/RECV."""
    from schedules import load_graph, read_torch_csv, write_torch_csv

    s = recompute_in_bubbles(build("zb-h1", pp=2, microbatches=4), 2.0)
    assert read_torch_csv(write_torch_csv(s, tmp_path / "a.csv")).programs == s.programs
    graph = validate(load_graph(f"csv:{write_torch_csv(s, tmp_path / 'b.csv', comms=True)}"))
    assert graph.schedule.programs == s.programs


# -- R in physical units (TransformerCosts) ----------------------------------------------------------------------------


def _units(recompute: str = "none", tp: int = 1, cluster: str = "dgx-a100:1", **kw):
    from sim.costs.cluster import cluster_preset
    from sim.costs.parallel import ParallelConfig
    from sim.costs.transformer import model_preset
    from sim.costs.transformer_costs import TransformerCosts

    return TransformerCosts(model=model_preset("gpt-6.2b"), cluster=cluster_preset(cluster),
                            parallel=ParallelConfig(pp=4, tp=tp), recompute=recompute, **kw)


@pytest.mark.parametrize("kw", [{}, {"efficiency": 0.5}, {"tp": 2}, {"tp": 2, "efficiency": 0.5}])
def test_units_r_costs_what_full_recompute_adds_to_i(kw):
    """R = the stage's layers' forward with their TP collectives: Korthikanti's full recomputation inside I, as a
    task of its own (calibrated GEMM model and constant efficiency; tp 1 and 2, no SP)."""

    none, full = _units("none", **kw), _units("full", **kw)
    for s in range(4):
        added = full.pass_time(Kind.I, s, 4) - none.pass_time(Kind.I, s, 4)
        assert none.pass_time(Kind.R, s, 4) == pytest.approx(added, rel=1e-12)
    # A middle stage's R is its F; the edges do not re-run the embedding (stage 0) or the LM head (last).
    assert [none.pass_time(Kind.R, s, 4) == none.pass_time(Kind.F, s, 4) for s in (1, 2)] == [True, True]
    assert none.pass_time(Kind.R, 0, 4) <= none.pass_time(Kind.F, 0, 4)
    assert none.pass_time(Kind.R, 3, 4) < none.pass_time(Kind.F, 3, 4)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1"])
def test_units_r_schedule_against_full_recompute_inside_i(name):
    """gpt-6.2b, pp=4, m=8 on A100s: R before every backward (costs recompute none) against recompute full
    inside I. Same busy time per rank; no later end (an R need not wait for the gradient); memory per
    1F1B rank r: (p-1-r) kept layer inputs + one microbatch's full activations, against p-r microbatches'
    layer inputs, each of the stage's layers keeping its own."""
    base = build(name, pp=4, microbatches=8)
    # compute not slowed by the sends it overlaps (contention 0): R and full recomputation overlap different sends
    none, full = _units("none", contention=0), _units("full", contention=0)
    r = simulate(validate(recompute_full(base)), none)
    k = simulate(validate(base), full)
    assert [x.busy for x in r.ranks] == pytest.approx([x.busy for x in k.ranks], rel=1e-12)
    assert r.makespan <= k.makespan * (1 + 1e-12)
    if name == "1f1b":
        got = [x.peak_activations for x in r.ranks]
        want = [(3 - s) * none.recompute_kept(s, 4) + none.stage_activations(s, 4) for s in range(4)]
        assert got == pytest.approx(want, rel=1e-12)
        assert [x.peak_activations for x in k.ranks] == pytest.approx(
            [(4 - s) * full.stage_activations(s, 4) for s in range(4)], rel=1e-12)


def test_units_refuse_r_actions_with_full_recompute_and_count_their_flops(tmp_path):
    """A schedule with R's (here from a CSV file) simulates in physical units; its hardware FLOPs count the R's,
    the same as full recomputation inside I; with costs recompute full the layers would be recomputed twice."""
    from schedules import ConfigError, write_torch_csv
    from sim.plan.study import Study, run_study

    s = recompute_full(build("1f1b", pp=4, microbatches=8))
    with pytest.raises(ConfigError, match="recomputes with R actions and the costs' recompute is full"):
        simulate(lower(s), _units("full"))
    path = write_torch_csv(s, tmp_path / "r.csv")
    with_r = run_study(Study(schedule=f"csv:{path}", microbatches=8, costs=_units("none")))
    inside = run_study(Study(schedule="1f1b", microbatches=8, costs=_units("full")))
    assert with_r.hardware_flops_per_step == pytest.approx(inside.hardware_flops_per_step, rel=1e-12)
    assert with_r.hardware_flops_per_step > with_r.model_flops_per_step
    assert with_r.step_time <= inside.step_time


def test_cli_recompute_bubbles(capsys):
    import json

    code, out, _ = run_sim(capsys, "--schedule", "v-half", "--pp", "4", "--microbatches", "8", "--recompute",
                           "bubbles", "--recompute-limit", "2", "--mw", "0", "--json")  # the I-frees accounting
    d = json.loads(out)
    assert code == 0 and (d["makespan"], d["peak_activations"]) == (29.0, 2.0)
    code, _, err = run_sim(capsys, "--schedule", "v-half", "--pp", "4", "--microbatches", "8", "--recompute", "bubbles")
    assert code == 2 and "recompute bubbles needs recompute_limit" in err and "(flag --recompute-limit)" in err
