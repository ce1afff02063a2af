"""Model factories that break the rules of ``--model FILE.py:factory`` one way each, for
``experiments/hostile_inputs.py`` (which copies this file into its scratch folder and points cases at it)."""
import sys

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own spelling)
from torch import nn

from real import UserModel


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x), x


class Nothing(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        self.lin(x)


def data(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 8, generator=g), torch.randint(4, (8,), generator=g)


def net():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


def good():
    return UserModel(model=net(), loss=F.cross_entropy, batches=data)


def stage_tuple():
    return UserModel(model=nn.Sequential(Pair(), nn.Linear(8, 4)), loss=F.cross_entropy, batches=data)


def last_tuple():
    return UserModel(model=nn.Sequential(nn.Linear(8, 8), Pair()), loss=F.cross_entropy, batches=data)


def last_none():
    return UserModel(model=nn.Sequential(nn.Linear(8, 8), Nothing()), loss=F.cross_entropy, batches=data)


def zero_d():
    return UserModel(model=net(), loss=F.cross_entropy, batches=lambda step: (torch.tensor(1.0), torch.tensor(1)))


def int_inputs():
    return UserModel(model=net(), loss=F.cross_entropy,
                     batches=lambda step: (torch.randint(3, (8, 8)), torch.randint(4, (8,))))


def width_changes():
    return UserModel(model=net(), loss=F.cross_entropy,
                     batches=lambda step: data(step) if step == 0 else (torch.randn(8, 9), data(step)[1]))


def loss_vector():
    return UserModel(model=net(), loss=lambda out, y: F.cross_entropy(out, y, reduction="none"), batches=data)


def loss_float():
    return UserModel(model=net(), loss=lambda out, y: float(F.cross_entropy(out, y)), batches=data)


def loss_nograd():
    return UserModel(model=net(), loss=lambda out, y: F.cross_entropy(out, y).detach(), batches=data)


def exits():
    sys.exit(0)


def exits_text():
    sys.exit("bye")
