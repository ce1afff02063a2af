"""Zero-bubble schedules: published bubble and memory figures, overlapped pairs, and zb-auto's guarantees.

Bubble "on the busiest-span rank" (the zero-bubble paper's measure) is
max over ranks of (last end - first start - busy time): idle inside a rank's
own span, so the warm-up offset of later ranks is not counted.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from conftest import run_sim

from schedules import Kind, PipelineParams, ScheduleError, ZBAutoOptions, build, lower, validate
from schedules.library.zb_auto import MIN_MEM_LIMIT, makespan
from sim import UniformCosts, simulate

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "torch" / "dualpipev_4rank_10mb.csv"  # copied from shared/
TIMES = [0.5, 1.0, 1.5, 2.0]


def sim(name, p, m, costs=None, **kw):
    return simulate(lower(build(name, pp=p, microbatches=m, **kw)), costs or UniformCosts())


def span_bubble(result) -> float:
    return max(r.last_end - r.first_start - r.busy for r in result.ranks)


@pytest.mark.parametrize(("tf", "tb", "tw"), [t for t in itertools.product(TIMES, TIMES, TIMES) if t[2] <= t[0]])
def test_zb_h1_bubble_is_p_minus_1_times_tf_plus_tb_minus_tw(tf, tb, tw):
    """ZB-H1 (Qi et al. 2024, Table 2): (p-1)(tf+tb-tw) for m >= p, when W is no longer than F."""
    c = UniformCosts(tf=tf, tb=tb, tw=tw)
    for p, m in [(2, 2), (3, 5), (4, 8), (5, 12)]:
        r = sim("zb-h1", p, m, c)
        assert span_bubble(r) == (p - 1) * (tf + tb - tw)  # multiples of 0.5: exact in binary floating point


@pytest.mark.parametrize(("tf", "tb", "tw"), [t for t in itertools.product(TIMES, TIMES, TIMES) if t[2] > t[0]])
def test_zb_h1_needs_w_no_longer_than_f(tf, tb, tw):
    """Outside its condition the formula undercounts: a W fills only tf of each gap, so the bubble is (p-1) tb.

    In general (p-1)(tf+tb-min(tf, tw)); e.g. tf=0.5, tb=tw=2, p=2: 1*(0.5+2.0-0.5) = 2.0 where
    (p-1)(tf+tb-tw) = 1*(0.5+2.0-2.0) = 0.5.
    """
    c = UniformCosts(tf=tf, tb=tb, tw=tw)
    for p, m in [(2, 2), (2, 5), (3, 5), (4, 8), (5, 12)]:
        bubble = span_bubble(sim("zb-h1", p, m, c))
        assert bubble == (p - 1) * tb  # multiples of 0.5: exact
        assert bubble > (p - 1) * (tf + tb - tw)  # what the formula would say: less, by (p-1)(tw-tf)


@pytest.mark.parametrize("mw", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (6, 12), (8, 8)])
def test_zb_h1_memory_rank_i_holds_p_minus_i_plus_1_mb_plus_i_minus_1_mw(p, m, mw):
    """Rank i (1-based) peaks at (p-i+1) M_B + (i-1) M_W: p-i+1 activations, i-1 deferred W remnants."""
    peaks = [x.peak_activations for x in sim("zb-h1", p, m, UniformCosts(mw=mw)).ranks]
    assert peaks == [(p - i + 1) + (i - 1) * mw for i in range(1, p + 1)]  # mw in quarters: exact


@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 6), (4, 8), (4, 16), (6, 12)])
def test_peaks_held_until_w(p, m):
    """The runtime's accounting, the default (an activation held until its W; docs/schedules.md's table): zb-h1,
    zb-v and interleaved-zb hold p M_B on every rank, dualpipe-v p + 1/2, v-min (p+4)//3, and zb-h2 all m
    microbatches (its W's run after its last I), where I freeing gives p-i+1, p, (vp-r)/v, p+1/2, p//3+1, 2(p-r)-1."""
    def peaks(name, **kw):
        return [x.peak_activations for x in sim(name, p, m, **kw).ranks]

    assert peaks("zb-h1") == peaks("zb-v") == [p] * p
    assert peaks("interleaved-zb", chunks=2) == [p] * p
    assert peaks("interleaved-zb", chunks=3) == pytest.approx([p] * p, rel=1e-12)  # sums of 1/3: float rounding
    assert peaks("dualpipe-v") == [p + 0.5] * p
    assert max(peaks("v-min")) == (p + 4) // 3
    assert peaks("zb-h2") == [m] * p


def test_zb_h1_issue_figure():
    """p=4, m=8, unit costs: bubble 3 on the busiest-span rank, makespan 24 + 3."""
    r = sim("zb-h1", 4, 8)
    assert r.makespan == 27.0 and span_bubble(r) == 3.0
    assert r.bubble_ratio == pytest.approx(1 / 9, rel=1e-12)  # 1 - busy / (p makespan) = 1 - 4*24/(4*27) = 3/27


@pytest.mark.parametrize(("tf", "tb", "tw"), [t for t in itertools.product(TIMES, TIMES, TIMES) if t[2] <= min(t[0], t[1])])
def test_zb_h2_bubble_is_p_minus_1_times_tf_plus_tb_minus_2tw(tf, tb, tw):
    """ZB-H2 (Qi et al. 2024): (p-1)(tf+tb-2tw) when m >= 2p-1 fills the warm-up and W is the shortest pass."""
    c = UniformCosts(tf=tf, tb=tb, tw=tw)
    for p, m in [(2, 3), (3, 5), (4, 7), (4, 13), (6, 12)]:
        assert span_bubble(sim("zb-h2", p, m, c)) == (p - 1) * (tf + tb - 2 * tw)  # multiples of 0.5: exact


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8])
def test_zb_h2_memory_and_zero_bubble_at_equal_times(p):
    """Rank r holds 2(p-r)-1 activations, 2p-1 on rank 0, in the paper's accounting (an I frees its microbatch);
    at tf=tb=tw each rank is busy all its span. In the runtime's (the default: held until W) every rank holds
    all 3p microbatches at once: its W's run after its last I."""
    r = sim("zb-h2", p, 3 * p, UniformCosts(mw=0.0))
    assert [x.peak_activations for x in r.ranks] == [2 * (p - k) - 1 for k in range(p)]
    assert span_bubble(r) == 0.0
    assert [x.peak_activations for x in sim("zb-h2", p, 3 * p).ranks] == [3 * p] * p


def test_zb_h2_with_too_few_microbatches_still_valid():
    """m < 2p-1: the warm-up cannot fill; the schedule stays valid, with a bubble."""
    r = sim("zb-h2", 4, 4)
    assert span_bubble(r) == 3.0


@pytest.mark.parametrize(("p", "m"), [(2, 3), (2, 8), (3, 5), (4, 7), (4, 8), (4, 16), (6, 11)])
def test_zb_v_zero_bubble_at_p_mb(p, m):
    """ZB-V (Qi et al. 2024, sec. 6): with tf=tb=tw and m >= 2p-1, no rank idles inside its span; peak p M_B."""
    r = sim("zb-v", p, m)
    assert span_bubble(r) == 0.0
    assert [x.peak_activations for x in r.ranks] == [p] * p
    assert all(x.busy == 3 * m for x in r.ranks)


def test_zb_v_with_fewer_microbatches_drops_the_extra_ones():
    """m < 2p-1: built for 2p-1 microbatches and trimmed (as torch does); still valid, not bubble-free."""
    s = build("zb-v", pp=4, microbatches=3)
    validate(s)
    assert {a.microbatch for prog in s.programs for a in prog} == {0, 1, 2}
    r = simulate(lower(s), UniformCosts())
    # Every pass is 1/2 (2 chunks per rank). The critical path is 26 passes: 0F0 1F0 2F0 3F0 4F0 3F1 4F1 3F2
    # 4F2 5F2 5I0 4I0 4W0 3I0 3W0 4I1 4W1 3I1 3W1 4I2 4W2 3I2 2I2 1I2 0I2 0W2, so the makespan is 26 * 0.5 = 13.
    # Each rank is busy 2 stages * 3 microbatches * 3 passes * 0.5 = 9; rank 0 starts at 0 and ends last:
    # 13 - 0 - 9 = 4 (ranks 1-3 span 12.5-0.5, 12-1, 11.5-1.5: idle 3, 2, 1).
    assert r.makespan == 13.0
    assert [x.busy for x in r.ranks] == [9.0] * 4
    assert [x.last_end - x.first_start - x.busy for x in r.ranks] == [4.0, 3.0, 2.0, 1.0]
    assert span_bubble(r) == 4.0


@pytest.mark.parametrize(("p", "v"), [(2, 2), (4, 2), (4, 3), (3, 4)])
def test_interleaved_zb_memory(p, v):
    """ZB1P looped: rank r runs (v-1)p + p-1-r warm-up forwards, so peaks at (vp - r)/v M_B (p on rank 0), in the
    zero-bubble accounting (an I frees its microbatch; the runtime's default holds it until W)."""
    r = sim("interleaved-zb", p, 2 * p, UniformCosts(mw=0.0), chunks=v)
    # Sums of 1/v: exact up to float rounding (1/3 is not a binary fraction).
    assert [x.peak_activations for x in r.ranks] == pytest.approx([(v * p - k) / v for k in range(p)], rel=1e-12)


def test_interleaved_zb_beats_interleaved_1f1b():
    """W filling the bubbles: at p=4, m=8, v=2, unit costs, 25.5 against interleaved 1F1B's 28.5."""
    assert sim("interleaved-zb", 4, 8, chunks=2).makespan == 25.5
    assert sim("interleaved-1f1b", 4, 8, chunks=2).makespan == 28.5


def test_dualpipe_v_equals_torchs_own_test_artifact():
    """Our DualPipeV at p=4, m=10 is, action for action, the schedule in torch's test artifacts."""
    ours = build("dualpipe-v", pp=4, microbatches=10)
    assert ours.to_text().splitlines() == FIXTURE.read_text().split()


def test_dualpipe_v_overlapped_pairs_cost_what_the_model_says():
    """A pair costs tf+tb+tw by default; pair_overlap=1 hides the shorter pass, shrinking the step."""
    g = lower(build("dualpipe-v", pp=4, microbatches=10))
    pairs = [t for t in g.tasks if t.action.kind is Kind.OVERLAP_F_B]
    assert len(pairs) == sum(2 * (10 - 8 + r + 1) + (4 - r - 1) for r in range(4)) - 1
    plain, hidden = UniformCosts(), UniformCosts(pair_overlap=1.0)
    assert {plain.duration(t, g) for t in pairs} == {1.5}  # (F + B) / 2 chunks = (1 + 2) / 2
    assert {hidden.duration(t, g) for t in pairs} == {1.0}  # max(F, B) / 2
    r = simulate(g, plain)
    assert all(x.busy == 30.0 for x in r.ranks)  # every pass once: 10 microbatches x 3 units
    # The critical path: 12 F (0.5) + 2 B (1.0) + 14 pairs (1.5) + 8 I or W (0.5) = 6 + 2 + 21 + 4 = 33.
    assert r.makespan == 33.0
    per_rank = [sum(t.rank == k for t in pairs) for k in range(4)]
    assert per_rank == [9, 10, 11, 11]
    h = simulate(g, hidden)
    assert [x.busy for x in h.ranks] == [30.0 - 0.5 * n for n in per_rank]  # each pair 0.5 shorter
    # Hiding the shorter pass moves the critical path: 12 F (0.5) + 5 B (1.0) + 11 pairs (1.0) + 8 I or W (0.5)
    # = 6 + 5 + 11 + 4 = 26 (what test_cli_pair_overlap gets through the command line).
    assert h.makespan == 26.0


def test_dualpipe_v_needs_two_microbatches_per_rank():
    with pytest.raises(ScheduleError, match=r"dualpipe-v needs microbatches >= 2\*pp = 8 \(one per stage\), got 7"):
        build("dualpipe-v", pp=4, microbatches=7)


def test_v_schedules_take_exactly_two_chunks():
    with pytest.raises(ScheduleError, match=r"schedule 'zb-v' places exactly 2 stages per rank \(chunks=2\), got chunks=3"):
        build("zb-v", pp=4, microbatches=8, chunks=3)


COST_CASES = [
    dict(tf=1.0, tb=1.0, tw=1.0, tcomm=0.0),
    dict(tf=1.0, tb=2.0, tw=1.0, tcomm=0.0),
    dict(tf=1.2, tb=1.9, tw=0.6, tcomm=0.1),
    dict(tf=0.5, tb=1.5, tw=1.5, tcomm=0.3),
]


@pytest.mark.parametrize("times", COST_CASES)
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 13), (6, 12)])
def test_zb_auto_no_worse_than_handcrafted_at_their_memory(times, p, m):
    """At limit p zb-auto is no slower than ZB-H1, at 2p-1 no slower than ZB-H2, and within its limit."""
    c = UniformCosts(**times)
    for limit, rival in ((p, "zb-h1"), (2 * p - 1, "zb-h2")):
        auto = build("zb-auto", pp=p, microbatches=m, mem_limit=limit, time_limit=0.5, **times)
        r = simulate(validate(auto), c)
        # Bounds, not values: zb-auto's schedule comes out of a greedy search with no closed form; the
        # guarantees are the memory limit and not losing to the hand-crafted schedule.
        assert r.peak_activations <= limit + 1e-9
        assert r.makespan <= sim(rival, p, m, c).makespan + 1e-9
        assert r.makespan == pytest.approx(makespan(auto, **times), rel=1e-12)  # its own estimate is the simulator's


def test_zb_auto_tight_limit_and_mw():
    """A limit of 1 M_B (the minimum) still yields a valid schedule; with mw the limit counts W remnants."""
    s = build("zb-auto", pp=4, microbatches=8, mem_limit=1.0, time_limit=0.5)
    assert simulate(validate(s), UniformCosts()).peak_activations == 1.0
    s = build("zb-auto", pp=4, microbatches=8, mem_limit=2.5, mw=0.5, time_limit=0.5)
    # A bound: what the greedy search fills up to the limit has no closed form.
    assert simulate(validate(s), UniformCosts(mw=0.5)).peak_activations <= 2.5


def test_zb_auto_refuses_a_limit_below_the_minimum():
    with pytest.raises(ScheduleError, match=f"below the minimum {MIN_MEM_LIMIT:g} M_B"):
        build("zb-auto", pp=4, microbatches=8, mem_limit=0.5)


@pytest.mark.parametrize(("kw", "field"), [({"mem_limit": 4}, "mem_limit"), ({"tf": 2.0}, "tf"),
                                           ({"time_limit": 1, "tw": 0.5}, "time_limit")])
def test_zb_auto_options_only_for_adaptive_schedules(kw, field):
    """zb-auto's inputs are its own options: any of them, or an options object, given to another schedule is refused."""
    with pytest.raises(ScheduleError, match=rf"^{field} applies only to adaptive schedules \(zb-auto\), not to '1f1b'$"):
        build("1f1b", pp=4, microbatches=8, **kw)
    with pytest.raises(ScheduleError, match=r"^options applies only to adaptive schedules \(zb-auto\), not to 'gpipe'$"):
        build("gpipe", PipelineParams(pp=4, microbatches=8), ZBAutoOptions())


def test_zb_auto_options_as_an_object_or_as_keywords():
    opts = ZBAutoOptions(tf=1.1, tb=1.7, tw=0.4, tcomm=0.05, mem_limit=6, time_limit=0)
    by_object = build("zb-auto", PipelineParams(pp=5, microbatches=11), opts)
    assert by_object == build("zb-auto", pp=5, microbatches=11, tf=1.1, tb=1.7, tw=0.4, tcomm=0.05, mem_limit=6,
                              time_limit=0)
    assert by_object == build("zb-auto", None, opts, pp=5, microbatches=11)
    with pytest.raises(TypeError, match=r"not both \(got \['tf'\]\)"):
        build("zb-auto", PipelineParams(pp=5, microbatches=11), opts, tf=1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tf'"):
        PipelineParams(pp=5, microbatches=11, tf=1.0)  # the shape alone: every schedule reads it


@pytest.mark.parametrize(("kw", "message"), [
    ({"mem_limit": 0}, "mem_limit must be > 0 M_B, got 0"),
    ({"time_limit": -1}, "time_limit must be seconds in [0, 3600], got -1"),
    ({"time_limit": True}, "time_limit must be seconds in [0, 3600], got True"),
    ({"tcomm": -0.5}, "tcomm must be a finite time >= 0, got -0.5"),
])
def test_zb_auto_options_are_checked_when_made(kw, message):
    with pytest.raises(ScheduleError) as err:
        ZBAutoOptions(**kw)
    assert str(err.value) == message and err.value.field == next(iter(kw))


def test_zb_auto_heuristic_is_deterministic():
    """time_limit=0: the heuristic alone, reproducible action for action (the timed search may not be)."""
    a = build("zb-auto", pp=5, microbatches=11, mem_limit=6, tf=1.1, tb=1.7, tw=0.4, tcomm=0.05, time_limit=0)
    b = build("zb-auto", pp=5, microbatches=11, mem_limit=6, tf=1.1, tb=1.7, tw=0.4, tcomm=0.05, time_limit=0)
    assert a is not b and a == b  # two separate builds (nothing cached) agree action for action


def test_cli_zb_h1_issue_figure(capsys):
    """python -m sim --schedule zb-h1 --pp 4 --microbatches 8 --json: makespan 24 + 3."""
    import json

    code, out, _ = run_sim(capsys, "--schedule", "zb-h1", "--pp", "4", "--microbatches", "8", "--json")
    d = json.loads(out)
    assert code == 0 and d["makespan"] == 27.0
    assert d["bubble_ratio"] == pytest.approx(1 / 9, rel=1e-12)  # 1 - 96/108 = 12/108
    assert max(r["last_end"] - r["first_start"] - r["busy"] for r in d["ranks"]) == 3.0


def test_cli_zb_auto_reads_times_and_limit(capsys):
    """--mem-limit and the pass times reach zb-auto: at 2p-1 with tb=2 it ties ZB-H2 (35) and holds 7 M_B."""
    import json

    code, out, _ = run_sim(capsys, "--schedule", "zb-auto", "--pp", "4", "--microbatches", "8",
                           "--mem-limit", "7", "--tb", "2", "--time-limit", "1", "--json")
    d = json.loads(out)
    # The peak is a bound: zb-auto's greedy schedule has no closed form, its guarantee is the limit.
    assert code == 0 and d["makespan"] == 35.0 and d["peak_activations"] <= 7.0


def test_cli_pair_overlap(capsys):
    import json

    outs = []
    for h in ("0", "1"):
        _, out, _ = run_sim(capsys, "--schedule", "dualpipe-v", "--pp", "4", "--microbatches", "10",
                               "--pair-overlap", h, "--json")
        outs.append(json.loads(out)["makespan"])
    assert outs == [33.0, 26.0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--schedule", "zb-auto", "--pp", "4", "--microbatches", "8", "--mem-limit", "0.5"],
     "zb-auto: mem_limit 0.5 M_B is below the minimum 1 M_B"),
    (["--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--mem-limit", "3"],
     "mem_limit applies only to adaptive schedules (zb-auto), not to '1f1b' (flag --mem-limit)"),
    (["--schedule", "dualpipe-v", "--pp", "4", "--microbatches", "10", "--pair-overlap", "2"],
     "uniform costs: pair_overlap must be a fraction of the shorter pass hidden in [0, 1], got 2.0 (flag --pair-overlap)"),
    (["--schedule", "dualpipe-v", "--pp", "4", "--microbatches", "6"], "dualpipe-v needs microbatches >= 2*pp = 8"),
])
def test_cli_zero_bubble_errors(capsys, argv, message):
    code, out, err = run_sim(capsys, *argv)
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err
