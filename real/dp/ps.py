"""The parameter server (dp mode ``ps``): servers hold the parameters' shards and the optimizer, trainers compute.

A run with ``servers`` K > 0 has pp x dp trainers (global ranks 0 .. pp x dp - 1,
the usual pipelines, :mod:`real.mesh`) and K servers after them. Each stage's
parameters are cut into :func:`real.dp.sync.make_buckets`'s buckets, each bucket
padded to a multiple of K and split into K contiguous shards: server j holds
shard j of every bucket of every stage, its gradient and its optimizer state
(one optimizer per stage, as the trainers' would be), 1/K of the model each.

* **push** (trainer, :class:`PSTrainer`): every parameter's ``.grad`` is a view
  into its bucket's flat gradient buffer (as ddp's); when a bucket has all the
  step's microbatches' gradients (the same post-accumulate-grad hooks), shard j
  of it is sent to server j (``isend``, traced ``{s}REDUCE_SCATTER_b{k}``).
* **update** (server, :class:`ParamServer`): the server receives the bucket's
  shard from every trainer that holds the stage, averages them (summed in
  trainer order, / dp) and, once every bucket of the stage is in, steps the
  stage's optimizer: synchronous SGD, the update of plain training. A traced
  step records each stage's update as a row ``{s}OPTIM`` of the server's rank
  on the collective stream (the trainers only wait for it, as for a transfer):
  from the moment the stage's last push is in to the end of its optimizer step
  (the last bucket's fold and the step; the simulator's server update,
  :mod:`schedules.dp.modes`).
* **pull** (trainer): the updated shards come back straight into the trainer's
  flat parameters (``irecv`` into the bucket's slice for server j, traced
  ``{s}ALL_GATHER_b{k}``), posted once the last pass of the step that reads the
  stage has ended (nothing reads the parameters while they are overwritten)
  and waited for before the next pass that reads the stage (the next step's
  first), so the pull overlaps the rest of the step and the loss all-reduce.

Messages are point to point on the default (gloo) group, tagged by (stage,
bucket). The servers also take part in every collective a trainer makes on
the default group (clock offsets, the barrier, each step's loss all-reduce,
checkpoint saves, the final gather), with nothing to add. A server that dies
is named by the trainer that was waiting for it (:class:`real.p2p.PeerError`);
torchrun restarts it like any rank (``--max-restarts``).

Checkpoints keep the layout of every other mode (whole tensors under whole-model
names): the servers gather their shards of the parameters and the optimizer
state over the servers' group (:func:`real.dp.zero.full_state`) and write them;
a trainer writes its random state only and reads the parameters back.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from real import checkpoint as ckpt
from real import stop
from real.config import Plan
from real.dp.sync import GradSync, _Bucket, make_buckets
from real.dp.zero import ShardedSync, full_state, load_full
from real.executor import Stage
from real.measure import clock_offset, held_bytes
from real.mesh import Mesh
from real.model_api import StagedModel
from real.models import make_optimizer
from real.p2p import PeerError
from schedules import Action, ConfigError, Kind
from schedules.graph import TaskGraph

__all__ = ["PSTrainer", "ParamServer", "ServerResult", "bucket_tag", "request_tag", "version_tag"]

log = logging.getLogger(__name__)

_TAGS = 1 << 16  # message tags per stage: its buckets, then async-ps's request and version messages
_MAX_BUCKETS = _TAGS - 2


def bucket_tag(stage: int, bucket: int) -> int:
    """The tag of stage ``stage``'s bucket ``bucket``'s push and pull messages."""
    if bucket >= _MAX_BUCKETS:
        raise ConfigError(f"stage {stage} has more than {_MAX_BUCKETS} gradient buckets; raise bucket_mb",
                          field="bucket_mb")
    return stage * _TAGS + bucket


def request_tag(stage: int) -> int:
    """async-ps: the tag of a trainer's request for stage ``stage``'s parameters (:mod:`real.dp.ps_async`)."""
    return stage * _TAGS + _TAGS - 1


def version_tag(stage: int) -> int:
    """async-ps: the tag of the version a server's answer carries."""
    return stage * _TAGS + _TAGS - 2


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _flat_views(params: Sequence[nn.Parameter], multiple: int) -> torch.Tensor:
    """A flat buffer (padded to a multiple of ``multiple``) holding ``params``' values, each now a view into it."""
    n = sum(p.numel() for p in params)
    p0 = params[0]
    data = torch.zeros(-(-n // multiple) * multiple, dtype=p0.dtype, device=p0.device)
    offset = 0
    for p in params:
        data[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
        p.data = data[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return data


@dataclass(eq=False)
class _Pending:
    """Messages of one bucket with the servers (or, on a server, with its trainers): (peer, work) each."""

    bucket: _Bucket
    works: list[tuple[int, dist.Work]]
    row: list | None
    what: str


class PSTrainer(GradSync):
    """A trainer's side of the parameter server: push gradient buckets, pull the updated shards (module doc)."""

    def __init__(self, stage_params: dict[int, Sequence[nn.Parameter]], *, graph: TaskGraph, pp_rank: int,
                 rank: int, servers: Sequence[int], bucket_mb: float, accumulations: int,
                 stamp: Callable[[], object], record: Callable[[object, object, object, float], list | None]) -> None:
        self.mode, self.group, self.accumulations = "ps", None, accumulations
        self.me, self.servers = rank, tuple(servers)
        self.world, self.rank = len(self.servers), 0  # shards per bucket
        self._stamp, self._record = stamp, record
        self._pushes: list[_Pending] = []
        self._pulls: dict[int, list[_Pending]] = {}  # stage -> pulls posted and not yet waited for
        self._read_done: set[int] = set()  # stages no task of this step reads any more
        self.buckets = [self._bucket(s, k, b) for s, params in stage_params.items()
                        for k, b in enumerate(make_buckets(params, bucket_mb * 2**20))]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        for b in self.buckets:
            for p in b.params:
                p.register_post_accumulate_grad_hook(self._on_grad)
        self.reads, _ = ShardedSync._program(graph, pp_rank)
        last: dict[int, int] = {}
        for tid, stages in self.reads.items():
            for s in stages:
                last[s] = tid
        self._last_reader: dict[int, list[int]] = {}
        for s, tid in last.items():
            self._last_reader.setdefault(tid, []).append(s)
        log.debug("ps trainer %d: %d buckets, %d servers", rank, len(self.buckets), self.world)

    def _bucket(self, stage: int, index: int, params: list[nn.Parameter]) -> _Bucket:
        data = _flat_views(params, self.world)
        grad = torch.zeros_like(data)
        offset = 0
        for p in params:
            p.grad = grad[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        return _Bucket(stage, index, params, grad, data=data)

    def optimizer_params(self) -> dict[int, list[torch.Tensor]]:
        """Nothing: the servers step the parameters."""
        return {}

    def begin_step(self) -> None:
        for b in self.buckets:
            b.grad.zero_()
            b.ready, b.launched, b.counts = 0, False, {}
        self._read_done = set()

    def _shard(self, b: _Bucket, flat: torch.Tensor, j: int) -> torch.Tensor:
        size = flat.numel() // self.world
        return flat[j * size:(j + 1) * size]

    def _launch(self, b: _Bucket) -> None:
        """Push: shard j of the bucket's gradient to server j."""
        b.launched = True
        start = self._stamp()
        tag = bucket_tag(b.stage, b.index)
        works = [(r, self._talk(dist.isend, self._shard(b, b.grad, j), r, tag, b, "push")) for j, r in
                 enumerate(self.servers)]
        row = self._record(Action(Kind.REDUCE_SCATTER, b.stage, bucket=b.index), start, None,
                           b.grad.numel() * b.grad.element_size())
        self._pushes.append(_Pending(b, works, row, "push"))
        if b.stage in self._read_done:
            self._pull(b)

    def _pull(self, b: _Bucket) -> None:
        """Post the receives of the bucket's updated shards, straight into its flat parameters."""
        start = self._stamp()
        tag = bucket_tag(b.stage, b.index)
        works = [(r, self._talk(dist.irecv, self._shard(b, b.data, j), r, tag, b, "pull")) for j, r in
                 enumerate(self.servers)]
        row = self._record(Action(Kind.ALL_GATHER, b.stage, bucket=b.index), start, None,
                           b.data.numel() * b.data.element_size())
        self._pulls.setdefault(b.stage, []).append(_Pending(b, works, row, "pull"))

    def _talk(self, op: Callable, tensor: torch.Tensor, peer: int, tag: int, b: _Bucket, what: str) -> dist.Work:
        try:
            return op(tensor, peer, tag=tag)
        except RuntimeError as exc:
            raise self._dead(peer, b, what, exc) from exc

    def _dead(self, peer: int, b: _Bucket, what: str, exc: BaseException) -> PeerError:
        return PeerError(f"rank {self.me}: parameter server {self.servers.index(peer)} (rank {peer}) failed the {what} "
                         f"of stage {b.stage} bucket {b.index}: it died or hangs ({_first_line(exc)})")

    def _wait(self, pending: _Pending) -> None:
        for peer, work in pending.works:
            try:
                work.wait()
            except RuntimeError as exc:
                raise self._dead(peer, pending.bucket, pending.what, exc) from exc
        if pending.row is not None:
            pending.row[2] = self._stamp()

    def poll(self) -> None:
        """Nothing: gloo's point-to-point works report completion only once waited for (:meth:`finish`)."""

    def before_task(self, tid: int) -> None:
        """The pulls of the stages the task reads are waited for (the parameters are this step's)."""
        for s in self.reads.get(tid, ()):
            for pending in self._pulls.pop(s, ()):
                self._wait(pending)

    def after_task(self, tid: int) -> None:
        """After the last task of the step that reads a stage, its pushed buckets' pulls are posted."""
        for s in self._last_reader.get(tid, ()):
            self._read_done.add(s)
            for b in self.buckets:
                if b.stage == s and b.launched:
                    self._pull(b)

    def finish(self) -> None:
        """Push what is left (parameters without a gradient), post every pull, wait for the pushes."""
        self._read_done = {b.stage for b in self.buckets}
        for b in self.buckets:
            if not b.launched:
                log.debug("stage %d bucket %d pushed at the end: %d of %d parameters ready", b.stage, b.index,
                          b.ready, len(b.params))
                self._launch(b)
        while self._pushes:
            self._wait(self._pushes.pop(0))

    def gather_all(self) -> None:
        """Wait for every pull: the parameters are the servers' latest."""
        for s in sorted(self._pulls):
            for pending in self._pulls.pop(s):
                self._wait(pending)


@dataclass(frozen=True)
class ServerResult:
    """What a server's run returns to :func:`real.train.run`: the losses it saw and its memory."""

    losses: list[float]
    step_times: list[float]
    memory: dict[str, Any]
    start_step: int


@dataclass(eq=False)
class ParamServer:
    """Server ``mesh.rank - pp x dp`` of a ps run: its shards of every stage, their optimizers, its loop."""

    plan: Plan
    mesh: Mesh
    model: StagedModel
    buckets: list[_Bucket] = field(init=False)

    def __post_init__(self) -> None:
        cfg, mesh, graph = self.plan.config, self.mesh, self.plan.graph
        self.world, self.rank, self.group = mesh.servers, mesh.rank - mesh.pp * mesh.dp, mesh.server_group
        self.dp = cfg.layout.dp
        last = self.plan.num_stages - 1
        stages = {s: Stage(s, self.plan.layers[s].start, self.model.layers(self.plan.layers[s]), is_last=s == last)
                  for s in range(self.plan.num_stages)}
        self.named = [np for s in sorted(stages) for np in stages[s].global_parameters()]
        self.trainers = {s: [mesh.global_rank(graph.schedule.stage_to_rank[s], d) for d in range(self.dp)]
                         for s in stages}
        self.buckets = [self._bucket(s, k, b) for s in sorted(stages)
                        for k, b in enumerate(make_buckets([p for _, p in stages[s].global_parameters()],
                                                           cfg.sync.bucket_mb * 2**20))]
        self.optimizers = {s: make_optimizer(cfg.optim.optimizer, [b.shard for b in self.buckets if b.stage == s],
                                             cfg.optim.lr) for s in sorted(stages)}
        self._peak_inbox = 0
        log.debug("parameter server %d: %d buckets of %d stages", self.rank, len(self.buckets), len(stages))

    def _bucket(self, stage: int, index: int, params: list[nn.Parameter]) -> _Bucket:
        """This server's shard of a bucket (and its gradient); the whole flat parameters are freed."""
        data = _flat_views(params, self.world)
        size = data.numel() // self.world
        b = _Bucket(stage, index, params, torch.empty(0, dtype=data.dtype), data=data)
        b.shard = data[self.rank * size:(self.rank + 1) * size].clone()
        b.shard_grad = torch.zeros_like(b.shard)
        b.shard.grad = b.shard_grad
        data.untyped_storage().resize_(0)  # the parameters stay views of the right shapes, holding nothing
        return b

    # one step
    def _dead(self, peer: int, b: _Bucket, what: str, exc: BaseException) -> PeerError:
        return PeerError(f"parameter server {self.rank} (rank {self.mesh.rank}): the {what} of stage {b.stage} bucket "
                         f"{b.index} with trainer rank {peer} failed: it died or hangs ({_first_line(exc)})")

    def _receive(self) -> list[tuple[_Bucket, list[torch.Tensor], _Pending]]:
        """Post the receives of every trainer's push of every bucket: later stages first (their backwards end
        first), buckets in order (bucket 0 holds the last layers)."""
        out = []
        for b in sorted(self.buckets, key=lambda b: (-b.stage, b.index)):
            tag = bucket_tag(b.stage, b.index)
            bufs = [torch.empty_like(b.shard) for _ in self.trainers[b.stage]]
            works = []
            for t, buf in zip(self.trainers[b.stage], bufs, strict=True):
                try:
                    works.append((t, dist.irecv(buf, t, tag=tag)))
                except RuntimeError as exc:
                    raise self._dead(t, b, "push", exc) from exc
            out.append((b, bufs, _Pending(b, works, None, "push")))
        self._peak_inbox = max(self._peak_inbox, sum(buf.numel() * buf.element_size() for _, bs, _ in out for buf in bs))
        return out

    def _wait(self, pending: _Pending) -> None:
        for peer, work in pending.works:
            try:
                work.wait()
            except RuntimeError as exc:
                raise self._dead(peer, pending.bucket, pending.what, exc) from exc

    @torch.no_grad()
    def step(self, traced: bool = False) -> list[tuple[Action, float, float]]:
        """Average every bucket's pushes, step each stage once all its buckets are in, send the shards back;
        ``traced``: each stage's update as (``{s}OPTIM``, start, end) on this server's perf_counter clock."""
        rows: list[tuple[Action, float, float]] = []
        inbox = self._receive()
        sends: list[_Pending] = []
        stage_left = {s: sum(1 for b in self.buckets if b.stage == s) for s in self.optimizers}
        for b, bufs, pending in inbox:
            self._wait(pending)
            start = time.perf_counter()
            b.shard_grad.copy_(bufs[0])
            for buf in bufs[1:]:
                b.shard_grad.add_(buf)
            b.shard_grad.div_(self.dp)
            stage_left[b.stage] -= 1
            if stage_left[b.stage]:
                continue
            self.optimizers[b.stage].step()
            if traced:
                rows.append((Action(Kind.OPTIM, b.stage), start, time.perf_counter()))
            for sb in (x for x in self.buckets if x.stage == b.stage):
                works = []
                for t in self.trainers[sb.stage]:
                    try:
                        works.append((t, dist.isend(sb.shard, t, tag=bucket_tag(sb.stage, sb.index))))
                    except RuntimeError as exc:
                        raise self._dead(t, sb, "pull", exc) from exc
                sends.append(_Pending(sb, works, None, "pull"))
        for pending in sends:
            self._wait(pending)
        return rows

    # the loop: the same default-group collectives as a trainer's (real.train), with nothing to add
    def serve(self, restored: ckpt.Restored | None) -> ServerResult:
        """Serve every step of the run (a fault injected at ``--fail-rank`` this server's rank included)."""
        cfg = self.plan.config
        start, losses = 0, []
        if restored is not None:
            load_full(restored, self, self.named, self.optimizers, self.mesh.rank)
            start, losses = restored.step, [float(x) for x in restored.info["losses"]]
        saver = ckpt.Checkpointer(cfg.checkpoint, self.mesh.rank, _restarts()) if cfg.checkpoint else None
        if saver is not None and restored is not None:
            saver.resumed(restored)
        offset = clock_offset()
        dist.barrier()
        metered, memory, times, rows = max(cfg.metered_step, start), {}, [], []
        t_prev = time.perf_counter()
        for step in range(start, cfg.steps):
            stop.inject_fault(self.mesh.rank, step, **asdict(cfg.faults))
            rows += [(step, None, self.mesh.rank, "collective", a, s + offset, e + offset, 0.0)  # real.train's rows
                     for a, s, e in self.step(step in cfg.traced_steps)]
            value = torch.tensor([0.0, stop.requested() is not None], dtype=torch.float64)
            dist.all_reduce(value)
            loss = float(value[0]) / self.dp
            if not math.isfinite(loss) or bool(value[1]):
                self._stop(step, loss, bool(value[1]), saver, restored)
            losses.append(loss)
            now = time.perf_counter()
            times.append(now - t_prev)
            t_prev = now
            if step == metered:
                memory = self.memory()
            if saver is not None:
                saver.poll()
                if saver.due(step + 1):
                    self._save(saver, step + 1, losses)
        if saver is not None:
            saver.wait()
        dist.gather_object((rows, memory, [], None), None, dst=0)
        return ServerResult(losses, times, memory, start)

    def _stop(self, step: int, loss: float, signalled: bool, saver: ckpt.Checkpointer | None,
              restored: ckpt.Restored | None) -> None:
        """What a trainer does at a non-finite loss or a signal (every rank stops after the same step)."""
        if saver is not None:
            saver.wait()
        if signalled:
            last = saver.last if saver is not None else (restored.path.name if restored is not None else None)
            raise stop.Interrupted(int(stop.requested() or 15), step + 1, last)
        error = ConfigError(f"step {step}: the loss is {loss}; training diverged with {self.plan.config.optim.optimizer}"
                            f" at lr {self.plan.config.optim.lr:g}: try a smaller lr", field="lr")
        error.every_rank = True
        raise error

    def _save(self, saver: ckpt.Checkpointer, steps_done: int, losses: list[float]) -> None:
        cfg = self.plan.config
        state = full_state(self, self.named, self.optimizers, self.mesh.rank)
        saver.save(steps_done, state, {"losses": losses, "world_size": cfg.world_size, "pp": cfg.layout.pp,
                                       "dp": cfg.layout.dp, "config": cfg.to_dict()})

    def memory(self) -> dict[str, Any]:
        """Bytes this server holds: its shards of the parameters, their gradients and optimizer state."""
        return {"rank": self.mesh.rank, "server": self.rank, "pp_rank": None, "dp_rank": None,
                "peak_activation_bytes": 0, "activation_bytes_per_microbatch": 0, "peak_activations_mb": 0.0,
                "max_memory_allocated": None,
                **held_bytes([p for _, p in self.named], self.optimizers.values()),
                "inflight_grad_bytes": self._peak_inbox}


def _restarts() -> int:
    """torchrun's restart count (:func:`real.trainer.restart_count`, which imports this module)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
