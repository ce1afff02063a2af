"""Gradient compression in the simulator: a gradient collective's bytes and the codec's time.

The codecs and their bytes are :mod:`schedules.dp.codecs`'s. The simulator's buckets are 16-bit
gradients cut by bytes, not by parameter (``TransformerCosts.bucket_size``), so:

* ``fp16`` / ``bf16``: 2 bytes per element (also when ``reduce_dtype`` is fp32);
* ``int8``: 1 byte per element plus a 4-byte scale per chunk, one chunk per rank of the dp group;
* ``powersgd:R``: the stage's ratio of (P and Q factors + tensors sent whole) to its elements, from the
  shapes of its parameters (torch's rule per tensor, :func:`schedules.dp.codecs.powersgd_split`),
  applied to each of its buckets alike, in the reduction's dtype (the factors are the gradient's
  dtype). The shapes are at tp 1: with tensor parallelism a shard's (n + m) R shrinks less than its n m,
  which this ratio does not follow.

The codec's own compute (compress and decompress) stretches the collective by ``codec_ns_per_param``
nanoseconds per gradient element of the bucket (0 unless profiled: the ``codecs`` section of
``python -m real.profile``), in its latency (the part of its duration that moves no bytes), so a shared link's flows are unchanged.
"""

from __future__ import annotations

import math
from functools import lru_cache

from schedules.dp.codecs import Compression, powersgd_split
from sim.costs.transformer import TransformerConfig

__all__ = ["compressed_bytes", "layer_shapes", "powersgd_ratio", "stage_shapes"]


def layer_shapes(m: TransformerConfig) -> list[tuple[int, ...]]:
    """The parameters of one transformer layer (fused QKV as Megatron-LM and nanoGPT hold it)."""
    h, f, kv = m.hidden, m.ffn, m.kv_hidden
    mats = [(h + 2 * kv, h), (h, h)] + ([(f, h), (f, h), (h, f)] if m.gated_mlp else [(f, h), (h, f)])
    if not m.bias:
        return [*mats, (h,), (h,)]
    return [*mats, (h + 2 * kv,), (h,), (f,), (h,), (h,), (h,), (h,), (h,)]


def stage_shapes(m: TransformerConfig, layers: int, first: bool, last: bool, split: bool) -> list[tuple[int, ...]]:
    """A stage's parameters, as ``TransformerCosts.params_of`` counts them."""
    shapes = layer_shapes(m) * layers
    if first:
        shapes += [(m.vocab, m.hidden)] * (1 if m.tied_embeddings else 2)
        shapes += [(m.seq_len, m.hidden)] if m.learned_positions else []
    if last:
        shapes += [(m.hidden,), (m.hidden,)] + ([(m.vocab, m.hidden)] if split else [])
    return shapes


@lru_cache(maxsize=256)
def powersgd_ratio(m: TransformerConfig, layers: int, first: bool, last: bool, split: bool, rank: int) -> float:
    """Elements PowerSGD sends per element of the stage's gradient."""
    shapes = stage_shapes(m, layers, first, last, split)
    factors, whole = powersgd_split(shapes, rank)
    return (factors + whole) / sum(math.prod(s) for s in shapes)


def compressed_bytes(comp: Compression, n16: float, elem_bytes: int, world: int, ratio: float) -> float:
    """Bytes of a gradient reduction of a bucket of ``n16`` 16-bit bytes (``n16 / 2`` elements) under ``comp``;
    ``elem_bytes``: the uncompressed reduction's bytes per element; ``ratio``: the stage's :func:`powersgd_ratio`."""
    elements = n16 / 2
    if comp.codec in ("fp16", "bf16"):
        return 2 * elements
    if comp.codec == "int8":
        return elements + 4 * world
    if comp.codec == "powersgd":
        return elem_bytes * elements * ratio
    return elem_bytes * elements
