"""v-half and v-min (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): the published claims.

The authors' summary of the paper (t_F = t_B = t_W; bubble rate 1 - (F+B+W) m / longest stage time):
peak activations p (1F1B), (p+2)//2 (V-Half, about 1/2), (p+4)//3 (V-Min, about 1/3) microbatches; bubble
rates ~ p/m (1F1B), ~ p/(2m) (V-Half), ~ 2p/(3m) (V-Min).
"""

from __future__ import annotations

import pytest

from schedules import build, validate
from schedules.library.controllable import V_MIN_INTERVAL, v_min_offsets
from sim import UniformCosts, simulate


def run(name, p, m):
    return simulate(validate(build(name, pp=p, microbatches=m)), UniformCosts())


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8, 12, 16])
def test_peak_memory_is_the_published_fraction_of_1f1b(p):
    """v-half's list scheduler caps (p+2)//2 M_B counting an I as freeing its microbatch (mw 0, asked for here);
    the runtime holds each until its W, and there v-half holds more than 1F1B (test_v_schedules_exact_figure)."""
    m = 4 * p
    assert run("1f1b", p, m).ranks[0].peak_activations == p
    half = validate(build("v-half", pp=p, microbatches=m))
    assert simulate(half, UniformCosts(mw=0.0)).peak_activations == (p + 2) // 2


@pytest.mark.parametrize("p", range(2, 17))
def test_v_min_peak_memory(p):
    """V-Min's building block holds exactly the published (p+4)//3 M_B under the paper's accounting (an
    activation held until its W: mw = 1), and p//3 + 1 under ours (I frees it): one less where p % 3 == 2."""
    sched = validate(build("v-min", pp=p, microbatches=4 * p))
    assert simulate(sched, UniformCosts()).peak_activations == (p + 4) // 3  # the default: the runtime's, mw = 1
    assert simulate(sched, UniformCosts(mw=0.0)).peak_activations == p // 3 + 1


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 16), (6, 18), (8, 16), (8, 32), (8, 64), (12, 48), (16, 64)])
def test_v_half_bubble_within_p_over_2m(p, m):
    """V-Half's bubble rate is at most p/(2m), under 1F1B's, at half its memory."""
    half, base = run("v-half", p, m), run("1f1b", p, m)
    assert half.span_bubble <= p / (2 * m)
    assert half.span_bubble < base.span_bubble


@pytest.mark.parametrize(("p", "m"), [(2, 4), (3, 9), (4, 8), (4, 16), (5, 10), (6, 18), (7, 14), (8, 16), (8, 32),
                                    (8, 64), (9, 27), (10, 20), (11, 44), (12, 48), (13, 26), (14, 56), (15, 30),
                                    (16, 16), (16, 64)])
def test_v_min_bubble_within_2p_over_3m(p, m):
    """V-Min's bubble rate is at most 2p/(3m) at a third of 1F1B's memory (the building block, p = 2..16)."""
    assert run("v-min", p, m).span_bubble <= 2 * p / (3 * m)


def test_v_min_bubble_at_p16():
    """The building block's figure at p=16, m=64: 13.3% against the paper's ~16.7% (our old list scheduler, kept
    for v-half, got 22.7% under V-Min's cap). Unit chunk passes of 1/2: span 2 x 64 x 3 / (1 - bubble)."""
    r = run("v-min", 16, 64)
    assert r.span_bubble <= 2 * 16 / (3 * 64)
    assert max(x.last_end - x.first_start for x in r.ranks) == 221.5  # 192 busy + 29.5 idle


def test_v_schedules_exact_figure():
    """p=4, m=8, unit times: whole-result figures of the two schedules."""
    half, vmin = run("v-half", 4, 8), run("v-min", 4, 8)
    # The runtime's accounting (the default: a microbatch held until its W): v-half defers its W's, so it holds
    # up to 7 M_B (1F1B: 4); v-min's W's follow their I's within its block. Counting an I as freeing (mw 0), the
    # figures its caps were set by: 3.0 each and 2, 2, 1.5, 2.
    assert [x.peak_activations for x in half.ranks] == [6.0, 6.0, 6.5, 7.0]
    assert [x.peak_activations for x in vmin.ranks] == [2.0] * 4
    freed_at_i = [simulate(validate(build(n, pp=4, microbatches=8)), UniformCosts(mw=0.0)) for n in ("v-half", "v-min")]
    assert [[x.peak_activations for x in r.ranks] for r in freed_at_i] == [[3.0] * 4, [2.0, 2.0, 1.5, 2.0]]
    assert all(x.busy == 24.0 for x in half.ranks + vmin.ranks)  # 8 microbatches x (F+I+W) = 24
    # Halves of unit passes: exact in binary. Largest spans 26.0 and 29.5: bubble 1 - 24/26, 1 - 24/29.5.
    assert (half.makespan, vmin.makespan) == (26.5, 29.5)
    assert [x.last_end - x.first_start for x in half.ranks] == [26.0, 25.5, 25.0, 25.0]
    assert [x.last_end - x.first_start for x in vmin.ranks] == [29.5, 28.5, 27.5, 27.0]


@pytest.mark.parametrize("p", range(1, 65))
def test_v_min_block_slots(p):
    """The block's premises, by slot arithmetic: its four slots are distinct modulo the 6-slot interval (so blocks
    never collide), and every pass's slot follows its producer's (F down the V, then I back up it)."""
    offs = v_min_offsets(p)
    assert all(len({o % V_MIN_INTERVAL for o in row}) == 4 for row in offs)
    for i, (fd, fu, iu, idn) in enumerate(offs):
        assert fu > (offs[i + 1][1] if i + 1 < p else offs[i][0])  # up F after the next rank's up F (or the turn)
        assert iu > (offs[i - 1][2] if i > 0 else fu)  # up I after the previous rank's up I (or the loss)
        assert idn > (offs[i + 1][3] if i + 1 < p else iu)  # down I after the next rank's down I (or the turn)
        assert i == 0 or fd > offs[i - 1][0]
