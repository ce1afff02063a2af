"""``run(config)``: train for real on this rank's part of the task graph; rank 0 gathers the results.

Every rank calls :func:`run` with the same config (torchrun starts them).
All input checks happen before the process group exists; then each rank
builds only its stages' layers (identical to the whole model's, see
:mod:`real.models`), runs ``steps`` training steps (:class:`real.trainer.Trainer`: executor, data-parallel
sync, optimizer), and rank 0 gathers the losses, the parameters (norm and
SHA-256), the activation memory of every rank and the trace of one step,
merged into the simulator's trace format with times aligned to rank 0's clock.
A step whose loss is not finite stops every rank at that step with a
ConfigError (the loss is all-reduced, so all ranks see the same value).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from common.usercode import UserCodeError
from real import checkpoint as ckpt
from real import stop, usercode
from real.config import Plan, RunConfig, make_plan
from real.data.sources import DataSource
from real.dp.peer_sync import check_resume
from real.dp.ps import ParamServer
from real.dp.ps_async import AsyncParamServer
from real.mesh import Mesh, env_world
from real.model_api import (
    StagedModel,
    UserModel,
    check_stages,
    plan_for,
    resolve_balance,
)
from real.trainer import RunResult, StepCallback, Trainer
from schedules import CheckpointError, ConfigError, SchedlabError
from schedules.trace import check_trace_path

if TYPE_CHECKING:
    pass

__all__ = ["fit", "resolve_backend", "resume_point", "run"]

log = logging.getLogger(__name__)


def resolve_backend(backend: str | None) -> str:
    """nccl when CUDA is available, gloo otherwise; an explicit nccl without CUDA is refused."""
    if backend is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError("backend nccl needs CUDA GPUs and none is available here; use backend gloo", field="backend")
    return backend


_DENSE = {"moe_experts": 0, "moe_top_k": 2}  # ModelConfig's MoE fields, as a dense model has them
_MUST_MATCH = (("data", "model"), ("data", "factory"), ("data", "batch_size"), ("data", "seed"), ("optim", "optimizer"))


def resume_point(config: RunConfig) -> ckpt.Restored | None:
    """The newest complete checkpoint to resume from (files only); SchedlabError if it belongs to another run.

    The layout (pp, dp, schedule) may differ, the model, global batch, seed and optimizer may not (with a token
    file the global batch may: its sampler's position is saved in windows, not steps).
    """
    if config.checkpoint is None:
        return None
    restored = ckpt.latest_complete(config.checkpoint.directory)
    if restored is None:
        return None
    if restored.step > config.steps:
        raise CheckpointError(f"checkpoint {restored.path} is of step {restored.step}, past this run's {config.steps} "
                              f"steps; give steps {restored.step} or more, or another checkpoint directory",
                              field="steps")
    saved = restored.info.get("config", {})
    if not isinstance(saved, dict):
        saved = {}
    mine = config.to_dict()
    for part, key in _MUST_MATCH:
        if key == "batch_size" and config.data.token_file is not None:
            continue
        theirs = saved.get(part, {}).get(key) if isinstance(saved.get(part), dict) else None
        if key == "model" and isinstance(theirs, dict):  # written before the MoE fields existed: a dense model
            theirs = {**_DENSE, **theirs}
        if theirs != mine[part][key]:
            was, now = _differing(theirs, mine[part][key])
            raise CheckpointError(
                f"checkpoint {restored.path} was written with {key} {was}, this run has {now}; use the same {key} "
                "to resume, or another checkpoint directory", field="directory"
            )
    check_resume(restored, saved, mine)
    return restored


def _differing(theirs: Any, mine: Any) -> tuple[str, str]:
    """Two saved values as the error names them: of two dicts (a model), only the fields that differ."""
    if not (isinstance(theirs, dict) and isinstance(mine, dict)):
        return repr(theirs), repr(mine)
    keys = [k for k in sorted({*theirs, *mine}) if theirs.get(k) != mine.get(k)]
    return tuple(", ".join(f"{k} {d.get(k)!r}" for k in keys) for d in (theirs, mine))


def run(
    config: RunConfig,
    *,
    trace_path: str | Path | None = None,
    mesh: Mesh | None = None,
    on_step: StepCallback | None = None,
    user: UserModel | None = None,
    ps_order: dict[int, list[tuple[int, int, int, int]]] | None = None,
) -> RunResult:
    """Train on this rank; every bad input raises SchedlabError before any communication.

    ``user``: a model of :mod:`real.model_api` instead of the built-in one (``config.data.model`` is then unused).
    ``ps_order``: async-ps, the order each server (by rank) follows (a run's ``RunResult.ps_order``,
    :mod:`real.dp.ps_async`).
    """
    _, world, _ = env_world()
    plan, model, data = plan_for(config, world, user)
    backend = resolve_backend(config.runtime.backend or ("gloo" if config.sync.servers else None))
    path = check_trace_path(trace_path) if trace_path is not None else None
    restored = resume_point(config)
    own = mesh is None
    mesh = mesh if mesh is not None else Mesh.create(plan, backend, config.runtime.timeout_s)
    held = None
    try:
        held = _lock(config, mesh)
        _check_user_model(config, mesh, model, plan, data)
        if config.layout.balance is not None:
            config = resolve_balance(config, model, plan.num_stages, data.sample(config.microbatch_size)[0],
                                     lambda split: _from_rank0(split, mesh))
            plan = make_plan(config, world, num_layers=model.num_layers, what=model.what)
            check_stages(model, plan)
        if mesh.is_server:
            return _serve(plan, mesh, backend, model, restored, (ps_order or {}).get(mesh.rank))
        return Trainer(plan, mesh, backend, model, data).train(path, on_step, restored)
    finally:
        if held is not None:
            ckpt.unlock(held)
        if own and not (mesh.distributed and stop.requested() is not None):  # stopped: peers may be gone (stop.leave)
            mesh.close()


def _serve(plan: Plan, mesh: Mesh, backend: str, model: StagedModel, restored: ckpt.Restored | None,
           script: list | None = None) -> RunResult:
    """A parameter server's run (dp mode ps, :mod:`real.dp.ps`); rank 0, a trainer, gathers the results."""
    cfg = plan.config
    server = AsyncParamServer(plan, mesh, model, script) if cfg.sync.dp_mode == "async-ps" else ParamServer(plan, mesh, model)
    done = server.serve(restored)
    return RunResult(cfg, mesh.rank, backend, done.losses, done.step_times, start_step=done.start_step,
                     resumed_from=str(restored.path) if restored else None)


def fit(user: UserModel, *, trace_path: str | Path | None = None, **fields: Any) -> RunResult:
    """Train ``user`` with the layout, data and optimizer of :meth:`RunConfig.of` ``(**fields)`` on this rank.

    Under torchrun every rank calls it (world size pp x dp); in one process pp must be 1.
    """
    steps = fields.pop("steps", 10)
    checkpoint = fields.pop("checkpoint", None)
    return run(RunConfig.of(steps=steps, checkpoint=checkpoint, **fields), trace_path=trace_path, user=user)


def _check_user_model(config: RunConfig, mesh: Mesh, model: StagedModel, plan: Plan, data: DataSource) -> None:
    """Rank 0 runs one microbatch through a user's whole model with gradients (see :func:`usercode.check_model`);
    every rank raises its error alike, so that rank 0 alone prints it."""
    if model.what is None:
        return
    refusal = None
    if mesh.rank == 0:
        try:
            blocks = model.blocks if model.blocks is not None else tuple(model.layers(range(model.num_layers)))
            usercode.check_model(blocks, plan.layers, model.loss, data.sample(config.microbatch_size), model.what)
        except SchedlabError as exc:
            refusal = (str(exc), exc.field, getattr(exc, "frames", []))
    refusal = _from_rank0(refusal, mesh)
    if refusal is not None:
        message, field_, frames = refusal
        error = UserCodeError(message, field=field_, frames=frames)
        error.every_rank = True
        raise error


def _lock(config: RunConfig, mesh: Mesh) -> Path | None:
    """Rank 0 takes the checkpoint directory's lock (one run per directory); every rank raises alike if it cannot.

    A resume-only run (``every`` 0) of a directory that does not exist has nothing to guard.
    """
    cfg = config.checkpoint
    if cfg is None or (cfg.every == 0 and not Path(cfg.directory).is_dir()):
        return None
    held, refusal = None, None
    if mesh.rank == 0:
        try:
            held = ckpt.lock(cfg.directory)
        except CheckpointError as exc:
            refusal = str(exc)
    refusal = _from_rank0(refusal, mesh)
    if refusal is not None:
        raise CheckpointError(refusal, field="directory")
    return held


def _from_rank0(value: Any, mesh: Mesh) -> Any:
    """Rank 0's ``value`` on every rank (a profiled split: every rank must use the same)."""
    if not mesh.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
