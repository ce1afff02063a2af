"""The gradient codecs of ``grad_compression`` (:mod:`schedules.dp.codecs`) on the runtime's flat buckets.

Each codec turns one bucket's gradient collective into its compressed form and hands back a
:class:`Pending` (``is_completed`` / ``wait``, as a ``dist.Work``) whose ``wait`` leaves the **average**
over the group (not the sum) where the uncompressed collective would leave the sum: the caller does not
divide again. ``nbytes`` is the size of the buffers handed to the collectives (the ``n`` of
:func:`schedules.dp.codecs.buffer_bytes`), counted from the tensors sent.

* ``fp16`` / ``bf16``, all-reduce: torch's own ``fp16_compress_hook`` / ``bf16_compress_hook``
  (``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``), called with the bucket as a one-tuple,
  which they accept outside DDP. Reduce-scatter (ZeRO): the same steps by hand (cast, divide by the group
  size, reduce-scatter, cast back), as torch has no reduce-scatter hook. gloo reduces fp16 and bf16
  (checked: all-reduce and reduce-scatter on 2 processes, torch 2.13).
* ``int8``: by hand (torch's ``quantization_hooks`` all-gather uint8 tensors without error feedback, so
  every rank receives p whole buckets). The bucket is cut into p chunks; each chunk is quantized with its
  absmax scale (``round(x / s)``, ``s = max|x| / 127``) after adding this bucket's residual, and the
  residual becomes what the rounding lost (error feedback). An all-to-all sends chunk j to rank j, which
  dequantizes the p copies and sums them in float32 (so the sum is exact in the wider type, where an int8
  all-reduce would overflow), averages, adds its own residual for that chunk, re-quantizes and all-gathers
  the result (the "server" side of double-sided error feedback, Tang et al. 2019, DoubleSqueeze). Bytes:
  ``p (c + 4)`` for each of the two collectives, a ring all-reduce's traffic in one byte per element. The
  ZeRO modes stop after the all-to-all: the averaged chunk is this rank's shard.
* ``powersgd:R``: torch's ``powerSGD_hook`` with its ``PowerSGDState`` (error feedback, warm start),
  called with a duck-typed bucket (``index``, ``buffer``, ``gradients``, ``is_last``: what the hook
  reads of a ``GradBucket``). torch asks ``start_powerSGD_iter`` > 1 because DDP rebuilds its buckets after
  the first iteration and the hook's memories are keyed by bucket index; these buckets are fixed when the
  sync is built, so compression starts at step 0 (the attribute is set after construction). The hook
  issues its second and third all-reduces from its own callbacks; so that every rank issues collectives in
  one order (gloo pairs them by order), each bucket's hook is waited for when it is launched.

The codecs' state (residuals, PowerSGD's error, P and Q memories, iteration and random generator) is
:meth:`Codec.state` / :meth:`Codec.load` for checkpoints, per rank.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from real import checkpoint as ckpt
from schedules.dp.codecs import SCALE_BYTES, Compression, parse_compression

__all__ = ["PROFILED", "Codec", "Pending", "codec_state", "dequantize", "load_codec", "make_codec", "profile_codecs",
           "quantize"]

log = logging.getLogger(__name__)

INT8_MAX = 127


def quantize(x: torch.Tensor, chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scales) of ``x`` in ``chunks`` equal chunks, each by its absmax (module doc)."""
    rows = x.view(chunks, -1)
    scales = rows.abs().amax(dim=1) / INT8_MAX
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(rows / safe[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.view(-1), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return (q.view(scales.numel(), -1).float() * scales[:, None]).view(-1)


def _pack(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Chunk j as ``[4 bytes of its float32 scale][its int8 values]``: one int8 buffer of p (4 + c)."""
    p = scales.numel()
    return torch.cat([scales.contiguous().view(torch.int8).view(p, SCALE_BYTES), q.view(p, -1)], dim=1).view(-1)


def _unpack(buf: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = buf.view(p, -1)
    return rows[:, SCALE_BYTES:].contiguous().view(-1), rows[:, :SCALE_BYTES].contiguous().view(torch.float32).view(-1)


class Pending:
    """A compressed collective in flight: ``is_completed`` / ``wait`` as a ``dist.Work``; ``wait`` finishes it."""

    def __init__(self, nbytes: int, finish: Callable[[], Any]) -> None:
        self.nbytes, self._finish, self._finished = nbytes, finish, False

    def is_completed(self) -> bool:
        """Finished; a collective with work left after it (a copy back, a second phase) only once waited for,
        so that every rank takes its next step (and issues its next collective) in program order."""
        return self._finished

    def wait(self) -> bool:
        if not self._finished:
            self._finish()
            self._finished = True
        return True


class _HookBucket:
    """What torch's PowerSGD hook reads of a ``dist.GradBucket``."""

    def __init__(self, index: int, flat: torch.Tensor, grads: list[torch.Tensor], last: bool) -> None:
        self._index, self._flat, self._grads, self._last = index, flat, grads, last

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._flat

    def gradients(self) -> list[torch.Tensor]:
        return self._grads

    def is_last(self) -> bool:
        return self._last


class Codec:
    """One rank's codec of ``comp`` over ``group``; ``sizes``: each bucket's key (``s{stage}b{index}``) and its
    padded number of elements."""

    def __init__(self, comp: Compression, group: dist.ProcessGroup, sizes: dict[str, int]) -> None:
        self.comp, self.group = comp, group
        self.world = dist.get_world_size(group)
        self.sizes = sizes
        self.keys = list(sizes)
        self.residual: dict[str, torch.Tensor] = {}  # int8: this rank's error per bucket
        self.owner_residual: dict[str, torch.Tensor] = {}  # int8 all-reduce: the error of the chunk it sums
        # codec compute on the training thread since the sync last logged it: int8's all of it; fp16/bf16's cast
        # and PowerSGD's whole hook (its collectives included) are in the hook call, timed there
        self.seconds = 0.0
        self.psgd: Any = None
        if comp.codec == "powersgd":
            self.psgd = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=comp.rank,
                                                    start_powerSGD_iter=2, use_error_feedback=True, warm_start=True,
                                                    random_seed=0)
            self.psgd.start_powerSGD_iter = 0  # fixed buckets: see the module doc

    # --- all-reduce (sync, ddp) ------------------------------------------------------------------------
    def allreduce(self, key: str, flat: torch.Tensor, grads: list[torch.Tensor]) -> Pending:
        """Average ``flat`` (``grads``: its parameters' views, for powersgd) over the group, compressed."""
        if self.comp.codec in ("fp16", "bf16"):
            hook = default_hooks.fp16_compress_hook if self.comp.codec == "fp16" else default_hooks.bf16_compress_hook
            t0 = time.perf_counter()
            fut = hook(self.group, (flat,))
            self.seconds += time.perf_counter() - t0
            return Pending(2 * flat.numel(), fut.wait)
        if self.comp.codec == "int8":
            return self._int8(key, flat, None)
        return self._powersgd(key, flat, grads)

    def _powersgd(self, key: str, flat: torch.Tensor, grads: list[torch.Tensor]) -> Pending:
        state = self.psgd
        before = state.total_numel_after_compression
        index = self.keys.index(key)
        t0 = time.perf_counter()
        powerSGD_hook.powerSGD_hook(state, _HookBucket(index, flat, grads, index == len(self.keys) - 1)).wait()
        self.seconds += time.perf_counter() - t0
        sent = (state.total_numel_after_compression - before) * flat.element_size()
        return Pending(sent, lambda: None)

    # --- reduce-scatter (zero1, zero2, zero3) -----------------------------------------------------------
    def reduce_scatter(self, key: str, flat: torch.Tensor, out: torch.Tensor) -> Pending:
        """This rank's shard of the average of ``flat`` into ``out`` (len(flat) / world elements)."""
        if self.comp.codec == "int8":
            return self._int8(key, flat, out)
        dtype = torch.float16 if self.comp.codec == "fp16" else torch.bfloat16
        t0 = time.perf_counter()
        small = flat.to(dtype).div_(self.world)  # as torch's _compress_hook: cast, then divide
        small_out = torch.empty(out.numel(), dtype=dtype, device=out.device)
        self.seconds += time.perf_counter() - t0
        work = dist.reduce_scatter_single(small_out, small, group=self.group, async_op=True)
        return Pending(small.numel() * small.element_size(), lambda: (work.wait(), out.copy_(small_out)))

    # --- int8 ---------------------------------------------------------------------------------------
    def _int8(self, key: str, flat: torch.Tensor, shard_out: torch.Tensor | None) -> Pending:
        t0 = time.perf_counter()
        p = self.world
        res = self.residual.setdefault(key, torch.zeros_like(flat))
        x = flat + res
        q, scales = quantize(x, p)
        res.copy_(x - dequantize(q, scales))
        packed = _pack(q, scales)
        got = torch.empty_like(packed)
        self.seconds += time.perf_counter() - t0
        work = dist.all_to_all_single(got, packed, group=self.group, async_op=True)

        def finish() -> None:
            work.wait()
            t1 = time.perf_counter()
            vals, sc = _unpack(got, p)
            mean = dequantize(vals, sc).view(p, -1).sum(dim=0).div_(p)  # float32: the sum of p int8 chunks
            if shard_out is not None:
                shard_out.copy_(mean)
                self.seconds += time.perf_counter() - t1
                return
            self.seconds += time.perf_counter() - t1
            self._int8_gather(key, flat, mean)

        return Pending(packed.numel(), finish)

    def _int8_gather(self, key: str, flat: torch.Tensor, mean: torch.Tensor) -> None:
        """Re-quantize this rank's averaged chunk (with its own residual) and all-gather every chunk into ``flat``."""
        t0 = time.perf_counter()
        own = self.owner_residual.setdefault(key, torch.zeros_like(mean))
        y = mean + own
        q, scale = quantize(y, 1)
        own.copy_(y - dequantize(q, scale))
        mine = _pack(q, scale)
        whole = torch.empty(mine.numel() * self.world, dtype=torch.int8, device=flat.device)
        self.seconds += time.perf_counter() - t0
        dist.all_gather_single(whole, mine, group=self.group)
        t1 = time.perf_counter()
        vals, sc = _unpack(whole, self.world)
        flat.copy_(dequantize(vals, sc))
        self.seconds += time.perf_counter() - t1

    # --- checkpoints ----------------------------------------------------------------------------------
    def state(self) -> dict[str, torch.Tensor]:
        """This rank's codec state as tensors (names without the rank prefix)."""
        out: dict[str, torch.Tensor] = {"world": torch.tensor([self.world], dtype=torch.int64)}
        for name, d in (("residual", self.residual), ("owner_residual", self.owner_residual)):
            out.update({f"{k}.{name}": t.clone() for k, t in d.items()})
        s = self.psgd
        if s is not None:
            for name, d in (("error", s.error_dict), ("p", s.p_memory_dict), ("q", s.q_memory_dict)):
                out.update({f"{self.keys[i]}.{name}": t.clone() for i, t in d.items()})
            _, mt, pos, has_gauss, gauss = s.rng.get_state()
            out["powersgd.iter"] = torch.tensor([s.iter], dtype=torch.int64)
            out["powersgd.rng_key"] = torch.from_numpy(mt.astype(np.int64))
            out["powersgd.rng_rest"] = torch.tensor([pos, has_gauss], dtype=torch.int64)
            out["powersgd.rng_gauss"] = torch.tensor([gauss], dtype=torch.float64)
        return out

    def fits(self, state: dict[str, torch.Tensor]) -> bool:
        """Whether ``state`` was saved by this codec's group size and buckets (residuals and errors of their sizes)."""
        if "world" in state and int(state["world"][0]) != self.world:
            return False
        want = {"residual": 1, "owner_residual": self.world, "error": 1}
        for name, t in state.items():
            key, _, kind = name.partition(".")
            if kind in want and (key not in self.sizes or t.numel() != self.sizes[key] // want[kind]):
                return False
        return True

    def load(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`state` saved (missing names: that state starts afresh, as on a first step); a state
        of another group size or other buckets is left out whole, with a warning."""
        if not self.fits(state):
            log.warning("the checkpoint's %s codec state is of another dp or other buckets; it starts afresh",
                        self.comp.spec)
            return
        for name, d in (("residual", self.residual), ("owner_residual", self.owner_residual)):
            for k in self.keys:
                if f"{k}.{name}" in state:
                    d[k] = state[f"{k}.{name}"].clone()
        s = self.psgd
        if s is None or "powersgd.iter" not in state:
            return
        for name, d in (("error", s.error_dict), ("p", s.p_memory_dict), ("q", s.q_memory_dict)):
            for i, k in enumerate(self.keys):
                if f"{k}.{name}" in state:
                    d[i] = state[f"{k}.{name}"].clone()
        s.iter = int(state["powersgd.iter"][0])
        pos, has_gauss = (int(v) for v in state["powersgd.rng_rest"])
        s.rng.set_state(("MT19937", state["powersgd.rng_key"].numpy().astype(np.uint32), pos, has_gauss,
                         float(state["powersgd.rng_gauss"][0])))


def codec_state(codec: Codec, rank: int) -> dict[str, torch.Tensor]:
    """``codec``'s state under checkpoint names of global rank ``rank`` (``codec.rank{r}.{name}``)."""
    return {f"codec.rank{rank}.{k}": v for k, v in codec.state().items()}


def load_codec(restored: ckpt.Restored, codec: Codec, rank: int) -> None:
    """Load this rank's codec state from ``restored`` (what it holds of it: a run saved without this codec
    or at another dp starts the codec afresh)."""
    prefix = f"codec.rank{rank}."
    meta = ckpt.read_metadata(restored.path).state_dict_metadata
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items() if k.startswith(prefix)}
    if not state:
        log.info("rank %d: the checkpoint holds no %s codec state; it starts afresh", rank, codec.comp.spec)
        return
    ckpt.load_state(restored, state, rank)
    codec.load({k[len(prefix):]: v for k, v in state.items()})


PROFILED = ("fp16", "bf16", "int8", "powersgd:1", "powersgd:4")


def profile_codecs(shapes: list[tuple[int, ...]], *, warmup: int = 2, reps: int = 5,
                   specs: tuple[str, ...] = PROFILED, device: torch.device | None = None) -> dict[str, float]:
    """Nanoseconds per gradient element of each codec's compress and decompress, on this process alone.

    One bucket of parameters of ``shapes`` on ``device`` (default the CPU), its codec's all-reduce on a group
    of this process only (so the collectives move nothing), less the plain all-reduce's time on that group;
    the median of ``reps``.
    Every rank of a process group calls it at once (each builds the one-process groups), or none is
    initialized. This is what ``parallel.codec_ns_per_param`` of the simulator takes.
    """
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        solo = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
        flat = torch.randn(sum(math.prod(s) for s in shapes), generator=torch.Generator().manual_seed(0)).to(device)
        plain = _median_seconds(lambda x, _: dist.all_reduce(x, group=solo), flat, shapes, warmup, reps)
        out = {}
        for spec in specs:
            codec = Codec(parse_compression(spec), solo, {"s0b0": flat.numel()})
            t = _median_seconds(lambda x, g, c=codec: c.allreduce("s0b0", x, g).wait(), flat, shapes, warmup, reps)
            out[spec] = max(t - plain, 0.0) / flat.numel() * 1e9
        return out
    finally:
        if own:
            dist.destroy_process_group()


def _median_seconds(fn: Callable[[torch.Tensor, list[torch.Tensor]], object], flat: torch.Tensor,
                    shapes: list[tuple[int, ...]], warmup: int, reps: int) -> float:
    times = []
    for i in range(warmup + reps):
        x = flat.clone()
        grads, offset = [], 0
        for s in shapes:
            grads.append(x[offset:offset + math.prod(s)].view(s))
            offset += math.prod(s)
        _sync(x.device)
        t0 = time.perf_counter()
        fn(x, grads)
        _sync(x.device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_codec(comp: Compression, group: dist.ProcessGroup, sizes: dict[str, int]) -> Codec | None:
    """The codec of ``comp`` for buckets of ``sizes`` (None for ``none``: the plain collectives)."""
    return None if comp.exact else Codec(comp, group, sizes)
