"""Data-parallel gradient sync, scheduled by gradient readiness.

Each stage's parameters are grouped into buckets in reverse order (the last
layers' gradients are ready first), each bucket capped at ``bucket_mb`` MiB;
bucket k of stage s is traced as ``{s}ALLREDUCE_b{k}`` (the notation of the
simulator's data-parallel pass). Every parameter's
``.grad`` is a view into its bucket's flat buffer, so autograd accumulates
straight into what the collective sends (no copies). A
``register_post_accumulate_grad_hook`` on every parameter counts its
accumulations; when each of a bucket's parameters has accumulated all of the
step's microbatches, the bucket's collective is launched asynchronously, while
the pipeline goes on with other work. All buckets are awaited before the
optimizer step.

Modes:

* ``sync``: no overlap; every bucket is all-reduced after the step's last backward;
* ``ddp``: the all-reduce of a bucket starts the moment its last gradient is in;
* ``zero1``: the same trigger runs a reduce-scatter instead; each replica keeps
  optimizer state for its own contiguous shard of every bucket, steps that
  shard, and an all-gather puts the updated parameters back everywhere.

Gradients are averaged over replicas (sum / dp); the loss is already divided
by the number of microbatches. With ``compression`` (``grad_compression``, :mod:`real.dp.compress`) each
bucket's gradient collective is its codec's, which leaves the average itself; the bytes traced for it are
what the codec handed to its collectives, and the step's total is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from real.dp.compress import make_codec
from real.p2p import Inflight
from schedules import Action, Kind
from schedules.dp.codecs import parse_compression

__all__ = ["GradSync", "make_buckets"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Bucket:
    stage: int
    index: int  # within the stage
    params: list[nn.Parameter]
    grad: torch.Tensor  # flat, padded to a multiple of the replica count
    data: torch.Tensor | None = None  # zero1: flat parameters, each parameter a view into it
    shard_grad: torch.Tensor | None = None  # zero1: this replica's reduced shard (its slice of ``grad``)
    shard: torch.Tensor | None = None  # zero1: this replica's slice of ``data`` (what the optimizer steps)
    ready: int = 0
    launched: bool = False
    counts: dict[int, int] = field(default_factory=dict)


def make_buckets(params: Sequence[nn.Parameter], cap_bytes: float) -> list[list[nn.Parameter]]:
    """Parameters in reverse order, cut into buckets of at most ``cap_bytes`` (at least one each)."""
    buckets: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in reversed(params):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > cap_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return [b for b in buckets if b]


class GradSync:
    """Averages this rank's gradients over its data-parallel replicas; see the module doc."""

    def __init__(
        self,
        stage_params: dict[int, Sequence[nn.Parameter]],
        *,
        group: dist.ProcessGroup,
        mode: str,
        bucket_mb: float,
        accumulations: int,
        stamp: Callable[[], object],
        record: Callable[[object, object, object, float], list | None],
        compression: str = "none",
        average_over: int | None = None,
        first_bucket: dict[int, int] | None = None,
    ) -> None:
        self.mode, self.group, self.accumulations = mode, group, accumulations
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # The sum is divided by the group's size, or by ``average_over`` (the experts of real.moe: dp, not their
        # group's dp / ep); ``first_bucket``: per stage, the index of its first bucket (after the dense ones).
        self.divisor = self.world if average_over is None else average_over
        first = first_bucket or {}
        self._stamp, self._record = stamp, record
        self.works = Inflight(stamp)
        self._launched: list[tuple[_Bucket, torch.Tensor | None]] = []  # zero1: with the reduce-scatter's output
        self.buckets = [self._bucket(s, first.get(s, 0) + k, b) for s, params in stage_params.items()
                        for k, b in enumerate(make_buckets(params, bucket_mb * 2**20))]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.codec = make_codec(parse_compression(compression), group,
                                {self.key(b): (b.grad if b.data is None else b.data).numel() for b in self.buckets})
        self.step_bytes = 0  # bytes of this step's gradient collectives (the traced rows' sum)
        for b in self.buckets:
            for p in b.params:
                p.register_post_accumulate_grad_hook(self._on_grad)
        log.debug("dp %s: %d buckets over %d parameters", mode, len(self.buckets), len(self._bucket_of))

    def _bucket(self, stage: int, index: int, params: list[nn.Parameter]) -> _Bucket:
        n = sum(p.numel() for p in params)
        padded = -(-n // self.world) * self.world
        p0 = params[0]
        grad = torch.zeros(padded, dtype=p0.dtype, device=p0.device)
        bucket = _Bucket(stage, index, params, grad)
        offset = 0
        if self.mode == "zero1":
            bucket.data = torch.zeros(padded, dtype=p0.dtype, device=p0.device)
        for p in params:
            view = slice(offset, offset + p.numel())
            p.grad = grad[view].view_as(p)
            if bucket.data is not None:
                bucket.data[view].copy_(p.detach().reshape(-1))
                p.data = bucket.data[view].view_as(p)
            offset += p.numel()
        if bucket.data is not None:
            size = padded // self.world
            bucket.shard = bucket.data[self.rank * size : (self.rank + 1) * size]
            # No gradient memory beyond the flat buffer: the shard's gradient is its own slice of it.
            bucket.shard_grad = grad[self.rank * size : (self.rank + 1) * size]
            bucket.shard.grad = bucket.shard_grad
        return bucket

    @staticmethod
    def key(b: _Bucket) -> str:
        """The bucket's name in the codec's state and checkpoints."""
        return f"s{b.stage}b{b.index}"

    def _grad_collective(self, b: _Bucket, flat: torch.Tensor, out: torch.Tensor | None) -> tuple[object, int]:
        """Launch ``flat``'s all-reduce (``out`` None) or reduce-scatter into ``out``: (its work, its bytes)."""
        if self.codec is not None:
            pending = (self.codec.allreduce(self.key(b), flat, [p.grad for p in b.params]) if out is None
                       else self.codec.reduce_scatter(self.key(b), flat, out))
            work, nbytes = pending, pending.nbytes
        elif out is None:
            work, nbytes = dist.all_reduce(flat, group=self.group, async_op=True), flat.numel() * flat.element_size()
        else:
            work = dist.reduce_scatter_single(out, flat, group=self.group, async_op=True)
            nbytes = flat.numel() * flat.element_size()
        self.step_bytes += nbytes
        return work, nbytes

    def _log_bytes(self) -> None:
        """The step's bytes of gradient collectives and (a codec) its compute on this thread, then reset."""
        if self.codec is None:
            log.info("dp %s: %d bytes of gradient collectives this step", self.mode, self.step_bytes)
            return
        log.info("dp %s, grad compression %s: %d bytes of gradient collectives this step, codec compute %.3f ms "
                 "on the training thread", self.mode, self.codec.comp.spec, self.step_bytes, self.codec.seconds * 1e3)
        self.codec.seconds = 0.0

    def optimizer_params(self) -> dict[int, list[torch.Tensor]]:
        """What each stage's optimizer steps: its parameters, or (zero1) this replica's shards of them."""
        out: dict[int, list[torch.Tensor]] = {}
        for b in self.buckets:
            out.setdefault(b.stage, []).extend([b.shard] if self.mode == "zero1" else b.params)
        return out

    def begin_step(self) -> None:
        for b in self.buckets:
            b.grad.zero_()
            b.ready, b.launched = 0, False
            b.counts = {}
        self._launched = []
        self.step_bytes = 0

    def _on_grad(self, p: nn.Parameter) -> None:
        bucket = self._bucket_of[id(p)]
        n = bucket.counts.get(id(p), 0) + 1
        bucket.counts[id(p)] = n
        if n == self.accumulations:
            bucket.ready += 1
            if bucket.ready == len(bucket.params) and self.mode != "sync":
                self._launch(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        bucket.launched = True
        start = self._stamp()
        out = None
        if self.mode == "zero1":
            out = torch.empty_like(bucket.shard_grad)  # the input cannot be the output: copied in at finish()
        work, nbytes = self._grad_collective(bucket, bucket.grad, out)
        kind = Kind.REDUCE_SCATTER if self.mode == "zero1" else Kind.ALLREDUCE
        row = self._record(Action(kind, bucket.stage, bucket=bucket.index), start, None, nbytes)
        self.works.add(work, row)
        self._launched.append((bucket, out))

    def poll(self) -> None:
        self.works.poll()

    on_gather: Callable[[], None] = staticmethod(lambda: None)  # ZeRO-3 (real.dp.zero) re-allocates parameters

    def before_task(self, tid: int) -> None:
        """Called before each compute task; parameters are whole here, nothing to gather."""

    def after_task(self, tid: int) -> None:
        """Called after each compute task."""

    def transient(self) -> dict[str, int]:
        """Peak bytes of buffers that live only around a collective (ZeRO-2/3); none here."""
        return {}

    def gather_all(self) -> None:
        """Parameters are whole on every replica in these modes."""

    def finish(self) -> None:
        """Launch what is left (sync mode; parameters without a gradient) and wait for every bucket."""
        for b in self.buckets:
            if not b.launched:
                if self.mode != "sync":
                    log.debug("stage %d bucket %d launched at the end: %d of %d parameters ready",
                              b.stage, b.index, b.ready, len(b.params))
                self._launch(b)
        self.works.drain()
        for b, out in self._launched:
            if out is not None:
                b.shard_grad.copy_(out)
            if self.codec is None:  # a codec leaves the average
                (b.shard_grad if self.mode == "zero1" else b.grad).div_(self.divisor)
        self._launched = []
        self._log_bytes()

    @torch.no_grad()
    def after_step(self) -> None:
        """zero1: gather every replica's updated shard into the full parameters."""
        if self.mode != "zero1":
            return
        for b in self.buckets:
            start = self._stamp()
            work = dist.all_gather_single(b.data, b.shard.clone(), group=self.group, async_op=True)
            self.works.add(work, self._record(Action(Kind.ALL_GATHER, b.stage, bucket=b.index), start, None,
                                              b.data.numel() * b.data.element_size()))
        self.works.drain()
