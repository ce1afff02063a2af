"""Where a run's batches come from: synthetic data, a user's batch function, or a token file.

A :class:`DataSource` gives each data-parallel replica its share of a step's
global batch. Three kinds: :class:`SyntheticData` (below), :class:`GlobalBatches`
(a user's ``step -> global batch`` function) and
:class:`real.data.tokens.TokenBatches` (windows of a token file, with an
exactly-once resumable sampler whose position goes into checkpoints).

Synthetic data: deterministic, with a learnable signal, generated on the fly (no downloads).

The global batch of a step is a function of ``(seed, step)`` only; every
layout takes the same rows: replica ``d`` of ``dp`` takes the d-th contiguous
share, and its microbatch ``j`` the j-th contiguous slice of that share. So a
pipeline x data-parallel run sees exactly the samples plain training sees.

* gpt: sequences that follow a fixed random permutation of the vocabulary
  (token t+1 = perm[token t]) except for 10% uniform noise tokens; the
  achievable loss is far below ln(vocab).
* mlp: Gaussian inputs labelled by the argmax of a fixed random linear
  teacher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from real.config import ModelConfig
from schedules import ConfigError

__all__ = ["NOISE", "DataSource", "GlobalBatches", "SyntheticData", "make_batch", "microbatches", "step_seed"]

NOISE = 0.1  # fraction of gpt tokens drawn uniformly instead of from the rule


def _generator(*key: int) -> torch.Generator:
    mixed = 0
    for k in key:
        mixed = (mixed * 6_364_136_223_846_793_005 + k + 1_442_695_040_888_963_407) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def step_seed(seed: int, step: int, rank: int) -> int:
    """The seed of a rank's global RNG for ``step``: restarted or resized runs draw the same numbers."""
    return int(_generator(seed, step, rank).initial_seed())


def make_batch(cfg: ModelConfig, seed: int, step: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the whole global batch of ``step`` on the CPU."""
    rule = _generator(seed, -1)  # fixed across steps: the thing to learn
    g = _generator(seed, step)
    if cfg.kind == "gpt":
        perm = torch.randperm(cfg.vocab, generator=rule)
        tokens = torch.empty(batch, cfg.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(cfg.vocab, (batch,), generator=g)
        noise = torch.rand(batch, cfg.seq, generator=g) < NOISE
        random = torch.randint(cfg.vocab, (batch, cfg.seq), generator=g)
        for t in range(cfg.seq):
            tokens[:, t + 1] = torch.where(noise[:, t], random[:, t], perm[tokens[:, t]])
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    teacher = torch.randn(cfg.dim, cfg.vocab, generator=rule)
    x = torch.randn(batch, cfg.dim, generator=g)
    return x, (x @ teacher).argmax(dim=-1)


def microbatches(
    batch: tuple[torch.Tensor, torch.Tensor], dp: int, dp_rank: int, num_microbatches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Replica ``dp_rank``'s contiguous share of the global batch, cut into equal microbatches."""
    inputs, targets = batch
    share = inputs.shape[0] // dp
    lo = dp_rank * share
    size = share // num_microbatches
    return [
        (inputs[lo + j * size : lo + (j + 1) * size], targets[lo + j * size : lo + (j + 1) * size])
        for j in range(num_microbatches)
    ]


def _every_rank(error: ConfigError) -> ConfigError:
    """Mark ``error`` as one rank 0 raises too: the command line prints it once, from rank 0."""
    error.every_rank = True
    return error


class DataSource(Protocol):
    """What a run reads its batches from (every rank holds one; all of them agree)."""

    def replica_batch(self, step: int, dp: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Replica ``dp_rank``'s contiguous share of the global batch of ``step``."""

    def sample(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows`` rows of the first batch, for shape inference and profiling (consumes nothing)."""

    def state(self, step: int) -> dict[str, Any] | None:
        """The position before ``step`` runs (JSON, saved in checkpoints), or None if the step is the position."""

    def restore(self, step: int, state: dict[str, Any] | None) -> None:
        """Continue at ``step`` from a position :meth:`state` saved."""


def _share(batch: tuple[torch.Tensor, torch.Tensor], dp: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = batch
    share = inputs.shape[0] // dp
    return inputs[dp_rank * share : (dp_rank + 1) * share], targets[dp_rank * share : (dp_rank + 1) * share]


class SyntheticData:
    """:func:`make_batch`: a step's batch is a function of ``(seed, step)``, so the step is the position."""

    def __init__(self, model: ModelConfig, seed: int, batch_size: int) -> None:
        self.model, self.seed, self.batch_size = model, seed, batch_size

    def replica_batch(self, step: int, dp: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _share(make_batch(self.model, self.seed, step, self.batch_size), dp, dp_rank)

    def sample(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = make_batch(self.model, self.seed, 0, self.batch_size)
        return x[:rows], y[:rows]

    def state(self, step: int) -> None:
        return None

    def restore(self, step: int, state: dict[str, Any] | None) -> None:
        return None


class GlobalBatches:
    """A user's function ``step -> (inputs, targets)`` of the whole global batch (``batch_size`` rows each)."""

    def __init__(self, fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]], batch_size: int) -> None:
        from common.usercode import describe

        self.fn, self.batch_size = fn, batch_size
        self.what = describe(fn, "batches")
        self._first: tuple[tuple[int, ...], torch.dtype, tuple[int, ...], torch.dtype] | None = None  # step 0's rows

    def _batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The user's batch of ``step``, checked: (inputs, targets) of batch_size rows each, shaped as step 0's.

        Every error is raised alike by every rank that reads data, rank 0 among them (it holds stage 0).
        """
        from common.usercode import UserCodeError, call

        try:
            got = call(f"{self.what} at step {step}", self.fn, step, field="batches")
        except UserCodeError as exc:
            raise _every_rank(exc) from exc.__cause__
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            raise _every_rank(UserCodeError(f"{self.what} returned {type(got).__name__} at step {step}; it must "
                                            "return (inputs, targets) tensors", field="batches"))
        x, y = got
        if x.dim() == 0 or y.dim() == 0:
            raise _every_rank(UserCodeError(f"{self.what} returned a 0-d tensor at step {step}; inputs and targets "
                                            f"need a first dimension of batch_size = {self.batch_size} rows",
                                            field="batches"))
        if x.shape[0] != self.batch_size or y.shape[0] != self.batch_size:
            raise _every_rank(ConfigError(f"batches({step}) returned {x.shape[0]} inputs and {y.shape[0]} targets; "
                                          f"the global batch_size is {self.batch_size}: return that many rows",
                                          field="batch_size"))
        rows = (tuple(x.shape[1:]), x.dtype, tuple(y.shape[1:]), y.dtype)
        if self._first is None:
            self._first = rows
        elif rows != self._first:
            raise _every_rank(UserCodeError(
                f"{self.what} returned rows of inputs {rows[0]} {rows[1]}, targets {rows[2]} {rows[3]} at step "
                f"{step}, where the first batch had {self._first[0]} {self._first[1]}, {self._first[2]} "
                f"{self._first[3]}; every step's rows must have the same shape and dtype", field="batches"))
        return x, y

    def replica_batch(self, step: int, dp: int, dp_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _share(self._batch(step), dp, dp_rank)

    def sample(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self._batch(0)
        return x[:rows], y[:rows]

    def state(self, step: int) -> None:
        return None

    def restore(self, step: int, state: dict[str, Any] | None) -> None:
        return None
