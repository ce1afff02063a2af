"""The asynchronous parameter server (dp mode ``async-ps``): trainers do not wait for each other.

The servers hold the same shards as :mod:`real.ps` and trainers push the same
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
Checkpoints are not supported in this mode.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from real import checkpoint as ckpt
from real.dp import _Bucket
from real.measure import clock_offset
from real.p2p import PeerError
from real.ps import ParamServer, PSTrainer, ServerResult, _Pending, bucket_tag, request_tag, version_tag

__all__ = ["AsyncPSTrainer", "AsyncParamServer"]

log = logging.getLogger(__name__)

class AsyncPSTrainer(PSTrainer):
    """A trainer of async-ps: pushes as :class:`real.ps.PSTrainer`, pulls by request within the staleness bound."""

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
        if self.step >= 0:
            self._record_staleness()
        super().begin_step()
        self.step += 1
        self._requested = set()
        self.used = {}

    def _record_staleness(self) -> None:
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
        """After the last step: its staleness recorded, the final parameters (every push applied) pulled."""
        if len(self.history) < self.step + 1:
            self._record_staleness()
        for s in sorted(self._versions):
            self._take_version(s)
        super().gather_all()


@dataclass(eq=False)
class _Channel:
    """One trainer's pushes of one stage: the buckets that have arrived, in step order each, and its clock."""

    trainer: int
    stage: int
    arrived: dict[int, deque[torch.Tensor]] = field(default_factory=dict)  # bucket -> gradients in step order
    clock: int = 0  # pushes complete (steps)


@dataclass(eq=False)
class AsyncParamServer(ParamServer):
    """A server of async-ps: the loop of the module doc.

    gloo's point-to-point works report completion only once waited for, so they cannot be polled: one
    thread per (trainer, stage) waits for its pushes in turn and one for its requests, and hands each
    message to the server's loop through a queue (the loop blocks on it: no busy polling).
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        cfg = self.plan.config
        self.staleness, self.steps = cfg.sync.staleness, cfg.steps
        self.version = dict.fromkeys(self.optimizers, 0)
        self._queue: dict[int, list[tuple[int, list[torch.Tensor]]]] = {s: [] for s in self.optimizers}
        self._channels = {(t, s): _Channel(t, s) for s in sorted(self.optimizers) for t in self.trainers[s]}
        self._waiting: list[tuple[int, int, int]] = []  # (trainer, stage, step asked for)
        self._inbox: queue.Queue = queue.Queue()

    def serve(self, restored: ckpt.Restored | None) -> ServerResult:
        """The run: the collectives every rank makes at its start and end around :meth:`serve_async`."""
        clock_offset()
        dist.barrier()
        self.serve_async()
        memory = self.memory()
        dist.gather_object(([], memory, [], None), None, dst=0)
        return ServerResult([], [], memory, 0)

    def _stage_buckets(self, s: int) -> list[_Bucket]:
        return [b for b in self.buckets if b.stage == s]

    def _listen(self, t: int, s: int) -> None:
        """Thread: trainer t's pushes of stage s (every bucket of every step), then hand each on."""
        try:
            for _ in range(self.steps):
                for b in self._stage_buckets(s):
                    buf = torch.empty_like(b.shard)
                    dist.irecv(buf, t, tag=bucket_tag(s, b.index)).wait()
                    self._inbox.put(("push", t, s, b.index, buf))
        except RuntimeError as exc:
            self._inbox.put(("error", t, s, "push", exc))

    def _listen_requests(self, t: int, s: int) -> None:
        """Thread: trainer t's requests for stage s, one per step."""
        try:
            for _ in range(self.steps):
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
        left = len(self._channels) * self.steps  # answers to give: one per trainer, stage and step (the last: final)
        while left:
            try:
                what, t, s, a, b = self._inbox.get(timeout=self.plan.config.runtime.timeout_s)
            except queue.Empty:
                raise PeerError(f"parameter server {self.rank} (rank {self.mesh.rank}): no push or request from any "
                                f"trainer in {self.plan.config.runtime.timeout_s:g} s; a trainer died or hangs") from None
            if what == "error":
                raise self._dead(t, self._stage_buckets(s)[0], a, b) from b
            if what == "push":
                self._arrive(self._channels[(t, s)], a, b)
            else:
                self._waiting.append((t, s, a))
            left -= self._answer()

    def _arrive(self, ch: _Channel, k: int, grad: torch.Tensor) -> None:
        ch.arrived.setdefault(k, deque()).append(grad)
        stage = self._stage_buckets(ch.stage)
        while all(ch.arrived.get(b.index) for b in stage):
            self._fold(ch, [ch.arrived[b.index].popleft() for b in stage])

    @torch.no_grad()
    def _fold(self, ch: _Channel, grads: list[torch.Tensor]) -> None:
        """One push of a stage in; every dp of them make an update (summed in trainer order)."""
        ch.clock += 1
        queue_ = self._queue[ch.stage]
        queue_.append((self.trainers[ch.stage].index(ch.trainer), grads))
        if len(queue_) < self.dp:
            return
        queue_.sort(key=lambda q: q[0])
        for i, b in enumerate(self._stage_buckets(ch.stage)):
            b.shard_grad.copy_(queue_[0][1][i])
            for _, g in queue_[1:]:
                b.shard_grad.add_(g[i])
            b.shard_grad.div_(self.dp)
        self.optimizers[ch.stage].step()
        self.version[ch.stage] += 1
        queue_.clear()

    def _slowest(self, s: int) -> int:
        return min(ch.clock for ch in self._channels.values() if ch.stage == s)

    def _answer(self) -> int:
        """Answer each request whose bound holds: the slowest has pushed step - S steps (the final one: all,
        and applied); the answer is the version and the shards, sent and waited for (the trainer has posted
        its receives before asking). Returns how many were answered."""
        answered = 0
        for t, s, step in list(self._waiting):
            final = step >= self.steps
            if self._slowest(s) < (self.steps if final else step - self.staleness) or (final and self._queue[s]):
                continue
            self._waiting.remove((t, s, step))
            stage = self._stage_buckets(s)
            others = min((ch.clock for ch in self._channels.values() if ch.stage == s and ch.trainer != t),
                         default=step)  # the asker has pushed every step before this one (its push may be on its way)
            answer = torch.tensor([self.version[s], min(others, step)], dtype=torch.int64)
            works = [(t, dist.isend(answer, t, tag=version_tag(s)))]
            works += [(t, dist.isend(b.shard, t, tag=bucket_tag(b.stage, b.index))) for b in stage]
            self._wait(_Pending(stage[0], works, None, "pull"))
            answered += 1
        return answered
