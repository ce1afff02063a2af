"""v-half and v-min (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): the published claims.

The authors' summary of the paper (t_F = t_B = t_W; bubble rate 1 - (F+B+W) m / longest stage time):
peak activations p (1F1B), (p+2)//2 (V-Half, about 1/2), (p+4)//3 (V-Min, about 1/3) microbatches; bubble
rates ~ p/m (1F1B), ~ p/(2m) (V-Half), ~ 2p/(3m) (V-Min).
"""

from __future__ import annotations

import pytest

from schedules import build, validate
from sim import UniformCosts, simulate


def run(name, p, m):
    return simulate(validate(build(name, pp=p, microbatches=m)), UniformCosts())


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8, 12, 16])
def test_peak_memory_is_the_published_fraction_of_1f1b(p):
    m = 4 * p
    assert run("1f1b", p, m).ranks[0].peak_activations == p
    assert run("v-half", p, m).peak_activations == (p + 2) // 2
    assert run("v-min", p, m).peak_activations == (p + 4) // 3


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 16), (6, 18), (8, 16), (8, 32), (8, 64), (12, 48), (16, 64)])
def test_v_half_bubble_within_p_over_2m(p, m):
    """V-Half's bubble rate is at most p/(2m), under 1F1B's, at half its memory."""
    half, base = run("v-half", p, m), run("1f1b", p, m)
    assert half.span_bubble <= p / (2 * m)
    assert half.span_bubble < base.span_bubble


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 16), (6, 18), (8, 16), (8, 32), (8, 64)])
def test_v_min_bubble_within_2p_over_3m(p, m):
    """V-Min's bubble rate is at most 2p/(3m) at a third of 1F1B's memory, for p <= 8."""
    assert run("v-min", p, m).span_bubble <= 2 * p / (3 * m)


@pytest.mark.xfail(strict=True, reason="our list scheduler starves at p >= 12 under V-Min's cap: 22.7% at p=16, "
                   "m=64 against the paper's ~16.7%; the paper's repeating building block is not built")
def test_v_min_bubble_at_p16():
    assert run("v-min", 16, 64).span_bubble <= 2 * 16 / (3 * 64)


def test_v_schedules_exact_figure():
    """p=4, m=8, unit times: whole-result figures of the two schedules."""
    half, vmin = run("v-half", 4, 8), run("v-min", 4, 8)
    assert [x.peak_activations for x in half.ranks] == [3.0] * 4
    assert [x.peak_activations for x in vmin.ranks] == [2.0] * 4
    assert all(x.busy == 24.0 for x in half.ranks + vmin.ranks)  # 8 microbatches x (F+I+W) = 24
    # Halves of unit passes: exact in binary. Largest spans 26.0 and 31.5: bubble 1 - 24/26, 1 - 24/31.5.
    assert (half.makespan, vmin.makespan) == (26.5, 31.5)
    assert [x.last_end - x.first_start for x in half.ranks] == [26.0, 25.5, 25.0, 25.0]
    assert [x.last_end - x.first_start for x in vmin.ranks] == [31.5, 30.5, 29.5, 29.0]
