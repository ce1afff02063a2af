"""The MILP form of zb-auto's refinement (HiGHS) agrees with CP-SAT where both can prove the optimum."""

from __future__ import annotations

import pytest

from schedules import build
from schedules.library.zb_exact import refine
from schedules.library.zb_milp import refine_milp
from schedules.timing import evaluate


def _seed(p, m, t, limit):
    """zb-auto's heuristic schedule (time_limit=0: no exact refinement), the refinements' starting point, in the
    accounting the MILP takes (mw 0: an I frees its microbatch; zb-auto's default is the runtime's, mw 1)."""
    return build("zb-auto", pp=p, microbatches=m, tf=t[0], tb=t[1], tw=t[2], tcomm=t[3], mw=0.0, mem_limit=limit,
                 time_limit=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("p", "m", "t", "limit", "seed_cost", "optimum"), [
    # scipy 1.17.1's HiGHS with presolve on calls this one infeasible (the seed satisfies it).
    (3, 4, (1.0, 1.0, 1.0, 0.1), 3.0, 14.6, 14.4),
    (4, 6, (2.0, 2.0, 1.0, 0.3), 4.0, 41.8, 40.6),
])
@pytest.mark.parametrize("solver", ["cp-sat", "scipy", "highspy"])
def test_solvers_reach_the_same_optimum_on_small_cases(p, m, t, limit, seed_cost, optimum, solver):
    """The heuristic leaves idle time; each solver finds the smallest largest span (each proves it well within
    the limit of 30 s), within the memory limit and no later than the seed."""
    if solver != "cp-sat":
        pytest.importorskip("scipy" if solver == "scipy" else "highspy")
    seed = _seed(p, m, t, limit)
    base = evaluate(seed, *t)
    assert max(base.spans) == pytest.approx(seed_cost)
    if solver == "cp-sat":
        out = refine(seed, *t, 0.0, limit, 30.0)
    else:
        out = refine_milp(seed, *t, 0.0, limit, 30.0, solver=solver)
    got = evaluate(out, *t, 0.0)
    assert max(got.spans) == pytest.approx(optimum)
    assert max(got.peaks) <= limit and got.makespan <= base.makespan + 1e-9


def test_milp_declines_a_w_that_holds_memory():
    seed = _seed(3, 4, (1.0, 1.0, 1.0, 0.1), 3.0)
    assert refine_milp(seed, 1.0, 1.0, 1.0, 0.1, 0.5, 3.0, 1.0) is None
