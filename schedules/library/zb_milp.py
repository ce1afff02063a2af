"""zb-auto's exact refinement as a mixed-integer linear program for HiGHS (``scipy.optimize.milp``).

The same problem as :mod:`schedules.library.zb_exact` (CP-SAT), stated the way the
zero-bubble paper states its ILP (Qi et al., ICLR 2024, sec. 3.2): continuous
start times, and for each pair of passes on one rank whose order the other
constraints leave open a binary that orders them, with a big-M of the seed's
makespan. Kept for the comparison of the two solvers
(``experiments/zb_solvers.py``); zb-auto uses CP-SAT.

Differences from the CP-SAT model, each forced by the tool:

* HiGHS through scipy takes no starting solution: the seed enters only as
  bounds (every start within the seed's makespan, the objective at most the
  seed's largest span), so the solver must find a feasible schedule itself;
* the memory limit is the linear form of the case W holds nothing (``mw`` = 0):
  F(j + L) starts after I(j) ends, L the limit in M_B. A W that holds a
  fraction is a cumulative constraint, which a MILP needs many more binaries
  for; :func:`refine_milp` returns None for ``mw`` > 0;
* the objective is the largest span alone (CP-SAT breaks ties by the
  makespan): the makespan enters only through the bound.

Pairs known to be ordered are given no binary: on rank r, F(a) comes before
I(b) for a <= b (F(b) precedes I(b)) and after it for a >= b + L (memory);
F(a) before W(b) and I(a) before W(b) for a <= b. What is left per rank:
about m(L - 1) F/I pairs and m(m - 1)/2 each of F/W and I/W.
"""

from __future__ import annotations

import math

from schedules.ir import Action, Kind, Schedule
from schedules.timing import evaluate

__all__ = ["SOLVERS", "refine_milp"]

_KINDS = (Kind.F, Kind.I, Kind.W)


SOLVERS = ("scipy", "highspy")


def refine_milp(
    seed: Schedule, tf: float, tb: float, tw: float, tcomm: float, mw: float, limit: float, time_limit: float,
    solver: str = "scipy",
) -> Schedule | None:
    """Like :func:`schedules.library.zb_exact.refine`, through HiGHS; None if it found nothing in ``time_limit`` seconds
    (or ``mw`` > 0, which this formulation does not take).

    ``solver``: ``scipy`` (``scipy.optimize.milp``: no starting solution) or
    ``highspy`` (HiGHS's own Python interface, given the seed as its first incumbent).
    """
    if mw > 0:
        return None
    p, m = seed.num_ranks, seed.num_microbatches
    model = _Model(seed, tf, tb, tw, tcomm, limit)
    x = model.solve_scipy(time_limit) if solver == "scipy" else model.solve_highspy(time_limit)
    if x is None:
        return None
    order = {kind: i for i, kind in enumerate(_KINDS)}
    programs = []
    for r in range(p):
        keyed = sorted((round(float(x[model.index[(k, r, j)]]), 6), order[k], j, Action(k, r, j))
                       for k in _KINDS for j in range(m))
        programs.append([item[-1] for item in keyed])
    return Schedule.from_programs(programs, name=seed.name, stage_to_rank=seed.stage_to_rank,
                                  num_microbatches=m, params=dict(seed.params))


class _Model:
    """The MILP in matrix form: minimise c.x, lo <= A x <= hi, bounds, binaries after the starts and the cost."""

    def __init__(self, seed: Schedule, tf: float, tb: float, tw: float, tcomm: float, limit: float) -> None:
        import numpy as np  # imported here: only this comparison needs numpy/scipy
        from scipy.sparse import coo_array

        p, m = seed.num_ranks, seed.num_microbatches
        self.hint = evaluate(seed, tf, tb, tw, tcomm)
        horizon, seed_cost = self.hint.makespan, max(self.hint.spans)
        held = math.floor(limit + 1e-9)
        dur = {Kind.F: tf, Kind.I: tb, Kind.W: tw}
        self.index = index = {key: n for n, key in enumerate(
            (k, r, j) for r in range(p) for k in _KINDS for j in range(m))}
        n_start = len(index)
        cost_var = n_start
        self.pairs = pairs = [(r, x, a, y, b) for r in range(p) for x, a, y, b in _open_pairs(m, held)]
        self.n_start, n_var = n_start, n_start + 1 + len(pairs)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        lo: list[float] = []
        hi: list[float] = []

        def add(terms: list[tuple[int, float]], low: float, high: float = math.inf) -> None:
            for col, val in terms:
                rows.append(len(lo))
                cols.append(col)
                vals.append(val)
            lo.append(low)
            hi.append(high)

        def s(kind: Kind, r: int, j: int) -> int:
            return index[(kind, r, j)]

        for r in range(p):
            for j in range(m):
                if r + 1 < p:  # later - earlier >= gap
                    add([(s(Kind.F, r + 1, j), 1), (s(Kind.F, r, j), -1)], tf + tcomm)
                    add([(s(Kind.I, r, j), 1), (s(Kind.I, r + 1, j), -1)], tb + tcomm)
                else:
                    add([(s(Kind.I, r, j), 1), (s(Kind.F, r, j), -1)], tf)
                add([(s(Kind.W, r, j), 1), (s(Kind.I, r, j), -1)], tb)
                if j + 1 < m:
                    for kind in _KINDS:
                        add([(s(kind, r, j + 1), 1), (s(kind, r, j), -1)], dur[kind])
                if j + held < m:
                    add([(s(Kind.F, r, j + held), 1), (s(Kind.I, r, j), -1)], tb)
            add([(cost_var, 1), (s(Kind.W, r, m - 1), -1), (s(Kind.F, r, 0), 1)], tw)  # cost >= span of r
        big = horizon
        for n, (r, x, a, y, b) in enumerate(pairs):
            z = n_start + 1 + n  # z = 1: x(a) first
            add([(s(y, r, b), 1), (s(x, r, a), -1), (z, -big)], dur[x] - big)
            add([(s(x, r, a), 1), (s(y, r, b), -1), (z, big)], dur[y])
        self.upper = np.empty(n_var)
        for (kind, _r, _j), n in index.items():
            self.upper[n] = horizon - dur[kind]
        self.upper[cost_var] = seed_cost
        self.upper[n_start + 1:] = 1
        self.integrality = np.zeros(n_var)
        self.integrality[n_start + 1:] = 1
        self.cost = np.zeros(n_var)
        self.cost[cost_var] = 1
        self.matrix = coo_array((vals, (rows, cols)), shape=(len(lo), n_var)).tocsr()
        self.lo, self.hi = np.array(lo), np.array(hi)
        self.seed = seed

    def seed_solution(self) -> list[float]:
        """The seed as a point of the model: its start times, its cost and the orders it takes."""
        x = [0.0] * len(self.cost)
        for r, prog in enumerate(self.seed.programs):
            for a, t in zip(prog, self.hint.starts[r], strict=True):
                x[self.index[(a.kind, r, a.microbatch)]] = float(t)
        x[self.n_start] = max(self.hint.spans)
        for n, (r, kx, a, ky, b) in enumerate(self.pairs):
            x[self.n_start + 1 + n] = 1.0 if x[self.index[(kx, r, a)]] < x[self.index[(ky, r, b)]] else 0.0
        return x

    def solve_scipy(self, time_limit: float):
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp

        res = milp(self.cost, constraints=LinearConstraint(self.matrix, self.lo, self.hi),
                   integrality=self.integrality, bounds=Bounds(np.zeros(len(self.cost)), self.upper),
                   # presolve off: with it, scipy 1.17.1's HiGHS calls small instances infeasible that
                   # the seed itself satisfies (p=3, m=4, tf=tb=tw=1, tcomm=0.1, limit 3: optimum 14.4).
                   options={"time_limit": float(time_limit), "disp": False, "presolve": False})
        return res.x

    def solve_highspy(self, time_limit: float):
        import highspy

        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = len(self.cost), len(self.lo)
        lp.col_cost_ = self.cost
        lp.col_lower_ = [0.0] * len(self.cost)
        lp.col_upper_ = self.upper
        lp.row_lower_ = self.lo
        lp.row_upper_ = [inf if v == math.inf else v for v in self.hi]
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = len(self.cost), len(self.lo)
        lp.a_matrix_.start_ = self.matrix.indptr
        lp.a_matrix_.index_ = self.matrix.indices
        lp.a_matrix_.value_ = self.matrix.data
        lp.integrality_ = [highspy.HighsVarType.kInteger if v else highspy.HighsVarType.kContinuous
                           for v in self.integrality]
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("threads", 1)
        h.passModel(lp)
        start = highspy.HighsSolution()
        start.col_value = self.seed_solution()
        start.value_valid = True
        h.setSolution(start)
        h.run()
        if h.getInfo().primal_solution_status != 2:  # kSolutionStatusFeasible
            return None
        return list(h.getSolution().col_value)


def _open_pairs(m: int, held: int) -> list[tuple[Kind, int, Kind, int]]:
    """(kind x, microbatch a, kind y, microbatch b) on one rank whose order the precedences leave open."""
    out = []
    for a in range(m):
        for b in range(a):  # a > b
            if a < b + held:
                out.append((Kind.F, a, Kind.I, b))
            out.append((Kind.F, a, Kind.W, b))
            out.append((Kind.I, a, Kind.W, b))
    return out
