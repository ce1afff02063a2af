"""The asynchronous parameter server (dp mode ``async-ps``): trainers do not wait for each other.

The servers hold the same shards as :mod:`real.dp.ps` and trainers push the same
buckets from the same gradient hooks; what changes is when a server updates and
when a trainer may go on (stale synchronous parallel, Ho et al. 2013, "More
effective distributed ML via a stale synchronous parallel parameter server",
with a bound of ``staleness`` S steps):

* **update:** a server folds each trainer's push of a stage into the stage's
  update as it arrives (a push counts once all its buckets are in), whatever
  the step it comes from; every dp pushes make one update (their gradients
  summed in trainer order, / dp) and one optimizer step: version v + 1 of the
  stage. No trainer waits for another's push.
* **bound:** after its last pass of step t that reads a stage, a trainer asks
  each server for the stage's parameters for step t + 1 (a request message
  after the pushes); the server answers once the slowest trainer of the stage
  has pushed steps up to t + 1 - S (its clock >= t + 1 - S), with its current
  shards and their version. So a trainer never runs more than S steps ahead of
  the slowest. The final request (after the last step) waits for every push:
  every trainer ends with the servers' last parameters.
* **staleness** of a step t: how many steps the trainer is ahead of the slowest
  when it is let go, t minus the slowest's pushes then (over its stages and the
  servers), at most S: what the bound limits. Logged per step (with the lag of
  the parameters' version, t minus the updates they hold) and returned in
  ``RunResult.staleness``.

With S = 0 every update is one push of each trainer for the same step, summed in
trainer order: exactly synchronous ps. With S >= 1 the gradients are stale: the
mathematics change (a different run, compared by time to a loss).

A server runs one polling loop over its trainers' pushes and requests (point to
point, no collective per step); the trainers skip the per-step loss all-reduce
(each keeps its own losses; rank 0 averages them over replicas at the end).

**Trace.** A traced run's servers record each update as sync ps's do
(:mod:`real.dp.ps`): a row ``{s}OPTIM`` of the server's rank on the collective
stream, from the start of the fold of the push that completes it (its
gradients summed, / dp) to the end of its optimizer step, for update k of the
stage (k = 0, 1, ...) in the run's traced steps, as step k. The pulls are the
trainers' rows (``{s}ALL_GATHER``, :mod:`real.dp.ps`). The simulator reads the
updates (:func:`sim.replay.server_updates`: the update time of
:mod:`sim.costs.async_ps`'s loop, ``analysis.validation.async_grid``).

**Order.** With S >= 1 what a run computes depends on the order in which a
server folds pushes and answers requests, which timing decides. Each server
records that order: one event per fold (trainer rank, stage, the push's step)
and per answer (trainer rank, stage, the step asked for), returned in
``RunResult.ps_order`` (server rank -> events). ``run(..., ps_order=)`` makes
the servers follow a recorded order instead (each event waits for its message):
the same order gives the same run, bit for bit, whatever the timing.

**Checkpoints** (``--checkpoint-every K``): a checkpoint step T (a multiple of
K) is a barrier. Its requests are answered only once every trainer's pushes of
steps < T are folded and their updates applied (as the final request), so every
trainer starts step T with the parameters of update T; then every rank saves
(the trainers' random state, own losses and staleness history; the servers'
whole parameters and optimizer state as :mod:`real.dp.ps`, their version counters
and push clocks, all T, and their order so far), and the servers receive nothing
more until the save is written. A run resumed from step T starts from exactly
that state, so it is bit-identical to a run that checkpointed at the same steps
(the barriers are part of the run) and folded in the same order after T: always
at S = 0, and at S >= 1 under ``ps_order`` (a resumed run checks that the given
order begins with the checkpoint's).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from real import checkpoint as ckpt
from real import stop
from real.dp.ps import ParamServer, PSTrainer, ServerResult, _Pending, _restarts, bucket_tag, request_tag, version_tag
from real.dp.sync import _Bucket
from real.dp.zero import full_state, load_full
from real.measure import clock_offset
from real.p2p import PeerError
from schedules import Action, CheckpointError, ConfigError, Kind

__all__ = ["ANSWER", "FOLD", "AsyncPSTrainer", "AsyncParamServer", "read_ps_order"]

log = logging.getLogger(__name__)

FOLD, ANSWER = 0, 1  # the kinds of a server's order events: (kind, trainer rank, stage, step)


def read_ps_order(path: str) -> dict[int, list[tuple[int, int, int, int]]]:
    """A recorded order from a JSON file: a run's ``--json`` output (its ``"ps_order"``) or that mapping alone,
    server rank -> [[kind, trainer rank, stage, step], ...]; ConfigError naming the file otherwise."""
    import json
    from pathlib import Path

    def bad(why: str) -> ConfigError:
        return ConfigError(f"ps order file {path!r}: {why}; give the --json output of an async-ps run",
                           field="ps_order")

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise bad(f"cannot be read ({exc.strerror or exc})") from None
    except ValueError:
        raise bad("is not JSON") from None
    data = data.get("ps_order", data) if isinstance(data, dict) else data
    try:
        order = {int(r): [tuple(int(x) for x in e) for e in events] for r, events in data.items()}
    except (AttributeError, TypeError, ValueError):
        raise bad('holds no "ps_order" mapping of server rank to [[kind, trainer, stage, step], ...]') from None
    if not order or any(len(e) != 4 or e[0] not in (FOLD, ANSWER) for events in order.values() for e in events):
        raise bad('holds no "ps_order" mapping of server rank to [[kind, trainer, stage, step], ...]')
    return order


def _read(restored: ckpt.Restored, prefix: str, rank: int) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors whose names start with ``prefix``, loaded whole (their shapes from its index)."""
    meta = ckpt.read_metadata(restored.path).state_dict_metadata
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items() if k.startswith(prefix)}
    if state:
        ckpt.load_state(restored, state, rank)
    return state


class AsyncPSTrainer(PSTrainer):
    """A trainer of async-ps: pushes as :class:`real.dp.ps.PSTrainer`, pulls by request within the staleness bound."""

    def __init__(self, stage_params: dict[int, Sequence[nn.Parameter]], *, staleness: int, steps: int,
                 **kw: Any) -> None:
        super().__init__(stage_params, **kw)
        self.staleness, self.steps = staleness, steps
        self.step = -1  # begin_step makes it 0
        self._requested: set[int] = set()  # stages whose request for the next step is out
        # stage -> (server, work, answer): the answer is [version, the slowest trainer's pushes]
        self._versions: dict[int, list[tuple[int, dist.Work, torch.Tensor]]] = {}
        self.used: dict[int, tuple[int, int]] = {}  # stage -> (oldest version, fewest pushes of the slowest)
        self.history: list[int] = []  # staleness of every step

    def begin_step(self) -> None:
        super().begin_step()
        self.step += 1
        self._requested = set()
        self.used = {}

    def after_step(self) -> None:
        """The step's staleness (every stage it read has had its answer by now)."""
        super().after_step()
        version = min((v for v, _ in self.used.values()), default=self.step)
        slowest = min((c for _, c in self.used.values()), default=self.step)
        self.history.append(self.step - slowest)
        log.info("rank %d: step %d ran %d step(s) ahead of the slowest trainer (bound %d), with parameters of %d "
                 "updates (lag %d)", self.me, self.step, self.step - slowest, self.staleness, version,
                 self.step - version)

    def _pull(self, b: _Bucket) -> None:
        """A stage is asked for once all its buckets are pushed and no task of the step reads it any more."""
        s = b.stage
        if s in self._requested or not all(x.launched for x in self.buckets if x.stage == s):
            return
        self._requested.add(s)
        for r in self.servers:  # the receives first: the server answers as soon as the bound allows
            version = torch.zeros(2, dtype=torch.int64)
            self._versions.setdefault(s, []).append((r, self._talk(dist.irecv, version, r, version_tag(s), b, "pull"),
                                                     version))
        for x in self.buckets:
            if x.stage == s:
                super()._pull(x)
        target = torch.tensor([self.step + 1], dtype=torch.int64)
        self._wait(_Pending(b, [(r, self._talk(dist.isend, target, r, request_tag(s), b, "request"))
                                for r in self.servers], None, "request"))

    def before_task(self, tid: int) -> None:
        """The stage's answer (within the bound) is waited for; the version it carries is what the step uses."""
        for s in self.reads.get(tid, ()):
            self._take_version(s)
        super().before_task(tid)

    def _take_version(self, s: int) -> None:
        for r, work, version in self._versions.pop(s, ()):
            try:
                work.wait()
            except RuntimeError as exc:
                b = next(x for x in self.buckets if x.stage == s)
                raise self._dead(r, b, "pull", exc) from exc
            v, c = self.used.get(s, (int(version[0]), int(version[1])))
            self.used[s] = (min(v, int(version[0])), min(c, int(version[1])))

    def gather_all(self) -> None:
        """After the last step: the final parameters (every push applied) pulled."""
        for s in sorted(self._versions):
            self._take_version(s)
        super().gather_all()

    # checkpoints: this trainer's own losses and staleness (the parameters come from the servers' part)
    def state(self, losses: Sequence[float], rank: int) -> dict[str, torch.Tensor]:
        return {f"async.rank{rank}.losses": torch.tensor(list(losses), dtype=torch.float64),
                f"async.rank{rank}.staleness": torch.tensor(self.history, dtype=torch.int64)}

    def load(self, restored: ckpt.Restored, rank: int) -> list[float]:
        """Resume at the checkpoint's step: this trainer's staleness history; returns its own losses."""
        state = _read(restored, f"async.rank{rank}.", rank)
        if len(state) != 2:
            raise CheckpointError(f"checkpoint {restored.path} holds no async-ps state of rank {rank} (written by "
                                  "another dp mode or layout); resume with the mode that wrote it", field="directory")
        self.step = restored.step - 1
        self.history = [int(x) for x in state[f"async.rank{rank}.staleness"]]
        return [float(x) for x in state[f"async.rank{rank}.losses"]]


@dataclass(eq=False)
class _Channel:
    """One trainer's pushes of one stage: the buckets that have arrived, the whole pushes not yet folded (in
    step order), and its clock."""

    trainer: int
    stage: int
    arrived: dict[int, deque[torch.Tensor]] = field(default_factory=dict)  # bucket -> gradients in step order
    ready: deque[list[torch.Tensor]] = field(default_factory=deque)  # whole pushes waiting for their turn
    clock: int = 0  # pushes folded (steps)


@dataclass(eq=False)
class AsyncParamServer(ParamServer):
    """A server of async-ps: the loop of the module doc; ``script``: an order to follow (a recorded one).

    gloo's point-to-point works report completion only once waited for, so they cannot be polled: one
    thread per (trainer, stage) waits for its pushes in turn and one for its requests, and hands each
    message to the server's loop through a queue (the loop blocks on it: no busy polling).
    """

    script: Sequence[Sequence[int]] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        cfg = self.plan.config
        self.staleness, self.steps = cfg.sync.staleness, cfg.steps
        self.version = dict.fromkeys(self.optimizers, 0)
        self._queue: dict[int, list[tuple[int, list[torch.Tensor]]]] = {s: [] for s in self.optimizers}
        self._channels = {(t, s): _Channel(t, s) for s in sorted(self.optimizers) for t in self.trainers[s]}
        self._waiting: list[tuple[int, int, int]] = []  # (trainer, stage, step asked for)
        self._inbox: queue.Queue = queue.Queue()
        self.order: list[tuple[int, int, int, int]] = []
        self._script = None if self.script is None else [tuple(int(x) for x in e) for e in self.script]
        self._pos = 0  # the next event of the script
        self.start = 0
        self._stepped = 0  # steps whose first push has been folded (faults are injected there)
        self._answered: dict[int, int] = {}  # checkpoint step asked for -> answers given
        self._saver: ckpt.Checkpointer | None = None
        self._paused: dict[int, threading.Event] = {}  # checkpoint step -> set once it is written
        self._signalled: float | None = None  # when this server saw a signal (the run stopping)
        self._gone: set[int] = set()  # trainers that have stopped since
        self._offset = 0.0  # this rank's clock offset (real.measure.clock_offset), for the trace's rows
        self.rows: list[tuple] = []  # traced updates and answers: real.train's row tuples (module doc)

    def _due(self, step: int) -> bool:
        c = self.plan.config.checkpoint
        return c is not None and c.every > 0 and step % c.every == 0

    def serve(self, restored: ckpt.Restored | None) -> ServerResult:
        """The run: the collectives every rank makes at its start and end around :meth:`serve_async`."""
        cfg = self.plan.config
        if restored is not None:
            self._restore(restored)
        if cfg.checkpoint is not None:
            self._saver = ckpt.Checkpointer(cfg.checkpoint, self.mesh.rank, _restarts())
            if restored is not None:
                self._saver.resumed(restored)
        self._paused = {t: threading.Event() for t in range(self.start + 1, self.steps) if self._due(t)}
        self._offset = clock_offset()
        dist.barrier()
        self.serve_async()
        if self._saver is not None:
            self._saver.wait()
        memory = self.memory()
        dist.gather_object((self.rows, memory, [], {"ps_order": self.order}), None, dst=0)
        return ServerResult([], [], memory, self.start)

    def _stage_buckets(self, s: int) -> list[_Bucket]:
        return [b for b in self.buckets if b.stage == s]

    def _listen(self, t: int, s: int) -> None:
        """Thread: trainer t's pushes of stage s (every bucket of every step), then hand each on."""
        try:
            for step in range(self.start, self.steps):
                if step in self._paused:  # nothing in flight while the checkpoint before this step is written
                    self._paused[step].wait()
                for b in self._stage_buckets(s):
                    buf = torch.empty_like(b.shard)
                    dist.irecv(buf, t, tag=bucket_tag(s, b.index)).wait()
                    self._inbox.put(("push", t, s, b.index, buf))
        except RuntimeError as exc:
            self._inbox.put(("error", t, s, "push", exc))

    def _listen_requests(self, t: int, s: int) -> None:
        """Thread: trainer t's requests for stage s, one per step."""
        try:
            for step in range(self.start, self.steps):
                if step in self._paused:
                    self._paused[step].wait()
                buf = torch.zeros(1, dtype=torch.int64)
                dist.irecv(buf, t, tag=request_tag(s)).wait()
                self._inbox.put(("request", t, s, int(buf[0]), None))
        except RuntimeError as exc:
            self._inbox.put(("error", t, s, "request", exc))

    def serve_async(self) -> None:
        """Serve every push and request of the run (steps x trainers x stages of each)."""
        for t, s in self._channels:
            for target in (self._listen, self._listen_requests):
                threading.Thread(target=target, args=(t, s), daemon=True, name=f"ps{self.rank}-{target.__name__}").start()
        left = len(self._channels) * (self.steps - self.start)  # answers to give: one per trainer, stage and step
        while left:
            what, t, s, a, b = self._next()
            if what == "error" and self._stopping():  # a trainer that stopped after the signal has gone
                self._gone.add(t)
                if self._gone >= {ch.trainer for ch in self._channels.values()}:
                    raise self._interrupted()
                continue
            if what == "error":
                raise self._dead(t, self._stage_buckets(s)[0], a, b) from b
            if what == "push":
                self._arrive(self._channels[(t, s)], a, b)
            else:
                self._waiting.append((t, s, a))
            left -= self._advance()
            self._checkpoint()

    # a signal: the trainers stop at their own step boundaries (no lockstep to stop in). The server goes on
    # answering, at once and whatever the bound (so that no trainer waits for one that has stopped), starts no new
    # save, and stops once every trainer has gone (its messages fail) or stop.GRACE_S after the signal.
    def _stopping(self) -> bool:
        if stop.requested() is not None and self._signalled is None:
            self._signalled = time.monotonic()
            for paused in self._paused.values():  # no save to wait for: the listeners go on (and see who left)
                paused.set()
        return self._signalled is not None

    def _interrupted(self) -> stop.Interrupted:
        last = self._saver.last if self._saver is not None else None
        return stop.Interrupted(int(stop.requested() or 15), min(ch.clock for ch in self._channels.values()), last)

    def _next(self) -> tuple:
        """The next message of a trainer (polled, to see a signal); PeerError after the timeout."""
        timeout = self.plan.config.runtime.timeout_s
        deadline = time.monotonic() + timeout
        while True:
            if self._stopping():
                deadline = min(deadline, self._signalled + stop.GRACE_S)
                self._answer_all()
            try:
                return self._inbox.get(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() < deadline:
                    continue
                if self._stopping():
                    raise self._interrupted() from None
                raise PeerError(f"parameter server {self.rank} (rank {self.mesh.rank}): no push or request from "
                                f"any trainer in {timeout:g} s; a trainer died or hangs") from None

    def _answer_all(self) -> None:
        """Stopping: every request waiting is answered now; one to a trainer that has gone is dropped."""
        for t, s, step in list(self._waiting):
            if t in self._gone:
                self._waiting.remove((t, s, step))
                continue
            try:
                self._give(t, s, step)
            except PeerError:
                self._gone.add(t)

    def _replaying(self) -> bool:
        return self._script is not None and self._pos < len(self._script)

    def _arrive(self, ch: _Channel, k: int, grad: torch.Tensor) -> None:
        ch.arrived.setdefault(k, deque()).append(grad)
        stage = self._stage_buckets(ch.stage)
        while all(ch.arrived.get(b.index) for b in stage):
            ch.ready.append([ch.arrived[b.index].popleft() for b in stage])

    def _advance(self) -> int:
        """Fold and answer what may be: the script's next events while it lasts, else every whole push as it
        arrives and every request the bound allows. Returns how many requests were answered."""
        answered = 0
        while self._replaying():
            done = self._replay_one()
            if done is None:
                return answered
            answered += done
        for ch in self._channels.values():
            while ch.ready:
                self._fold(ch, ch.ready.popleft())
        for t, s, step in list(self._waiting):
            if self._allowed(s, step) and not self._stopping():
                self._give(t, s, step)
                answered += 1
        return answered

    def _replay_one(self) -> int | None:
        """The script's next event if its message is in (1: an answer, 0: a fold), None if not yet."""
        kind, t, s, step = self._script[self._pos]
        ch = self._channels.get((t, s))
        if ch is None or kind not in (FOLD, ANSWER):
            raise ConfigError(f"async-ps order event {self._pos} {(kind, t, s, step)} names no trainer and stage of "
                              f"server {self.rank}; give the order this run's layout recorded", field="ps_order")
        if kind == FOLD:
            if not ch.ready:
                return None
            if ch.clock != step:
                raise ConfigError(f"async-ps order event {self._pos}: trainer {t}'s push of step {step}, but its "
                                  f"next is step {ch.clock}; give the order this run recorded", field="ps_order")
            self._fold(ch, ch.ready.popleft())
        else:
            if (t, s, step) not in self._waiting:
                return None
            if not self._allowed(s, step):
                raise ConfigError(f"async-ps order event {self._pos}: trainer {t}'s request for step {step} answered "
                                  f"before staleness {self.staleness} allows it; give the order a run with this "
                                  "staleness and these checkpoints recorded", field="ps_order")
            self._give(t, s, step)
        self._pos += 1
        return int(kind == ANSWER)

    @torch.no_grad()
    def _fold(self, ch: _Channel, grads: list[torch.Tensor]) -> None:
        """One push of a stage in; every dp of them make an update (summed in trainer order). The first push of
        a step folded is the server's step for the injected faults (--fail-at-step, --slow-rank)."""
        if ch.clock >= self._stepped:
            self._stepped = ch.clock + 1
            stop.inject_fault(self.mesh.rank, ch.clock, **asdict(self.plan.config.faults))
        self.order.append((FOLD, ch.trainer, ch.stage, ch.clock))
        ch.clock += 1
        queue_ = self._queue[ch.stage]
        queue_.append((self.trainers[ch.stage].index(ch.trainer), grads))
        if len(queue_) < self.dp:
            return
        start = time.perf_counter()
        queue_.sort(key=lambda q: q[0])
        for i, b in enumerate(self._stage_buckets(ch.stage)):
            b.shard_grad.copy_(queue_[0][1][i])
            for _, g in queue_[1:]:
                b.shard_grad.add_(g[i])
            b.shard_grad.div_(self.dp)
        self.optimizers[ch.stage].step()
        self._trace(self.version[ch.stage], Action(Kind.OPTIM, ch.stage), start)
        self.version[ch.stage] += 1
        queue_.clear()

    def _trace(self, step: int, action: Action, start: float) -> None:
        """A row of real.train's trace (module doc) for ``step``, from ``start`` to now, if the step is traced."""
        if step in self.plan.config.traced_steps:
            self.rows.append((step, None, self.mesh.rank, "collective", action, start + self._offset,
                              time.perf_counter() + self._offset, 0.0))

    def _slowest(self, s: int) -> int:
        return min(ch.clock for ch in self._channels.values() if ch.stage == s)

    def _allowed(self, s: int, step: int) -> bool:
        """The bound: the slowest has pushed step - S steps; the final request and a checkpoint step's: every
        push before the step, and applied."""
        whole = step >= self.steps or self._due(step)
        return self._slowest(s) >= (step if whole else step - self.staleness) and not (whole and self._queue[s])

    def _give(self, t: int, s: int, step: int) -> None:
        """The answer: the version and the shards, sent and waited for (the trainer has posted its receives
        before asking)."""
        self._waiting.remove((t, s, step))
        self.order.append((ANSWER, t, s, step))
        if self._due(step):
            self._answered[step] = self._answered.get(step, 0) + 1
        stage = self._stage_buckets(s)
        others = min((ch.clock for ch in self._channels.values() if ch.stage == s and ch.trainer != t),
                     default=step)  # the asker has pushed every step before this one (its push may be on its way)
        answer = torch.tensor([self.version[s], min(others, step)], dtype=torch.int64)
        works = [(t, dist.isend(answer, t, tag=version_tag(s)))]
        works += [(t, dist.isend(b.shard, t, tag=bucket_tag(b.stage, b.index))) for b in stage]
        self._wait(_Pending(stage[0], works, None, "pull"))

    # checkpoints
    def _checkpoint(self) -> None:
        """Once every request for a checkpoint step is answered (the barrier), save with the trainers (who are in
        the save's collectives by then), then let the listeners go on."""
        for step in sorted(self._answered):
            if self._saver is None or self._answered[step] < len(self._channels) or self._stopping():
                continue
            del self._answered[step]
            state = full_state(self, self.named, self.optimizers, self.mesh.rank)
            state.update(self._state())
            cfg = self.plan.config
            self._saver.save(step, state, {"losses": [], "world_size": cfg.world_size, "pp": cfg.layout.pp,
                                           "dp": cfg.layout.dp, "config": cfg.to_dict()})
            if step in self._paused:
                self._paused[step].set()

    def _state(self) -> dict[str, torch.Tensor]:
        j = self.rank
        return {f"async.server{j}.version": torch.tensor([self.version[s] for s in sorted(self.version)]),
                f"async.server{j}.clock": torch.tensor([ch.clock for ch in self._channels.values()]),
                f"async.server{j}.order": torch.tensor(self.order, dtype=torch.int64).reshape(-1, 4)}

    def _restore(self, restored: ckpt.Restored) -> None:
        """The servers' shards and optimizer state, versions, clocks and order at the checkpoint's step."""
        load_full(restored, self, self.named, self.optimizers, self.mesh.rank)
        prefix = f"async.server{self.rank}."
        state = _read(restored, prefix, self.mesh.rank)
        if len(state) != 3:
            raise CheckpointError(f"checkpoint {restored.path} holds no async-ps state of server {self.rank} (written "
                                  "by another dp mode or number of servers); resume with the mode that wrote it",
                                  field="directory")
        versions, clocks = state[prefix + "version"].tolist(), state[prefix + "clock"].tolist()
        if set(versions) | set(clocks) != {restored.step} or len(clocks) != len(self._channels):
            raise CheckpointError(f"checkpoint {restored.path}: server {self.rank}'s versions {versions} and clocks "
                                  f"{clocks} are not all its step {restored.step}", field="directory")
        self.start = self._stepped = restored.step
        self.version = dict.fromkeys(self.version, restored.step)
        for ch in self._channels.values():
            ch.clock = restored.step
        self.order = [tuple(e) for e in state[prefix + "order"].tolist()]
        if self._script is not None:
            if self._script[:len(self.order)] != self.order:
                raise ConfigError(f"async-ps: the order given does not begin with the {len(self.order)} events of "
                                  f"checkpoint {restored.path} (server {self.rank}); give the order of the run that "
                                  "wrote it", field="ps_order")
            self._pos = len(self.order)
