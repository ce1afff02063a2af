"""zb-auto against the zero-bubble paper (Qi et al., ICLR 2024): Table 5's ZB-2p column, Table 9's pass times.

The bubble rate is the paper's: 1 - m (T_F + T_B + T_W) / cost, cost the largest span (last end - first start)
of a stage. Communication is an edge delay, as in the paper's simulation.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from schedules import build, lower
from schedules.timing import evaluate
from sim import UniformCosts, simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from zb_table5 import TABLE5, zb2p


def row(model, p, m):
    return next(r for r in TABLE5 if r[:3] == (model, p, m))


@pytest.mark.parametrize(("model", "m", "published"), [
    # Qi et al. 2024, Table 5: bubble rates of 1F1B, ZB-H1, ZB-H2 for the 1.5B and 6.2B models at p=8.
    ("1.5B", 24, (0.2431, 0.1585, 0.1083)),
    ("1.5B", 32, (0.1985, 0.1242, 0.0837)),
    ("1.5B", 64, (0.1240, 0.0674, 0.0444)),
    ("6.2B", 24, (0.2347, 0.1323, 0.0698)),
    ("6.2B", 32, (0.1898, 0.1045, 0.0559)),
    ("6.2B", 64, (0.1091, 0.0554, 0.0294)),
])
def test_simulator_reproduces_the_papers_handcrafted_columns(model, m, published):
    """Our simulator on the Table 9 times gives the paper's 1F1B / ZB-H1 / ZB-H2 bubble rates to 4 digits."""
    _, p, _, tf, tb, tw, tc, _ = row(model, 8, m)
    costs = UniformCosts(tf=tf, tb=tb, tw=tw, tcomm=tc)
    ours = tuple(round(simulate(lower(build(n, pp=p, microbatches=m)), costs).span_bubble, 4)
                 for n in ("1f1b", "zb-h1", "zb-h2"))
    assert ours == published


def test_heuristic_alone_meets_zb2p_at_p8_m32():
    """The issue's command without search time: within 0.5 points of the paper's 0.39% (we get 0.28%)."""
    _, p, m, tf, tb, tw, tc, paper = row("1.5B", 8, 32)
    assert abs(zb2p(p, m, tf, tb, tw, tc, 0) - paper) <= 0.005


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("model", "p", "m"), [("1.5B", 8, 24), ("1.5B", 8, 32), ("6.2B", 8, 32), ("14.6B", 16, 48)])
def test_zb_auto_matches_table5_zb2p(model, p, m):
    """Within 0.5 percentage points of the published ZB-2p (the heuristic alone is too, on these rows; at
    1.5B p=8 m=24 the refinement takes 4.46% to the proven optimum 4.33%, the paper's figure)."""
    _, p, m, tf, tb, tw, tc, paper = row(model, p, m)
    s = build("zb-auto", pp=p, microbatches=m, tf=tf, tb=tb, tw=tw, tcomm=tc, mem_limit=2 * p, time_limit=10)
    timing = evaluate(s, tf, tb, tw, tc)
    assert abs(timing.span_bubble - paper) <= 0.005
    assert max(timing.peaks) <= 2 * p
    result = simulate(lower(s), UniformCosts(tf=tf, tb=tb, tw=tw, tcomm=tc))  # the simulator agrees
    assert result.span_bubble == pytest.approx(timing.span_bubble, abs=1e-12)


def test_refinement_never_worse_than_its_seed():
    """A short search at 1.5B p=8 m=24: the refined schedule's cost and makespan are no larger than the seed's."""
    _, p, m, tf, tb, tw, tc, _ = row("1.5B", 8, 24)
    kw = dict(pp=p, microbatches=m, tf=tf, tb=tb, tw=tw, tcomm=tc, mem_limit=2 * p)
    seed = evaluate(build("zb-auto", time_limit=0, **kw), tf, tb, tw, tc)
    refined = evaluate(build("zb-auto", time_limit=1, **kw), tf, tb, tw, tc)
    assert max(refined.spans) <= max(seed.spans) and refined.makespan <= seed.makespan + 1e-9
