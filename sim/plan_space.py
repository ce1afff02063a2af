"""The planner's search space: every valid configuration of a model on a cluster at a fixed global batch.

A configuration (:class:`PlanConfig`) is tensor degree ``tp`` (a divisor of the
devices per node that also divides what tensor parallelism splits: heads, K/V
heads, hidden size, FFN), pipeline degree ``pp`` (the layers split as evenly
as possible over ``pp * chunks`` stages, extra layers first, or with two stages more than layers the
first and the last holding only the embedding and the output; counts that do
not divide are allowed), data degree ``dp = devices / (tp * pp)``, a registered
schedule with its chunks ``v`` (the choices in ``chunks`` for schedules that
take several, the fixed count for V-shaped ones, 1 for the rest), a
microbatch size ``b`` and count ``m`` with ``dp * b * m = global batch``, a
data-parallel mode (one of ``dp_modes``; ``none`` when ``dp = 1``, where they
all coincide), recomputation and sequence parallelism (only with ``tp > 1``).

A shape (schedule, pp, m, v) is valid when the schedule's generator takes it;
:func:`shape_ok` knows the registered generators' rules (checked against
``build`` in the tests) and builds the schedule for any other one.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from schedules import ScheduleError, build, names, spec
from schedules.dp import DP_MODES
from schedules.errors import ConfigError, check_choice, check_positive, check_positive_ints, quote
from schedules.registry import MAX_TASKS, TASKS_PER_PASS
from sim.cluster import Cluster
from sim.gpu_model import RECOMPUTE_MODES
from sim.network import LINK_MODELS
from sim.recompute_modes import check_recompute
from sim.transformer import TransformerConfig

__all__ = ["PLAN_DP_MODES", "PlanConfig", "PlanSpace", "enumerate_configs", "shape_ok", "tp_choices"]

PLAN_DP_MODES = ("ddp", "zero1", "zero2", "fsdp")


class PlanConfig(NamedTuple):
    """One point of the search space (field names as in the ``--json`` output)."""

    tp: int
    pp: int
    dp: int
    schedule: str
    chunks: int
    microbatch_size: int
    microbatches: int
    dp_mode: str
    recompute: str
    sp: bool

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    def label(self) -> str:
        sp = "+sp" if self.sp else ""
        v = f" v{self.chunks}" if self.chunks > 1 else ""
        return (f"tp{self.tp}{sp} pp{self.pp} dp{self.dp} {self.schedule}{v} m{self.microbatches}x{self.microbatch_size} "
                f"{self.dp_mode} rc-{self.recompute}")


@dataclass(frozen=True, kw_only=True)
class PlanSpace:
    """What to search: the model, the cluster, the global batch (sequences) and the choices per dimension.

    ``memory_limit`` is bytes per device (None: the device's capacity).
    ``chunks`` are the stage counts per rank tried for schedules that take
    several; ``microbatch_sizes`` None tries every divisor of the batch per
    replica. ``schedules`` None is every registered schedule except the
    adaptive ones (zb-auto): an adaptive schedule is a search of its own,
    rebuilt for every set of pass times (each (tp, sp, b, recompute)), and
    its memory is known only once built; name it to include it.
    """

    model: TransformerConfig
    cluster: Cluster
    global_batch: int
    memory_limit: float | None = None
    schedules: tuple[str, ...] | None = None
    chunks: tuple[int, ...] = (2, 3, 4, 8)  # 8: one layer per virtual stage, as Llama 3 405B was trained
    microbatch_sizes: tuple[int, ...] | None = None
    dp_modes: tuple[str, ...] = PLAN_DP_MODES
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    sp: tuple[bool, ...] = (False, True)
    tp: tuple[int, ...] | None = None  # None: every valid divisor
    pp: tuple[int, ...] | None = None  # None: every valid divisor
    bucket_mb: float | None = None  # None: one transformer layer's 16-bit weights per tensor shard, at least 25 MiB
    link_model: str = "fair"  # how transfers share a port in the simulations (sim.network)

    def bucket_for(self, tp: int) -> float:
        """Gradient/parameter bucket in MiB. By default one layer per bucket, as FSDP wraps each transformer block
        (torchtitan does), and never under PyTorch DDP's 25 MiB; a 405B stage in 25 MiB buckets would be thousands
        of collectives per pass."""
        if self.bucket_mb is not None:
            return self.bucket_mb
        return max(25.0, 2.0 * self.model.layer_params / tp / 2**20)

    def __post_init__(self) -> None:
        check_positive_ints("plan", global_batch=self.global_batch)
        if self.memory_limit is not None:
            check_positive("plan", "memory_limit", self.memory_limit, " bytes")
        for name in self.schedule_names:
            spec(name)
        for v in self.chunks:
            check_positive_ints("plan", chunks=v)
        for b in self.microbatch_sizes or ():
            check_positive_ints("plan", microbatch_size=b)
        for mode in self.dp_modes:
            check_choice("plan", "dp_mode", mode, [m for m in DP_MODES if m not in ("none", "sync", "ps")])
        for r in self.recompute:
            check_recompute("plan", r)
        if self.bucket_mb is not None:
            check_positive("plan", "bucket_mb", self.bucket_mb, " MiB")
        check_choice("plan", "link_model", self.link_model, LINK_MODELS)
        for value in (*(self.tp or ()), *(self.pp or ())):
            check_positive_ints("plan", degree=value)
        if not (self.chunks and self.dp_modes and self.recompute and self.sp):
            raise ConfigError("plan: chunks, dp_modes, recompute and sp each need at least one choice", field="plan")

    @property
    def schedule_names(self) -> tuple[str, ...]:
        if self.schedules is not None:
            return tuple(spec(n).name for n in self.schedules)
        return tuple(n for n in names(by_family=True) if not spec(n).adaptive)

    @property
    def devices(self) -> int:
        return self.cluster.num_devices

    @property
    def capacity(self) -> float:
        return self.cluster.spec.memory_bytes if self.memory_limit is None else self.memory_limit


def tp_choices(model: TransformerConfig, cluster: Cluster) -> list[int]:
    """Tensor degrees that keep a group inside a node and divide what they split (as ParallelConfig.check_tp)."""
    per_node = math.gcd(*Counter(d.node for d in cluster.devices).values())
    sizes = [model.heads, model.kv_heads, model.hidden, model.ffn, per_node]
    return [t for t in range(1, per_node + 1) if all(n % t == 0 for n in sizes)]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def chunk_choices(name: str, chunks: Sequence[int]) -> tuple[int, ...]:
    sp = spec(name)
    if sp.fixed_chunks is not None:
        return (sp.fixed_chunks,)
    if sp.multi_chunk:
        return tuple(sorted({v for v in chunks if v >= 2}))
    return (1,)


# The registered generators' own rules (each raises ScheduleError otherwise); tests/test_plan.py checks this
# table against build() over a grid of shapes, so a generator that changes its rules fails there.
_RULES = {
    "interleaved-1f1b": lambda pp, m, v: m % pp == 0,
    "interleaved-zb": lambda pp, m, v: m % pp == 0,
    "dualpipe-v": lambda pp, m, v: m >= 2 * pp,
}
_FREE = frozenset({"gpipe", "1f1b", "looped-bfs", "zb-h1", "zb-v", "zb-h2", "zb-auto"})


@lru_cache(maxsize=65536)
def shape_ok(name: str, pp: int, m: int, v: int) -> bool:
    """Whether ``build(name, pp=pp, microbatches=m, chunks=v)`` succeeds (without building when the rule is known)."""
    if TASKS_PER_PASS * pp * v * m > MAX_TASKS:
        return False
    rule = _RULES.get(name)
    if rule is not None:
        return bool(rule(pp, m, v))
    if name in _FREE:
        return True
    try:
        build(name, pp=pp, microbatches=m, chunks=v)
    except ScheduleError:
        return False
    return True


def enumerate_configs(space: PlanSpace) -> Iterator[PlanConfig]:
    """Every valid configuration of ``space``, in a fixed order."""
    model, devices, batch = space.model, space.devices, space.global_batch
    tps = tp_choices(model, space.cluster)
    if space.tp is not None:
        tps = [t for t in tps if t in space.tp]
    for tp in tps:
        for pp in _divisors(devices // tp) if devices % tp == 0 else ():
            if space.pp is not None and pp not in space.pp:
                continue
            dp = devices // (tp * pp)
            if batch % dp:
                continue
            per_replica = batch // dp
            sizes = _divisors(per_replica) if space.microbatch_sizes is None else \
                [b for b in space.microbatch_sizes if per_replica % b == 0]
            modes = ("none",) if dp == 1 else space.dp_modes
            sps = (False,) if tp == 1 else space.sp
            for name in space.schedule_names:
                for v in chunk_choices(name, space.chunks):
                    if pp * v > model.layers and pp * v != model.layers + 2:  # +2: embedding, output alone
                        continue
                    for b in sizes:
                        m = per_replica // b
                        if not shape_ok(name, pp, m, v):
                            continue
                        for mode in modes:
                            for rc in space.recompute:
                                for sp in sps:
                                    yield PlanConfig(tp, pp, dp, name, v, b, m, mode, rc, sp)


def describe_space(space: PlanSpace) -> str:
    return (f"{space.model.name} on {space.cluster.name} ({space.devices} x {space.cluster.spec.name}), "
            f"global batch {space.global_batch} x {space.model.seq_len} tokens, "
            f"memory limit {space.capacity / 1e9:g} GB per device; schedules {', '.join(space.schedule_names)}; "
            f"chunks {quote(list(space.chunks))}")
