"""The mixture-of-experts decoder block of the built-in GPT, and its expert parallelism over the replicas.

A :class:`MoEBlock` is a :class:`real.models.DecoderBlock` whose 4x MLP is replaced by ``experts`` MLPs of the same
shape (dim -> 4 dim -> dim, GELU) and a linear router (dim -> experts, no bias): each token goes to the ``top_k``
experts of highest softmax probability (``torch.topk``), and its output is the sum of their outputs, each weighted
by its probability renormalised over the ``top_k`` chosen (the gates sum to 1). Dropless: every expert takes every
token routed to it.

Expert parallelism (``ep`` N, Megatron-Core's and torchtitan's folding over data parallelism): N consecutive
replicas of a stage form an ep group; group rank j keeps experts ``j E/N .. (j+1) E/N - 1`` (:func:`shard_experts`)
and drops the others. In the forward, each rank routes its own tokens, an all-to-all of counts tells every rank how
many rows it receives from each peer, a *dispatch* all-to-all sends every (token, expert) pair's input to the
expert's owner, the experts run, and a *combine* all-to-all sends the outputs back; the backward runs both
all-to-alls in reverse (:class:`_AllToAll`). The forward's all-to-alls go over the ep group, the backward's over a
second group of the same ranks (``grad_group``): an overlapped F+B pair runs its forward in a thread beside its
backward (:mod:`real.executor`), and with a group per direction the two passes' all-to-alls never meet in one
queue, each group seeing the same sequence on every peer (ep peers run the same program). The gradient sync
(:mod:`real.dp.sync`, via ``real.trainer``) averages an expert's parameters over its *expert data-parallel* group, the dp / N ranks that hold
it (one per ep group), dividing by dp as for the dense parameters: each ep group's expert gradient already sums
the contributions of its N replicas' tokens, so the sum over the dp / N groups is the sum over all dp replicas.

Parameters are created in the same order on every rank (all experts, then the non-local ones dropped), so a rank
holds exactly the single-process model's parameters of its experts, named as there (``3.experts.5.fc.weight``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

__all__ = ["ExpertGroup", "MoEBlock", "is_expert_param", "shard_experts"]

log = logging.getLogger(__name__)


def is_expert_param(name: str) -> bool:
    """Whether a parameter (named as in the whole model, ``"3.experts.5.fc.weight"``) belongs to an expert."""
    return ".experts." in f".{name}"


@dataclass(eq=False)
class ExpertGroup:
    """This rank's ep group: its rank and size, the process groups, and the bytes its all-to-alls sent to peers.

    ``group`` carries the forward's all-to-alls, ``grad_group`` (the same ranks; None: ``group``) the backward's.
    ``sent`` counts, per phase (``dispatch``, ``combine``, and their backwards ``dispatch_grad``,
    ``combine_grad``), the payload bytes this rank sent to the other ranks, ``{phase}_kept`` what stayed on it,
    and ``counts`` the bytes of the all-to-alls of counts sent to the others; :meth:`take` returns and resets them.
    ``watch = (stamp, done)``: each all-to-all calls ``done(phase, start, end, bytes sent)`` with ``stamp()``'s
    before and after it (the trace's all-to-all rows, :class:`real.executor.Executor`).
    """

    rank: int
    size: int
    group: dist.ProcessGroup
    grad_group: dist.ProcessGroup | None = None
    sent: dict[str, int] = field(default_factory=dict)
    watch: tuple[Callable[[], object], Callable[[str, object, object, int], None]] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # two passes may add at once

    def __post_init__(self) -> None:
        if self.grad_group is None:
            self.grad_group = self.group

    def group_of(self, phase: str) -> dist.ProcessGroup:
        """The group an all-to-all of ``phase`` goes over: the backward's own for ``*_grad`` phases."""
        return self.grad_group if phase.endswith("_grad") else self.group

    def add(self, phase: str, nbytes: int) -> None:
        with self._lock:
            self.sent[phase] = self.sent.get(phase, 0) + nbytes

    def take(self) -> dict[str, int]:
        with self._lock:
            out, self.sent = self.sent, {}
        return out

    def all_to_all(self, out: torch.Tensor, x: torch.Tensor, phase: str, sent: int,
                   out_splits: list[int] | None = None, in_splits: list[int] | None = None) -> None:
        """``all_to_all_single`` over :meth:`group_of` ``phase``; ``sent``, the bytes that go to the peers, is
        counted and, with the stamps around it, reported to ``watch``."""
        start = self.watch[0]() if self.watch else None
        dist.all_to_all_single(out, x, out_splits, in_splits, group=self.group_of(phase))
        self.add(phase, sent)
        if self.watch:
            self.watch[1](phase, start, self.watch[0](), sent)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` along dim 0 with split sizes; the backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], ep: ExpertGroup,
                phase: str) -> torch.Tensor:
        ctx.splits, ctx.ep, ctx.phase = (out_splits, in_splits), ep, phase
        return _exchange(x, out_splits, in_splits, ep, phase)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        return _exchange(grad, in_splits, out_splits, ctx.ep, f"{ctx.phase}_grad"), None, None, None, None


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], ep: ExpertGroup,
              phase: str) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    row = x[0].numel() * x.element_size() if x.dim() > 1 else x.element_size()
    ep.all_to_all(out, x, phase, (sum(in_splits) - in_splits[ep.rank]) * row, out_splits, in_splits)
    ep.add(f"{phase}_kept", in_splits[ep.rank] * row)
    return out


class ExpertMLP(nn.Module):
    """One expert: the dense block's MLP, W2 gelu(W1 x), dim -> 4 dim -> dim."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x)))


class MoEBlock(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + moe(ln(x)); see the module doc."""

    def __init__(self, dim: int, heads: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.heads, self.num_experts, self.top_k = heads, experts, top_k
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleDict({str(e): ExpertMLP(dim) for e in range(experts)})  # last: see real.trainer
        self.ep: ExpertGroup | None = None

    @property
    def local_experts(self) -> range:
        """The experts this rank holds (all of them without expert parallelism)."""
        if self.ep is None:
            return range(self.num_experts)
        per = self.num_experts // self.ep.size
        return range(self.ep.rank * per, (self.ep.rank + 1) * per)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.moe(self.ln2(x).reshape(b * t, d)).view(b, t, d)

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gates, experts) of every token of ``h`` (tokens, dim): the top_k softmax probabilities, renormalised
        to sum to 1, and their experts, each (tokens, top_k)."""
        probs = F.softmax(self.router(h), dim=-1)
        gates, chosen = torch.topk(probs, self.top_k, dim=-1)
        return gates / gates.sum(dim=-1, keepdim=True), chosen

    def moe(self, h: torch.Tensor) -> torch.Tensor:
        """sum over each token's chosen experts of gate x expert(token), for ``h`` (tokens, dim)."""
        gates, chosen = self.route(h)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the (token, expert) pairs grouped by expert
        token = order // self.top_k
        counts = torch.bincount(flat, minlength=self.num_experts)
        rows = h[token]
        outs = self._experts(rows, counts) if self.ep is None else self._parallel(rows, counts)
        weighted = outs * gates.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(h).index_add(0, token, weighted)

    def _run(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows grouped by local expert, ``counts[i]`` for the i-th local expert: every one runs, even on no row,
        so that every rank's autograd graph (and its gradient hooks' order) is the same."""
        parts = rows.split(counts)
        return torch.cat([self.experts[str(e)](part) for e, part in zip(self.local_experts, parts, strict=True)])

    def _experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return self._run(rows, counts.tolist())

    def _parallel(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Dispatch the rows to their experts' ranks, run the local experts, combine the outputs back."""
        ep, per = self.ep, self.num_experts // self.ep.size
        got = torch.empty_like(counts)
        # got[i * per + l]: the rows rank i sends local expert l
        ep.all_to_all(got, counts, "counts", (counts.numel() - per) * counts.element_size())
        send = counts.view(ep.size, per).sum(dim=1).tolist()
        recv_by = got.view(ep.size, per)
        recv = recv_by.sum(dim=1).tolist()
        received = _AllToAll.apply(rows, recv, send, ep, "dispatch")  # by source rank, then by expert
        local = torch.repeat_interleave(torch.arange(per, device=rows.device).repeat(ep.size), recv_by.reshape(-1))
        perm = torch.argsort(local, stable=True)  # by local expert, then by source rank
        outs = self._run(received[perm], recv_by.sum(dim=0).tolist())[torch.argsort(perm)]
        return _AllToAll.apply(outs, send, recv, ep, "combine")


def shard_experts(layers: list[nn.Module], rank: int, size: int, group: dist.ProcessGroup,
                  grad_group: dist.ProcessGroup | None = None) -> ExpertGroup:
    """Keep only ep rank ``rank``'s experts in every MoE block of ``layers`` and attach the ep group to them
    (``grad_group``, the same ranks, for the backward's all-to-alls; None: ``group``)."""
    ep = ExpertGroup(rank, size, group, grad_group)
    for layer in layers:
        for block in layer.modules():
            if isinstance(block, MoEBlock):
                if block.num_experts % size:
                    raise ValueError(f"{block.num_experts} experts do not divide over ep {size}")
                block.ep = ep
                keep = {str(e) for e in block.local_experts}
                for name in [n for n in block.experts if n not in keep]:
                    del block.experts[name]
    log.debug("ep rank %d of %d: experts sharded", rank, size)
    return ep
