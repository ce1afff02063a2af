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

__all__ = ["DataMaster", "LeaseClient", "MasterReport", "rendezvous_store"]

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
    """Leases ``num_shards`` shards to ``trainers`` ranks through ``store`` (see the module doc)."""

    def __init__(self, store: dist.Store, num_shards: int, trainers: int, *, lease_timeout_s: float = 10.0,
                 join_timeout_s: float = 60.0, poll_s: float = 0.02) -> None:
        if num_shards < 1 or trainers < 1:
            raise ValueError(f"a data master needs shards and trainers, got {num_shards} and {trainers}")
        self.store, self.num_shards, self.trainers = store, num_shards, trainers
        self.lease_timeout_s, self.join_timeout_s, self.poll_s = lease_timeout_s, join_timeout_s, poll_s
        self.report = MasterReport()
        self._pending = deque(range(num_shards))
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
