"""The bytes a step's gradient collectives should send under a codec, from a model's parameter shapes alone.

The prediction the runtime's measured bytes are checked against (tests, ``experiments/compression_loss.py``):
the runtime's buckets (:func:`real.dp.sync.make_buckets`: parameters in reverse order, cut at the cap, padded to a
multiple of the group) and each bucket's bytes from :func:`schedules.dp.codecs.buffer_bytes`. Nothing here
reads what a run sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from real.dp.sync import make_buckets
from schedules.dp.codecs import SCATTER_MODES, Compression, buffer_bytes

__all__ = ["predicted_step_bytes"]


def predicted_step_bytes(comp: Compression, stage_shapes: Mapping[int, Sequence[tuple[int, ...]]], *, mode: str,
                         bucket_mb: float, world: int, reductions: int = 1) -> int:
    """Bytes of one rank's gradient collectives in a step: its stages' buckets, each reduced ``reductions`` times
    (zero2/zero3: once per gradient pass, i.e. per microbatch; the other modes once)."""
    total = 0
    for shapes in stage_shapes.values():
        params = [torch.empty(s, device="meta") for s in shapes]
        for bucket in make_buckets(params, bucket_mb * 2**20):
            n = sum(p.numel() for p in bucket)
            padded = -(-n // world) * world
            total += buffer_bytes(comp, reduce=mode not in SCATTER_MODES, padded=padded, world=world,
                                  shapes=[tuple(p.shape) for p in bucket])
    return total * (reductions if mode in ("zero2", "zero3", "fsdp") else 1)
