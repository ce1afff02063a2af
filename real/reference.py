"""Plain single-process training: the reference every pipeline and data-parallel layout must equal.

Deliberately shares nothing with the executor but the model definition, the
data and the optimizer choice: the whole model as one ``nn.Sequential``, a
plain loop over the step's microbatches with gradient accumulation, one
optimizer step.
"""

from __future__ import annotations

import torch
from torch import nn

from real.config import RunConfig
from real.data.sources import make_batch
from real.model_api import UserModel, data_for
from real.models import build_model, loss_fn, make_optimizer

__all__ = ["reference_run", "reference_user_run"]


def reference_run(config: RunConfig) -> tuple[list[float], dict[str, torch.Tensor]]:
    """(loss of every step, final parameters by name) of plain training with ``config``'s model and data.

    Each step accumulates over the ``dp x microbatches`` microbatches of the
    global batch (the ones every layout of ``config`` runs), each loss divided
    by their number.
    """
    model = build_model(config.data.model, config.data.seed)
    opt = make_optimizer(config.optim.optimizer, model.parameters(), config.optim.lr)
    n = config.layout.dp * config.layout.microbatches
    size = config.data.batch_size // n
    losses = []
    for step in range(config.steps):
        inputs, targets = make_batch(config.data.model, config.data.seed, step, config.data.batch_size)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(n):
            loss = loss_fn(model(inputs[j * size : (j + 1) * size]), targets[j * size : (j + 1) * size]) / n
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def reference_user_run(user: UserModel, config: RunConfig) -> tuple[list[float], dict[str, torch.Tensor]]:
    """:func:`reference_run` for a user model (:mod:`real.model_api`): its blocks or stage modules as one
    ``nn.Sequential`` (parameters ``"{block}.{name}"``), a traced model as itself (its own parameter names).
    Float32, no autocast. ``user`` is trained in place: pass a fresh one."""
    model = user.model if user.form == "traced" else nn.Sequential(*user.model)
    data = data_for(config, user)
    opt = make_optimizer(config.optim.optimizer, model.parameters(), config.optim.lr)
    n = config.layout.dp * config.layout.microbatches
    size = config.data.batch_size // n
    losses = []
    for step in range(config.steps):
        inputs, targets = data.replica_batch(step, 1, 0)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(n):
            loss = user.loss(model(inputs[j * size : (j + 1) * size]), targets[j * size : (j + 1) * size]) / n
            loss.backward()
            total += loss.item()
        opt.step()
        losses.append(total)
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}
