"""Failures, checkpoints and restarts: the goodput of a long training job.

A job of N steps (each ``step_time`` seconds, from the normal simulation)
checkpoints every K steps and loses, at each failure, the work since its last
complete checkpoint, then pays a restart (detection + rescheduling + loading).
Failures hit devices independently, exponentially with a per-device MTBF (so
the job sees a Poisson process of rate devices / MTBF), or follow a given trace.

The job is one SimPy process; a second process injects failures and
interrupts it, so a failure can land in a compute segment, a checkpoint or a
restart (a restart then begins again), as in Daly's model.

Reference formulas for the checkpoint interval tau (compute time between
checkpoints), with checkpoint cost delta and MTBF M:

* Young (1974): tau = sqrt(2 delta M).
* Daly (2006), "A higher order estimate of the optimum checkpoint interval for
  restart dumps", eq. 37: tau = sqrt(2 delta M) [1 + sqrt(delta/(2M))/3 +
  delta/(18M)] - delta for delta < 2M, else tau = M; and his expected wall
  time (eq. 20): T_w = M e^{R/M} (e^{(tau+delta)/M} - 1) T_s / tau.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import simpy

from common.errors import ConfigError, check_positive, check_positive_ints

__all__ = [
    "CheckpointPolicy",
    "ElasticResult",
    "FailureModel",
    "GoodputResult",
    "daly_interval",
    "daly_wall_time",
    "simulate_elastic",
    "simulate_job",
    "sweep_intervals",
    "young_interval",
]


def young_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Young's optimum compute time between checkpoints: sqrt(2 delta M)."""
    return math.sqrt(2.0 * checkpoint_cost * mtbf)


def daly_interval(checkpoint_cost: float, mtbf: float) -> float:
    """Daly's higher-order optimum (2006, eq. 37); M itself once delta >= 2M."""
    d, m = checkpoint_cost, mtbf
    if d >= 2.0 * m:
        return m
    x = d / (2.0 * m)
    return math.sqrt(2.0 * d * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - d


def daly_wall_time(solve_time: float, interval: float, checkpoint_cost: float, restart: float, mtbf: float) -> float:
    """Daly's expected wall time (2006, eq. 20) of ``solve_time`` useful seconds checkpointed every ``interval``."""
    m = mtbf
    return m * math.exp(restart / m) * (math.exp((interval + checkpoint_cost) / m) - 1.0) * solve_time / interval


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureModel:
    """Independent exponential failures per device, or a fixed trace of (time s, device)."""

    devices: int
    mtbf_device: float = math.inf  # seconds
    trace: tuple[tuple[float, int], ...] | None = None

    def __post_init__(self) -> None:
        check_positive_ints("failure model", devices=self.devices)
        if not self.mtbf_device > 0:
            raise ConfigError(f"mtbf_device must be > 0 seconds, got {self.mtbf_device!r}")
        if self.trace is not None:
            times = [t for t, _ in self.trace]
            if times != sorted(times) or any(t < 0 for t in times):
                raise ConfigError("failure trace must list (time >= 0, device) in increasing time")
            bad = [d for _, d in self.trace if not 0 <= d < self.devices]
            if bad:
                raise ConfigError(f"failure trace names device {bad[0]}; valid devices are 0..{self.devices - 1}")

    @property
    def job_mtbf(self) -> float:
        """MTBF of the whole job: any device failing stops it."""
        return self.mtbf_device / self.devices

    def arrivals(self) -> list[tuple[float, int]] | None:
        """The trace, or None: then failures are drawn on the fly."""
        return list(self.trace) if self.trace is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointPolicy:
    """Checkpoint every ``every_steps`` steps; ``cost`` s in all, of which ``blocking`` s stop training.

    ``blocking`` None means a synchronous checkpoint (blocking = cost). With
    asynchronous checkpoints the rest is written in the background, at most
    one in flight: a checkpoint counts only once written, and the next one
    waits for it.
    """

    every_steps: int
    cost: float
    restart: float
    blocking: float | None = None

    def __post_init__(self) -> None:
        check_positive_ints("checkpoint policy", every_steps=self.every_steps)
        for name in ("cost", "restart"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0 seconds, got {getattr(self, name)!r}")
        if self.blocking is not None and not 0 <= self.blocking <= self.cost:
            raise ConfigError(f"blocking part must be in [0, cost={self.cost}], got {self.blocking!r}")

    @property
    def blocking_cost(self) -> float:
        return self.cost if self.blocking is None else self.blocking


@dataclass(frozen=True, slots=True)
class GoodputResult:
    wall_time: float
    useful_time: float
    lost_work: float  # seconds of steps computed and then lost
    restarts: int
    checkpoint_time: float  # blocking checkpoint time in all
    restart_time: float

    @property
    def goodput(self) -> float:
        return self.useful_time / self.wall_time if self.wall_time > 0 else 1.0


class _Job:
    """The job as a SimPy process; the failure process interrupts it."""

    def __init__(self, env: simpy.Environment, steps: int, step_time: float, policy: CheckpointPolicy) -> None:
        self.env, self.steps, self.step_time, self.policy = env, steps, step_time, policy
        self.saved = 0  # steps held by the last complete checkpoint
        self.done = 0  # steps computed since the last restart point (>= saved)
        self.pending: tuple[int, float] | None = None  # asynchronous checkpoint in flight: (steps, written at)
        self.computing_since: float | None = None
        self.lost = self.ckpt_time = self.restart_time = 0.0
        self.restarts = 0

    def _commit_async(self) -> None:
        if self.pending is not None and self.pending[1] <= self.env.now + 1e-12:
            self.saved, self.pending = max(self.saved, self.pending[0]), None

    def run(self):
        p, env = self.policy, self.env
        while True:
            try:
                while self.done < self.steps:
                    n = min(p.every_steps - self.done % p.every_steps, self.steps - self.done)
                    self.computing_since = env.now
                    yield env.timeout(n * self.step_time)
                    self.computing_since = None
                    self.done += n
                    self._commit_async()
                    if self.done % p.every_steps == 0 and self.done < self.steps:
                        yield from self._checkpoint()
                return
            except simpy.Interrupt:
                partial = 0.0 if self.computing_since is None else env.now - self.computing_since
                self.computing_since = None
            # A failure: what the last complete checkpoint does not hold is lost; restart.
            self._commit_async()
            self.pending = None  # an unfinished asynchronous write does not count
            self.lost += (self.done - self.saved) * self.step_time + partial
            self.done = self.saved
            self.restarts += 1
            yield from self._restart()

    def _restart(self):
        env = self.env
        while True:  # a failure during the restart starts it again
            start = env.now
            try:
                yield env.timeout(self.policy.restart)
                return
            except simpy.Interrupt:
                self.restarts += 1
            finally:
                self.restart_time += env.now - start

    def _checkpoint(self):
        p, env = self.policy, self.env
        start = env.now
        try:
            if self.pending is not None:  # at most one in flight: wait for the previous write
                yield env.timeout(max(0.0, self.pending[1] - env.now))
                self._commit_async()
            yield env.timeout(p.blocking_cost)
        finally:
            self.ckpt_time += env.now - start
        if p.blocking is None:
            self.saved = self.done
        else:
            self.pending = (self.done, env.now + (p.cost - p.blocking))


def simulate_job(
    steps: int, step_time: float, failures: FailureModel, policy: CheckpointPolicy, *, seed: int = 0
) -> GoodputResult:
    """One run of the job under failures; deterministic for a given seed."""
    check_positive_ints("job", steps=steps)
    check_positive("job", "step_time", step_time, " seconds")
    env = simpy.Environment(initial_time=0.0)
    job = _Job(env, steps, step_time, policy)
    proc = env.process(job.run())
    env.process(_inject(env, proc, failures, random.Random(seed)))
    env.run(until=proc)
    return GoodputResult(
        wall_time=env.now,
        useful_time=steps * step_time,
        lost_work=job.lost,
        restarts=job.restarts,
        checkpoint_time=job.ckpt_time,
        restart_time=job.restart_time,
    )


def _inject(env: simpy.Environment, proc: simpy.Process, failures: FailureModel, rng: random.Random):
    trace = failures.arrivals()
    rate = failures.devices / failures.mtbf_device
    i = 0
    while proc.is_alive:
        if trace is not None:
            if i >= len(trace):
                return
            yield env.timeout(max(0.0, trace[i][0] - env.now))
            i += 1
        else:
            if rate <= 0:
                return
            yield env.timeout(rng.expovariate(rate))
        if proc.is_alive:
            proc.interrupt("failure")


def sweep_intervals(
    steps: int,
    step_time: float,
    failures: FailureModel,
    *,
    intervals: Sequence[int],
    cost: float,
    restart: float,
    blocking: float | None = None,
    trials: int = 20,
    seed: int = 0,
) -> list[dict]:
    """Mean goodput over ``trials`` runs for each checkpoint interval (in steps)."""
    rows = []
    for k in intervals:
        policy = CheckpointPolicy(every_steps=k, cost=cost, restart=restart, blocking=blocking)
        runs = [simulate_job(steps, step_time, failures, policy, seed=seed + t) for t in range(trials)]
        rows.append({
            "every_steps": k,
            "interval_s": k * step_time,
            "goodput": sum(r.goodput for r in runs) / trials,
            "wall_time": sum(r.wall_time for r in runs) / trials,
            "lost_work": sum(r.lost_work for r in runs) / trials,
            "restarts": sum(r.restarts for r in runs) / trials,
        })
    return rows


@dataclass(frozen=True, slots=True)
class ElasticResult:
    wall_time: float
    useful_time: float
    timeline: tuple[tuple[float, int], ...] = field(repr=False)  # (time, replicas training; 0 while stopped)

    @property
    def goodput(self) -> float:
        return self.useful_time / self.wall_time


def simulate_elastic(
    *,
    dp: int,
    devices_per_replica: int,
    steps: int,
    step_time: float,
    mtbf_device: float,
    repair_time: float,
    restart: float,
    checkpoint_every: int,
    checkpoint_cost: float,
    shrink: bool,
    seed: int = 0,
) -> ElasticResult:
    """Data-parallel job whose replicas fail and come back after ``repair_time``.

    A failure takes its replica (``devices_per_replica`` devices) out until
    repaired and loses the work since the last checkpoint. ``shrink`` False:
    wait until the replica is back, then restart. True: restart at once with
    the replicas left (global batch fixed, so a step takes
    ``step_time * dp / alive``), and grow back when a repaired replica returns,
    at a checkpoint followed by a restart (no work lost). Failures during
    restarts and checkpoints are left out here (``simulate_job`` has them).
    """
    check_positive_ints("elastic job", dp=dp, devices_per_replica=devices_per_replica, steps=steps)
    rng = random.Random(seed)
    rate = devices_per_replica / mtbf_device  # failures per second of one replica

    def draws(now: float, n: int) -> list[float]:  # memoryless: fresh failure times for the replicas in service
        return [now + rng.expovariate(rate) if rate > 0 else math.inf for _ in range(n)]

    t, done, saved, alive = 0.0, 0.0, 0, dp
    repaired: list[float] = []  # when the failed replicas come back
    fails = draws(0.0, dp)
    timeline: list[tuple[float, int]] = [(0.0, dp)]
    while done < steps:
        if alive == 0 or (not shrink and alive < dp):  # stopped: wait for repairs, then restart
            t = max(t, min(repaired) if shrink else max(repaired))
            back = [x for x in repaired if x <= t]
            repaired = [x for x in repaired if x > t]
            alive += len(back)
            t += restart
            fails = draws(t, alive)
            timeline.append((t, alive))
            continue
        per_step = step_time * dp / alive
        boundary = min(steps, (int(done) // checkpoint_every + 1) * checkpoint_every)
        seg_end = t + (boundary - done) * per_step
        rejoin = min(repaired) if shrink and repaired else math.inf
        first_fail = min(fails)
        if first_fail < min(seg_end, rejoin):
            t, done, alive = first_fail, float(saved), alive - 1
            repaired.append(t + repair_time)
            timeline.append((t, 0))
            if shrink and alive > 0:
                t += restart
                timeline.append((t, alive))
            fails = draws(t, alive)
        elif rejoin < seg_end:  # a repaired replica joins: checkpoint, then restart at the larger size
            done += (rejoin - t) / per_step
            t = rejoin + checkpoint_cost + restart
            saved = done
            repaired.remove(rejoin)
            alive += 1
            fails = draws(t, alive)
            timeline.append((rejoin, 0))
            timeline.append((t, alive))
        else:
            t, done = seg_end, float(boundary)
            if done < steps:
                t += checkpoint_cost
                saved = done
    timeline.append((t, alive))
    return ElasticResult(wall_time=t, useful_time=steps * step_time, timeline=tuple(timeline))
