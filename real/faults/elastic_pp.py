"""Live elastic training of pipeline replicas (``--elastic live --pp P``, P > 1): see :mod:`real.faults.elastic`.

Each replica group is one torchrun job of ``pp`` processes: a whole pipeline.
Its ranks run the schedule's program with :class:`real.executor.Executor` and
:class:`real.p2p.PipeComm` on their own process group (torchrun's world of the
replica, :class:`real.mesh.Mesh` at dp 1). Across replicas, the ranks of the
same stage average their gradients through torchft: one
:class:`torchft.Manager` per rank, ``replica_id`` per replica group and group
rank = pipeline rank, as torchft's own multi-rank replica groups are built; the
group's rank 0 serves the managers of the others, so every rank of a replica
sees the same quorum, and a step commits only if every rank of it votes yes.

Shares keep the message shapes fixed: the global batch is ``microbatches``
microbatches of ``batch / microbatches`` rows, and a replica of quorum rank r
among n runs microbatches ``share(microbatches, n, r)`` of them (contiguous,
in quorum order). The executor of a count m (the schedule's graph for m
microbatches; cached) divides each microbatch's loss by m, so the gradients
are scaled by ``m / microbatches x n`` before torchft's averaging all-reduce:
its result is the gradient of the whole batch's mean loss, whatever n is.
A replica given no microbatch (more replicas than microbatches) contributes
zeros. After a commit the ranks of a replica all-reduce the last stage's loss
and whether any of them received SIGINT/SIGTERM, so all leave after the same
step.

State transfer is per rank: a joining replica's rank p receives pipeline rank
p's state (its stages' parameters, optimizer state, the losses and the data
position) from the same rank of a live replica (torchft's checkpoint transport
serves each group rank its own). Periodic DCP checkpoints: the replica of
quorum rank 0 writes them, each pipeline rank its stages' share, on the
replica's own process group; a replica that starts while one exists loads it
(every pipeline rank its share), then is overwritten by live replicas' state
if it joins them.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from real import checkpoint as ckpt
from real import stop
from real.config import RunConfig, make_plan
from real.executor import Executor, Stage
from real.faults.elastic import (
    LiveConfig,
    LiveResult,
    _Events,
    _inputs,
    _resume,
    _tensors,
    check_live,
    check_quorum,
    hold_lock,
    job_run,
    make_manager,
    release_lock,
    share,
)
from real.measure import ActivationMeter, Recorder
from real.mesh import Mesh
from real.model_api import data_for
from real.models import activation_shape, build_layers, make_optimizer
from real.p2p import PipeComm
from schedules import CheckpointError, ConfigError, SchedlabError

__all__ = ["check_shares", "train_live_pipeline"]

log = logging.getLogger(__name__)


def _with_microbatches(config: RunConfig, m: int) -> RunConfig:
    """``config`` for a replica that runs m microbatches of the same size (the batch is m of them)."""
    size = config.microbatch_size
    return replace(config, data=replace(config.data, batch_size=m * size),
                   layout=replace(config.layout, microbatches=m))


def check_shares(config: RunConfig) -> None:
    """Every microbatch count a replica can be given (its share of ``microbatches`` among any number of replicas)
    must be one the schedule runs: ConfigError naming the first that is not, before anything runs."""
    total = config.layout.microbatches
    counts = {}
    for n in range(1, total + 1):
        for c in {total // n, -(-total // n)} - {0}:
            counts.setdefault(c, n)
    for c, n in sorted(counts.items(), reverse=True):
        try:
            make_plan(_with_microbatches(config, c), config.layout.pp)
        except SchedlabError as exc:
            raise ConfigError(f"live elastic training: with {n} replicas a replica runs {c} of the {total} "
                              f"microbatches, which schedule {config.layout.schedule!r} cannot ({exc}); use a "
                              "schedule that runs any number of microbatches, e.g. 1f1b, gpipe or zb-h1",
                              field="schedule") from exc


class _PipelineReplica:
    """One pipeline rank of a replica: its stages, optimizer, data and losses; an executor per microbatch count."""

    def __init__(self, config: RunConfig, mesh: Mesh) -> None:
        self.config, self.mesh = config, mesh
        plan = make_plan(config, config.layout.pp)
        self.layers = plan.layers
        last = plan.num_stages - 1
        self.stages = {s: Stage(s, plan.layers[s].start, build_layers(config.data.model, config.data.seed,
                                                                      plan.layers[s]), is_last=s == last)
                       for s in plan.stages_of(mesh.pp_rank)}
        self.named = [np for s in sorted(self.stages) for np in self.stages[s].global_parameters()]
        self.optimizer = make_optimizer(config.optim.optimizer, [p for _, p in self.named], config.optim.lr)
        self.is_first, self.is_last = 0 in self.stages, last in self.stages
        self.data = data_for(config, None)
        self.losses: list[float] = []
        self.committed = False
        self.leave = False  # a rank of this replica received SIGINT/SIGTERM: all leave after the committed step
        self.started = self.last_commit = time.monotonic()
        self.heals: list[tuple[float, int]] = []
        self.recorder = Recorder(mesh.device)
        self.meter = ActivationMeter([p for _, p in self.named])
        self._executors: dict[int, Executor] = {}

    def executor(self, m: int) -> Executor:
        """The executor of the schedule for m microbatches (message shapes: one microbatch, fixed)."""
        if m not in self._executors:
            cfg = _with_microbatches(self.config, m)
            graph = make_plan(cfg, cfg.layout.pp).graph
            shape = activation_shape(cfg.data.model, cfg.microbatch_size)
            comm = PipeComm(graph, self.mesh.pp_rank, global_rank=self.mesh.global_rank, groups=self.mesh.p2p_groups,
                            shape=shape, dtype=torch.float32, device=self.mesh.device, recv_ahead=None,
                            stamp=self.recorder.stamp)
            self._executors[m] = Executor(graph, self.mesh.pp_rank, self.stages, comm=comm, meter=self.meter,
                                          recorder=self.recorder)
        return self._executors[m]

    def state_dict(self) -> dict[str, Any]:
        return {"model": {n: p.data for n, p in self.named}, "optimizer": self.optimizer.state_dict(),
                "losses": list(self.losses), "data": self.data.state(len(self.losses))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for n, p in self.named:
                p.copy_(state["model"][n])
        self.optimizer.load_state_dict(state["optimizer"])
        self.losses = list(state["losses"])
        self.data.restore(len(self.losses), state["data"])
        self.heals.append((time.perf_counter(), sum(t.numel() * t.element_size() for t in _tensors(state))))

    def microbatches(self, step: int, lo: int, hi: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Microbatches ``lo .. hi-1`` of the step's global batch (stages without data: none needed)."""
        if not (self.is_first or self.is_last) or hi == lo:
            return []
        inputs, targets = self.data.replica_batch(step, 1, 0)
        size = self.config.microbatch_size
        return [(inputs[i * size:(i + 1) * size], targets[i * size:(i + 1) * size]) for i in range(lo, hi)]

    def windows(self, step: int, lo: int, hi: int) -> list[int] | None:
        if not hasattr(self.data, "ids"):
            return None
        size = self.config.microbatch_size
        return self.data.ids(step)[lo * size:hi * size].tolist()


def _group_store(mesh: Mesh, timeout: timedelta) -> tuple[str, int, dist.TCPStore | None]:
    """A store for this attempt's managers, hosted by pipeline rank 0 on its host: torchrun's store outlives a
    restart, and torchft's manager keys in it (its server's address) would send a restarted rank to the dead
    server. Its host name and port reach the other ranks by a broadcast on the replica's group."""
    hosted = None
    where: list[Any] = [None, 0]
    if mesh.pp_rank == 0:
        hosted = dist.TCPStore(socket.gethostname(), 0, is_master=True, wait_for_workers=False, timeout=timeout)
        where = [socket.gethostname(), hosted.port]
    dist.broadcast_object_list(where, src=0)
    return str(where[0]), int(where[1]), hosted


def _manager(config: RunConfig, live: LiveConfig, replica: _PipelineReplica, mesh: Mesh):
    addr, port, hosted = _group_store(mesh, timedelta(seconds=config.runtime.timeout_s))
    return make_manager(config, live, replica, mesh.pp_rank, mesh.pp, addr, port), hosted


def _inject_fault(config: RunConfig, mesh: Mesh, step: int, events: _Events) -> None:
    """``--fail-at-step S --fail-rank P`` (first torchrun attempt only): pipeline rank P dies at step S."""
    f = config.faults
    if f.fail_at_step != step or f.fail_rank != mesh.pp_rank or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)):
        return
    events.add("fault", step=step, mode=f.fail_mode, pp_rank=mesh.pp_rank)
    log.warning("injected fault (%s) at step %d, pipeline rank %d", f.fail_mode, step, mesh.pp_rank)
    logging.shutdown()
    if f.fail_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        time.sleep(3600)


def _run_share(replica: _PipelineReplica, step: int, lo: int, hi: int, scale: float) -> torch.Tensor:
    """Run microbatches lo..hi-1 through this rank's program; gradients scaled by ``scale``; the scaled loss."""
    replica.optimizer.zero_grad(set_to_none=True)
    loss = replica.executor(hi - lo).run_step(replica.microbatches(step, lo, hi)) if hi > lo else None
    for _, p in replica.named:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        p.grad.mul_(scale)
    return torch.tensor([0.0 if loss is None else float(loss) * scale], dtype=torch.float64)


def _step(replica: _PipelineReplica, manager, live: LiveConfig, events: _Events) -> bool:
    """One attempt at the manager's step on this pipeline rank (see the module doc)."""
    t0 = time.perf_counter()
    manager.start_quorum()
    quorum_s = time.perf_counter() - t0
    step, n, rank = manager.current_step(), manager.num_participants(), manager.participating_rank()
    _inject_fault(replica.config, replica.mesh, step, events)
    waiting = not replica.committed and n < live.wait_replicas
    error = check_quorum(live, n, waiting, replica.started, replica.last_commit)
    late = torch.tensor([error is not None], dtype=torch.float64)
    if waiting or n < live.min_replicas:  # every rank of the replica sees this quorum: they give up together
        dist.all_reduce(late)
    if late[0]:
        raise error or check_quorum(live, n, waiting, replica.started, replica.last_commit, late=True)
    if waiting:
        manager.report_error(RuntimeError(f"{n} of the {live.wait_replicas} replicas to wait for"))
    count = replica.config.layout.microbatches
    lo, hi = share(count, n, rank)
    total = _run_share(replica, step, lo, hi, (hi - lo) / count * n)
    works = [manager.allreduce(p.grad) for _, p in replica.named] + [manager.allreduce(total)]
    for w in works:
        w.wait()
    committed = manager.should_commit()
    if committed:
        replica.optimizer.step()
        # the last stage's loss to every rank of the replica, and whether any rank was asked to leave (a signal):
        # one all-reduce on the replica's group, so all its ranks leave after the same step
        agreed = torch.tensor([float(total) if replica.is_last else 0.0, stop.requested() is not None],
                              dtype=torch.float64)
        dist.all_reduce(agreed)
        total = agreed[:1]
        replica.leave = bool(agreed[1])
        replica.losses.append(float(total))
        replica.committed = True
        replica.last_commit = time.monotonic()
    events.add("step", step=step, committed=committed, participants=n, rank=rank, pp_rank=replica.mesh.pp_rank,
               microbatches=[lo, hi], rows=(hi - lo) * replica.config.microbatch_size,
               windows=replica.windows(step, lo, hi), quorum_s=quorum_s, step_s=time.perf_counter() - t0,
               loss=float(total) if committed else None)
    if replica.heals and replica.heals[-1][0] >= t0:
        events.add("heal", step=step, pp_rank=replica.mesh.pp_rank, bytes=replica.heals[-1][1],
                   seconds=replica.heals[-1][0] - t0)
    if waiting or n < live.min_replicas:
        time.sleep(0.05)
    time.sleep(max(0.0, live.min_step_s - (time.perf_counter() - t0)))
    return committed


def _save(replica: _PipelineReplica, manager, saver: ckpt.Checkpointer) -> None:
    """After a committed step: the replica of quorum rank 0 writes a checkpoint when one is due (DCP, every
    pipeline rank its stages' share, on the replica's own process group). Every rank of a replica has the same
    quorum rank and the same commit, so they all take part or none does."""
    done = manager.current_step()
    if manager.participating_rank() != 0 or not saver.due(done):
        return
    cfg = replica.config
    info = {"losses": replica.losses, "world_size": cfg.layout.pp, "pp": cfg.layout.pp,
            "dp": manager.num_participants(), "config": cfg.to_dict(), "data": replica.data.state(done)}
    saver.save(done, ckpt.state_dict(replica.named, [replica.optimizer], replica.mesh.pp_rank), info)


def train_live_pipeline(config: RunConfig, live: LiveConfig) -> LiveResult:
    """Train this pipeline rank of this replica until the job's step count is reached."""
    check_live(config)
    if config.layout.pp < 2:
        raise ConfigError(f"pp {config.layout.pp}: a replica of one process trains with real.faults.elastic.train_live",
                          field="pp")
    check_shares(config)
    mesh = Mesh.create(make_plan(config, config.layout.pp), "gloo", config.runtime.timeout_s)
    try:
        _lock(config, live, mesh)
        events = _Events(live.events, _inputs(config))
    except BaseException:
        mesh.close()
        raise
    try:
        return _train(config, live, mesh, events)
    finally:
        if mesh.rank == 0:
            release_lock(config)
        events.close()


def _lock(config: RunConfig, live: LiveConfig, mesh: Mesh) -> None:
    """The replica's rank 0 takes the checkpoint directory's lock (:func:`real.faults.elastic.hold_lock`); every
    rank of the replica raises its refusal alike."""
    box: list[str | None] = [None]
    if mesh.rank == 0:
        try:
            hold_lock(config, live)
        except SchedlabError as exc:
            box = [str(exc)]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise CheckpointError(box[0], field="directory")


def _train(config: RunConfig, live: LiveConfig, mesh: Mesh, events: _Events) -> LiveResult:
    from real.trainer import param_digest, restart_count

    replica = _PipelineReplica(config, mesh)
    manager, hosted = _manager(config, live, replica, mesh)
    saver = (ckpt.Checkpointer(config.checkpoint, mesh.pp_rank, restart_count(), run=job_run(live), shared=True)
             if config.checkpoint and config.checkpoint.every else None)
    try:
        resumed = _resume(config, replica, manager, mesh.pp_rank) if config.checkpoint else None
        events.add("start", replica=live.replica_id, pp_rank=mesh.pp_rank, resumed_from=resumed,
                   step=manager.current_step())
        while manager.current_step() < config.steps:
            stop.progress(manager.current_step(), saver.last if saver is not None else resumed)
            committed = _step(replica, manager, live, events)
            if committed and saver is not None:
                _save(replica, manager, saver)
            if replica.leave:
                if saver is not None:
                    saver.wait()
                raise stop.Interrupted(int(stop.requested() or signal.SIGTERM), manager.current_step(),
                                       saver.last if saver is not None else resumed)
        if saver is not None:
            saver.wait()
    finally:
        manager.shutdown(wait=False)
        del hosted
        mesh.close()
    norm, sha = param_digest(p for _, p in replica.named)
    return LiveResult(replica.losses, norm, sha, {n: p.detach().clone() for n, p in replica.named}, resumed,
                      len(replica.heals), mesh.pp_rank)
