"""Live elastic training: data-parallel replicas under torchft's per-step quorum (``--elastic live``).

Each replica group is its own job (its own torchrun, or one process): at
pp 1 one process that holds the whole model. Every step begins with a quorum
at torchft's lighthouse (:class:`torchft.Manager`, ``use_async_quorum=False``):

* the replicas in the quorum split the step's global batch, contiguous
  shares in quorum order (sizes differ by at most one row), so the global
  batch, and the mathematics of a step, never change with their number. Each
  scales its mean loss by ``rows / batch x participants`` before torchft's
  averaging all-reduce (:meth:`Manager.allreduce`), which makes the result the
  gradient of the whole batch's mean loss;
* a replica that dies fails the step's all-reduce on the others: torchft
  reports the error, :meth:`Manager.should_commit` says no, the optimizer does
  not step and the same step runs again with the next quorum, without the dead
  replica (it stops heartbeating), in the same processes. No restart, no
  checkpoint read;
* a replica that (re)joins is behind: in its first quorum torchft sends it a
  live replica's state over HTTP (:class:`torchft.checkpointing.HTTPTransport`)
  at the step boundary: parameters, optimizer state, the losses so far and
  the data position (:func:`state_dict`). It then trains that step with the others.

Data: the step's global batch is what the data source gives for the manager's
step (synthetic: a function of ``(seed, step)``; a token file: the sampler's
windows ``step x batch ..``); a step is committed once, so every window is
trained exactly once whatever the quorums were. Periodic DCP checkpoints
(``--checkpoint-dir``) are written by the replica of quorum rank 0 after a
committed step; a replica that starts fresh while a checkpoint exists loads it
(the case where every replica died); one that joins live replicas is then
overwritten by their state. The replicas of a job are one run of the
directory (:func:`job_run`, their lighthouse): they share its ``LOCK`` and
refuse a directory another run holds, at the start and before every save,
and ``--keep-last`` removes only the job's own checkpoints.

SIGINT or SIGTERM makes a replica leave after the step in progress (the others
go on without it), with :class:`real.stop.Interrupted`.

Each replica appends its events to ``--events FILE`` (JSON lines): ``start``
(PID, whether a checkpoint was read), ``step`` (step, committed, participants,
this replica's rank and rows, window ids with a token file, the quorum's and
the step's seconds, the loss), ``heal`` (bytes received, seconds) and ``fault``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common.outputs import open_append
from real import checkpoint as ckpt
from real import stop
from real.config import RunConfig
from real.model_api import data_for
from real.models import build_model, loss_fn, make_optimizer
from schedules import ConfigError

__all__ = ["ELASTIC_MODES", "MAX_REPLICA_ID", "QUORUM_TIMEOUT_S", "LiveConfig", "LiveResult", "check_live",
           "check_live_layout", "check_quorum", "job_run", "make_manager", "pause_report", "share", "train_live"]

log = logging.getLogger(__name__)

ELASTIC_MODES = ("live",)
# torchft numbers a process of replica N as N x (ranks per replica) + rank, a 32-bit rank of its process groups;
# a larger id fails at every quorum, which torchft retries for ever. 2**20 replicas is far beyond any job.
MAX_REPLICA_ID = 2**20 - 1
QUORUM_TIMEOUT_S = 60.0  # the default of --quorum-timeout


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveConfig:
    """A replica's place in a live elastic job."""

    lighthouse: str  # torchft lighthouse address, e.g. http://host:29510
    replica_id: int = 0  # this replica group's number (torchft needs trailing digits in the id)
    wait_replicas: int = 1  # a process commits its first step only with this many replicas in the quorum
    min_replicas: int = 1  # fewer in a quorum: the step is not committed
    events: str | None = None  # JSON-lines event log of this replica
    min_step_s: float = 0.0  # each step lasts at least this long (a stand-in for a slower model: demos, tests)
    quorum_timeout_s: float = QUORUM_TIMEOUT_S  # wait_replicas to join, or min_replicas in a quorum, at most this long

    def __post_init__(self) -> None:
        if not self.lighthouse:
            raise ConfigError("live elastic training needs the lighthouse's address, e.g. http://host:29510",
                              field="lighthouse")
        if not isinstance(self.replica_id, int) or not 0 <= self.replica_id <= MAX_REPLICA_ID:
            raise ConfigError(f"replica_id must be an integer in 0..{MAX_REPLICA_ID}, got {self.replica_id!r}",
                              field="replica_id")
        if not 0 < self.quorum_timeout_s <= 86400:
            raise ConfigError(f"quorum_timeout_s must be in (0, 86400] seconds, got {self.quorum_timeout_s!r}",
                              field="quorum_timeout_s")
        if not 0 <= self.min_step_s < 3600:
            raise ConfigError(f"min_step_s must be in [0, 3600) seconds, got {self.min_step_s!r}", field="min_step_s")
        for name in ("wait_replicas", "min_replicas"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}", field=name)


@dataclass
class LiveResult:
    """What a replica reports: the losses of every committed step (those before it joined come with the state)."""

    losses: list[float]
    param_norm: float
    param_sha256: str
    parameters: dict[str, torch.Tensor]
    resumed_from: str | None
    heals: int
    pp_rank: int = 0  # this process's pipeline rank in its replica (its stages' parameters are the digest's)

    def to_json(self) -> dict[str, Any]:
        return {"losses": self.losses, "param_norm": self.param_norm, "param_sha256": self.param_sha256,
                "resumed_from": self.resumed_from, "heals": self.heals, "pid": os.getpid(), "pp_rank": self.pp_rank}


def share(batch: int, participants: int, rank: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of a ``batch`` that participant ``rank`` of ``participants`` trains: contiguous, in
    quorum order, the first ``batch % participants`` one row larger."""
    if not 0 <= rank < participants:
        raise ValueError(f"participant rank {rank} is not in 0..{participants - 1}")
    base, extra = divmod(batch, participants)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def check_live_layout(pp: int, dp: int | str, microbatches: int) -> None:
    """What ``--elastic live`` runs: dp left to the quorum; at pp 1 one process and one pass a step, at pp > 1 a
    whole pipeline per replica (:mod:`real.faults.elastic_pp`) whose microbatches the replicas share."""
    if not isinstance(pp, int) or pp < 1:
        raise ConfigError(f"pp must be an integer >= 1, got {pp!r}", field="pp")
    if dp != 1:
        raise ConfigError(f"live elastic training takes the number of replicas from the quorum at every step; got "
                          f"dp {dp}: use dp 1 and start one replica group per replica", field="dp")
    if pp == 1 and microbatches != 1:
        raise ConfigError(f"live elastic training at pp 1 trains each replica's share in one pass; got "
                          f"microbatches {microbatches}: use 1", field="microbatches")


def check_live(config: RunConfig) -> None:
    """:func:`check_live_layout` of ``config``, and the built-in model without a data master."""
    check_live_layout(config.layout.pp, config.layout.dp, config.layout.microbatches)
    if config.data.factory is not None or config.data.data_master:
        raise ConfigError("live elastic training trains the built-in model from its own data position; a model "
                          "factory and a data master are not supported with it", field="elastic")


def job_run(live: LiveConfig) -> str:
    """The run id every replica of one live job shares (one lighthouse serves one job): the checkpoint
    directory's lock and its checkpoints are the job's, not one replica's."""
    return f"live {live.lighthouse}"


def _inputs(config: RunConfig) -> dict[str, str | None]:
    """The files a replica reads: an events file must never be one of them."""
    token = config.data.token_file
    return {"token_file": token, "token file sidecar": f"{token}.json" if token else None}


class _Events:
    """Append-only JSON-lines log of one replica (None: nothing written); never appended to one of ``inputs``
    (:func:`common.outputs.open_append`)."""

    def __init__(self, path: str | None, inputs: dict[str, str | None] | None = None) -> None:
        self.path = Path(path) if path else None
        self._file = open_append(self.path, "events file", inputs) if self.path is not None else None

    def add(self, event: str, **fields: Any) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps({"event": event, "time": time.time(), "pid": os.getpid(), **fields}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def hold_lock(config: RunConfig, live: LiveConfig) -> None:
    """Take (or share with this job's other replicas) the checkpoint directory's lock; CheckpointError naming
    the directory and the holder if another run holds it. A resume-only run of no directory takes none."""
    cfg = config.checkpoint
    if cfg is not None and (cfg.every or Path(cfg.directory).is_dir()):
        ckpt.lock(cfg.directory, job_run(live))


def release_lock(config: RunConfig) -> None:
    """Remove the checkpoint directory's lock if this process holds it (taken at the start or before a save)."""
    if config.checkpoint is not None:
        ckpt.unlock(Path(config.checkpoint.directory) / ckpt.LOCK)


class _Replica:
    """One replica's model, optimizer, data and losses; its state is what torchft sends a joining replica."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.model = build_model(config.data.model, config.data.seed)
        self.optimizer = make_optimizer(config.optim.optimizer, self.model.parameters(), config.optim.lr)
        self.named = list(self.model.named_parameters())
        self.data = data_for(config, None)
        self.losses: list[float] = []
        self.committed = False  # this process has committed a step
        self.started = self.last_commit = time.monotonic()
        self.heals: list[tuple[float, int]] = []  # (seconds since the quorum began, bytes) of each received state

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "losses": list(self.losses), "data": self.data.state(len(self.losses))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.losses = list(state["losses"])
        self.data.restore(len(self.losses), state["data"])
        nbytes = sum(t.numel() * t.element_size() for t in _tensors(state))
        self.heals.append((time.perf_counter(), nbytes))

    def batch(self, step: int, participants: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, list[int] | None]:
        """This replica's rows of the step's global batch, and their window ids (a token file) or None."""
        inputs, targets = self.data.replica_batch(step, 1, 0)
        lo, hi = share(inputs.shape[0], participants, rank)
        ids = self.data.ids(step)[lo:hi].tolist() if hasattr(self.data, "ids") else None
        return inputs[lo:hi], targets[lo:hi], ids


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def _store() -> tuple[str, int, dist.TCPStore | None]:
    """The replica group's store: torchrun's (MASTER_ADDR, MASTER_PORT), or one this process hosts."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None
    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    return "localhost", store.port, store


def make_manager(config: RunConfig, live: LiveConfig, replica: Any, rank: int, world_size: int, addr: str,
                 port: int):
    """torchft's Manager for this process of a replica: its per-attempt warnings quieted (the runtime says what
    matters in one line), and a lighthouse it cannot reach one line naming ``--lighthouse`` (every rank alike)."""
    os.environ.setdefault("RUST_LOG", "error")  # torchft's own Rust log lines (read when torchft is imported)
    from torchft import Manager, ProcessGroupGloo

    if not log.isEnabledFor(logging.INFO):  # -v shows torchft's warnings
        for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
            logging.getLogger(name).setLevel(logging.ERROR)
    timeout = timedelta(seconds=config.runtime.timeout_s)
    try:
        return Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=replica.load_state_dict,
                       state_dict=replica.state_dict, min_replica_size=live.min_replicas, use_async_quorum=False,
                       rank=rank, world_size=world_size, store_addr=addr, store_port=port,
                       lighthouse_addr=live.lighthouse, replica_id=f"replica_{live.replica_id}", timeout=timeout,
                       quorum_timeout=timedelta(seconds=live.quorum_timeout_s), connect_timeout=timeout)
    except RuntimeError as exc:
        why = str(exc).strip().splitlines()[-1].split(";")[0] if str(exc).strip() else type(exc).__name__
        error = ConfigError(f"cannot reach the torchft lighthouse at {live.lighthouse!r} ({why}); start "
                            "torchft_lighthouse there, or give its address", field="lighthouse")
        error.every_rank = True
        raise error from None


def check_quorum(live: LiveConfig, n: int, waiting: bool, started: float, since: float,
                 late: bool = False) -> ConfigError | None:
    """Why this replica gives up, or None: the ``wait_replicas`` not joined within quorum_timeout_s of the start
    (``waiting``: its first step not committed yet), or fewer than min_replicas in the quorum for that long
    since ``since`` (the last commit, or the start), rather than retrying for ever. Every rank of a replica
    raises it alike (rank 0 prints it). ``late``: another rank of the replica found the limit passed, so this one
    gives up too, whatever its own clock says."""
    now, limit = time.monotonic(), live.quorum_timeout_s
    error = None
    if waiting and (late or now - started > limit):
        error = ConfigError(f"replica {live.replica_id}: {n} of the {live.wait_replicas} replicas to wait for "
                            f"joined within {limit:g} s (has the job ended?)", field="wait_replicas")
    elif n < live.min_replicas and (late or now - since > limit):
        error = ConfigError(f"replica {live.replica_id}: {n} replica(s) in the quorum for {limit:g} s, fewer than "
                            f"the {live.min_replicas} a step needs (are the others running?); start them, or give "
                            "fewer", field="min_replicas")
    if error is not None:
        error.every_rank = True
    return error


def _manager(config: RunConfig, live: LiveConfig, replica: _Replica):
    addr, port, hosted = _store()
    return make_manager(config, live, replica, 0, 1, addr, port), hosted


def _resume(config: RunConfig, replica: _Replica, manager, rank: int = 0) -> str | None:
    """Load the newest complete checkpoint, if any (every replica had died): the manager continues at its step.
    ``rank``: this process's rank in its replica (a pipeline's ranks each load their stages' share)."""
    from real.train import resume_point

    restored = resume_point(config)
    if restored is None:
        return None
    ckpt.load(restored, replica.named, [replica.optimizer], rank)
    replica.losses = [float(x) for x in restored.info["losses"]]
    replica.data.restore(restored.step, restored.info.get("data"))
    manager.load_state_dict({"step": restored.step, "batches_committed": restored.step})
    log.info("replica resumed from %s (step %d)", restored.path, restored.step)
    return str(restored.path)


def _inject_fault(config: RunConfig, step: int, events: _Events) -> None:
    """``--fail-at-step S`` (first torchrun attempt only): this replica dies (SIGKILL) at the start of step S."""
    f = config.faults
    if f.fail_at_step != step or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0:
        return
    events.add("fault", step=step, mode=f.fail_mode)
    log.warning("injected fault (%s) at step %d", f.fail_mode, step)
    logging.shutdown()
    if f.fail_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        time.sleep(3600)


def _step(replica: _Replica, manager, live: LiveConfig, events: _Events) -> bool:
    """One attempt at the manager's step: quorum, this replica's share, the all-reduce, commit or not."""
    t0 = time.perf_counter()
    manager.start_quorum()  # synchronous: a joining replica has the live state when it returns
    quorum_s = time.perf_counter() - t0
    step, n, rank = manager.current_step(), manager.num_participants(), manager.participating_rank()
    _inject_fault(replica.config, step, events)
    waiting = not replica.committed and n < live.wait_replicas
    if (error := check_quorum(live, n, waiting, replica.started, replica.last_commit)) is not None:
        raise error
    if waiting:  # this process's first step commits only with wait_replicas replicas (a fresh or restarted job)
        manager.report_error(RuntimeError(f"{n} of the {live.wait_replicas} replicas to wait for"))
    inputs, targets, ids = replica.batch(step, n, rank)
    replica.optimizer.zero_grad(set_to_none=True)
    scale = inputs.shape[0] / replica.config.data.batch_size * n  # the all-reduce averages over n participants
    loss = loss_fn(replica.model(inputs), targets) * scale
    loss.backward()
    total = loss.detach().reshape(1).double()
    works = [manager.allreduce(p.grad) for p in replica.model.parameters()] + [manager.allreduce(total)]
    for w in works:
        w.wait()
    committed = manager.should_commit()
    if committed:
        replica.optimizer.step()
        replica.losses.append(float(total))
        replica.committed = True
        replica.last_commit = time.monotonic()
    events.add("step", step=step, committed=committed, participants=n, rank=rank, rows=int(inputs.shape[0]),
               windows=ids, quorum_s=quorum_s, step_s=time.perf_counter() - t0,
               loss=float(total) if committed else None)
    if replica.heals and replica.heals[-1][0] >= t0:
        events.add("heal", step=step, bytes=replica.heals[-1][1], seconds=replica.heals[-1][0] - t0)
    if waiting or n < live.min_replicas:
        time.sleep(0.05)  # do not spin the lighthouse
    time.sleep(max(0.0, live.min_step_s - (time.perf_counter() - t0)))
    return committed


def train_live(config: RunConfig, live: LiveConfig) -> LiveResult:
    """Train this replica until the job's step count is reached (see the module doc)."""
    check_live(config)
    if config.layout.pp > 1:
        raise ConfigError(f"pp {config.layout.pp}: pipeline replicas train with real.faults.elastic_pp.train_live_pipeline",
                          field="pp")
    hold_lock(config, live)
    events = None
    try:
        events = _Events(live.events, _inputs(config))
        return _train(config, live, events)
    finally:
        release_lock(config)
        if events is not None:
            events.close()


def _train(config: RunConfig, live: LiveConfig, events: _Events) -> LiveResult:
    from real.trainer import param_digest

    replica = _Replica(config)
    manager, hosted = _manager(config, live, replica)
    saver = (ckpt.Checkpointer(config.checkpoint, 0, 0, run=job_run(live), shared=True)
             if config.checkpoint and config.checkpoint.every else None)
    try:
        resumed = _resume(config, replica, manager) if config.checkpoint else None
        events.add("start", replica=live.replica_id, resumed_from=resumed, step=manager.current_step())
        while manager.current_step() < config.steps:
            stop.progress(manager.current_step(), saver.last if saver is not None else resumed)
            committed = _step(replica, manager, live, events)
            done = manager.current_step()
            if committed and saver is not None and manager.participating_rank() == 0 and saver.due(done):
                info = {"losses": replica.losses, "world_size": 1, "pp": 1, "dp": manager.num_participants(),
                        "config": config.to_dict(), "data": replica.data.state(done)}
                saver.save(done, ckpt.state_dict(replica.named, [replica.optimizer], 0), info)
            if stop.requested() is not None:  # SIGINT/SIGTERM: this replica leaves at a step boundary
                if saver is not None:
                    saver.wait()
                raise stop.Interrupted(int(stop.requested()), done, saver.last if saver is not None else resumed)
        if saver is not None:
            saver.wait()
    finally:
        manager.shutdown(wait=False)
        del hosted  # the replica's own store (no torchrun) lives until here
    norm, sha = param_digest(p for _, p in replica.named)
    return LiveResult(replica.losses, norm, sha, {n: p.detach().clone() for n, p in replica.named}, resumed,
                      len(replica.heals))


def pause_report(survivor: list[dict[str, Any]], victim: list[dict[str, Any]]) -> dict[str, float]:
    """What the death and the rejoin of ``victim`` cost ``survivor``, from their event logs (seconds, bytes).

    ``detection``: the victim's fault to the end of the survivor's failed attempt; ``quorum``: the quorum of the
    survivor's next attempt; ``pause``: the survivor's interval between the commits around the failed step, less
    its median committed step; ``replacement``: the fault to the new process's start; ``heal_s`` and
    ``heal_bytes``: the joining replica's first quorum with the state transfer, and the bytes it received.
    ValueError if the logs hold no fault, failed attempt or heal.
    """
    fault = next((e for e in victim if e["event"] == "fault"), None)
    if fault is None:
        raise ValueError("the victim's events hold no fault")
    steps = [e for e in survivor if e["event"] == "step"]
    failed = next((i for i, e in enumerate(steps) if not e["committed"] and e["time"] >= fault["time"]), None)
    if failed is None or failed == 0 or failed + 1 >= len(steps):
        raise ValueError("the survivor's events hold no failed attempt after the fault between two commits")
    before, retry = steps[failed - 1], steps[failed + 1]
    normal = sorted(e["step_s"] for e in steps if e["committed"])
    restarted = [e for e in victim if e["event"] == "start" and e["time"] > fault["time"]]
    heal = next((e for e in victim if e["event"] == "heal" and e["time"] > fault["time"]), None)
    if not restarted or heal is None:
        raise ValueError("the victim's events hold no restart with a heal after the fault")
    return {"detection": steps[failed]["time"] - fault["time"], "quorum": retry["quorum_s"],
            "pause": retry["time"] - before["time"] - normal[len(normal) // 2],
            "replacement": restarted[0]["time"] - fault["time"], "heal_s": heal["seconds"],
            "heal_bytes": float(heal["bytes"])}
