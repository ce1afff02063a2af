"""Deterministic synthetic data with a learnable signal, generated on the fly (no downloads).

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

import torch

from real.config import ModelConfig

__all__ = ["NOISE", "make_batch", "microbatches", "step_seed"]

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
