"""Data parallelism that averages parameters, not gradients: decentralized SGD and local SGD.

Neither mode reduces a gradient: each replica's optimizer steps its own
parameters with its own gradient, and the replicas' parameters drift apart
between averagings. Both change the mathematics (the docs' dp-modes page says
when they equal ddp).

* ``decentralized`` (D-PSGD, Lian et al. 2017, as Bagua's full-precision
  ``DecentralizedAlgorithm`` orders it): when a step starts, each bucket's
  parameters x_t are copied into a flat buffer and exchanged with the
  replica's neighbours (gloo ``isend``/``irecv`` in the dp group, one pair per
  neighbour, traced as ``{s}EXCHANGE{j}_b{k}``, j the neighbour: 0 the next,
  1 the previous replica of the ring), overlapping the forward and backward
  passes (Bagua marks the weights ready in its forward pre-hook). An
  exchange's trace row ends when its send and receive have both completed:
  gloo's point-to-point works report ``is_completed()`` False until waited
  for, so on gloo a watcher thread waits for them and stamps the end (polling
  between tasks would stamp every exchange at the last backward's end). After the
  last backward the exchanges are awaited and the parameters set to the mean
  of the replica's x_t and its neighbours' (Bagua's post-backward hook copies
  the peers' average back); then the optimizer applies the local gradient
  g_i(x_t): x_{t+1} = mean(x_t over the neighbourhood) - lr g_i(x_t).
  ``peer_selection`` ring: both ring neighbours (one at dp 2); random: one
  peer per step, the replicas paired by a shuffle drawn from (seed, step)
  (:func:`schedules.dp.modes.random_peer`).
* ``local-sgd``: replicas step alone; after the optimizer step, each bucket's
  parameters are averaged over the dp group by torch's
  ``PeriodicModelAverager`` (period ``sync_every``, no warm-up: it averages
  after steps 0, K, 2K, ... counted from 0, torch's convention), one averager
  per bucket so that each bucket is one all-reduce, traced as
  ``{s}ALLREDUCE_b{k}`` like the IR's.

Checkpoints hold every replica's own parameters and optimizer state under
``replica{d}.model.NAME`` / ``replica{d}.optim.NAME.KEY`` (the replicas
differ) and the step counter (``peer_sync.step``: the averagers' and the
random peer's), so a resumed run is bit-identical to an uninterrupted one. It
resumes with the same mode, dp and pp only.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

from real import checkpoint as ckpt
from real.config import RunConfig
from real.dp.sync import GradSync, make_buckets
from real.dp.zero import make_sync
from real.p2p import Inflight
from schedules import Action, CheckpointError, Kind
from schedules.dp.modes import random_peer, ring_neighbours
from schedules.graph import TaskGraph

__all__ = ["PEER_MODES", "PeerSync", "check_resume", "make_data_sync"]

log = logging.getLogger(__name__)

PEER_MODES = ("decentralized", "local-sgd")
_STEP_KEY = "peer_sync.step"


def make_data_sync(stage_params: dict[int, Sequence[nn.Parameter]], config: RunConfig, *, graph: TaskGraph,
                   pp_rank: int, group: dist.ProcessGroup, stamp: Callable[[], object],
                   record: Callable[..., list | None]) -> GradSync | PeerSync:
    """The data-parallel sync of ``config``'s mode: :class:`PeerSync` here, or :func:`real.dp.zero.make_sync`'s."""
    sync = config.sync
    common = {"group": group, "mode": sync.dp_mode, "bucket_mb": sync.bucket_mb, "stamp": stamp, "record": record}
    if sync.dp_mode in PEER_MODES:
        return PeerSync(stage_params, sync_every=sync.sync_every, peer_selection=sync.peer_selection,
                        seed=config.data.seed, **common)
    return make_sync(stage_params, graph=graph, pp_rank=pp_rank, accumulations=config.layout.microbatches,
                     compression=sync.grad_compression, **common)


def check_resume(restored: ckpt.Restored, saved: dict[str, Any], mine: dict[str, Any]) -> None:
    """decentralized and local-sgd checkpoints hold one state per replica: they resume with the same mode, dp and
    pp only (checked here, on files, so that no rank waits in a load another rank refused)."""
    def layout(d: dict[str, Any]) -> tuple[Any, ...]:
        sync, lay = d.get("sync"), d.get("layout")
        return (sync.get("dp_mode") if isinstance(sync, dict) else None,
                *((lay.get("dp"), lay.get("pp")) if isinstance(lay, dict) else (None, None)))

    theirs, ours = layout(saved), layout(mine)
    if {theirs[0], ours[0]} & set(PEER_MODES) and theirs != ours:
        raise CheckpointError(f"checkpoint {restored.path} was written with dp mode {theirs[0]} at dp {theirs[1]}, pp "
                              f"{theirs[2]}; this run has {ours[0]} at dp {ours[1]}, pp {ours[2]}: decentralized and "
                              "local-sgd checkpoints hold each replica's own state and resume with the same mode, dp "
                              "and pp only; use those, or another checkpoint directory", field="directory")


@dataclass(eq=False)
class _Bucket:
    stage: int
    index: int
    params: list[nn.Parameter]
    sent: torch.Tensor | None = None  # decentralized: this step's x_t, flat
    received: list[torch.Tensor] = field(default_factory=list)  # decentralized: the neighbours' x_t
    averager: PeriodicModelAverager | None = None  # local-sgd

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.params)


class _Watcher:
    """A thread that waits for a step's exchanges in the order issued and stamps each row's end when its send and
    receive have both completed (gloo's point-to-point works cannot be polled: see the module doc)."""

    def __init__(self, stamp: Callable[[], object]) -> None:
        self._stamp = stamp
        self._pending: list[tuple[tuple[dist.Work, ...], list | None]] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def add(self, works: tuple[dist.Work, ...], row: list | None) -> None:
        self._pending.append((works, row))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._wait, args=(self._pending,), name="exchange-watcher",
                                        daemon=True)
        self._pending = []
        self._thread.start()

    def _wait(self, pending: list[tuple[tuple[dist.Work, ...], list | None]]) -> None:
        try:
            for works, row in pending:
                for work in works:
                    work.wait()
                if row is not None:
                    row[2] = self._stamp()
        except BaseException as exc:
            self._error = exc

    def join(self) -> None:
        """Wait for the step's exchanges; the watcher's error (a peer that died), if any, raised here."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


class PeerSync:
    """The sync object of :mod:`real.train` for ``decentralized`` and ``local-sgd``; see the module doc."""

    def __init__(self, stage_params: dict[int, Sequence[nn.Parameter]], *, group: dist.ProcessGroup, mode: str,
                 bucket_mb: float, stamp: Callable[[], object], record: Callable[..., list | None],
                 sync_every: int = 1, peer_selection: str = "ring", seed: int = 0) -> None:
        self.mode, self.group = mode, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.peer_selection, self.seed, self.sync_every = peer_selection, seed, sync_every
        self._stamp, self._record = stamp, record
        self.works = Inflight(stamp)
        self.step = 0  # steps done: what the averagers and the random peer count
        self.buckets = [_Bucket(s, k, b) for s, params in stage_params.items()
                        for k, b in enumerate(make_buckets(params, bucket_mb * 2**20))]
        if mode == "local-sgd":
            with warnings.catch_warnings():  # period 1: torch warns that DDP would do (it would, for SGD)
                warnings.simplefilter("ignore", UserWarning)
                for b in self.buckets:
                    b.averager = PeriodicModelAverager(period=sync_every, warmup_steps=0, process_group=group)
        self._neighbours: tuple[int, ...] = ()
        self._due = False  # decentralized: this step's exchanges are still to launch
        # gloo's send/recv works complete only when waited for: a thread waits for them (see the module doc)
        self._watcher = _Watcher(stamp) if dist.get_backend(group) == "gloo" else None
        log.debug("dp %s: %d buckets", mode, len(self.buckets))

    on_gather: Callable[[], None] = staticmethod(lambda: None)  # parameters re-allocated: the meter's exclusions

    def optimizer_params(self) -> dict[int, list[torch.Tensor]]:
        out: dict[int, list[torch.Tensor]] = {}
        for b in self.buckets:
            out.setdefault(b.stage, []).extend(b.params)
        return out

    def neighbours(self, step: int) -> tuple[int, ...]:
        """The dp ranks this replica exchanges with at ``step`` (decentralized)."""
        if self.peer_selection == "ring":
            return ring_neighbours(self.rank, self.world)
        return (random_peer(self.rank, self.world, self.seed, step),)

    def begin_step(self) -> None:
        for b in self.buckets:
            for p in b.params:
                p.grad = None
        self._due = self.mode == "decentralized"

    @torch.no_grad()
    def _launch(self) -> None:
        """decentralized: send each bucket's x_t to the step's neighbours and receive theirs."""
        self._due = False
        self._neighbours = self.neighbours(self.step)
        for b in self.buckets:
            b.sent = torch.cat([p.detach().reshape(-1) for p in b.params])
            b.received = [torch.empty_like(b.sent) for _ in self._neighbours]
            for j, peer in enumerate(self._neighbours):
                self._exchange(b, j, peer)
        if self._watcher is not None:
            self._watcher.start()

    def _exchange(self, b: _Bucket, j: int, peer: int) -> None:
        """Send x_t to ``peer`` and receive its x_t: tags tell a ring's two directions apart (what I send to my
        next, my next receives from its previous)."""
        start = self._stamp()
        ring = self.peer_selection == "ring" and len(self._neighbours) == 2
        send_tag = 2 * b.index + (j if ring else 0)
        recv_tag = 2 * b.index + (1 - j if ring else 0)
        send = dist.isend(b.sent, group=self.group, group_dst=peer, tag=send_tag + 1000 * b.stage)
        recv = dist.irecv(b.received[j], group=self.group, group_src=peer, tag=recv_tag + 1000 * b.stage)
        row = self._record(Action(Kind.EXCHANGE, b.stage, j, bucket=b.index), start, None, b.sent.numel() *
                           b.sent.element_size())
        if self._watcher is not None:
            self._watcher.add((send, recv), row)
            return
        self.works.add(send, None, b.sent)
        self.works.add(recv, row)

    def poll(self) -> None:
        self.works.poll()

    def before_task(self, tid: int) -> None:
        """decentralized: the exchanges start before the step's first compute task (Bagua's forward pre-hook)."""
        if self._due:
            self._launch()

    def after_task(self, tid: int) -> None:
        """Nothing to release."""

    def transient(self) -> dict[str, int]:
        """Bytes of the decentralized exchange's buffers (x_t and the neighbours'), none for local-sgd."""
        if self.mode != "decentralized":
            return {}
        return {"exchange_buffer_bytes": sum(b.nbytes * (1 + len(b.received)) for b in self.buckets)}

    def gather_all(self) -> None:
        """Each replica keeps its own parameters; rank 0 reports replica 0's."""

    @torch.no_grad()
    def finish(self) -> None:
        """decentralized: wait for the exchanges, then set the parameters to the neighbourhood's mean of x_t."""
        if self._due:  # a rank without compute tasks
            self._launch()
        self.works.drain()
        if self._watcher is not None:
            self._watcher.join()
        if self.mode != "decentralized":
            return
        for b in self.buckets:
            mean = b.sent.clone()
            for r in b.received:
                mean += r
            mean /= 1 + len(b.received)
            offset = 0
            for p in b.params:
                p.copy_(mean[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            b.sent, b.received = None, []

    @torch.no_grad()
    def after_step(self) -> None:
        """local-sgd: each bucket's averager (it all-reduces on its period's steps); the step counter."""
        if self.mode == "local-sgd":
            averaging = self.step % self.sync_every == 0
            for b in self.buckets:
                start = self._stamp()
                b.averager.average_parameters(b.params)
                if averaging:
                    self._record(Action(Kind.ALLREDUCE, b.stage, bucket=b.index), start, self._stamp(), b.nbytes)
            if averaging:
                self.on_gather()  # torch's average_parameters points every parameter at a new flat buffer
        self.step += 1

    # --- checkpoints: every replica's own state -----------------------------------------------------------
    def state(self, named: list[tuple[str, nn.Parameter]], optimizers: dict[int, torch.optim.Optimizer],
              rank: int) -> dict[str, Any]:
        """This rank's checkpoint state: its replica's parameters and optimizer state, the step counter."""
        base = ckpt.state_dict(named, list(optimizers.values()), rank)
        prefix = f"replica{self.rank}."
        state = {(prefix + k if k.startswith(("model.", "optim.")) else k): v for k, v in base.items()}
        state[_STEP_KEY] = torch.tensor([self.step], dtype=torch.int64)
        return state

    @torch.no_grad()
    def load(self, restored: ckpt.Restored, named: list[tuple[str, nn.Parameter]],
             optimizers: dict[int, torch.optim.Optimizer], rank: int) -> None:
        """Load this replica's state from a checkpoint of the same mode, dp and pp (CheckpointError if not)."""
        meta = ckpt.read_metadata(restored.path).state_dict_metadata
        prefix = f"replica{self.rank}."
        missing = [f"{prefix}model.{n}" for n, _ in named if f"{prefix}model.{n}" not in meta]
        if missing or _STEP_KEY not in meta:
            raise CheckpointError(f"checkpoint {restored.path} has no {self.mode} state of replica {self.rank} "
                                  f"({(missing or [_STEP_KEY])[0]}); resume {self.mode} from a {self.mode} checkpoint "
                                  "of the same dp, or use another checkpoint directory", field="directory")
        state: dict[str, Any] = {f"{prefix}model.{n}": p.data for n, p in named}
        stage_of = {id(p): s for s, opt in optimizers.items() for g in opt.param_groups for p in g["params"]}
        for n, p in named:
            head = f"{prefix}optim.{n}."
            for key, m in meta.items():
                if id(p) in stage_of and key.startswith(head) and "." not in key[len(head):]:
                    state[key] = torch.empty(m.size, dtype=m.properties.dtype, device=p.device)
                    optimizers[stage_of[id(p)]].state[p][key[len(head):]] = state[key]
        rng_key = f"rng.rank{rank}"
        if rng_key in meta:
            state[rng_key] = torch.empty_like(torch.get_rng_state())
        state[_STEP_KEY] = torch.zeros(1, dtype=torch.int64)
        ckpt.load_state(restored, state, rank)
        if rng_key in state:
            torch.set_rng_state(state[rng_key])
        self.step = int(state[_STEP_KEY][0])
        for b in self.buckets:
            if b.averager is not None:
                b.averager.step = self.step
        if self.step != restored.step:
            raise CheckpointError(f"checkpoint {restored.path}: its {_STEP_KEY} is {self.step}, not its step "
                                  f"{restored.step}; remove it to resume from the one before", field="directory")

