"""The models a real run trains: a small GPT-style decoder and an MLP, as lists of layers.

A model is ``num_layers`` layers (input layer, blocks, head) that stages take
contiguous slices of. Layer ``i`` is initialised from its own seed derived
from ``(seed, i)``, so a rank that builds only its stages' layers gets exactly
the parameters the whole single-process model has.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from real.config import ModelConfig
from real.moe import MoEBlock

__all__ = ["activation_shape", "build_layers", "build_model", "layer_seed", "loss_fn", "make_optimizer"]


class TokenEmbedding(nn.Module):
    """Token plus learned position embedding: (batch, seq) ids -> (batch, seq, dim)."""

    def __init__(self, vocab: int, seq: int, dim: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)


class DecoderBlock(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x)); causal attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class LMHead(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits."""

    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


class ResidualMLP(nn.Module):
    """x + W2 gelu(W1 ln(x))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(F.gelu(self.fc(self.ln(x))))


def layer_seed(seed: int, index: int) -> int:
    """The seed layer ``index`` is initialised from (a fixed mix, the same on every rank)."""
    return (seed * 1_000_003 + index * 7_919 + 17) % (2**63 - 1)


def _make_layer(cfg: ModelConfig, index: int) -> nn.Module:
    last = cfg.num_layers - 1
    if cfg.kind == "gpt":
        if index == 0:
            return TokenEmbedding(cfg.vocab, cfg.seq, cfg.dim)
        if index == last:
            return LMHead(cfg.dim, cfg.vocab)
        if cfg.moe_experts:
            return MoEBlock(cfg.dim, cfg.heads, cfg.moe_experts, cfg.moe_top_k)
        return DecoderBlock(cfg.dim, cfg.heads)
    if index == 0:
        return nn.Sequential(nn.Linear(cfg.dim, cfg.dim), nn.GELU())
    if index == last:
        return nn.Linear(cfg.dim, cfg.vocab)
    return ResidualMLP(cfg.dim)


def build_layers(cfg: ModelConfig, seed: int, indices: Iterable[int]) -> list[nn.Module]:
    """Layers ``indices`` of the model, each initialised from :func:`layer_seed` (global RNG untouched)."""
    layers = []
    for i in indices:
        if not 0 <= i < cfg.num_layers:
            raise ValueError(f"layer {i} does not exist; the model has layers 0..{cfg.num_layers - 1}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(layer_seed(seed, i))
            layers.append(_make_layer(cfg, i))
    return layers


def build_model(cfg: ModelConfig, seed: int) -> nn.Sequential:
    """The whole model in one process: the same parameters every pipeline layout splits."""
    return nn.Sequential(*build_layers(cfg, seed, range(cfg.num_layers)))


def activation_shape(cfg: ModelConfig, batch: int) -> tuple[int, ...]:
    """Shape of the hidden state between any two layers, for ``batch`` samples."""
    return (batch, cfg.seq, cfg.dim) if cfg.kind == "gpt" else (batch, cfg.dim)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over every predicted token (gpt) or sample (mlp)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_optimizer(name: str, params: Iterable[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    """``sgd``: SGD with momentum 0.9; ``adamw``: AdamW with torch's defaults. Both act element by element,
    so a rank stepping its own share of the parameters (or a ZeRO-1 shard) does what one optimizer over
    all of them does."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}; valid: sgd, adamw")
