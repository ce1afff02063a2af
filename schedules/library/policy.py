"""Schedules written as policies: a rule that picks each rank's next action, turned into a static order.

A *policy* is a function ``(RankState) -> Action | None``. Given what one rank can run now
(``state.ready``), what it has run (``state.done``, ``state.count``), the activations it holds
(``state.held``, M_B) and the pipeline's shape, it returns one of the ready actions, or None to wait
until more become ready. :func:`from_policy` runs every rank under the policy in a deterministic
event-driven run of uniform pass times (:class:`PassTimes`: by default tf = tb = tw = 1 and free
messages, the simulator's defaults) and returns what each rank ran as an ordinary :class:`Schedule`,
which lowers, validates, simulates and runs like any generator's. The times only decide what is ready
when; the order, once built, is static.

Readiness (the data dependencies :mod:`schedules.timing` times): F of stage s needs F of s - 1 (stage 0:
nothing); a backward (B, or I with ``split_backward``) needs its F and the backward of s + 1 (the last
stage: its F alone); W needs its I. An input made on another rank arrives ``tcomm`` after its pass ends,
one made on the same rank at once. A pass of one of a rank's v chunks takes 1/v of its time. Activations
as the simulator counts them: F holds 1/v M_B from its start, B frees that at its end, I all but the
fraction ``mw``, W the rest.

Determinism: at each instant every end and arrival is recorded first, then the idle ranks choose in
rank order; ``state.ready`` is sorted by microbatch, then stage, then kind (F, I or B, W). A waiting rank
is asked again when its ready actions change or its running action ends, never for time alone.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from common.errors import ScheduleError, check_positive, quote
from schedules.check import check_schedule
from schedules.ir import Action, Kind, Schedule
from schedules.registry import PipelineParams, check_size, check_uniform_times, make_schedule
from schedules.timing import MW_RUNTIME, pass_time

__all__ = ["PassTimes", "Policy", "RankState", "from_policy"]

EPS = 1e-9  # M_B: sums of 1/v shares are compared with this slack
_KIND_ORDER = {Kind.F: 0, Kind.I: 1, Kind.B: 1, Kind.W: 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class PassTimes:
    """The uniform pass times readiness is decided with (those of ``sim.UniformCosts``).

    ``tf``, ``tb``, ``tw``: forward, input-gradient and weight-gradient backward of one microbatch
    through a rank's whole share (a full backward B takes tb + tw); ``tcomm``: the delay of a message
    between ranks; ``mw``: the fraction of a microbatch's activations its W holds after its I.
    """

    tf: float = 1.0
    tb: float = 1.0
    tw: float = 1.0
    tcomm: float = 0.0
    mw: float = MW_RUNTIME  # as the simulator and the runtime count memory: I keeps what W needs

    def __post_init__(self) -> None:
        check_uniform_times(tf=self.tf, tb=self.tb, tw=self.tw, tcomm=self.tcomm, mw=self.mw)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankState:
    """What one idle rank sees when its policy is asked for its next action.

    ``ready``: the actions it may start now (sorted by microbatch, stage, kind); ``done``: what it has
    run, in order (``len(done)`` is the step being chosen); ``counts[(kind, stage)]``: how many of
    ``done`` are of that kind on that stage; ``held``: the activations it holds now, M_B;
    ``mem_limit``: the limit it must stay within (None: no limit); ``time``: the run's clock.
    """

    rank: int
    pp: int
    num_stages: int
    num_microbatches: int
    stages: tuple[int, ...]
    time: float
    ready: tuple[Action, ...]
    done: tuple[Action, ...]
    counts: Mapping[tuple[Kind, int], int]
    held: float
    mem_limit: float | None

    def count(self, kind: Kind, stage: int | None = None) -> int:
        """How many actions of ``kind`` this rank has run (on ``stage``, or on all its stages)."""
        if stage is not None:
            return self.counts.get((kind, stage), 0)
        return sum(self.counts.get((kind, s), 0) for s in self.stages)

    def first(self, kind: Kind, stage: int | None = None) -> Action | None:
        """The ready action of ``kind`` (on ``stage``) with the lowest microbatch, or None."""
        return next((a for a in self.ready if a.kind is kind and (stage is None or a.stage == stage)), None)

    def fits(self, action: Action) -> bool:
        """Whether starting ``action`` keeps this rank within ``mem_limit`` (an F holds pp / num_stages M_B)."""
        if self.mem_limit is None or action.kind is not Kind.F:
            return True
        return self.held + self.pp / self.num_stages <= self.mem_limit + EPS


Policy = Callable[[RankState], Action | None]


def from_policy(name: str, params: PipelineParams, policy: Policy, *, placement: Sequence[int] | None = None,
                split_backward: bool = False, mem_limit: float | None = None,
                times: PassTimes | None = None) -> Schedule:
    """The schedule ``policy`` makes: each rank runs what the policy picks, readiness in uniform ``times``.

    ``placement[s]``: stage s's rank (default stage r on rank r; v stages on each rank for v chunks);
    ``split_backward``: backwards are I and W instead of B; ``mem_limit``: M_B per rank that no action
    may pass (the policy can ask ``state.fits``). The schedule's params record ``policy`` (the
    function's name) and ``mem_limit`` when given. Raises ScheduleError, naming the schedule, rank and
    action, when the policy picks an action it may not run now, passes the limit, raises, or leaves
    every rank waiting with work left (a deadlock).
    """
    placement = _check_inputs(name, params, policy, placement, mem_limit, times)
    run = _Run(name, params, policy, placement, split_backward, mem_limit, times or PassTimes())
    extra: dict[str, object] = {"policy": run.policy_name}
    if mem_limit is not None:
        extra["mem_limit"] = mem_limit
    schedule = make_schedule(name, params, run.run(), placement, **extra)
    check_schedule(schedule)
    return schedule


def _check_inputs(name: str, params: PipelineParams, policy: object, placement: Sequence[int] | None,
                  mem_limit: float | None, times: object) -> tuple[int, ...]:
    """The placement as a tuple, once every input is known good."""
    if not isinstance(name, str) or not name:
        raise ScheduleError(f"a policy's schedule needs a name (a non-empty string), got {quote(name)}", field="name")
    if not isinstance(params, PipelineParams):
        raise ScheduleError(f"schedule {name!r}: params must be a PipelineParams, got {quote(params)}", field="params")
    if not callable(policy):
        raise ScheduleError(f"schedule {name!r}: policy must be a function (RankState) -> Action | None, "
                            f"got {quote(policy)}", field="policy")
    if times is not None and not isinstance(times, PassTimes):
        raise ScheduleError(f"schedule {name!r}: times must be a PassTimes, got {quote(times)}", field="times")
    if mem_limit is not None:
        check_positive(f"schedule {name!r}", "mem_limit", mem_limit, " (M_B)", error=ScheduleError)
    p = params.pp
    stages = tuple(range(p)) if placement is None else tuple(placement)
    v = params.chunks or max(1, len(stages) // p)
    if len(stages) != p * v:
        raise ScheduleError(f"schedule {name!r}: placement places {len(stages)} stage(s); with pp={p} and "
                            f"chunks={v} give one rank for each of {p * v} stages", field="placement")
    for r in range(p):
        held = sum(1 for x in stages if x == r)
        if held != v:
            raise ScheduleError(f"schedule {name!r}: placement puts {held} stage(s) on rank {r}; give every rank "
                                f"{v} (chunks={v}), ranks 0..{p - 1}", field="placement")
    check_size(name, p, v, params.microbatches)
    return stages


class _Run:
    """The event-driven run: ranks, their ready actions and what they hold, and a heap of ends and arrivals."""

    def __init__(self, name: str, params: PipelineParams, policy: Policy, placement: tuple[int, ...],
                 split: bool, mem_limit: float | None, times: PassTimes) -> None:
        self.name, self.policy, self.s2r, self.mem_limit = name, policy, placement, mem_limit
        qualname = getattr(policy, "__qualname__", None)  # a function defined in another: its own name alone
        self.policy_name = qualname.rpartition("<locals>.")[2] if isinstance(qualname, str) else repr(policy)
        self.p, self.m, self.n_st = params.pp, params.microbatches, len(placement)
        self.share = self.p / self.n_st  # M_B one chunk's forward holds
        self.back = Kind.I if split else Kind.B
        self.kinds = (Kind.F, Kind.I, Kind.W) if split else (Kind.F, Kind.B)
        self.tcomm, self.mw = times.tcomm, times.mw
        v = self.n_st // self.p
        self.duration = {k: pass_time(k, times.tf, times.tb, times.tw) / v for k in self.kinds}
        self.end: dict[Action, float] = {}  # action -> when it ended
        self.step_of: dict[Action, int] = {}  # action -> the step of its rank that started it
        self.stages = [tuple(s for s, x in enumerate(placement) if x == r) for r in range(self.p)]
        self.ready: list[list[tuple[tuple[int, int, int], Action]]] = [[] for _ in range(self.p)]  # sorted by key
        self.ready_set: list[set[Action]] = [set() for _ in range(self.p)]
        self.done: list[list[Action]] = [[] for _ in range(self.p)]
        self.counts: list[dict[tuple[Kind, int], int]] = [{} for _ in range(self.p)]
        self.held = [0.0] * self.p
        self.busy: list[Action | None] = [None] * self.p
        self.changed = [True] * self.p  # its view changed since it was last asked
        self.heap: list[tuple[float, int, bool, Action]] = []  # (time, seq, is an end, action)
        self.seq = 0
        self.dependents: dict[Action, list[Action]] = {}
        self.left = self.n_st * self.m * len(self.kinds)

    def work(self) -> list[Action]:
        return [Action(k, s, mb) for mb in range(self.m) for s in range(self.n_st) for k in self.kinds]

    def deps(self, a: Action) -> list[Action]:
        s, mb = a.stage, a.microbatch
        if a.kind is Kind.F:
            return [Action(Kind.F, s - 1, mb)] if s > 0 else []
        if a.kind is Kind.W:
            return [Action(Kind.I, s, mb)]
        return [Action(Kind.F, s, mb)] + ([Action(self.back, s + 1, mb)] if s < self.n_st - 1 else [])

    def run(self) -> list[list[Action]]:
        """Every rank's actions in the order it ran them."""
        for a in self.work():
            for d in self.deps(a):
                self.dependents.setdefault(d, []).append(a)
            if a.stage == 0 and a.kind is Kind.F:
                self._push(0.0, False, a)
        t = 0.0
        while self.heap:
            t = self.heap[0][0]
            while self.heap and self.heap[0][0] == t:
                self._apply(t, *heapq.heappop(self.heap)[2:])
            self._decide(t)
        if self.left:
            raise self._deadlock(t)
        return self.done

    def _push(self, t: float, is_end: bool, a: Action) -> None:
        heapq.heappush(self.heap, (t, self.seq, is_end, a))
        self.seq += 1

    def _apply(self, t: float, is_end: bool, a: Action) -> None:
        r = self.s2r[a.stage]
        self.changed[r] = True
        if not is_end:
            insort(self.ready[r], (_key(a), a))
            self.ready_set[r].add(a)
            return
        self.busy[r] = None
        self.end[a] = t
        self.left -= 1
        self.held[r] -= self.share * {Kind.B: 1.0, Kind.I: 1.0 - self.mw, Kind.W: self.mw}.get(a.kind, 0.0)
        for b in self.dependents.get(a, ()):
            deps = self.deps(b)
            if all(d in self.end for d in deps):
                rb = self.s2r[b.stage]
                self._push(max(self.end[d] + (0.0 if self.s2r[d.stage] == rb else self.tcomm) for d in deps),
                           False, b)

    def _decide(self, t: float) -> None:
        for r in range(self.p):
            if self.busy[r] is None and self.changed[r] and self.ready[r]:
                self.changed[r] = False
                a = self._ask(r, t)
                if a is not None:
                    self._start(r, a, t)

    def _state(self, r: int, t: float) -> RankState:
        return RankState(
            rank=r, pp=self.p, num_stages=self.n_st, num_microbatches=self.m,
            stages=self.stages[r], time=t,
            ready=tuple(a for _, a in self.ready[r]), done=tuple(self.done[r]),
            counts=MappingProxyType(dict(self.counts[r])), held=self.held[r], mem_limit=self.mem_limit,
        )

    def _ask(self, r: int, t: float) -> Action | None:
        state = self._state(r, t)
        try:
            a = self.policy(state)
        except Exception as e:
            text = " ".join(str(e).split())
            raise ScheduleError(f"schedule {self.name!r}, rank {r}: the policy {self.policy_name} raised "
                                f"{type(e).__name__} at step {len(state.done)} (t={t:g}): {text}") from e
        if a is not None and not (isinstance(a, Action) and a in self.ready_set[r]):
            raise ScheduleError(self._refusal(state, a))
        return a

    def _start(self, r: int, a: Action, t: float) -> None:
        if a.kind is Kind.F and self.mem_limit is not None and self.held[r] + self.share > self.mem_limit + EPS:
            fit = [x for x in self.ready[r] if x[1].kind is not Kind.F]
            raise ScheduleError(
                f"schedule {self.name!r}, rank {r}, action {a}: the policy {self.policy_name} chose it at step "
                f"{len(self.done[r])} (t={t:g}), but it would hold {self.held[r]:g} + {self.share:g} = "
                f"{self.held[r] + self.share:g} M_B, above mem_limit {self.mem_limit:g} M_B; valid: "
                f"{_listed([x[1] for x in fit])}None (state.fits says which fit)")
        del self.ready[r][bisect_left(self.ready[r], (_key(a),))]
        self.ready_set[r].discard(a)
        self.step_of[a] = len(self.done[r])
        self.done[r].append(a)
        key = (a.kind, a.stage)
        self.counts[r][key] = self.counts[r].get(key, 0) + 1
        self.held[r] += self.share if a.kind is Kind.F else 0.0
        self.busy[r] = a
        self._push(t + self.duration[a.kind], True, a)

    def _refusal(self, state: RankState, a: object) -> str:
        """Why the policy may not run ``a`` now, naming what it may run."""
        r, step, t = state.rank, len(state.done), state.time
        valid = f"valid: {_listed(state.ready)}None (wait)"
        if not isinstance(a, Action):
            return (f"schedule {self.name!r}, rank {r}: the policy {self.policy_name} returned {quote(a)} at step "
                    f"{step} (t={t:g}), not an Action; {valid}")
        head = f"schedule {self.name!r}, rank {r}, action {a}: the policy {self.policy_name} chose it at step {step} " \
               f"(t={t:g}), but"
        if a.kind not in self.kinds or a.sub_actions is not None or a.bucket is not None \
                or not (0 <= a.stage < self.n_st and isinstance(a.microbatch, int) and 0 <= a.microbatch < self.m):
            kinds = ", ".join(k.value for k in self.kinds)
            return (f"{head} it is not work of this schedule (kinds {kinds}, stages 0..{self.n_st - 1}, "
                    f"microbatches 0..{self.m - 1}); {valid}")
        if self.s2r[a.stage] != r:
            return f"{head} it is rank {self.s2r[a.stage]}'s (stage {a.stage} is placed there); {valid}"
        if a in self.step_of:
            return f"{head} it already ran (step {self.step_of[a]}); {valid}"
        return f"{head} it is not ready: {self._missing(a)}; {valid}"

    def _missing(self, a: Action) -> str:
        """What ``a`` still waits for: an input not made yet, or one on its way."""
        for d in self.deps(a):
            if d not in self.end:
                return f"it needs {d}, " + ("still running" if d in self.step_of else "not run yet")
        r = self.s2r[a.stage]
        arrival = max(self.end[d] + (0.0 if self.s2r[d.stage] == r else self.tcomm) for d in self.deps(a))
        return f"its inputs arrive at t={arrival:g}"

    def _deadlock(self, t: float) -> ScheduleError:
        waits = []
        for r in range(self.p):
            if self.ready[r]:
                ready = ", ".join(str(x[1]) for x in self.ready[r][:8]) + (", ..." if len(self.ready[r]) > 8 else "")
                waits.append(f"rank {r} has {ready} ready but its policy returned None")
                continue
            todo = [a for a in self.work() if self.s2r[a.stage] == r and a not in self.step_of]
            if todo:
                a = min(todo, key=_key)
                waits.append(f"rank {r} waits for {a}: {self._missing(a)}")
        return ScheduleError(f"schedule {self.name!r}: the policy {self.policy_name} deadlocks at t={t:g}, every "
                             f"rank waiting and nothing in flight with {self.left} actions left: " + "; ".join(waits))


def _key(a: Action) -> tuple[int, int, int]:
    """Where ``a`` sorts among ready actions: by microbatch, then stage, then kind (F, I or B, W)."""
    return a.microbatch, a.stage, _KIND_ORDER[a.kind]


def _listed(actions: Sequence[Action]) -> str:
    """``'0F3, 0B1 or '``: the actions to name before a last alternative (empty for none); at most 8."""
    shown = [str(a) for a in actions[:8]] + (["..."] if len(actions) > 8 else [])
    return ", ".join(shown) + " or " if shown else ""
