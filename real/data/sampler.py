"""An exactly-once, resumable, per-epoch-shuffled order of a dataset's windows.

The windows of every epoch, each epoch in its own order (a permutation drawn
from ``(seed, epoch)``), are laid end to end as one stream; training takes the
stream in order, a global batch at a time, so each window of an epoch is used
exactly once (a batch that reaches the end of an epoch takes the rest from
the next). The position is one number: the windows consumed since the start
of epoch 0. It is what a checkpoint saves, so a restarted run continues where
the saved one stopped however the world size or the global batch changed:
replicas only slice the batch the stream gives (see :mod:`real.data.tokens`).
"""

from __future__ import annotations

import torch

__all__ = ["EpochSampler"]


class EpochSampler:
    """``num_windows`` windows, a new order every epoch from ``seed``."""

    def __init__(self, num_windows: int, seed: int) -> None:
        if num_windows < 1:
            raise ValueError(f"a sampler needs at least one window, got {num_windows}")
        self.num_windows, self.seed = num_windows, seed
        self._cache: dict[int, torch.Tensor] = {}

    def order(self, epoch: int) -> torch.Tensor:
        """The window ids of ``epoch`` in the order they are used (int64)."""
        if epoch not in self._cache:
            if len(self._cache) > 2:
                self._cache.pop(min(self._cache))
            g = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch * 7_919 + 12_345) % (2**63 - 1))
            self._cache[epoch] = torch.randperm(self.num_windows, generator=g)
        return self._cache[epoch]

    def take(self, consumed: int, count: int) -> torch.Tensor:
        """The ``count`` window ids after the first ``consumed`` of the stream."""
        if consumed < 0 or count < 0:
            raise ValueError(f"position {consumed} and count {count} must be >= 0")
        parts, pos, left = [], consumed, count
        while left:
            epoch, offset = divmod(pos, self.num_windows)
            chunk = self.order(epoch)[offset : offset + left]
            parts.append(chunk)
            pos += len(chunk)
            left -= len(chunk)
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.long)

    def epoch_of(self, consumed: int) -> tuple[int, int]:
        """(epoch, windows of it used) at position ``consumed``."""
        return divmod(consumed, self.num_windows)
