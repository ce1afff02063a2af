"""zb-auto's exact refinement: a constraint program over pass start times, seeded by the list scheduler.

The zero-bubble paper (Qi et al., ICLR 2024, sec. 3.2) refines its heuristic
schedule with an ILP. We state the same problem for CP-SAT (OR-Tools), which
takes the heuristic schedule as a complete hint, has interval and no-overlap
constraints built in, and improves on the hint within its time limit. The
paper's form, a big-M MILP, is :mod:`schedules.library.zb_milp`; on Table 5 rows
HiGHS found no schedule at all within the same time limit through
``scipy.optimize.milp``, which takes no starting solution, and, given the seed
through highspy, did not improve on it, where CP-SAT
proves 1.5B p=8 m=24's optimum (experiments/zb_solvers.py measures all three).

Variables: the start of every pass F, I, W of every (rank, microbatch), one
stage per rank, times in integer ticks (the pass times scaled to at least
10^4 ticks and rounded). Constraints:

* data: F(r, j) ends ``tcomm`` before F(r+1, j) starts; the last rank's I(j)
  follows its F(j); I(r+1, j) ends ``tcomm`` before I(r, j); W(r, j) follows I(r, j);
* a rank runs one pass at a time (no overlap), each kind in microbatch order
  (microbatches are interchangeable, so this loses nothing and breaks symmetry);
* memory: a rank's activations (F +1 M_B at its start, I -(1-mw) and W -mw at
  their ends) stay within the limit at every instant;
* no worse than the seed: makespan at most the seed's.

Objective: the paper's cost, the largest span (last end - first start) of a
rank; ties broken by the makespan. The result is read back as per-rank
orders (by start time) and timed as the simulator does; the caller keeps it
only if it beats the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schedules.ir import Action, Kind, Schedule
from schedules.timing import evaluate

__all__ = ["STATUSES", "Refinement", "refine", "solve"]

# What the solver said, in words (CP-SAT's status names in parentheses):
STATUSES = {
    "OPTIMAL": "optimal",  # the returned schedule's cost is proven the least
    "FEASIBLE": "feasible",  # a schedule, stopped by the time limit before a proof
    "INFEASIBLE": "no solution",  # proven: no schedule satisfies the model (the seed should: a bug)
    "UNKNOWN": "timed out",  # the time limit came before any schedule
}

_TICKS = 10_000  # the longest pass spans at least this many ticks
_MEM_Q = 1000  # memory resolution when W holds a fraction mw


def _scale(*times: float) -> int:
    top = max(times)
    if top <= 0:
        return 1
    return 10 ** max(0, math.ceil(math.log10(_TICKS / top)))


@dataclass(frozen=True, slots=True)
class Refinement:
    """The solver's schedule (None unless it found one) and its status, one of :data:`STATUSES`' values."""

    schedule: Schedule | None
    status: str


def refine(
    seed: Schedule, tf: float, tb: float, tw: float, tcomm: float, mw: float, limit: float,
    time_limit: float, workers: int = 8,
) -> Schedule | None:
    """:func:`solve`'s schedule alone (None if it found none)."""
    return solve(seed, tf, tb, tw, tcomm, mw, limit, time_limit, workers).schedule


def solve(
    seed: Schedule, tf: float, tb: float, tw: float, tcomm: float, mw: float, limit: float,
    time_limit: float, workers: int = 8,
) -> Refinement:
    """The best schedule found at no larger cost than ``seed``'s and no larger makespan, with the solver's status.

    ``seed`` has one stage per rank (stage r on rank r), I/W split. ``time_limit``
    bounds the search in wall-clock seconds. ``workers``: CP-SAT's parallel
    portfolio (its large-neighbourhood workers find the improvements; one
    worker alone found none on the paper's configurations within the default limit). A search
    stopped by the limit may return a different, equally valid schedule from
    one run to the next; one that proves optimality returns the optimal cost.
    """
    from ortools.sat.python import cp_model  # imported here: only zb-auto's refinement needs it

    p, m = seed.num_ranks, seed.num_microbatches
    k = _scale(tf, tb, tw, tcomm)
    t_f, t_b, t_w, t_c = (round(x * k) for x in (tf, tb, tw, tcomm))
    hint = evaluate(seed, t_f, t_b, t_w, t_c)
    horizon = int(hint.makespan)
    seed_cost = int(max(hint.spans))

    model = cp_model.CpModel()
    dur = {Kind.F: t_f, Kind.I: t_b, Kind.W: t_w}
    start: dict[tuple[Kind, int, int], cp_model.IntVar] = {}
    per_rank: list[list[cp_model.IntervalVar]] = [[] for _ in range(p)]
    for r in range(p):
        for kind in (Kind.F, Kind.I, Kind.W):
            for j in range(m):
                s = model.new_int_var(0, horizon - dur[kind], f"{kind.value}{r}_{j}")
                start[(kind, r, j)] = s
                per_rank[r].append(model.new_fixed_size_interval_var(s, dur[kind], f"i{kind.value}{r}_{j}"))

    def at(kind: Kind, r: int, j: int):
        return start[(kind, r, j)]

    for r in range(p):
        model.add_no_overlap(per_rank[r])
        for j in range(m):
            if r + 1 < p:
                model.add(at(Kind.F, r + 1, j) >= at(Kind.F, r, j) + t_f + t_c)
                model.add(at(Kind.I, r, j) >= at(Kind.I, r + 1, j) + t_b + t_c)
            else:
                model.add(at(Kind.I, r, j) >= at(Kind.F, r, j) + t_f)
            model.add(at(Kind.W, r, j) >= at(Kind.I, r, j) + t_b)
            if j + 1 < m:
                for kind in (Kind.F, Kind.I, Kind.W):
                    model.add(at(kind, r, j + 1) >= at(kind, r, j) + dur[kind])
        _memory(model, cp_model, at, r, m, t_f, t_b, t_w, mw, limit)

    spans = []
    for r in range(p):
        spans.append(at(Kind.W, r, m - 1) + t_w - at(Kind.F, r, 0))
    cost = model.new_int_var(0, seed_cost, "cost")
    model.add_max_equality(cost, spans)
    end = model.new_int_var(0, horizon, "makespan")
    model.add_max_equality(end, [at(Kind.W, r, m - 1) + t_w for r in range(p)])
    model.minimize(cost * (horizon + 1) + end)

    for r, prog in enumerate(seed.programs):
        for a, t in zip(prog, hint.starts[r], strict=True):
            model.add_hint(at(a.kind, r, a.microbatch), int(t))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    status = solver.solve(model)
    name = solver.status_name(status)
    if name not in STATUSES:  # MODEL_INVALID: the model built above is wrong
        raise AssertionError(f"zb-auto's refinement built an invalid model: {solver.solution_info()}")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Refinement(None, STATUSES[name])
    order = {Kind.F: 0, Kind.I: 1, Kind.W: 2}
    programs: list[list[Action]] = []
    for r in range(p):
        keyed = []
        for kind in (Kind.F, Kind.I, Kind.W):
            for j in range(m):
                t = solver.value(at(kind, r, j))
                keyed.append((t, t + dur[kind], order[kind], j, Action(kind, r, j)))
        keyed.sort(key=lambda x: x[:4])
        programs.append([x[-1] for x in keyed])
    return Refinement(Schedule.from_programs(programs, name=seed.name, stage_to_rank=seed.stage_to_rank,
                                             num_microbatches=m, params=dict(seed.params)), STATUSES[name])


def _memory(model, cp_model, at, r: int, m: int, t_f: int, t_b: int, t_w: int, mw: float, limit: float) -> None:
    """Activations of rank r within ``limit`` M_B at every instant."""
    if mw in (0, 1):
        # F(j + L) may start only when I(j) (mw 0), or W(j) (mw 1), has freed its microbatch: at most L held at once.
        held = math.floor(limit + 1e-9)
        kind, t = (Kind.I, t_b) if mw == 0 else (Kind.W, t_w)
        for j in range(m - held):
            model.add(at(Kind.F, r, j + held) >= at(kind, r, j) + t)
        return
    q_i = round(_MEM_Q * (1 - mw))
    times, changes = [], []
    for j in range(m):
        times += [at(Kind.F, r, j), at(Kind.I, r, j) + t_b, at(Kind.W, r, j) + t_w]
        changes += [_MEM_Q, -q_i, -(_MEM_Q - q_i)]
    model.add_reservoir_constraint(times, changes, 0, math.floor(limit * _MEM_Q + 1e-6))


