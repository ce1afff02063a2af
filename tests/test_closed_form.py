"""The simulator against the published closed forms, across many (p, m, v) and cost settings."""

from __future__ import annotations

import itertools

import pytest

from analysis.theory import bubble_ratio, bubble_time
from schedules import build, lower
from sim import UniformCosts, simulate

SHAPES = [(p, m) for p, m in itertools.product([1, 2, 3, 4, 5, 8], [1, 2, 3, 4, 7, 8, 12, 16])]
COSTS = [UniformCosts(), UniformCosts(tf=1.0, tb=2.0, tw=0.5), UniformCosts(tf=0.3, tb=0.7, tw=1.9)]


def sim(name: str, pp: int, m: int, chunks: int | None = None, costs: UniformCosts | None = None):
    return simulate(lower(build(name, pp=pp, microbatches=m, chunks=chunks)), costs or UniformCosts())


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), SHAPES)
def test_flush_bubble_ratio_is_p_minus_1_over_m_plus_p_minus_1(name, p, m):
    """GPipe and 1F1B: bubble ratio (p-1)/(m+p-1) exactly, for any pass times."""
    for costs in COSTS:
        r = sim(name, p, m, costs=costs)
        assert r.bubble_ratio == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
        t = costs.tf + costs.tb + costs.tw
        assert r.makespan == pytest.approx((m + p - 1) * t, rel=1e-12)
        assert all(x.busy == pytest.approx(m * t) for x in r.ranks)


@pytest.mark.parametrize(("p", "m"), SHAPES)
def test_gpipe_holds_all_microbatches_on_every_rank(p, m):
    assert [x.peak_activations for x in sim("gpipe", p, m).ranks] == [m] * p


@pytest.mark.parametrize(("p", "m"), SHAPES)
def test_1f1b_rank_r_holds_p_minus_r(p, m):
    """1F1B: rank r (0-based) holds min(p - r, m) microbatches at its peak."""
    assert [x.peak_activations for x in sim("1f1b", p, m).ranks] == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("rounds", [1, 2, 3])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_time_is_p_minus_1_times_t_over_v(p, rounds, v):
    """Interleaved 1F1B: bubble time (p-1)(t_f+t_b+t_w)/v per rank (Narayanan et al. 2021)."""
    m = p * rounds
    for costs in COSTS:
        r = sim("interleaved-1f1b", p, m, v, costs)
        t = costs.tf + costs.tb + costs.tw
        assert r.makespan == pytest.approx(m * t + (p - 1) * t / v, rel=1e-12)
        assert r.makespan - r.ranks[0].busy == pytest.approx((p - 1) * t / v, rel=1e-9, abs=1e-12)
        assert r.bubble_ratio == pytest.approx(bubble_ratio("interleaved-1f1b", p, m, v, costs.tf, costs.tb, costs.tw))


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_rank0_peak_is_published_p_plus_p_minus_1_over_v(p, v):
    """Rank 0 holds p + (p-1)/v microbatches' activations (Megatron's (1 + (p-1)/(pv)) x p M_B).

    Rank r runs (v-1)p + 2(p-1-r) warm-up forwards and one more before its first
    backward, each chunk holding M_B/v: ((v+1)p - 1 - 2r)/v. Needs m >= 2p so the
    warm-up is not cut short by the end of the microbatches.
    """
    m = 2 * p
    ranks = sim("interleaved-1f1b", p, m, v).ranks
    assert ranks[0].peak_activations == pytest.approx(p + (p - 1) / v)
    for r, stats in enumerate(ranks):
        assert stats.peak_activations == pytest.approx(((v + 1) * p - 1 - 2 * r) / v)


def test_issue_figures():
    """The two figures the spine promises from the CLI's defaults."""
    assert sim("gpipe", 4, 8).bubble_ratio == pytest.approx(3 / 11, abs=1e-9)
    r = sim("interleaved-1f1b", 4, 8, 2)
    assert r.makespan == 28.5
    assert r.bubble_ratio == pytest.approx(4.5 / 28.5, abs=1e-9)


@pytest.mark.parametrize(("p", "m"), [(p, m) for p, m in SHAPES if m >= p])
@pytest.mark.parametrize("v", [2, 3])
def test_looped_bfs_bubble_and_memory(p, m, v):
    """Looped BFS with m >= p: same bubble time as interleaved; every rank holds all m microbatches."""
    r = sim("looped-bfs", p, m, v, COSTS[1])
    assert r.makespan - r.ranks[0].busy == pytest.approx(bubble_time("looped-bfs", p, m, v, 1.0, 2.0, 0.5))
    assert all(x.peak_activations == pytest.approx(m) for x in r.ranks)


def test_comm_delay_adds_to_the_critical_path():
    """GPipe with t_comm: the first microbatch's forward and the last backward each cross p-1 links.

    Forward of mb 0 reaches the last rank at (p-1)(t_f + c); the last rank then runs
    back to back; the last backward crosses p-1 links back: makespan =
    (m+p-1)(t_f + t_b + t_w) + 2(p-1)c for GPipe when c <= t_f (no extra stalls).
    """
    c = UniformCosts(tf=1.0, tb=1.0, tw=1.0, tcomm=0.25)
    for p, m in [(2, 4), (4, 8), (5, 3)]:
        r = sim("gpipe", p, m, costs=c)
        assert r.makespan == pytest.approx((m + p - 1) * 3 + 2 * (p - 1) * 0.25)


def test_mw_split_memory():
    """I frees all but mw of a microbatch, W frees the rest: program F0 I0 F1 I1 W0 W1 peaks at 1 + mw."""
    from schedules import Schedule

    s = Schedule.from_programs([["0F0", "0I0", "0F1", "0I1", "0W0", "0W1"]], name="iw")
    for mw in (0.0, 0.25, 1.0):
        r = simulate(lower(s), UniformCosts(mw=mw))
        # after 0I0 holds mw; 0F1 adds 1 -> 1 + mw; after 0I1 2mw; W frees.
        assert r.ranks[0].peak_activations == pytest.approx(max(1.0, 1.0 + mw))
