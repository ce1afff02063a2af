"""A user-defined model for ``schedlab run --model experiments/my_model.py:build`` (the README's example).

Not a transformer: a small convolutional classifier of 1-D signals whose
class is the position of a bump; 6 blocks that the stages split.
"""

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from real import UserModel


def batches(step: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: noise plus a bump at one of 4 places; the target is the place."""
    g = torch.Generator().manual_seed(step)
    y = torch.randint(4, (size,), generator=g)
    x = torch.randn(size, 1, 32, generator=g)
    x[torch.arange(size), 0, 4 + 8 * y] += 1.5
    return x, y


def build() -> UserModel:
    net = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2), nn.ReLU(), nn.Conv1d(8, 8, 5, padding=2, stride=2),
                        nn.Flatten(), nn.Linear(8 * 16, 32), nn.Linear(32, 4))
    return UserModel(model=net, loss=F.cross_entropy, batches=batches)
