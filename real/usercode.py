"""The boundary of the user's model: what its loss and blocks must return, checked before training.

A user's model (:mod:`real.model_api`) brings three kinds of code: the
factory, ``batches(step)`` and ``loss(output, targets)``, and the blocks'
``forward``. :func:`common.usercode.call` runs one of them and turns whatever it raises
(``sys.exit`` included) into a :class:`UserCodeError`: one line with the
exception and the innermost frame of the user's own files, and the user's
frames alone (never the runtime's) in :attr:`UserCodeError.frames`, which
the command line prints under ``-v``. :func:`check_loss` says what a loss
must return; :func:`check_model` runs one microbatch through the whole model
with gradients before training, so a loss of the wrong type, shape or
without grad, and a block that fails on the data, are refused before any
step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from common.usercode import UserCodeError, call, describe

__all__ = ["check_loss", "check_model", "checked_loss"]

def check_loss(value: Any, what: str) -> torch.Tensor:
    """``value`` if it is what a loss must return: one floating number as a tensor with grad (while grad is on)."""
    if not isinstance(value, torch.Tensor):
        raise UserCodeError(f"{what} returned {type(value).__name__}; it must return the mean loss as a torch "
                            "tensor of one element, computed from the output (not .item())", field="loss")
    if value.numel() != 1:
        raise UserCodeError(f"{what} returned a tensor of shape {tuple(value.shape)}; it must return the mean loss, "
                            "one element: reduce it (e.g. .mean())", field="loss")
    if not value.is_floating_point():
        raise UserCodeError(f"{what} returned a {value.dtype} tensor; a loss must be floating point", field="loss")
    if torch.is_grad_enabled() and not value.requires_grad:
        raise UserCodeError(f"{what} returned a tensor without grad; compute it from the output with torch "
                            "operations (no .detach(), .item() or torch.tensor(...))", field="loss")
    return value


def check_model(blocks: Sequence[torch.nn.Module], stages: Sequence[range], loss: Callable[..., Any],
                sample: tuple[torch.Tensor, torch.Tensor], what: str) -> None:
    """Run one microbatch through every stage with gradients and check each output and the loss (before training).

    Blocks run in eval mode (no running statistic moves, no dropout drawn) and the global RNG is restored.
    """
    x, y = sample
    last = len(stages) - 1
    modes = [(m, m.training) for b in blocks for m in b.modules()]
    try:
        for b in blocks:
            b.eval()
        with torch.random.fork_rng(devices=[]), torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the user's code warns at its first step anyway, if it must
            for s, r in enumerate(stages):
                for i in r:
                    if i > 0 and not isinstance(x, torch.Tensor):
                        raise UserCodeError(f"{what}: block {i - 1} ({type(blocks[i - 1]).__name__}) returns "
                                            f"{type(x).__name__}; a block must return one tensor, the next block's "
                                            "input", field="model")
                    x = call(f"{what}: block {i} ({type(blocks[i]).__name__}) on the data of batches(0)",
                             blocks[i], x)
                if not isinstance(x, torch.Tensor):
                    kind = "the last stage" if s == last else f"stage {s}"
                    raise UserCodeError(f"{what}: {kind} (blocks {r.start}..{r.stop - 1}) returns "
                                        f"{type(x).__name__}; every stage must return one tensor", field="model")
            check_loss(call(describe(loss, "loss"), loss, x, y, field="loss"), describe(loss, "loss"))
    finally:
        for m, training in modes:
            m.training = training


def checked_loss(loss: Callable[..., Any]) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """``loss`` behind the boundary: its errors and a result of the wrong kind are UserCodeErrors naming it."""
    what = describe(loss, "loss")

    def checked(output: Any, targets: torch.Tensor) -> torch.Tensor:
        if not isinstance(output, torch.Tensor):
            raise UserCodeError(f"the last stage returns {type(output).__name__}; every stage must return one "
                                f"tensor, the last one for {what}", field="model")
        return check_loss(call(what, loss, output, targets, field="loss"), what)

    return checked
