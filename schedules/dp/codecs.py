"""Gradient compression of the data-parallel gradient collectives, defined once: the codecs and their bytes.

``grad_compression`` is one of ``none``, ``fp16``, ``bf16``, ``int8`` or ``powersgd:R`` (R >= 1, the rank
of the approximation). The runtime executes it (:mod:`real.dp.compress`), the simulator charges its bytes
(:mod:`sim.costs.transformer_costs`); both take the bytes from the functions here, so what the trace counts and
what the IR predicts are one formula.

Only ``none`` is exact. ``fp16`` and ``bf16`` round every gradient to 16 bits before the sum (torch's
``fp16_compress_hook`` / ``bf16_compress_hook``: divide by the group size, cast, all-reduce, cast back):
the sum of the rounded values is not the sum of the values, so these change the mathematics as the lossy
codecs do, only less. ``int8`` and ``powersgd`` carry error feedback (what one step's compression lost is
added to the next step's gradient), so the error is delayed, not dropped.

Bytes of one bucket's gradient collective (``buffer_bytes``): the size of the buffers handed to the
collectives, the ``n`` of the alpha-beta formulas of :mod:`sim.costs.collectives`. The runtime's bucket holds
``padded`` elements (a multiple of the group size ``p``) of 4-byte gradients:

* ``none``: ``4 padded``; ``fp16`` / ``bf16``: ``2 padded``;
* ``int8``: the bucket in ``p`` chunks of ``c = padded / p``, each chunk one byte per element and its
  float32 absmax scale: ``p (c + 4) = padded + 4 p``. An all-reduce is an all-to-all of the packed chunks
  (each rank sums the chunk it owns, in float32) and an all-gather of the re-quantized sums: ring
  traffic ``2 (p-1)/p`` of that, the ring all-reduce's; a reduce-scatter (the ZeRO modes) is the
  all-to-all alone;
* ``powersgd:R`` (all-reduce only): torch's ``powerSGD_hook`` sends a matrix of ``n`` x ``m``
  (a parameter viewed as ``shape[0]`` x the rest) as the factors P (n x r) and Q (m x r), ``r = min(n, m, R)``,
  when ``2 (n + m) r < n m`` (its ``min_compression_rate`` 2), and every other tensor (vectors) whole,
  padding excluded: ``4 (sum of (n + m) r + the uncompressed elements)``, in three all-reduces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from common import parse
from common.errors import ConfigError, quote

__all__ = ["CODECS", "Compression", "buffer_bytes", "check_dp_mode", "parse_compression", "powersgd_messages",
           "powersgd_split"]

CODECS = ("none", "fp16", "bf16", "int8", "powersgd:R")
REDUCE_MODES = ("sync", "ddp")  # all-reduce of whole buckets
SCATTER_MODES = ("zero1", "zero2", "zero3", "fsdp")  # reduce-scatter into shards
MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default: compress a matrix only if it shrinks at least 2x
#: The largest PowerSGD rank taken (a matrix of n x m is compressed at rank min(n, m, R) at most).
MAX_POWERSGD_RANK = 2**20
SCALE_BYTES = 4  # int8: one float32 absmax scale per chunk


@dataclass(frozen=True, slots=True)
class Compression:
    """A parsed ``grad_compression``: the codec and, for powersgd, the rank."""

    codec: str = "none"
    rank: int = 0

    @property
    def spec(self) -> str:
        return f"powersgd:{self.rank}" if self.codec == "powersgd" else self.codec

    @property
    def exact(self) -> bool:
        """Whether the reduced gradient is the exact sum (only ``none``)."""
        return self.codec == "none"


def parse_compression(spec: object) -> Compression:
    """``none``, ``fp16``, ``bf16``, ``int8`` or ``powersgd:R`` -> :class:`Compression`; ConfigError otherwise."""
    text = spec.strip().lower() if isinstance(spec, str) else None
    if text in ("none", "fp16", "bf16", "int8"):
        return Compression(text)
    rank = parse.int_text(text[9:]) if text is not None and text.startswith("powersgd:") else None
    if rank is not None and 1 <= rank <= MAX_POWERSGD_RANK:
        return Compression("powersgd", rank)
    raise ConfigError(f"unknown grad compression {quote(spec)}; valid: {', '.join(CODECS)} (R a rank from 1 to "
                      f"{MAX_POWERSGD_RANK:,} (2^20), e.g. powersgd:2)", field="grad_compression")


def check_dp_mode(comp: Compression, dp_mode: str) -> None:
    """Refuse a codec where the mode has no gradient collective it applies to (ConfigError, one line)."""
    if comp.exact:
        return
    if dp_mode not in (*REDUCE_MODES, *SCATTER_MODES):
        raise ConfigError(f"grad compression {comp.spec} applies to the gradient collectives of "
                          f"{', '.join((*REDUCE_MODES, *SCATTER_MODES))}, not dp mode {dp_mode!r}; use one of them "
                          "or grad compression none", field="grad_compression")
    if comp.codec == "powersgd" and dp_mode in SCATTER_MODES:
        raise ConfigError(f"grad compression {comp.spec} needs whole gradients (its factors are all-reduced), "
                          f"dp mode {dp_mode} reduce-scatters shards; use dp mode ddp or sync, or fp16, bf16 "
                          "or int8", field="grad_compression")


def powersgd_split(shapes: Sequence[tuple[int, ...]], rank: int) -> tuple[int, int]:
    """(elements of the P and Q factors, elements sent whole) of tensors of ``shapes`` (torch's rule:
    :func:`powersgd_messages`)."""
    whole, p, q = powersgd_messages(shapes, rank)
    return p + q, whole


def powersgd_messages(shapes: Sequence[tuple[int, ...]], rank: int) -> tuple[int, int, int]:
    """Elements of the three all-reduces of one bucket's PowerSGD hook (torch's ``powerSGD_hook``, 2.13), in the
    order it issues them: the tensors sent whole, P (``n r`` of each matrix compressed) and Q (``m r``)."""
    whole = p = q = 0
    for shape in shapes:
        n = shape[0] if shape else 1
        m = math.prod(shape[1:]) if len(shape) > 1 else 1
        r = min(n, m, rank)
        if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
            p, q = p + n * r, q + m * r
        else:
            whole += n * m
    return whole, p, q


def buffer_bytes(comp: Compression, *, reduce: bool, padded: int, world: int,
                 shapes: Sequence[tuple[int, ...]] = (), elem_bytes: int = 4) -> int:
    """Bytes of one bucket's gradient collective (module doc): an all-reduce (``reduce``) or a reduce-scatter
    of a bucket of ``padded`` elements over ``world`` ranks; ``shapes``: its parameters' (powersgd)."""
    if comp.codec == "none":
        return elem_bytes * padded
    if comp.codec in ("fp16", "bf16"):
        return 2 * padded
    if comp.codec == "int8":
        return padded + SCALE_BYTES * world
    if not reduce:
        raise ValueError("powersgd has no reduce-scatter")
    factors, whole = powersgd_split(shapes, comp.rank)
    return elem_bytes * (factors + whole)
