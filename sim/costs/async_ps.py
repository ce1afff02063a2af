"""The asynchronous parameter server over many steps: trainers of different speeds under a staleness bound.

The task graph of ``async-ps`` (:mod:`schedules.dp.modes`, ps's) is one step of one
trainer: its passes, each bucket's push, the servers' update of each stage
and the pulls after it (:func:`cycle_of` cuts it). This module
runs that step over and over for ``dp`` trainers at once, as the runtime's
:mod:`real.dp.ps_async` does, in a small event loop (no SimPy):

* **trainer** i with speed v_i (``ParallelConfig.trainer_speeds``, 1 = the
  simulated device; 2 = twice as fast) starts its step n, computes for
  ``compute_s / v_i`` (the step's compute; communication does not scale with
  the speed), its push ends ``push_s`` later (the push left exposed after the
  last pass) and reaches the server; with it goes its request for the
  parameters of step n + 1;
* **server**: takes the pushes one at a time in the order they arrive (ties:
  trainer order); every ``dp``-th push completes an update, an optimizer step
  of ``update_s`` (the servers' shards, 28 bytes per parameter at the server's
  memory bandwidth, :func:`update_time`) during which nothing else is served;
  a push is counted (the trainer's clock) once it is folded, the dp-th once
  its update is done (the runtime's :meth:`real.dp.ps_async.AsyncParamServer._fold`);
* **bound**: the request for step n + 1 is answered, when the server is not
  busy, once every trainer (the asker too) has pushed at least n + 1 - S steps
  (``staleness`` S); the answer's parameters arrive ``pull_s`` later and step
  n + 1 starts. The **staleness** of that step is n + 1 minus the fewest steps
  another trainer has pushed then, at most S (what :mod:`real.dp.ps_async` logs);
  its **wait** is the time from the request to the answer.

Closed forms (``update_s`` = 0, τ_i = compute_s / v_i + push_s + pull_s, the
slowest τ_s): the slowest trainer never waits, starting step n at n τ_s; a
faster one starts step n at max(n τ_i, (n - S) τ_s) (it is let go for step
n when the slowest's clock reaches n - S, at (n - S - 1) τ_s + its compute and
push; the pull follows), so over N steps its
rate is N / max(N τ_i, (N - S) τ_s): τ_s for S = 0 (synchronous ps, the
slowest paces all, and with ``update_s`` > 0 every step also waits for the
update: τ_s + update_s), N / (N τ_i) for S >= N (each at its own rate), and
in between the faster one finishes S steps ahead. The mode's time per step
(one update, a global batch of dp trainers' microbatches) is dp / Σ rates.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError, check_positive, quote

__all__ = ["AsyncPSResult", "Cycle", "TrainerStats", "check_speeds", "cycle_of", "simulate_async_ps", "update_time"]

STEPS = 64  # steps per trainer the loop runs by default: long enough for the bound's rate to show


@dataclass(frozen=True, slots=True)
class Cycle:
    """One step of a trainer at speed 1, cut where the bound acts: its compute, the push left exposed after
    it, the pull after the answer; and the server's update (seconds)."""

    compute_s: float
    push_s: float
    pull_s: float
    update_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("compute_s", "push_s", "pull_s", "update_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ConfigError(f"async-ps cycle: {name} must be a finite number of seconds >= 0, got {quote(v)}",
                                  field=name)

    def own(self, speed: float) -> float:
        """τ: a trainer's step at ``speed`` when nothing holds it back (the update not waited for)."""
        return self.compute_s / speed + self.push_s + self.pull_s


@dataclass(frozen=True, slots=True)
class TrainerStats:
    """One trainer over the run: steps per second, seconds waited for answers, the staleness of each step."""

    speed: float
    steps_per_s: float
    wait_s: float
    staleness: tuple[int, ...]

    @property
    def max_staleness(self) -> int:
        return max(self.staleness, default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"speed": self.speed, "steps_per_s": self.steps_per_s, "wait_s": self.wait_s,
                "max_staleness": self.max_staleness}


@dataclass(frozen=True, slots=True)
class AsyncPSResult:
    cycle: Cycle
    staleness: int
    steps: int
    trainers: tuple[TrainerStats, ...]

    @property
    def time_per_step(self) -> float:
        """Seconds per update (one step of the whole batch): dp / Σ each trainer's steps per second."""
        return len(self.trainers) / sum(t.steps_per_s for t in self.trainers)

    def to_dict(self) -> dict[str, Any]:
        return {"staleness": self.staleness, "steps": self.steps, "time_per_step": self.time_per_step,
                "cycle": {"compute_s": self.cycle.compute_s, "push_s": self.cycle.push_s,
                          "pull_s": self.cycle.pull_s, "update_s": self.cycle.update_s},
                "trainers": [t.to_dict() for t in self.trainers]}

    def format(self) -> list[str]:
        lines = [f"async-ps, staleness {self.staleness}, {self.steps} steps per trainer: {self.time_per_step:.6g} s "
                 f"per update (dp / sum of the trainers' rates)"]
        lines += [f"  trainer {i}: speed {t.speed:g}  {t.steps_per_s:.4g} steps/s  waited {t.wait_s:.4g} s  "
                  f"max staleness {t.max_staleness}" for i, t in enumerate(self.trainers)]
        return lines


def check_speeds(speeds: Sequence[float], dp: int, owner: str = "parallel") -> tuple[float, ...]:
    """The trainers' speeds: one finite number > 0 per replica (empty: all 1)."""
    if isinstance(speeds, str | bytes) or not isinstance(speeds, Sequence):
        raise ConfigError(f"{owner}: trainer_speeds must be a list of numbers > 0, one per replica, got "
                          f"{quote(speeds)}", field="trainer_speeds")
    if not speeds:
        return (1.0,) * dp
    if len(speeds) != dp:
        raise ConfigError(f"{owner}: trainer_speeds has {len(speeds)} speed(s), dp is {dp}; give one per replica "
                          f"(e.g. {','.join(['1'] * dp)})", field="trainer_speeds")
    for v in speeds:
        check_positive(owner, "trainer_speeds", v)
    return tuple(float(v) for v in speeds)


def update_time(params: float, servers: int, memory_bw: float, bytes_per_param: float) -> float:
    """One update on a server: its 1/servers of the parameters, ``bytes_per_param`` moved each, at ``memory_bw``."""
    return bytes_per_param * params / servers / memory_bw


@dataclass
class _Loop:
    """The event loop's state (see the module doc)."""

    cycle: Cycle
    speeds: tuple[float, ...]
    staleness: int
    steps: int

    def __post_init__(self) -> None:
        n = len(self.speeds)
        self.events: list[tuple[float, int, int, str, int, int]] = []  # (time, order, seq, kind, trainer, step)
        self.seq = 0
        self.clock = [0] * n  # pushes counted per trainer
        self.folded = 0
        self.busy_until = 0.0
        self.queue: deque[int] = deque()  # trainers whose pushes wait to be folded, in arrival order
        self.waiting: list[tuple[int, int, float]] = []  # (trainer, step asked for, asked at)
        self.start = [[0.0] for _ in range(n)]  # start of each step
        self.wait = [0.0] * n
        self.stale = [[0] for _ in range(n)]

    def push(self, t: float, kind: str, trainer: int, step: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, 0 if kind == "done" else 1, self.seq, kind, trainer, step))

    def run(self) -> None:
        for i in range(len(self.speeds)):
            self._started(0.0, i, 0)
        while self.events:
            now, _, _, kind, i, n = heapq.heappop(self.events)
            if kind == "arrive":  # push of step n and the request for n + 1
                self.queue.append(i)
                self.waiting.append((i, n + 1, now))
            elif kind == "done":
                self._count(i)
                self.busy_until = now
            else:  # "start"
                self._started(now, i, n)
                continue
            self._serve(now)

    def _started(self, now: float, i: int, n: int) -> None:
        if n >= self.steps:
            return
        c = self.cycle
        self.push(now + c.compute_s / self.speeds[i] + c.push_s, "arrive", i, n)

    def _count(self, i: int) -> None:
        self.clock[i] += 1

    def _serve(self, now: float) -> None:
        """Fold what has arrived and answer what the bound allows, while the server is free."""
        while now >= self.busy_until:
            if self._answer(now):
                continue
            if not self.queue:
                return
            i = self.queue.popleft()
            self.folded += 1
            if self.folded % len(self.speeds) == 0 and self.cycle.update_s > 0:
                self.busy_until = now + self.cycle.update_s
                self.push(self.busy_until, "done", i, 0)
                return
            self._count(i)

    def _answer(self, now: float) -> bool:
        for k, (i, n, asked) in enumerate(self.waiting):
            if min(self.clock) >= n - self.staleness:  # every trainer's pushes, the asker's too (real.dp.ps_async)
                others = min((c for j, c in enumerate(self.clock) if j != i), default=n)
                del self.waiting[k]
                self.wait[i] += now - asked
                self.stale[i].append(n - min(others, n))
                self.start[i].append(now + self.cycle.pull_s)
                self.push(now + self.cycle.pull_s, "start", i, n)
                return True
        return False


def simulate_async_ps(cycle: Cycle, speeds: Sequence[float], staleness: int, steps: int = STEPS) -> AsyncPSResult:
    """``steps`` steps of each trainer (speeds: one per replica) under the bound ``staleness``."""
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise ConfigError(f"async-ps: staleness must be a whole number of steps >= 0, got {quote(staleness)}",
                          field="staleness")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"async-ps: steps must be a whole number >= 1, got {quote(steps)}", field="steps")
    speeds = check_speeds(speeds, len(speeds) or 1, "async-ps")
    loop = _Loop(cycle, speeds, staleness, steps)
    loop.run()
    stats = []
    for i, v in enumerate(speeds):
        end = loop.start[i][steps]  # when its step N would start: N steps done, their last pull in
        stats.append(TrainerStats(v, steps / end if end > 0 else math.inf, loop.wait[i],
                                  tuple(loop.stale[i][:steps])))
    return AsyncPSResult(cycle, staleness, steps, tuple(stats))


def cycle_of(result: Any, update_s: float) -> Cycle:
    """The cycle of a simulated async-ps step (a :class:`sim.plan.study.StudyResult`): compute to the last compute
    task's end, the push to the last push's end after it, the pull to the last pull's end after the later of
    that and the servers' last update (the graph's OPTIM tasks, :mod:`schedules.dp.modes`); ``update_s``: the
    servers' whole update of the step (every stage's), which the loop runs after the step's last push.

    So at staleness 0 and equal speeds the time per update is the synchronous ps step of the same graph plus
    the part of the servers' update that ps runs before the step's last push is in (the later stages',
    updated while the earlier ones still push): ``update_s - (last update end - last push end)``, 0 at pp 1.
    """
    from schedules import Kind, Stream

    sim = result.sim
    tasks = sim.graph.tasks
    compute = max((sim.end[t.id] for t in tasks if t.stream is Stream.COMPUTE), default=0.0)
    pushes = max((sim.end[t.id] for t in tasks if t.action.kind is Kind.REDUCE_SCATTER), default=compute)
    updated = max((sim.end[t.id] for t in tasks if t.action.kind is Kind.OPTIM), default=pushes)
    pulls = max((sim.end[t.id] for t in tasks if t.action.kind is Kind.ALL_GATHER), default=pushes)
    pushed = max(compute, pushes)
    return Cycle(compute, pushed - compute, max(pulls - max(pushed, updated), 0.0), update_s)
