"""ZeRO-2 and ZeRO-3 (FSDP) on the runtime's own gradient hooks.

Both keep, per bucket of :mod:`real.dp.sync`, this replica's contiguous shard of the
flat parameters (``shard``, what the optimizer steps), its gradient
(``shard_grad``) and so its optimizer state: 1/dp of each.

* gradients: autograd accumulates a parameter's ``.grad`` as usual; when every
  parameter of a bucket has received one more microbatch's gradient, the
  bucket is copied into a transient flat buffer, the parameters' ``.grad`` are
  dropped, and the buffer is reduce-scattered asynchronously, its result
  added to ``shard_grad`` once it completes (polled between tasks). So no
  full-size gradient outlives the collective of one microbatch; this is the
  per-microbatch reduce-scatter of ``schedules.dp.modes``'s zero2 and zero3.
* ``zero2``: the flat parameters stay whole on every replica; after the
  optimizer step each bucket is all-gathered from the updated shards.
* ``zero3``: the flat parameters are freed (their storage resized to 0, so
  every view, and every tensor autograd saved from them, stays valid but
  empty) and all-gathered before each compute task that reads the stage (F,
  I, W, B, R: ``schedules.dp.modes.ZERO3_READS``) and freed after it, one gather
  per bucket, task and stage, traced with the microbatch of the task's pass
  of that stage (``{s}ALL_GATHER{m}_b{k}``), as the IR's gathers say
  (``add_data_parallel(..., one_buffer=True)``); the gathers of the next
  reading task are launched when a task starts (one task ahead), or, for a
  stage the running task holds, as soon as it ends; the step's first task's
  when it starts. A reduce-scatter is traced with the microbatch of the pass
  that completed its bucket (``{s}REDUCE_SCATTER{m}_b{k}``, the IR's), or,
  reduced at the step's end, with its count in the step.

Why not FSDP2 (``fully_shard``): it works on CPU with gloo in torch 2.13 (two
processes, DTensor shards of a Linear), but its unshard and reduce hooks are
tied to a module's forward and a full backward; this runtime runs split
backwards (I now, W later, :mod:`real.backward`) and a stage's passes out of
module order, so the gathers and reduce-scatters are placed here per task,
on the same flat buckets as zero1, and checkpoints keep one layout.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from real import checkpoint as ckpt
from real.dp.sync import GradSync, _Bucket
from schedules import Action, Kind
from schedules.dp.modes import ZERO3_READS
from schedules.graph import TaskGraph

__all__ = ["SHARDED_MODES", "ShardedSync", "full_state", "load_full", "make_sync"]

log = logging.getLogger(__name__)

SHARDED_MODES = ("zero2", "zero3")
# The passes that read a stage's parameters, as the IR's zero3 gathers say. W too: the first stage's W is its whole
# backward, and elsewhere autograd's weight-gradient nodes read the weights (LayerNorm's backward reads its weight
# for any output: a freed one fails "The tensor has a non-zero number of elements, but its data is not allocated").
_READS = ZERO3_READS
# Reduce-scatters in flight at most; launching one more first waits for the oldest. Without a bound, a step's
# flat gradients pile up until the next poll (measured: twice a whole gradient), and ZeRO-2 saves nothing at
# its peak. Two keep one bucket's transfer overlapping the next bucket's backward.
MAX_INFLIGHT = 2


def _flatten_grads(bucket: _Bucket) -> torch.Tensor:
    """The bucket's gradients in one flat tensor (zeros where a parameter has none, and in the padding), the
    parameters' ``.grad`` dropped. One ``torch.cat``: no zero-filled buffer written over parameter by parameter
    (timed in a loop on a 1.3 MB bucket of the grid's model: 0.06 against 0.14 ms of one core)."""
    dtype, device = bucket.shard.dtype, bucket.shard.device
    parts, n = [], 0
    for p in bucket.params:
        g = p.grad
        parts.append(g.reshape(-1).to(dtype) if g is not None else torch.zeros(p.numel(), dtype=dtype, device=device))
        p.grad = None
        n += p.numel()
    if bucket.data.numel() > n:
        parts.append(torch.zeros(bucket.data.numel() - n, dtype=dtype, device=device))
    return torch.cat(parts)


def make_sync(stage_params: dict[int, Sequence[nn.Parameter]], *, graph: TaskGraph, pp_rank: int, mode: str,
              **kw: Any) -> GradSync:
    """The data-parallel sync of ``mode``: :class:`real.dp.sync.GradSync` (sync, ddp, zero1) or :class:`ShardedSync`."""
    if mode in (*SHARDED_MODES, "fsdp"):
        return ShardedSync(stage_params, graph=graph, pp_rank=pp_rank, mode=mode, **kw)
    return GradSync(stage_params, mode=mode, **kw)


class ShardedSync(GradSync):
    """``zero2`` / ``zero3`` (``fsdp``); see the module doc. ``graph``/``pp_rank``: the program zero3 gathers for."""

    def __init__(self, stage_params: dict[int, Sequence[nn.Parameter]], *, graph: TaskGraph, pp_rank: int,
                 mode: str, **kw: Any) -> None:
        self._pending: deque[tuple[_Bucket, dist.Work, torch.Tensor, torch.Tensor, list | None]] = deque()
        self._gathering: dict[int, list[tuple[_Bucket, dist.Work, list | None]]] = {}
        self._whole: set[int] = set()  # zero3: stages whose parameters are gathered now
        self._peaks = {"inflight_grad_bytes": 0, "gathered_param_bytes": 0}  # since begin_step
        self._inflight = 0  # bytes of flat gradients being reduce-scattered
        super().__init__(stage_params, mode="zero3" if mode == "fsdp" else mode, **kw)
        self.reads, self.next = self._program(graph, pp_rank)
        self._task: int | None = None  # the compute task running (the microbatch its reduce-scatters are traced with)
        self.on_gather = lambda: None  # zero3: called after parameters are re-allocated (the meter's exclusions)
        if self.mode == "zero3":
            for s in {b.stage for b in self.buckets}:
                self._free(s)

    @staticmethod
    def _program(graph: TaskGraph, pp_rank: int) -> tuple[dict[int, dict[int, int]], dict[int, int | None]]:
        """Stages each compute task reads (stage -> the microbatch of its first pass of it), and the next task
        that reads any."""
        reads: dict[int, dict[int, int]] = {}
        for tid in graph.programs[pp_rank]:
            stages: dict[int, int] = {}
            for p in graph.tasks[tid].action.parts():
                if p.kind in _READS:
                    stages.setdefault(p.stage, p.microbatch)
            if stages:
                reads[tid] = stages
        order = list(reads)
        return reads, dict(zip(order, [*order[1:], None], strict=True))

    def _bucket(self, stage: int, index: int, params: list[nn.Parameter]) -> _Bucket:
        n = sum(p.numel() for p in params)
        padded = -(-n // self.world) * self.world
        size = padded // self.world
        p0 = params[0]
        data = torch.zeros(padded, dtype=p0.dtype, device=p0.device)
        offset = 0
        for p in params:
            view = slice(offset, offset + p.numel())
            data[view].copy_(p.detach().reshape(-1))
            p.data = data[view].view_as(p)
            p.grad = None
            offset += p.numel()
        bucket = _Bucket(stage, index, params, torch.empty(0, dtype=p0.dtype, device=p0.device), data=data)
        bucket.shard = data[self.rank * size:(self.rank + 1) * size]  # zero2: stepped in place, as zero1
        if self.mode == "zero3":
            bucket.shard = bucket.shard.clone()  # its own storage: the whole parameters are freed between passes
        bucket.shard_grad = torch.zeros(size, dtype=p0.dtype, device=p0.device)
        bucket.shard.grad = bucket.shard_grad
        return bucket

    def optimizer_params(self) -> dict[int, list[torch.Tensor]]:
        out: dict[int, list[torch.Tensor]] = {}
        for b in self.buckets:
            out.setdefault(b.stage, []).append(b.shard)
        return out

    def begin_step(self) -> None:
        for b in self.buckets:
            b.shard_grad.zero_()
            b.counts, b.ready = {}, 0
        self.step_bytes = 0
        self._peaks = dict.fromkeys(self._peaks, 0)

    def transient(self) -> dict[str, int]:
        """Peaks of the step so far: flat gradients in flight, whole parameters gathered (zero3) at once."""
        return dict(self._peaks)

    def _on_grad(self, p: nn.Parameter) -> None:
        bucket = self._bucket_of[id(p)]
        bucket.counts[id(p)] = 1
        if len(bucket.counts) == len(bucket.params):
            self._reduce(bucket)

    def _reduce(self, bucket: _Bucket) -> None:
        """Reduce-scatter what the bucket's parameters hold in ``.grad`` (then dropped) into its shard."""
        flat = _flatten_grads(bucket)
        out = torch.empty_like(bucket.shard_grad)
        start = self._stamp()
        work, nbytes = self._grad_collective(bucket, flat, out)
        mb = self.reads.get(self._task, {}).get(bucket.stage, bucket.ready)  # the pass that completed the bucket
        row = self._record(Action(Kind.REDUCE_SCATTER, bucket.stage, mb, bucket=bucket.index), start, None, nbytes)
        self._pending.append((bucket, work, out, flat, row))
        self._inflight += flat.numel() * flat.element_size()
        self._peaks["inflight_grad_bytes"] = max(self._peaks["inflight_grad_bytes"], self._inflight)
        self._fold(wait=True, keep=MAX_INFLIGHT)
        bucket.ready += 1  # reduce-scatters of this bucket in this step
        bucket.counts = {}

    def _fold(self, wait: bool, keep: int = 0) -> None:
        """Add completed reduce-scatters into the shards (``wait``: all but the newest ``keep``, waiting)."""
        while len(self._pending) > keep and (wait or self._pending[0][1].is_completed()):
            bucket, work, out, flat, row = self._pending.popleft()
            work.wait()
            self._inflight -= flat.numel() * flat.element_size()
            bucket.shard_grad.add_(out)
            if row is not None:
                row[2] = self._stamp()

    def poll(self) -> None:
        self._fold(wait=False)
        self.works.poll()

    def finish(self) -> None:
        """Reduce what a partly ready bucket holds, wait for every reduce-scatter, average over replicas."""
        for b in self.buckets:
            if b.counts:
                log.debug("stage %d bucket %d reduced at the end: %d of %d parameters ready",
                          b.stage, b.index, len(b.counts), len(b.params))
                self._reduce(b)
        self._fold(wait=True)
        if self.codec is None:  # a codec leaves the average
            for b in self.buckets:
                b.shard_grad.div_(self.world)
        self._log_bytes()

    @torch.no_grad()
    def after_step(self) -> None:
        """zero2: gather the updated shards into the whole parameters (zero3 gathers before each pass)."""
        if self.mode == "zero2":
            for b in self.buckets:
                self._gather_bucket(b, keep=None)
            self.works.drain()

    def _gather_bucket(self, b: _Bucket, keep: list | None, mb: int | None = None) -> None:
        """All-gather bucket ``b``; zero3: ``mb``, the microbatch of the pass it is for (traced with it)."""
        start = self._stamp()
        source = b.shard.clone() if self.mode == "zero2" else b.shard  # zero2: the shard is a slice of the output
        work = dist.all_gather_single(b.data, source, group=self.group, async_op=True)
        row = self._record(Action(Kind.ALL_GATHER, b.stage, mb, bucket=b.index), start, None,
                           b.data.numel() * b.data.element_size())
        if keep is None:
            self.works.add(work, row, keepalive=source)
        else:
            keep.append((b, work, row))

    # zero3: parameters gathered around the tasks that read them
    @torch.no_grad()
    def _launch_gather(self, stage: int, mb: int | None) -> None:
        if stage in self._whole or stage in self._gathering:
            return
        works: list[tuple[_Bucket, dist.Work, list | None]] = []
        for b in self.buckets:
            if b.stage == stage:
                b.data.untyped_storage().resize_(b.data.numel() * b.data.element_size())
                self._gather_bucket(b, keep=works, mb=mb)
        self._gathering[stage] = works
        whole = sum(b.data.untyped_storage().nbytes() for b in self.buckets)
        self._peaks["gathered_param_bytes"] = max(self._peaks["gathered_param_bytes"], whole)
        self.on_gather()

    def _wait_gather(self, stage: int, mb: int | None) -> None:
        self._launch_gather(stage, mb)
        for _, work, row in self._gathering.pop(stage, ()):
            work.wait()
            if row is not None:
                row[2] = self._stamp()
        self._whole.add(stage)

    def _free(self, stage: int) -> None:
        for b in self.buckets:
            if b.stage == stage:
                b.data.untyped_storage().resize_(0)
        self._whole.discard(stage)

    def before_task(self, tid: int) -> None:
        """zero3: the task's stages gathered (waited for); the next reading task's other stages launched."""
        self._task = tid
        if self.mode != "zero3" or tid not in self.reads:
            return
        for s, mb in self.reads[tid].items():
            self._wait_gather(s, mb)
        for s, mb in self.reads.get(self.next[tid], {}).items():
            if s not in self.reads[tid]:
                self._launch_gather(s, mb)

    def after_task(self, tid: int) -> None:
        """zero3: free the task's stages, as the IR does after every pass; a stage the next reading task
        reads too is gathered again at once (its buffer is in use until now, so it cannot be prefetched)."""
        self._task = None
        if self.mode != "zero3" or tid not in self.reads:
            return
        again = self.reads.get(self.next[tid], {})
        for s in self.reads[tid]:
            self._free(s)
            if s in again:
                self._launch_gather(s, again[s])

    def gather_all(self) -> None:
        """zero3: every stage's parameters whole (to read them after training); the others hold them already."""
        if self.mode == "zero3":
            for s in sorted({b.stage for b in self.buckets}):
                self._wait_gather(s, None)


# Checkpoints of the sharded modes (zero1, zero2, zero3): whole tensors under whole-model names, as the
# replicated modes write them, so a run resumes with any dp and any mode.
def _gathered(sync: GradSync, shard: torch.Tensor) -> torch.Tensor:
    full = torch.empty(shard.numel() * sync.world, dtype=shard.dtype, device=shard.device)
    dist.all_gather_single(full, shard.contiguous(), group=sync.group)
    return full


def _pieces(b: _Bucket, flat: torch.Tensor) -> list[torch.Tensor]:
    out, offset = [], 0
    for p in b.params:
        out.append(flat[offset:offset + p.numel()].view(p.shape).clone())
        offset += p.numel()
    return out


@torch.no_grad()
def full_state(sync: GradSync, named: list[tuple[str, nn.Parameter]], optimizers: dict[int, torch.optim.Optimizer],
               rank: int) -> dict[str, Any]:
    """This rank's checkpoint state with every parameter and optimizer tensor whole (gathered over dp)."""
    name_of = {id(p): n for n, p in named}
    state: dict[str, Any] = {}
    for b in sync.buckets:
        for p, t in zip(b.params, _pieces(b, _gathered(sync, b.shard)), strict=True):
            state[f"model.{name_of[id(p)]}"] = t
        for key, value in optimizers[b.stage].state.get(b.shard, {}).items():
            if not isinstance(value, torch.Tensor):
                continue
            whole = _pieces(b, _gathered(sync, value)) if value.shape == b.shard.shape else [value.clone()] * len(b.params)
            for p, t in zip(b.params, whole, strict=True):
                state[f"optim.{name_of[id(p)]}.{key}"] = t
    state[f"rng.rank{rank}"] = torch.get_rng_state()
    return state


@torch.no_grad()
def load_full(restored: ckpt.Restored, sync: GradSync, named: list[tuple[str, nn.Parameter]],
              optimizers: dict[int, torch.optim.Optimizer], rank: int) -> None:
    """Load a checkpoint (of any mode and dp) into this replica's shards and optimizer state."""
    meta = ckpt.read_metadata(restored.path).state_dict_metadata
    name_of = {id(p): n for n, p in named}
    state: dict[str, Any] = {f"model.{n}": torch.empty(p.shape, dtype=p.dtype) for n, p in named}
    for n, _ in named:
        for key, m in meta.items():
            if key.startswith(f"optim.{n}.") and "." not in key[len(f"optim.{n}."):]:
                state[key] = torch.empty(m.size, dtype=m.properties.dtype)
    rng_key = f"rng.rank{rank}"
    if rng_key in meta:
        state[rng_key] = torch.empty_like(torch.get_rng_state())
    ckpt.load_state(restored, state, rank)
    for b in sync.buckets:
        names = [name_of[id(p)] for p in b.params]
        flat = _flat(b, [state[f"model.{n}"] for n in names])
        size = b.shard.numel()
        b.shard.copy_(flat[sync.rank * size:(sync.rank + 1) * size])
        if b.data.untyped_storage().nbytes():  # zero1, zero2: whole parameters here too (zero3: freed)
            b.data.copy_(flat)
        keys = {k[len(f"optim.{names[0]}."):] for k in state if k.startswith(f"optim.{names[0]}.")}
        opt = optimizers[b.stage]
        for key in sorted(keys):
            parts = [state[f"optim.{n}.{key}"] for n in names]
            if parts[0].shape == b.params[0].shape:
                opt.state[b.shard][key] = _flat(b, parts)[sync.rank * size:(sync.rank + 1) * size].clone()
            else:
                opt.state[b.shard][key] = parts[0].clone()
    if rng_key in state:
        torch.set_rng_state(state[rng_key])


def _flat(b: _Bucket, tensors: list[torch.Tensor]) -> torch.Tensor:
    flat = torch.zeros(b.data.numel(), dtype=b.shard.dtype, device=b.shard.device)
    offset = 0
    for t in tensors:
        flat[offset:offset + t.numel()].copy_(t.reshape(-1))
        offset += t.numel()
    return flat
