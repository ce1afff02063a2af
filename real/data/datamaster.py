"""A data master: rank 0 hands out shards of the data as leases through the rendezvous store.

The master (:class:`DataMaster`, a thread on rank 0) and the trainers
(:class:`LeaseClient`, one per rank) talk only through a ``torch.distributed``
store, the one torchrun's rendezvous already runs (:func:`rendezvous_store`),
never through collectives, so a trainer that dies blocks no one:

* a trainer asks for work by incrementing its request counter ``req/{r}``
  and waits for the answer ``lease/{r}/{n}``: a shard id, or -1 when every
  shard is done;
* it proves it is alive by incrementing ``hb/{r}`` every ``heartbeat_s``
  (a thread); the master notes, on its own clock, when each counter last moved;
* it reports a finished shard by setting ``done/{shard}/{r}``.

The master starts handing out shards once every trainer has beaten once (or
after ``join_timeout_s``), so a trainer slow to start still gets its share.

A lease whose holder's heartbeat has not moved for ``lease_timeout_s`` is
revoked: the trainer is taken as lost and the shard goes back to the front
of the queue, for the next trainer that asks. A shard counts as done only
when its current holder reports it (the report of a revoked holder is under
its own key, never read), so every shard is completed once. The master records
who completed what, every reassignment and every lost trainer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

__all__ = ["DataMaster", "LeaseClient", "MasterBatches", "MasterReport", "rendezvous_store"]

log = logging.getLogger(__name__)

FINISHED = -1
_PREFIX = "schedlab/datamaster"


def rendezvous_store(world: int, *, host: bool = False, timeout_s: float = 60.0) -> dist.Store:
    """A client of the rendezvous store at ``MASTER_ADDR:MASTER_PORT``: torchrun's agent store, or without one
    the store rank 0 hosts (``host=True``: this call starts it, as env:// rendezvous has rank 0 do).

    Keys are prefixed by the torchrun attempt, so a restarted group starts afresh.
    """
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=host and not agent, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"{_PREFIX}/attempt{attempt}", store)


@dataclass
class MasterReport:
    """What the master saw: who completed each shard, each revoked lease, each lost trainer."""

    completed_by: dict[int, int] = field(default_factory=dict)  # shard -> rank
    reassigned: list[tuple[int, int]] = field(default_factory=list)  # (shard, rank that lost it)
    lost: list[int] = field(default_factory=list)
    leases: list[tuple[int, int]] = field(default_factory=list)  # (shard, rank), in the order granted

    def to_json(self) -> dict[str, Any]:
        return {"completed_by": {str(k): v for k, v in sorted(self.completed_by.items())},
                "reassigned": self.reassigned, "lost": self.lost, "leases": self.leases}


class DataMaster:
    """Leases shards ``first .. first + num_shards - 1`` to ``trainers`` ranks through ``store`` (module doc)."""

    def __init__(self, store: dist.Store, num_shards: int, trainers: int, *, first: int = 0,
                 lease_timeout_s: float = 10.0, join_timeout_s: float = 60.0, poll_s: float = 0.02) -> None:
        if num_shards < 1 or trainers < 1:
            raise ValueError(f"a data master needs shards and trainers, got {num_shards} and {trainers}")
        self.store, self.num_shards, self.trainers = store, num_shards, trainers
        self.lease_timeout_s, self.join_timeout_s, self.poll_s = lease_timeout_s, join_timeout_s, poll_s
        self.report = MasterReport()
        self._pending = deque(range(first, first + num_shards))  # shard ids first.. (a resumed run's next ones)
        self._held: dict[int, int] = {}  # shard -> rank
        self._answered = dict.fromkeys(range(trainers), 0)
        self._waiting: dict[int, int] = {}  # rank -> request number not yet answered
        self._beat: dict[int, tuple[int, float]] = {}  # rank -> (counter, when it last moved)
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> DataMaster:
        """Serve in a daemon thread (rank 0 trains beside it)."""
        self._thread = threading.Thread(target=self._run, name="data-master", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> MasterReport:
        if self._thread is not None:
            self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.report

    def _run(self) -> None:
        try:
            self.serve()
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def serve(self) -> MasterReport:
        """Until every shard is done: answer requests, collect reports, revoke the leases of the lost."""
        deadline = time.monotonic() + self.join_timeout_s
        while time.monotonic() < deadline and not all(self.store.add(f"hb/{r}", 0) for r in range(self.trainers)):
            time.sleep(self.poll_s)
        while len(self.report.completed_by) < self.num_shards:
            self._collect()
            self._check_heartbeats()
            self._answer()
            time.sleep(self.poll_s)
        self.store.set("finished", "1")
        for r, n in self._waiting.items():
            self.store.set(f"lease/{r}/{n}", str(FINISHED))
        # The store may live in this process: stay until every trainer still alive has seen the end.
        deadline = time.monotonic() + self.join_timeout_s
        while self.store.add("exited", 0) < self.trainers - len(self.report.lost) and time.monotonic() < deadline:
            self._check_heartbeats()
            time.sleep(self.poll_s)
        log.info("data master: %d shards done; lost trainers %s, %d leases reassigned", self.num_shards,
                 self.report.lost, len(self.report.reassigned))
        return self.report

    def _collect(self) -> None:
        for shard, rank in list(self._held.items()):
            if not self.store.check([f"done/{shard}/{rank}"]):
                continue
            del self._held[shard]
            self.report.completed_by[shard] = rank

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for r in range(self.trainers):
            count = self.store.add(f"hb/{r}", 0)
            last = self._beat.get(r)
            if last is None or count != last[0]:
                self._beat[r] = (count, now)
            elif now - last[1] > self.lease_timeout_s and r not in self.report.lost:
                mine = [s for s, holder in self._held.items() if holder == r]
                if not mine and count == 0:
                    continue  # never started: holds nothing, may still come
                self.report.lost.append(r)
                self._waiting.pop(r, None)
                for s in mine:
                    del self._held[s]
                    self._pending.appendleft(s)
                    self.report.reassigned.append((s, r))
                log.warning("data master: rank %d lost (no heartbeat for %.1f s); shards %s go back to the queue",
                            r, now - last[1], mine)

    def _answer(self) -> None:
        for r in range(self.trainers):
            if r in self.report.lost:
                continue
            asked = self.store.add(f"req/{r}", 0)
            if asked > self._answered[r]:
                self._waiting[r] = self._answered[r] + 1
            if r in self._waiting and self._pending:
                n = self._waiting.pop(r)
                shard = self._pending.popleft()
                self._held[shard] = r
                self._answered[r] = n
                self.report.leases.append((shard, r))
                self.store.set(f"lease/{r}/{n}", str(shard))


class LeaseClient:
    """A trainer's side: heartbeats, :meth:`acquire` a shard (None when all are done), :meth:`complete` it."""

    def __init__(self, store: dist.Store, rank: int, *, heartbeat_s: float = 1.0, poll_s: float = 0.02) -> None:
        self.store, self.rank, self.poll_s = store, rank, poll_s
        self._finished = False
        self._stop = threading.Event()
        self._beats = threading.Thread(target=self._beat, args=(heartbeat_s,), name="heartbeat", daemon=True)
        self._beats.start()

    def _beat(self, every: float) -> None:
        while not self._stop.is_set():
            self.store.add(f"hb/{self.rank}", 1)
            self._stop.wait(every)

    def acquire(self, timeout_s: float = 300.0) -> int | None:
        """The next shard leased to this rank; None once every shard is done."""
        n = self.store.add(f"req/{self.rank}", 1)
        key = f"lease/{self.rank}/{n}"
        deadline = time.monotonic() + timeout_s
        while not self.store.check([key]):
            if self.store.check(["finished"]):
                self._finish()
                return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.rank}: no answer from the data master within {timeout_s:g} s")
            time.sleep(self.poll_s)
        shard = int(self.store.get(key))
        if shard == FINISHED:
            self._finish()
            return None
        return shard

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.store.add("exited", 1)

    def complete(self, shard: int) -> None:
        self.store.set(f"done/{shard}/{self.rank}", "1")

    def close(self) -> None:
        self._stop.set()
        self._beats.join()


class MasterBatches:
    """A run's token-file batches with each replica's per-step shard leased from a :class:`DataMaster`.

    The data source of ``data_master``: the stream is the sampler's (:class:`real.data.tokens.TokenBatches`), cut
    into shards of one replica's share of a step (``batch_size // dp`` windows): shard ``j`` is the stream's windows
    from ``j * share``. The master on rank 0 of a run that starts at step ``s0`` leases shards
    ``consumed(s0) // share ..`` (one per replica and step) in that order, one trainer per replica (its pipeline rank 0; a last stage on
    another rank reads the shard id its first stage published in the store).

    Training is synchronous, which fixes what a lease may do. Every replica asks for one lease per step and
    the steps are separated by the loss all-reduce, so step ``k`` gets exactly the ``dp`` shards after step ``k-1``'s, in
    some order among the replicas: the global batch is the sampler's, only which replica trains on which share
    may differ (the gradient is their mean). A lease is completed once the step that used it is done on every
    rank. A trainer that dies mid-lease also breaks the step's collectives for everyone, so its lease is not
    handed to a survivor within the attempt (the survivors cannot finish that step either); the group restarts
    from the last checkpoint and the new attempt's master leases every shard after the checkpoint's position
    again: the dead trainer's, and those completed after the checkpoint, whose updates the restored parameters
    do not hold. The checkpoint's data position is the master's durable state: a checkpoint is written
    between steps, when the shards done are exactly the stream's shards before it. The lease timeout is the
    collective timeout, so a live but slow trainer never loses a lease another replica would then train on
    twice (a lease of another step is refused with a RuntimeError).
    """

    def __init__(self, tokens: Any, *, dp: int, lease_timeout_s: float) -> None:
        self.tokens, self.dp = tokens, dp
        self.file, self.batch_size, self.sampler = tokens.file, tokens.batch_size, tokens.sampler
        self.lease_timeout_s = lease_timeout_s
        self.master: DataMaster | None = None
        self.client: LeaseClient | None = None
        self.store: dist.Store | None = None
        self._held: int | None = None
        self.shards: list[tuple[int, int, int]] = []  # (step, replica, shard) this rank trained on

    def start(self, *, rank: int, world: int, dp_rank: int, holder: bool, needs_data: bool, start_step: int,
              steps: int) -> None:
        """Start the master (rank 0) and this replica's lease client (its ``holder``); after :meth:`restore`."""
        dp = self.dp
        self.share = self.batch_size // dp
        self.start_step, self.first_window = start_step, self.tokens.consumed(start_step)
        # Shard ids count shares of the stream; a position that is not a whole number of shares (a resize that
        # changed the share) starts the count there.
        self.first_shard = self.first_window // self.share
        self.base_window = self.first_window - self.first_shard * self.share
        shards = max(steps - start_step, 0) * dp
        if shards == 0 or not (needs_data or rank == 0):
            return
        base = rendezvous_store(world, timeout_s=self.lease_timeout_s) if world > 1 else dist.HashStore()
        self.store = dist.PrefixStore(f"run/from{start_step}", base)
        if rank == 0:
            self.master = DataMaster(self.store, shards, dp, first=self.first_shard, lease_timeout_s=self.lease_timeout_s,
                                     join_timeout_s=self.lease_timeout_s).start()
        if holder:
            self.client = LeaseClient(self.store, dp_rank, heartbeat_s=min(1.0, self.lease_timeout_s / 4))

    def replica_batch(self, step: int, dp: int, dp_rank: int) -> tuple[Any, Any]:
        if self.client is not None:
            shard = self.client.acquire(timeout_s=self.lease_timeout_s)
            mine = self.first_shard + (step - self.start_step) * dp
            if shard is None or not mine <= shard < mine + dp:
                raise RuntimeError(f"replica {dp_rank}: the data master leased shard {shard} at step {step}, whose "
                                   f"shards are {mine}..{mine + dp - 1} (a lease revoked from a live trainer?)")
            self._held = shard
            self.store.set(f"shard/{step}/{dp_rank}", str(shard))
        else:
            shard = int(self.store.get(f"shard/{step}/{dp_rank}"))
        ids = self.sampler.take(self.base_window + shard * self.share, self.share)
        self.shards.append((step, dp_rank, shard))
        log.debug("step %d replica %d windows %s (shard %d)", step, dp_rank, ",".join(map(str, ids.tolist())), shard)
        return self.file.windows(ids)

    def step_done(self, step: int) -> None:
        """The step that used this replica's lease is done on every rank: complete the lease."""
        if self.client is not None and self._held is not None:
            self.client.complete(self._held)
            self._held = None

    def finish(self) -> MasterReport | None:
        """After the last step: leave the master (holders), and on rank 0 its report once every lease is done."""
        if self.client is not None:
            if self.client.acquire(timeout_s=self.lease_timeout_s) is not None:
                raise RuntimeError("the data master leased a shard after the last step")
            self.client.close()
        if self.master is None:
            return None
        report = self.master.join(timeout=self.lease_timeout_s)
        log.info("data master: %d shards of %d windows completed; leases %s; lost trainers %s",
                 len(report.completed_by), self.share, report.leases, report.lost)
        return report

    def sample(self, rows: int) -> tuple[Any, Any]:
        return self.tokens.sample(rows)

    def state(self, step: int) -> dict[str, Any]:
        """The sampler's position (every shard before it done) and the shards of this epoch done."""
        state = self.tokens.state(step)
        share = self.batch_size // self.dp
        return {**state, "source": "data master", "shard_windows": share,
                "epoch_shards_done": state["offset"] // share}

    def restore(self, step: int, state: dict[str, Any] | None) -> None:
        self.tokens.restore(step, state)
