"""The training loop of one rank: its stages, the executor and the data-parallel sync, step by step.

:class:`Trainer` builds this rank's stages of the plan, runs ``steps`` steps (the executor over its program,
the data-parallel mode's sync, the optimizer), checkpoints and resumes, stops every rank at the same step on a
signal or a loss that is not finite, and gathers on rank 0 what :class:`RunResult` holds: losses, step times,
the parameters' digest, every rank's activation memory and the traced steps in the simulator's format.
:func:`real.train.run` checks the inputs and calls it.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

import torch
import torch.distributed as dist

from real import checkpoint as ckpt
from real import stop
from real.config import Plan, RunConfig
from real.data.datamaster import MasterBatches
from real.data.sources import DataSource, microbatches, step_seed
from real.dp.compress import codec_state, load_codec
from real.dp.experts import ExpertDataSync
from real.dp.peer_sync import PeerSync, make_data_sync
from real.dp.ps import PSTrainer
from real.dp.ps_async import AsyncPSTrainer
from real.dp.zero import SHARDED_MODES, full_state, load_full
from real.executor import Executor, Stage
from real.measure import ActivationMeter, Recorder, Span, clock_offset, held_bytes
from real.mesh import Mesh
from real.model_api import (
    Boundaries,
    StagedModel,
    autocast_for,
    builtin_boundaries,
    builtin_model,
    data_for,
    infer_boundaries,
)
from real.models import make_optimizer
from real.moe import is_expert_param, shard_experts
from real.p2p import PeerError, PipeComm, matching_sends
from schedules import Action, ConfigError, Kind, Stream
from schedules.trace import make_trace, write_trace

if TYPE_CHECKING:
    import pandas as pd

    from real.dp.sync import GradSync

__all__ = ["RunResult", "StepCallback", "Trainer", "param_digest", "restart_count"]

log = logging.getLogger(__name__)

StepCallback = Callable[[int, float, float], None]  # (step, loss, seconds)


class _Row(NamedTuple):
    """One traced task on one rank: its graph task id (None for runtime-added OPTIM/collectives) and times."""

    step: int
    task: int | None
    rank: int
    stream: str
    action: Action | Span
    start: float
    end: float
    bytes: float


@dataclass(frozen=True, eq=False)
class RunResult:
    """What a run produced. The gathered fields (trace, parameters, memory) are set on rank 0 only."""

    config: RunConfig
    rank: int
    backend: str
    losses: list[float]
    step_times: list[float]
    trace: pd.DataFrame | None = None
    trace_path: str | None = None
    parameters: dict[str, torch.Tensor] | None = None
    memory: list[dict[str, Any]] | None = None
    param_norm: float | None = None
    param_sha256: str | None = None
    start_step: int = 0
    resumed_from: str | None = None
    staleness: dict[int, list[int]] | None = None  # async-ps: per trainer rank, each step's (real.dp.ps_async)
    ps_order: dict[int, list[tuple[int, int, int, int]]] | None = None  # async-ps: per server rank, its order
    ep_bytes: list[dict[str, int]] | None = None  # ep > 1: this rank's all-to-all bytes to peers, per step run

    def to_json(self) -> dict[str, Any]:
        c, lay = self.config, self.config.layout
        return {
            "schedule": c.schedule, "world_size": c.world_size, "pp": lay.pp, "dp": lay.dp,
            "microbatches": lay.microbatches,
            "chunks": self.trace.attrs["params"]["chunks"] if self.trace is not None else lay.chunks,
            "backend": self.backend, "dp_mode": c.sync.dp_mode,
            "grad_compression": c.sync.grad_compression, "steps": c.steps,
            "losses": self.losses, "step_times": self.step_times, "trace": self.trace_path,
            "start_step": self.start_step, "resumed_from": self.resumed_from, "restart_count": restart_count(),
            "param_norm": self.param_norm, "param_sha256": self.param_sha256, "memory": self.memory,
            **({"staleness": {str(r): v for r, v in self.staleness.items()}} if self.staleness is not None else {}),
            **({"ps_order": {str(r): [list(e) for e in v] for r, v in self.ps_order.items()}}
               if self.ps_order is not None else {}),
        }


def param_digest(tensors: Iterable[torch.Tensor]) -> tuple[float, str]:
    """(L2 norm in float64, SHA-256 of the raw bytes) of tensors in a fixed order."""
    sha, sq = hashlib.sha256(), 0.0
    for t in tensors:
        t = t.detach().cpu().contiguous()
        sq += float(t.double().pow(2).sum())
        sha.update(t.numpy().tobytes())
    return sq**0.5, sha.hexdigest()


def restart_count() -> int:
    """How many times torchrun has restarted the group (0 on the first attempt, or without torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


_COMM_FAILURE = re.compile(r"gloo|timed? ?out|connection|peer", re.IGNORECASE)


@dataclass(eq=False)
class Trainer:
    plan: Plan
    mesh: Mesh
    backend: str
    model: StagedModel | None = None  # None: the built-in model of the config
    data: DataSource | None = None  # None: the config's
    stages: dict[int, Stage] = field(init=False)

    def __post_init__(self) -> None:
        cfg, mesh = self.plan.config, self.mesh
        self.model = self.model if self.model is not None else builtin_model(cfg)
        self.data = self.data if self.data is not None else data_for(cfg, None)
        self.boundaries = self._boundaries()
        here = self.plan.stages_of(mesh.pp_rank)
        last = self.plan.num_stages - 1
        self.stages = {
            s: Stage(s, self.plan.layers[s].start, self.model.layers(self.plan.layers[s]),
                     is_last=s == last).to(mesh.device)
            for s in here
        }
        if mesh.ep != cfg.layout.ep:
            raise ConfigError(f"the mesh was made for ep {mesh.ep}, the run has ep {cfg.layout.ep}; create the mesh "
                              "from this run's plan (real.Mesh.create)", field="ep")
        self.experts = (shard_experts(list(self.stages.values()), mesh.ep_rank, mesh.ep, mesh.ep_group,
                                      mesh.ep_grad_group) if mesh.ep > 1 else None)
        self.ep_bytes: list[dict[str, int]] = []  # per step run, this rank's all-to-all bytes (real.moe.ExpertGroup)
        self.named = [np for s in sorted(self.stages) for np in self.stages[s].global_parameters()]
        params = [p for _, p in self.named]
        self.recorder = Recorder(mesh.device)
        self.meter = ActivationMeter(params)
        by_stage = {s: [p for _, p in self.stages[s].global_parameters()] for s in sorted(self.stages)}
        self.sync = None
        if cfg.sync.servers:
            kind, extra = PSTrainer, {}
            if cfg.sync.dp_mode == "async-ps":
                kind, extra = AsyncPSTrainer, {"staleness": cfg.sync.staleness, "steps": cfg.steps}
            self.sync = kind(by_stage, **extra, graph=self.plan.graph, pp_rank=mesh.pp_rank, rank=mesh.rank,
                             servers=[mesh.server_rank(j) for j in range(mesh.servers)],
                             bucket_mb=cfg.sync.bucket_mb, accumulations=cfg.layout.microbatches,
                             stamp=self.recorder.stamp, record=self.recorder.add)
        elif self.experts is not None:
            self.sync = self._expert_sync()
        elif mesh.dp_group is not None:
            self.sync = make_data_sync(by_stage, cfg, graph=self.plan.graph, pp_rank=mesh.pp_rank,
                                       group=mesh.dp_group, stamp=self.recorder.stamp, record=self.recorder.add)
            self.sync.on_gather = self.meter.exclude_parameters
        # One optimizer per stage (element-wise optimizers: the same as one over all), so that with data
        # parallelism each stage's update is traced as {s}OPTIM, as the simulator's data-parallel pass has it.
        shares = self.sync.optimizer_params() if self.sync else by_stage  # ps: none, the servers step
        self.optimizers = {s: make_optimizer(cfg.optim.optimizer, shares[s], cfg.optim.lr) for s in sorted(shares)}
        self.executor = Executor(self.plan.graph, mesh.pp_rank, self.stages, comm=self._comm(), meter=self.meter,
                                 recorder=self.recorder, poll=self.sync.poll if self.sync else lambda: None,
                                 loss=self.model.loss, autocast=autocast_for(cfg.runtime.dtype, mesh.device),
                                 message_dtypes={s: dt for s, (_, dt) in self.boundaries.items()},
                                 around=(self.sync.before_task, self.sync.after_task) if self.sync else None,
                                 overlap_timeout_s=cfg.runtime.timeout_s if self._overlaps() else None)
        if self.experts is not None:
            self.experts.watch = (self.recorder.stamp, self.executor.exchanged)
        self.needs_data = 0 in self.stages or last in self.stages
        self._sharded = self.sync is not None and self.sync.mode in ("zero1", *SHARDED_MODES)  # checkpoints gather
        self.metered = cfg.metered_step  # train() moves it to the first step a resumed run runs

    def _overlaps(self) -> bool:
        """Whether an overlapped pair runs its parts at once: with expert parallelism over gloo, on the CPU, with
        an ep group per direction (one CUDA stream would queue the two passes' NCCL all-to-alls in either order)."""
        ep = self.experts
        return ep is not None and ep.grad_group is not ep.group and self.mesh.device.type == "cpu"

    def _expert_sync(self) -> ExpertDataSync:
        """ep > 1: the dense parameters averaged over the dp group, the experts over their expert-dp group."""
        cfg, mesh = self.plan.config, self.mesh
        parts: tuple[dict[int, list], dict[int, list]] = ({}, {})
        for s in sorted(self.stages):
            for name, p in self.stages[s].global_parameters():
                parts[is_expert_param(name)].setdefault(s, []).append(p)
        return ExpertDataSync(*parts, group=mesh.dp_group, expert_group=mesh.expert_dp_group,
                              mode=cfg.sync.dp_mode, bucket_mb=cfg.sync.bucket_mb,
                              accumulations=cfg.layout.microbatches, stamp=self.recorder.stamp,
                              record=self.recorder.add)

    def _boundaries(self) -> Boundaries:
        """(shape, dtype) of every stage's output: the built-in model's hidden state, or inferred on the CPU."""
        cfg = self.plan.config
        if self.model.what is None:
            return builtin_boundaries(cfg, self.plan.num_stages)
        return infer_boundaries(self.model, self.plan, self.data.sample(cfg.microbatch_size)[0], cfg.runtime.dtype)

    def _comm(self) -> PipeComm | None:
        if self.mesh.p2p_groups is None:
            return None
        cfg = self.plan.config
        shape, dtype = self.boundaries[0]
        return PipeComm(self.plan.graph, self.mesh.pp_rank, global_rank=self.mesh.global_rank,
                        groups=self.mesh.p2p_groups, shape=shape, dtype=dtype, device=self.mesh.device,
                        recv_ahead=cfg.runtime.recv_ahead, stamp=self.recorder.stamp, boundaries=self.boundaries)

    def _batches(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cfg = self.plan.config
        if not self.needs_data:
            return []
        share = self.data.replica_batch(step, cfg.layout.dp, self.mesh.dp_rank)
        dev = self.mesh.device
        return [(x.to(dev), y.to(dev)) for x, y in microbatches(share, 1, 0, cfg.layout.microbatches)]

    def _step(self, step: int) -> torch.Tensor | None:
        torch.manual_seed(step_seed(self.plan.config.data.seed, step, self.mesh.rank))
        batches = self._batches(step)  # before the fault: with a data master, a killed rank dies holding a lease
        stop.inject_fault(self.mesh.rank, step, **asdict(self.plan.config.faults))
        if self.sync is not None:
            self.sync.begin_step()
        else:
            for opt in self.optimizers.values():
                opt.zero_grad(set_to_none=True)
        cfg = self.plan.config
        self.recorder.begin(step in cfg.traced_steps)
        self.meter.begin(step == self.metered)
        loss = self.executor.run_step(batches)
        if self.sync is not None:
            self.sync.finish()
        if self.experts is not None:
            self.ep_bytes.append(self.experts.take())
            log.info("ep rank %d: all-to-all bytes sent to peers this step %s", self.experts.rank, self.ep_bytes[-1])
        for s, opt in self.optimizers.items():
            start = self.recorder.stamp()
            opt.step()
            if self.sync is not None:
                self.recorder.add(Action(Kind.OPTIM, s), start, self.recorder.stamp(), 0)
        if self.sync is not None:
            self.sync.after_step()
        return loss

    def _global_loss(self, loss: torch.Tensor | None) -> tuple[float, bool]:
        """The step's mean loss over the whole batch (summed over pipelines' last stages, / dp), and whether
        any rank received a signal: one all-reduce, so every rank stops after the same step."""
        if isinstance(self.sync, AsyncPSTrainer):  # no step in lockstep: this replica's loss (averaged at the end)
            return 0.0 if loss is None else float(loss), stop.requested() is not None
        value = torch.tensor([0.0 if loss is None else float(loss), stop.requested() is not None],
                             dtype=torch.float64)
        if self.mesh.distributed:
            dist.all_reduce(value)
        return float(value[0]) / self.plan.config.layout.dp, bool(value[1])

    def _codec(self):
        """The gradient codec whose state a checkpoint holds (real.dp.compress), None without one: only the
        bucketed gradient syncs (real.dp.sync, real.dp.zero) have codecs; parameter servers and peer syncs have none."""
        return getattr(self.sync, "codec", None)

    def _sharded_parts(self) -> list[tuple[GradSync, list[tuple[str, torch.nn.Parameter]]]]:
        """zero1 (and zero2, zero3): each gradient sync with its parameters, gathered and loaded over its own group;
        with ep > 1 the dense part over dp, the experts over their expert-dp group (real.dp.experts)."""
        parts = self.sync.parts if isinstance(self.sync, ExpertDataSync) else (self.sync,)
        out = []
        for part in parts:
            mine = {id(p) for b in part.buckets for p in b.params}
            out.append((part, [(n, p) for n, p in self.named if id(p) in mine]))
        return out

    def _load(self, restored: ckpt.Restored | None) -> tuple[int, list[float]]:
        """(first step to run, losses of the steps before it) from ``restored``, loaded into this rank."""
        if restored is None:
            return 0, []
        if self._sharded:
            for part, named in self._sharded_parts():
                load_full(restored, part, named, self.optimizers, self.mesh.rank)
        elif isinstance(self.sync, PSTrainer):  # the parameters (the servers load the optimizer state)
            ckpt.load(restored, self.named, [], self.mesh.rank)
            if isinstance(self.sync, AsyncPSTrainer):  # this trainer's own losses and staleness
                losses = self.sync.load(restored, self.mesh.rank)
        elif isinstance(self.sync, PeerSync):
            self.sync.load(restored, self.named, self.optimizers, self.mesh.rank)
        else:
            ckpt.load(restored, self.named, list(self.optimizers.values()), self.mesh.rank)
        if (codec := self._codec()) is not None:
            load_codec(restored, codec, self.mesh.rank)
        self.data.restore(restored.step, restored.info.get("data"))
        log.info("rank %d: resumed from %s (step %d)", self.mesh.rank, restored.path, restored.step)
        if not isinstance(self.sync, AsyncPSTrainer):
            losses = [float(x) for x in restored.info["losses"]]
        return restored.step, losses

    def _save(self, saver: ckpt.Checkpointer, steps_done: int, losses: list[float]) -> None:
        cfg = self.plan.config
        if self._sharded:
            state = {}
            for part, named in self._sharded_parts():
                state.update(full_state(part, named, self.optimizers, self.mesh.rank))
        elif isinstance(self.sync, PSTrainer):  # the servers write the parameters and the optimizer state
            state = ckpt.state_dict([], [], self.mesh.rank)
            if isinstance(self.sync, AsyncPSTrainer):
                state.update(self.sync.state(losses, self.mesh.rank))
        elif isinstance(self.sync, PeerSync):
            state = self.sync.state(self.named, self.optimizers, self.mesh.rank)
        else:
            state = ckpt.state_dict(self.named, list(self.optimizers.values()), self.mesh.rank)
        if (codec := self._codec()) is not None:
            state.update(codec_state(codec, self.mesh.rank))
        info = {"losses": losses, "world_size": cfg.world_size, "pp": cfg.layout.pp, "dp": cfg.layout.dp,
                "ep": cfg.layout.ep, "config": cfg.to_dict()}
        position = self.data.state(steps_done)
        if position is not None:
            info["data"] = position
        saver.save(steps_done, state, info)

    def _guarded(self, step: int) -> tuple[float, bool]:
        """One step, its global loss and whether to stop (a signal); a collective that fails (timeout, dead peer)
        names the group's ranks."""
        try:
            return self._global_loss(self._step(step))
        except PeerError:
            raise
        except RuntimeError as exc:
            if not self.mesh.distributed or not _COMM_FAILURE.search(str(exc)):
                raise
            peers = [r for r in range(self.mesh.world_size) if r != self.mesh.rank]
            raise PeerError(f"rank {self.mesh.rank}: a collective of step {step} failed; a peer among ranks "
                            f"{peers} died or hangs ({str(exc).splitlines()[0]})") from exc

    def train(self, path: Path | None, on_step: StepCallback | None, restored: ckpt.Restored | None = None
              ) -> RunResult:
        cfg = self.plan.config
        start, losses = self._load(restored)
        self.metered = max(cfg.metered_step, start)  # a resumed run measures its first step
        if start >= cfg.steps:
            log.warning("the checkpoint is at step %d, steps is %d: nothing left to train", start, cfg.steps)
        saver = ckpt.Checkpointer(cfg.checkpoint, self.mesh.rank, restart_count()) if cfg.checkpoint else None
        if saver is not None and restored is not None:
            saver.resumed(restored)
        offset = clock_offset() if self.mesh.distributed else 0.0
        log.info("rank %d (pipeline rank %d, replica %d): stages %s, layers %s, clock offset to rank 0 %.6f s",
                 self.mesh.rank, self.mesh.pp_rank, self.mesh.dp_rank, sorted(self.stages),
                 [f"{self.plan.layers[s].start}..{self.plan.layers[s].stop - 1}" for s in sorted(self.stages)], offset)
        leased = isinstance(self.data, MasterBatches)
        if leased:
            self.data.start(rank=self.mesh.rank, world=self.mesh.world_size, dp_rank=self.mesh.dp_rank,
                            holder=self.mesh.pp_rank == 0, needs_data=self.needs_data, start_step=start,
                            steps=cfg.steps)
        if self.mesh.distributed:
            dist.barrier()
        times, rows, memory, traced_times = [], [], {}, {}
        t_prev = time.perf_counter()
        last = restored.path.name if restored is not None else None
        for step in range(start, cfg.steps):
            stop.progress(step, saver.last if saver is not None else last)
            loss, interrupted = self._guarded(step)
            if leased:
                self.data.step_done(step)  # every rank has the step's loss: the step is done everywhere
            if not math.isfinite(loss):
                self._diverged(step, loss, saver)
            if interrupted:
                self._interrupted(step + 1, saver, last)
            now = time.perf_counter()
            losses.append(loss)
            times.append(now - t_prev)
            t_prev = now
            if step in cfg.traced_steps:
                rows += self._trace_rows(step, offset)
                traced_times[step] = times[-1]
            if step == self.metered:
                memory = self._memory()
            if on_step is not None and self.mesh.rank == 0:
                on_step(step, loss, times[-1])
            stop.progress(step + 1, saver.last if saver is not None else last)  # a save cut off names these
            if saver is not None:
                saver.poll()
                if saver.due(step + 1):
                    self._save(saver, step + 1, losses)
                    t_prev = time.perf_counter()
        if saver is not None:
            saver.wait()
        if leased:
            self.data.finish()
        result = self._gather(losses, times, rows, memory, path, traced_times)
        return replace(result, start_step=start, resumed_from=str(restored.path) if restored else None,
                       ep_bytes=self.ep_bytes if self.experts is not None else None)

    def _interrupted(self, steps_done: int, saver: ckpt.Checkpointer | None, last: str | None) -> NoReturn:
        """Stop after a signal (every rank after the same step): an asynchronous save in flight is finished
        (it is whole), none is started; Interrupted says where training stopped and what it resumes from."""
        if saver is not None:
            saver.wait()
            last = saver.last
        signum = stop.requested() or signal.SIGTERM  # another rank's signal: this one stops alike
        raise stop.Interrupted(int(signum), steps_done, last)

    def _diverged(self, step: int, loss: float, saver: ckpt.Checkpointer | None) -> NoReturn:
        """Stop at a non-finite loss (every rank at the same step: the loss is all-reduced); ConfigError naming it.

        An asynchronous save in flight is finished first, as a synchronous one would have been.
        """
        if saver is not None:
            saver.wait()
        optim = self.plan.config.optim
        error = ConfigError(f"step {step}: the loss is {loss}; training diverged with {optim.optimizer} at lr "
                            f"{optim.lr:g}: try a smaller lr", field="lr")
        error.every_rank = True  # the loss is all-reduced: every rank raises this same error, one line says it
        raise error

    def _trace_rows(self, step: int, offset: float) -> list[_Row]:
        """This rank's rows of a traced step on rank 0's clock.

        The recorder holds a task id (a task of the graph), an Action the
        runtime adds itself (OPTIM, and the data-parallel collectives) or a Span
        on a stream of its own (an overlapped pair's parts, the all-to-alls).
        """
        tasks, rank = self.plan.graph.tasks, self.mesh.rank
        out = []
        for key, start, end, nbytes in self.recorder.resolve():
            if isinstance(key, int):
                task, action, stream = key, tasks[key].action, tasks[key].stream
            elif isinstance(key, Span):
                task, action, stream = None, key, key.stream
            else:
                task, action = None, key
                stream = Stream.COMPUTE if action.kind is Kind.OPTIM else Stream.COLLECTIVE
            out.append(_Row(step, task, rank, str(stream), action, start + offset, end + offset, nbytes))
        return out

    def _memory(self) -> dict[str, Any]:
        """Activation bytes of the metered step (the same every step: the program does not change)."""
        dev = self.mesh.device
        per_mb = sum(self.meter.first_bytes.get((s, 0), 0) for s in self.stages)
        return {
            "rank": self.mesh.rank, "pp_rank": self.mesh.pp_rank, "dp_rank": self.mesh.dp_rank,
            "peak_activation_bytes": self.meter.peak, "activation_bytes_per_microbatch": per_mb,
            "peak_activations_mb": self.meter.peak / per_mb if per_mb else 0.0,
            "max_memory_allocated": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
            **held_bytes([p for _, p in self.named], self.optimizers.values()),
            **(self.sync.transient() if self.sync is not None else {}),
        }

    def _gather(self, losses: list[float], times: list[float], rows: list[_Row], memory: dict[str, Any],
                path: Path | None, traced_times: dict[int, float]) -> RunResult:
        if self.sync is not None:
            self.sync.gather_all()
        # Replica 0 sends the dense parameters, the ep replicas of its group (0..ep-1) their own experts: every
        # parameter once, in the whole model's order once sorted by layer (a block's experts are its last).
        dense, experts = self.mesh.dp_rank == 0, self.mesh.dp_rank < self.mesh.ep
        params = [(name, p.detach().cpu().clone()) for name, p in self.named
                  if (experts if is_expert_param(name) else dense)]
        staleness = self.sync.history if isinstance(self.sync, AsyncPSTrainer) else None
        mine = (rows, memory, params, None if staleness is None else (losses, staleness))
        parts = [mine]
        if self.mesh.distributed:
            parts = [None] * self.mesh.world_size if self.mesh.rank == 0 else None
            dist.gather_object(mine, parts, dst=0)
        base = RunResult(self.plan.config, self.mesh.rank, self.backend, losses, times)
        if self.mesh.rank != 0:
            return base
        named = sorted((np for _, _, ps, _ in parts for np in ps), key=lambda np: int(np[0].split(".", 1)[0]))
        norm, sha = param_digest(t for _, t in named)
        trace = self._make_trace([_Row(*r) for rs, _, _, _ in parts for r in rs],  # a server's rows: plain tuples
                                 [m for _, m, _, _ in parts], traced_times)
        if path is not None:
            write_trace(trace, path)
        by_rank = None
        orders = None
        if staleness is not None:  # async-ps: the step's loss over the whole batch, from every replica's own
            mine_too = [(r, x) for r, (*_, x) in enumerate(parts) if isinstance(x, tuple)]
            orders = {r: x["ps_order"] for r, (*_, x) in enumerate(parts) if isinstance(x, dict)}
            losses = [sum(ls[i] for _, (ls, _) in mine_too) / self.plan.config.layout.dp for i in range(len(losses))]
            by_rank = {r: hist for r, (_, hist) in mine_too}
        return RunResult(self.plan.config, 0, self.backend, losses, times, trace, str(path) if path else None,
                         dict(named), [m for _, m, _, _ in parts], norm, sha, staleness=by_rank,
                         ps_order=orders)

    def _make_trace(self, rows: list[_Row], memory: list[dict[str, Any]], traced_times: dict[int, float]
                    ) -> pd.DataFrame:
        cfg, sched = self.plan.config, self.plan.graph.schedule
        rows = _bound_send_ends(rows, self.plan)
        t0 = min((r.start for r in rows), default=0.0)
        cols = {
            "rank": [r.rank for r in rows],
            "stream": [r.stream for r in rows],
            "action": [str(r.action) for r in rows],
            "kind": [str(r.action.kind) for r in rows],
            "stage": [r.action.stage for r in rows],
            "microbatch": [-1 if r.action.microbatch is None else r.action.microbatch for r in rows],
            "start": [r.start - t0 for r in rows],
            "end": [r.end - t0 for r in rows],
            "bytes": [r.bytes for r in rows],
            "step": [r.step for r in rows],
        }
        meta = {
            "source": "real", "schedule": sched.name, "params": dict(sched.params),
            # the order the ranks ran (R actions included): a report rebuilds any schedule from it, a user's too
            "programs": [[str(a) for a in prog] for prog in sched.programs], "stage_to_rank": list(sched.stage_to_rank),
            "dp": cfg.layout.dp, "world_size": cfg.world_size, "backend": self.backend, "device": self.mesh.device.type,
            "dp_mode": cfg.sync.dp_mode, "model": cfg.data.model.to_dict() if cfg.data.factory is None else {"factory": cfg.data.factory},
            "batch_size": cfg.data.batch_size,
            "microbatch_size": cfg.microbatch_size, "step": cfg.traced_step, "steps": cfg.steps,
            # rank 0's wall time of each traced step (its end to the previous step's end): programs, optimizer,
            # the loss all-reduce; what sim.costs.calibrated.from_trace calls the step time.
            "step_times": {str(k): v for k, v in sorted(traced_times.items())},
            "layers_per_stage": [len(r) for r in self.plan.layers], "memory": memory,
        }
        return make_trace(cols, meta)


def _bound_send_ends(rows: list[_Row], plan: Plan) -> list[_Row]:
    """A SEND ends no later than its receiver has the value (gloo shows a send's completion only on wait)."""
    graph, pp = plan.graph, plan.config.layout.pp
    recv_end = {(r.step, r.rank, r.task): r.end for r in rows if r.task is not None and r.stream == "recv"}
    send_of = {s: r for r, s in matching_sends(graph).items()}
    out = []
    for r in rows:
        if r.task is not None and r.stream == "send":
            recv = send_of[r.task]
            peer = (r.rank // pp) * pp + graph.tasks[recv].rank
            r = r._replace(end=max(min(r.end, recv_end.get((r.step, peer, recv), r.end)), r.start))
        out.append(r)
    return out
