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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from common import parse
from common.errors import ConfigError, check_choice, check_positive, check_positive_ints, choice, quote
from schedules import ScheduleError, build, names, spec
from schedules.dp.codecs import check_dp_mode, parse_compression
from schedules.registry import MAX_TASKS, TASKS_PER_PASS, canonical_name
from sim.costs.cluster import Cluster
from sim.costs.gpu_model import RECOMPUTE_MODES
from sim.costs.recompute_modes import check_recompute
from sim.costs.transformer import TransformerConfig
from sim.network import LINK_MODELS

__all__ = ["ACCUMULATION", "EXPERT_OVERLAP", "MAX_GLOBAL_BATCH", "MAX_MICROBATCHES", "NO_PIPELINE", "PLAN_DP_MODES",
           "PlanConfig", "PlanSpace", "enumerate_configs", "ep_choices",
           "shape_ok", "tp_choices", "why_empty"]

#: The data-parallel modes the planner searches by default: every exact mode the runtime runs (``real/``), ``zero3``
#: under its FSDP name (``schedules.dp.modes``'s alias: ``zero3`` is read as ``fsdp``). ``none`` is what every mode is at
#: dp = 1. ``ps`` is searched when named (it needs parameter servers: a cluster such as ``dgx-h100:2+ps2``).
#: async-ps, decentralized and local SGD change the mathematics: they are compared by time to a loss
#: (schedlab compare --time-to-loss), not planned by step time.
PLAN_DP_MODES = ("sync", "ddp", "zero1", "zero2", "fsdp")
_PLANNABLE = (*PLAN_DP_MODES, "ps")
_PLAN_ALIASES = {"zero3": "fsdp"}
# Microbatches per step the planner tries at most: twice the most the 405B example's top five use (512 x 1). Each
# one more is seven tasks per stage to build, bound and simulate: with 4096, a batch of 10^8 sequences on one node
# had not finished after 4.5 minutes (schedules of ~10^6 tasks); with 1024 it takes ~12 s (gpt-tiny, dgx-h100:1,
# 1 worker, 2 busy cores).
MAX_MICROBATCHES = 1024
MAX_GLOBAL_BATCH = 2**40  # sequences per step: 10^12, beyond any real run (Llama 3 405B: 2,048 of 8,192 tokens)


#: At pp = 1 there is no pipeline: the one rank runs each microbatch's forward and backward in turn and accumulates
#: the gradients, which is what torchtitan and Megatron-LM run without pipeline parallelism, and 1F1B's order on one
#: rank (:data:`ACCUMULATION`). The planner searches that order alone there and names it :data:`NO_PIPELINE` in its
#: table, labels, ``--json`` and exports: a pipeline schedule at pp = 1 (interleaved chunks, an I/W split, GPipe's
#: all-forwards-first) is something no trainer runs.
NO_PIPELINE = "no-pipeline"
ACCUMULATION = "1f1b"


class PlanConfig(NamedTuple):
    """One point of the search space (field names as in the ``--json`` output).

    At pp = 1, ``schedule`` is :data:`ACCUMULATION` (the order simulated) and ``chunks`` 1; the label and
    :meth:`to_dict` say :data:`NO_PIPELINE`.
    """

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
    ep: int = 1  # expert parallelism (a MoE model): the routed experts over ep of the dp ranks

    @property
    def pipeline(self) -> str:
        """The schedule's name as the output gives it: :data:`NO_PIPELINE` for the accumulation loop at pp = 1."""
        return NO_PIPELINE if self.pp == 1 and self.schedule == ACCUMULATION else self.schedule

    def to_dict(self) -> dict[str, Any]:
        return {**self._asdict(), "schedule": self.pipeline}

    def label(self) -> str:
        sp = "+sp" if self.sp else ""
        v = f" v{self.chunks}" if self.chunks > 1 else ""
        ep = f" ep{self.ep}" if self.ep > 1 else ""
        return (f"tp{self.tp}{sp} pp{self.pp} dp{self.dp}{ep} {self.pipeline}{v} m{self.microbatches}x{self.microbatch_size} "
                f"{self.dp_mode} rc-{self.recompute}")


#: Schedules whose overlapped pairs pay only by hiding expert all-to-alls (a dense model's pair costs its two
#: passes): searched by default for a MoE model with ep > 1 among its choices; named, they are searched for any.
EXPERT_OVERLAP = frozenset({"combined-1f1b"})


@dataclass(frozen=True, kw_only=True)
class PlanSpace:
    """What to search: the model, the cluster, the global batch (sequences) and the choices per dimension.

    ``memory_limit`` is bytes per device (None: the device's capacity).
    ``chunks`` are the stage counts per rank tried for schedules that take
    several; ``microbatch_sizes`` None tries every divisor of the batch per
    replica; sizes that leave more than :data:`MAX_MICROBATCHES` microbatches
    are not tried. ``schedules`` None is every registered schedule except the
    adaptive ones (zb-auto): an adaptive schedule is a search of its own,
    rebuilt for every set of pass times (each (tp, sp, b, recompute)), and
    its memory is known only once built; name it to include it. A dense
    model's default leaves out :data:`EXPERT_OVERLAP` too.
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
    ep: tuple[int, ...] | None = None  # None: a MoE model's every ep dividing dp and its experts; a dense model's 1
    bucket_mb: float | None = None  # None: one transformer layer's 16-bit weights per tensor shard, at least 25 MiB
    link_model: str = "fair"  # how transfers share a port in the simulations (sim.network)
    grad_compression: str = "none"  # the codec of every candidate's gradient collectives (schedules.dp.codecs)
    reduce_dtype: str = "bf16"  # fp32: gradients accumulated and reduced in fp32 (Llama 3; TransformerCosts.reduce_dtype)

    def bucket_for(self, tp: int) -> float:
        """Gradient/parameter bucket in MiB. By default one layer per bucket, as FSDP wraps each transformer block
        (torchtitan does), and never under PyTorch DDP's 25 MiB; a 405B stage in 25 MiB buckets would be thousands
        of collectives per pass."""
        if self.bucket_mb is not None:
            return self.bucket_mb
        return max(25.0, 2.0 * self.model.layer_params / tp / 2**20)

    def __post_init__(self) -> None:
        check_positive_ints("plan", global_batch=self.global_batch)
        if self.global_batch > MAX_GLOBAL_BATCH:
            raise ConfigError(f"plan: global_batch {self.global_batch:,} is beyond {MAX_GLOBAL_BATCH:,} (2^40) "
                              "sequences; give a smaller batch", field="global_batch")
        self._normalize()
        if self.memory_limit is not None:
            check_positive("plan", "memory_limit", self.memory_limit, " bytes")
        for name in self.schedule_names:
            spec(name)
        for v in self.chunks:
            check_positive_ints("plan", chunks=v)
        for b in self.microbatch_sizes or ():
            check_positive_ints("plan", microbatch_size=b)
        for mode in self.dp_modes:
            check_choice("plan", "dp_mode", mode, _PLANNABLE)
        if "ps" in self.dp_modes and not self.cluster.pservers:
            raise ConfigError(f"plan: dp mode 'ps' needs parameter servers and cluster {self.cluster.name!r} has "
                              "none; give a cluster with servers (e.g. dgx-h100:2+ps2) or leave ps out",
                              field="dp_modes")
        for r in self.recompute:
            check_recompute("plan", r)
        if self.bucket_mb is not None:
            check_positive("plan", "bucket_mb", self.bucket_mb, " MiB")
        parse.canonical_field(self, "link_model", "plan", LINK_MODELS)
        parse.canonical_field(self, "reduce_dtype", "plan", ("bf16", "fp32"))
        comp = parse_compression(self.grad_compression)
        for mode in self.dp_modes:  # powersgd: all-reduce modes only
            check_dp_mode(comp, mode)
        object.__setattr__(self, "grad_compression", comp.spec)
        for value in (*(self.tp or ()), *(self.pp or ()), *(self.ep or ())):
            check_positive_ints("plan", degree=value)
        if self.model.moe is None and self.ep not in (None, (1,)):
            raise ConfigError(f"plan: ep {', '.join(map(str, self.ep))} splits a MoE model's experts, and model "
                              f"{self.model.name!r} has none; use a MoE model or leave ep out", field="ep")
        if not (self.chunks and self.dp_modes and self.recompute and self.sp):
            raise ConfigError("plan: chunks, dp_modes, recompute and sp each need at least one choice", field="plan")

    def _normalize(self) -> None:
        """Every choice once, names in their canonical case (``DDP`` is ``ddp``): a repeated value would list
        one configuration twice."""
        modes = (*_PLANNABLE, *_PLAN_ALIASES)
        fixed = {
            "schedules": None if self.schedules is None else [canonical_name(n) for n in self.schedules],
            "dp_modes": [_PLAN_ALIASES.get(m, m) for m in (choice("plan", "dp_mode", m, modes) for m in self.dp_modes)],
            "recompute": [check_recompute("plan", r.lower() if isinstance(r, str) else r) for r in self.recompute],
            "chunks": self.chunks, "microbatch_sizes": self.microbatch_sizes, "sp": self.sp, "tp": self.tp,
            "pp": self.pp, "ep": self.ep,
        }
        for key, values in fixed.items():
            if values is not None:
                object.__setattr__(self, key, tuple(dict.fromkeys(values)))

    @property
    def schedule_names(self) -> tuple[str, ...]:
        if self.schedules is not None:
            return self.schedules  # canonical already (_normalize): registered names, the user's references
        moe = self.model.moe is not None and self.ep != (1,)
        return tuple(n for n in names(by_family=True) if not spec(n).adaptive and (moe or n not in EXPERT_OVERLAP))

    @property
    def devices(self) -> int:
        return self.cluster.num_devices

    @property
    def capacity(self) -> float:
        return self.cluster.spec.memory_bytes if self.memory_limit is None else self.memory_limit


def tp_choices(model: TransformerConfig, cluster: Cluster) -> list[int]:
    """Tensor degrees that keep a group inside a node and divide what they split (as ParallelConfig.check_tp)."""
    per_node = math.gcd(*cluster.node_sizes)
    sizes = [model.heads, model.kv_heads, model.hidden, model.ffn, per_node]
    return [t for t in range(1, per_node + 1) if all(n % t == 0 for n in sizes)]


@lru_cache(maxsize=256)
def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, by trial division up to sqrt(n) (n <= 2^40: at most 2^20 steps)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def chunk_choices(name: str, chunks: Sequence[int]) -> tuple[int, ...]:
    sp = spec(name)
    if sp.fixed_chunks is not None:
        return (sp.fixed_chunks,)
    if sp.multi_chunk:
        return tuple(sorted({v for v in chunks if v >= 2}))
    if sp.any_chunks:  # its own rule (_RULES) says which fit a shape
        return tuple(sorted({1, *chunks}))
    return (1,)


# The registered generators' own rules (each raises ScheduleError otherwise); tests/test_plan.py checks this
# table against build() over a grid of shapes, so a generator that changes its rules fails there.
_RULES = {
    "interleaved-1f1b": lambda pp, m, v: m % pp == 0,
    "interleaved-zb": lambda pp, m, v: m % pp == 0,
    "dualpipe-v": lambda pp, m, v: m >= 2 * pp,
    "combined-1f1b": lambda pp, m, v: m % pp == 0 and (pp == 1 or v >= 2),
}
_FREE = frozenset({"gpipe", "1f1b", "looped-bfs", "zb-h1", "zb-v", "zb-h2", "zb-auto", "v-half", "v-min"})


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


def _shapes(space: PlanSpace, pp: int) -> list[tuple[str, int]]:
    """(schedule, chunks) searched at pipeline degree ``pp``: at pp = 1 the accumulation loop, and Megatron-Core's
    combined 1F1B (its EP A2A overlap without a pipeline) where :data:`EXPERT_OVERLAP` is searched."""
    if pp == 1:
        return [(ACCUMULATION, 1), *((n, 1) for n in space.schedule_names if n in EXPERT_OVERLAP)]
    return [(name, v) for name in space.schedule_names for v in chunk_choices(name, space.chunks)]


def ep_choices(space: PlanSpace, dp: int) -> list[int]:
    """Expert-parallel degrees tried at ``dp`` replicas: a MoE model's divisors of dp that divide its experts (or those
    of ``space.ep``), a dense model's 1. dp modes other than the exact all-reduce and ZeRO ones are the runtime's
    choice with experts too (docs/moe.md)."""
    moe = space.model.moe
    if moe is None:
        return [1]
    valid = [e for e in _divisors(dp) if moe.experts % e == 0]
    return valid if space.ep is None else [e for e in valid if e in space.ep]


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
            for name, v in _shapes(space, pp):
                if pp * v > model.layers and pp * v != model.layers + 2:  # +2: embedding, output alone
                    continue
                for b in sizes:
                    m = per_replica // b
                    if m > MAX_MICROBATCHES or not shape_ok(name, pp, m, v):
                        continue
                    for mode in modes:
                        for rc in space.recompute:
                            for sp in sps:
                                for ep in ep_choices(space, dp):
                                    yield PlanConfig(tp, pp, dp, name, v, b, m, mode, rc, sp, ep)


def why_empty(space: PlanSpace) -> ConfigError:
    """The constraint that leaves no configuration in ``space`` (the first of the enumeration's filters to reject
    everything), as the error to raise."""
    model, devices, batch = space.model, space.devices, space.global_batch
    tps = [t for t in tp_choices(model, space.cluster) if space.tp is None or t in space.tp]
    if not tps:
        return ConfigError(f"plan: no tensor degree of {quote(list(space.tp or ()))} divides the heads, hidden size "
                           f"and devices per node; valid: {tp_choices(model, space.cluster)}", field="tp")
    pairs = [(tp, pp) for tp in tps if devices % tp == 0 for pp in _divisors(devices // tp)
             if space.pp is None or pp in space.pp]
    if not pairs:
        return ConfigError(f"plan: no pipeline degree of {quote(list(space.pp or ()))} divides the {devices} devices "
                           "over the tensor degrees", field="pp")
    split = [(tp, pp, devices // (tp * pp)) for tp, pp in pairs if batch % (devices // (tp * pp)) == 0]
    if not split:
        dps = sorted({devices // (tp * pp) for tp, pp in pairs})
        return ConfigError(f"plan: the global batch {batch} cannot be split: it is not a multiple of any "
                           f"data-parallel degree the devices allow ({quote(dps)}, devices / (tp x pp))",
                           field="global_batch")
    replicas = sorted({batch // dp for _, _, dp in split})
    if space.microbatch_sizes is not None and not any(r % b == 0 for r in replicas for b in space.microbatch_sizes):
        return ConfigError(f"plan: no microbatch size of {quote(list(space.microbatch_sizes))} divides the batch "
                           f"per replica ({quote(replicas)})", field="microbatch_sizes")
    sizes = space.microbatch_sizes or [b for r in replicas for b in _divisors(r)]
    if not any(r % b == 0 and r // b <= MAX_MICROBATCHES for r in replicas for b in sizes):
        return ConfigError(f"plan: every microbatch size leaves more than {MAX_MICROBATCHES} microbatches per step "
                           f"(batch per replica {quote(replicas)}); give larger microbatch sizes",
                           field="microbatch_sizes")
    shapes = [(name, v) for name in space.schedule_names for v in chunk_choices(name, space.chunks)]
    if not shapes:
        return ConfigError(f"plan: chunks {quote(list(space.chunks))} leave no stage count for "
                           f"{', '.join(space.schedule_names)}: each takes 2 or more stages per rank", field="chunks")
    if not any(pp * v <= model.layers for _, pp, _ in split for _, v in shapes):
        return ConfigError(f"plan: every split has more stages (pp x chunks) than the model's {model.layers} "
                           "layers; give fewer nodes or fewer chunks", field="cluster")
    return ConfigError(f"plan: no schedule of {', '.join(space.schedule_names)} takes the shapes left (pipeline "
                       f"degrees {quote(sorted({pp for _, pp, _ in split}))}, batch per replica {quote(replicas)}); "
                       f"interleaved schedules need microbatches a multiple of pp, dualpipe-v at least 2 x pp, and "
                       f"a schedule at most {MAX_TASKS:,} tasks", field="schedules")


def describe_space(space: PlanSpace) -> str:
    return (f"{space.model.name} on {space.cluster.name} ({space.devices} x {space.cluster.spec.name}), "
            f"global batch {space.global_batch} x {space.model.seq_len} tokens, "
            f"memory limit {space.capacity / 1e9:.3g} GB per device; schedules {', '.join(space.schedule_names)}; "
            f"chunks {quote(list(space.chunks))}")
