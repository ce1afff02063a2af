"""What a real run is: the model, the run, and the plan checked before any communication.

Every check that can fail on bad input lives here and runs on every rank
before the process group exists, so a bad flag is one clear line on every
rank and never a hang: :func:`make_plan` turns a :class:`RunConfig` and the
world size into a :class:`Plan` (the validated task graph, the layers of each
stage, the microbatch size) or raises :class:`schedules.ScheduleError`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from common import parse
from common.errors import check_choice, check_positive, check_positive_ints
from real.checkpoint import CheckpointConfig
from schedules import ConfigError, Kind, ScheduleError, TaskGraph, import_schedules, load_graph, lower, validate
from schedules.dp.codecs import check_dp_mode, parse_compression
from schedules.dp.modes import DP_MODES as SCHEDULE_DP_MODES
from schedules.dp.modes import PEER_SELECTIONS
from schedules.library.recompute import check_recompute, place_recompute
from schedules.partition import split_layers, stage_ranges

__all__ = [
    "BACKENDS",
    "BALANCE",
    "DP_MODES",
    "DTYPES",
    "EP_DP_MODES",
    "FAIL_MODES",
    "MODEL_FLAGS",
    "MODEL_KINDS",
    "OPTIMIZERS",
    "PS_MODES",
    "DataConfig",
    "FaultConfig",
    "Layout",
    "ModelConfig",
    "OptimConfig",
    "Plan",
    "RunConfig",
    "RuntimeConfig",
    "SyncConfig",
    "make_plan",
    "model_argv",
    "partition",
]

MODEL_KINDS = ("gpt", "mlp")
# The data-parallel modes of schedules.dp.modes that the runtime implements (real.dp.sync; zero2, zero3 = fsdp: real.dp.zero;
# ps, async-ps: real.dp.ps / real.dp.ps_async, with parameter servers; decentralized, local-sgd: real.dp.peer_sync).
DP_MODES = ("sync", "ddp", "zero1", "zero2", "zero3", "fsdp", "ps", "async-ps", "decentralized", "local-sgd")
PS_MODES = ("ps", "async-ps")  # the modes with parameter servers (real.dp.ps, real.dp.ps_async)
if not set(DP_MODES) <= set(SCHEDULE_DP_MODES):
    raise ImportError(f"real.config.DP_MODES {DP_MODES} must be modes of schedules.dp.modes {SCHEDULE_DP_MODES}")
OPTIMIZERS = ("sgd", "adamw")
BACKENDS = ("gloo", "nccl")
DTYPES = ("float32", "bfloat16")  # bfloat16: autocast passes and bf16 messages, float32 master weights
BALANCE = ("time",)  # split a model's blocks into stages of equal profiled forward+backward time
EP_DP_MODES = ("sync", "ddp", "zero1")  # the data-parallel modes that run with expert parallelism (real.moe)
FAIL_MODES = ("kill", "hang")  # an injected fault: SIGKILL itself, or stop answering (sleep)
MAX_SEED = 2**63 - 1  # torch.manual_seed takes up to 2**64 - 1; one signed 64-bit range keeps every use safe
# Kinds the executor runs. A schedule with anything else is refused before any communication.
SUPPORTED_KINDS = frozenset({
    Kind.F, Kind.I, Kind.W, Kind.B, Kind.R, Kind.OVERLAP_F_B, Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B,
})


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """A small model, built layer by layer from a seed.

    ``gpt``: token+position embedding, ``layers`` pre-LayerNorm decoder blocks
    (causal self-attention with ``heads`` heads, a 4x MLP), final LayerNorm and
    a linear head over ``vocab`` tokens; sequences of ``seq`` tokens. With ``moe_experts`` E > 0 every
    block's MLP is a mixture of E such MLPs, each token sent to the ``moe_top_k`` its router ranks
    highest (:mod:`real.moe`); 0 is the dense model.
    ``mlp``: an input projection of ``dim`` features, ``layers`` residual
    GELU blocks and a linear head over ``vocab`` classes.
    Either way the model is a list of ``layers + 2`` layers that stages split.
    """

    kind: str = "gpt"
    layers: int = 4
    dim: int = 32
    heads: int = 2
    vocab: int = 64
    seq: int = 16
    moe_experts: int = 0
    moe_top_k: int = 2

    def __post_init__(self) -> None:
        check_choice("model", "kind", self.kind, MODEL_KINDS)
        check_positive_ints("model", layers=self.layers, dim=self.dim, heads=self.heads, vocab=self.vocab, seq=self.seq)
        self._check_moe()
        if self.vocab < 2:
            raise ConfigError(f"model: vocab must be >= 2 (tokens or classes), got {self.vocab}", field="vocab")
        if self.kind == "gpt" and self.dim % self.heads:
            raise ConfigError(
                f"model: dim {self.dim} is not divisible by heads {self.heads}; "
                f"use a dim that is a multiple of {self.heads}", field="dim"
            )

    def _check_moe(self) -> None:
        e, k = self.moe_experts, self.moe_top_k
        if isinstance(e, bool) or not isinstance(e, int) or e < 0:
            raise ConfigError(f"model: moe_experts must be an integer >= 0 (0: the dense model), got {e!r}",
                              field="moe_experts")
        if e and self.kind != "gpt":
            raise ConfigError(f"model: moe_experts {e} applies to the gpt model, not {self.kind!r}; use model gpt "
                              "or moe_experts 0", field="moe_experts")
        check_positive_ints("model", moe_top_k=k)
        if e and k > e:
            raise ConfigError(f"model: moe_top_k {k} is more than the {e} experts; valid: 1..{e}", field="moe_top_k")

    @property
    def num_layers(self) -> int:
        """Layers that stages split: input layer, blocks, head."""
        return self.layers + 2

    def to_dict(self) -> dict[str, Any]:
        """The fields; a dense model's without the MoE ones (as it was written before they existed)."""
        d = asdict(self)
        if not self.moe_experts:
            del d["moe_experts"], d["moe_top_k"]
        return d


#: The command-line flags of a ModelConfig's shape (besides --model, its kind), as argparse dests.
MODEL_FLAGS = ("layers", "dim", "heads", "vocab", "seq", "moe_experts", "moe_top_k")


def model_argv(model: ModelConfig) -> list[str]:
    """The flags that give ``model`` (for a command started with torchrun); the MoE ones only for a MoE model."""
    keys = MODEL_FLAGS if model.moe_experts else MODEL_FLAGS[:5]
    return ["--model", model.kind, *(x for k in keys for x in (f"--{k.replace('_', '-')}", str(getattr(model, k))))]


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Which schedule, on how many pipeline ranks and data-parallel replicas, in how many microbatches.

    ``split`` gives the layers of each stage, ``boundaries`` the first layer of
    every stage but the first, ``balance`` "time" splits by profiled time (at
    most one of them; none: as even as possible).
    ``recompute`` places R actions (:func:`schedules.library.recompute.place_recompute`):
    none, full (an R right before every backward) or bubbles (moved into idle
    time within ``recompute_limit`` M_B per rank). ``schedule`` may be the user's
    own (``file.py:NAME``, :mod:`schedules.load`); ``imports`` are imported first
    (modules or files whose registered schedules ``schedule`` names).
    ``ep``: expert parallelism, folded over the data-parallel replicas: ``ep`` consecutive replicas of a
    stage share one copy of its MoE blocks' experts, each holding ``experts / ep`` of them (:mod:`real.moe`).
    """

    schedule: str
    pp: int = 1
    dp: int = 1
    microbatches: int = 1
    chunks: int | None = None
    split: tuple[int, ...] | None = None
    boundaries: tuple[int, ...] | None = None
    balance: str | None = None
    recompute: str = "none"
    recompute_limit: float | None = None
    imports: tuple[str, ...] = ()  # modules or files that register schedules, imported by every rank first
    ep: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "imports", tuple(self.imports))
        check_positive_ints(f"run of {self.schedule!r}", pp=self.pp, dp=self.dp, microbatches=self.microbatches,
                            ep=self.ep)
        if self.dp % self.ep:
            valid = ", ".join(str(n) for n in range(1, self.dp + 1) if self.dp % n == 0)
            raise ConfigError(f"run of {self.schedule!r}: ep {self.ep} does not divide dp {self.dp} (expert "
                              f"parallelism is folded over the data-parallel replicas); valid ep: {valid}", field="ep")
        check_recompute(f"run of {self.schedule!r}", self.recompute, self.recompute_limit)
        if self.balance is not None:
            check_choice(f"run of {self.schedule!r}", "balance", self.balance, BALANCE)
        given = [k for k in ("split", "boundaries", "balance") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ConfigError(f"run of {self.schedule!r}: give one of split, boundaries and balance, not "
                              f"{' and '.join(given)}", field=given[1])

    @property
    def world_size(self) -> int:
        return self.pp * self.dp


@dataclass(frozen=True, slots=True, kw_only=True)
class DataConfig:
    """The model and its data: ``batch_size`` is the global batch of one step over all replicas."""

    model: ModelConfig = field(default_factory=ModelConfig)
    batch_size: int = 32
    seed: int = 0  # fixes the model's initial weights and the data
    factory: str | None = None  # "pkg.module:factory" of a user model (real.model_api); None: the built-in model
    token_file: str | None = None  # a token file (real.data.tokens) to train the gpt on; None: synthetic data
    # Each replica takes its per-step shard of the token file's windows as a lease from a data master on rank 0
    # (real.data.datamaster.MasterBatches) instead of its fixed slice of the sampler's batch.
    data_master: bool = False

    def __post_init__(self) -> None:
        check_positive_ints("data", batch_size=self.batch_size)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"data: seed must be an integer from 0 to 2**63 - 1 = {MAX_SEED} (torch's seeds), "
                              f"got {self.seed!r}", field="seed")
        if self.data_master and self.token_file is None:
            raise ConfigError("data_master hands out the windows of a token file; give a token_file",
                              field="data_master")


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimConfig:
    optimizer: str = "adamw"
    lr: float = 3e-3

    def __post_init__(self) -> None:
        parse.canonical_field(self, "optimizer", "optimizer config", OPTIMIZERS)
        check_positive("optimizer config", "lr", self.lr)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyncConfig:
    """Data-parallel synchronization: a mode of :data:`DP_MODES`, the bucket cap, and the codec of the gradient
    collectives (:mod:`schedules.dp.codecs`: none, fp16, bf16, int8, powersgd:R).

    ``servers``: parameter-server processes of modes ``ps`` and ``async-ps`` (:mod:`real.dp.ps`), started
    besides the pp x dp trainers (global ranks pp x dp onwards); required by those, refused by the others.
    ``staleness``: async-ps's bound, the steps a trainer may run ahead of the slowest (:mod:`real.dp.ps_async`).
    ``sync_every`` (local-sgd: average the parameters once every that many steps) and ``peer_selection``
    (decentralized: ring or random).
    """

    dp_mode: str = "ddp"
    bucket_mb: float = 25.0
    servers: int = 0
    staleness: int = 0
    grad_compression: str = "none"
    sync_every: int = 1
    peer_selection: str = "ring"

    def __post_init__(self) -> None:
        owner = "data-parallel sync"
        parse.canonical_field(self, "dp_mode", owner, DP_MODES)
        check_positive(owner, "bucket_mb", self.bucket_mb, " MiB")
        if not isinstance(self.servers, int) or isinstance(self.servers, bool) or self.servers < 0:
            raise ConfigError(f"{owner}: servers must be a whole number >= 0, got {self.servers!r}", field="servers")
        if self.dp_mode in PS_MODES and self.servers == 0:
            raise ConfigError(f"{owner}: dp_mode {self.dp_mode} needs parameter servers; give servers >= 1 "
                              "(a placement with /pserver devices, e.g. '/pserver/CPU:0,/trainer/CPU:0-1')",
                              field="servers")
        if self.dp_mode not in PS_MODES and self.servers:
            raise ConfigError(f"{owner}: {self.servers} parameter server(s) with dp_mode "
                              f"{self.dp_mode}; servers serve dp_mode ps or async-ps only", field="servers")
        if not isinstance(self.staleness, int) or isinstance(self.staleness, bool) or self.staleness < 0:
            raise ConfigError(f"{owner}: staleness must be a whole number of steps >= 0, got "
                              f"{self.staleness!r}", field="staleness")
        if self.staleness and self.dp_mode != "async-ps":
            raise ConfigError(f"{owner}: staleness {self.staleness} applies to dp_mode async-ps only, not "
                              f"{self.dp_mode}; leave it out or use async-ps", field="staleness")
        comp = parse_compression(self.grad_compression)
        check_dp_mode(comp, self.dp_mode)
        object.__setattr__(self, "grad_compression", comp.spec)  # POWERSGD:2 is powersgd:2
        check_positive_ints(owner, sync_every=self.sync_every)
        parse.canonical_field(self, "peer_selection", owner, PEER_SELECTIONS)
        if self.sync_every != 1 and self.dp_mode != "local-sgd":
            raise ConfigError(f"{owner}: sync_every {self.sync_every} applies to dp_mode local-sgd, not "
                              f"{self.dp_mode!r}; use dp_mode local-sgd or leave it out", field="sync_every")
        if self.peer_selection != "ring" and self.dp_mode != "decentralized":
            raise ConfigError(f"{owner}: peer_selection {self.peer_selection!r} applies to dp_mode decentralized, "
                              f"not {self.dp_mode!r}; use dp_mode decentralized or leave it out",
                              field="peer_selection")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    """How the run executes and what it records.

    ``recv_ahead`` bounds the receives posted ahead per peer (None: all of a
    step at its start); ``trace_step`` is the step traced (negative counts from the end), and with
    ``trace_steps`` = n the n steps that end with it (every measured step of a run, for calibration).
    """

    backend: str | None = None
    timeout_s: float = 300.0
    recv_ahead: int | None = None
    trace_step: int = -1
    trace_steps: int = 1
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_positive_ints("runtime", trace_steps=self.trace_steps)
        if self.backend is not None:
            check_choice("runtime", "backend", self.backend, BACKENDS)
        parse.canonical_field(self, "dtype", "runtime", DTYPES)
        check_positive("runtime", "timeout_s", self.timeout_s, " seconds")
        if self.recv_ahead is not None:
            check_positive_ints("runtime", recv_ahead=self.recv_ahead)


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultConfig:
    """An injected fault, for testing recovery: rank ``fail_rank`` dies (kill) or hangs at ``fail_at_step``;
    and a straggler: rank ``slow_rank`` sleeps ``slow_s`` seconds before each of its steps (every attempt)."""

    fail_at_step: int | None = None
    fail_rank: int = 0
    fail_mode: str = "kill"
    slow_rank: int | None = None
    slow_s: float = 0.0

    def __post_init__(self) -> None:
        check_choice("fault injection", "fail_mode", self.fail_mode, FAIL_MODES)


_PARTS = {"layout": Layout, "data": DataConfig, "optim": OptimConfig, "sync": SyncConfig,
          "runtime": RuntimeConfig, "faults": FaultConfig}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """One training run, one config per concern; the checks that span concerns live here.

    Each replica splits its share of the global batch into ``layout.microbatches``
    equal microbatches. :meth:`of` builds one from the fields of all concerns
    as flat keywords (what a script or a test writes).
    """

    layout: Layout
    steps: int = 10
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    checkpoint: CheckpointConfig | None = None
    faults: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        owner = f"run of {self.layout.schedule!r}"
        check_positive_ints(owner, steps=self.steps)
        trace_step = self.runtime.trace_step
        if not -self.steps <= trace_step < self.steps:
            raise ConfigError(
                f"{owner}: trace_step {trace_step} is out of range for {self.steps} steps; "
                f"valid: {-self.steps}..{self.steps - 1} (negative counts from the end)", field="trace_step"
            )
        if self.runtime.trace_steps > self.traced_step + 1:
            raise ConfigError(
                f"{owner}: trace_steps {self.runtime.trace_steps} reaches before step 0 (the steps traced end "
                f"with step {self.traced_step}); valid: 1..{self.traced_step + 1}", field="trace_steps"
            )
        self._check_faults(owner)
        if self.sync.servers and self.runtime.backend == "nccl":
            raise ConfigError(f"{owner}: parameter servers run on CPU processes (gloo) only; use backend gloo",
                              field="backend")
        if self.sync.servers and self.data.data_master:
            raise ConfigError(f"{owner}: data_master with parameter servers is not supported; leave data_master out",
                              field="data_master")
        self._check_ep(owner)
        if self.sync.peer_selection == "random" and self.layout.dp % 2:
            raise ConfigError(f"{owner}: peer_selection random pairs the replicas and needs an even dp, got dp "
                              f"{self.layout.dp}; use an even dp or peer_selection ring", field="peer_selection")
        per_replica = self.layout.dp * self.layout.microbatches
        if self.data.batch_size % per_replica:
            fits = (self.data.batch_size // per_replica or 1) * per_replica
            raise ConfigError(
                f"{owner}: batch size {self.data.batch_size} is not divisible by dp x microbatches = "
                f"{self.layout.dp} x {self.layout.microbatches} = {per_replica}; use a multiple of {per_replica}, "
                f"e.g. {fits}", field="batch_size")

    def _check_ep(self, owner: str) -> None:
        """ep > 1 needs the built-in MoE model, experts divisible by ep, and what the runtime has tested with it."""
        ep, model = self.layout.ep, self.data.model
        if ep == 1:
            return
        if self.data.factory is not None or not model.moe_experts:
            raise ConfigError(f"{owner}: ep {ep} shards the experts of the built-in MoE model; give moe_experts "
                              "(a multiple of ep) or leave ep out", field="ep")
        if model.moe_experts % ep:
            valid = ", ".join(str(n) for n in range(1, self.layout.dp + 1)
                              if self.layout.dp % n == 0 and model.moe_experts % n == 0)
            raise ConfigError(f"{owner}: ep {ep} does not divide moe_experts {model.moe_experts}; valid ep: {valid}",
                              field="ep")
        unsupported = [
            (self.sync.dp_mode not in EP_DP_MODES, f"dp_mode {self.sync.dp_mode!r}",
             f"use dp_mode {', '.join(EP_DP_MODES)}", "dp_mode"),
            (self.sync.grad_compression != "none", f"grad_compression {self.sync.grad_compression!r}",
             "use grad_compression none", "grad_compression"),
            (self.layout.balance is not None, f"balance {self.layout.balance!r}", "give split or boundaries",
             "balance"),
            (self.layout.recompute == "bubbles", "recompute 'bubbles'", "use recompute none or full", "recompute"),
            (self.runtime.dtype != "float32", f"dtype {self.runtime.dtype!r}", "use dtype float32", "dtype"),
        ]
        for bad, what, fix, name in unsupported:
            if bad:
                raise ConfigError(f"{owner}: ep {ep} is not supported with {what}; {fix} or leave ep out", field=name)

    def _check_faults(self, owner: str) -> None:
        f = self.faults
        if f.fail_at_step is not None and not 0 <= f.fail_at_step < self.steps:
            raise ConfigError(
                f"{owner}: fail_at_step {f.fail_at_step} is out of range for {self.steps} steps; "
                f"valid: 0..{self.steps - 1}", field="fail_at_step"
            )
        if not isinstance(f.fail_rank, int) or not 0 <= f.fail_rank < self.world_size:
            raise ConfigError(
                f"{owner}: fail_rank {f.fail_rank!r} is not a rank of pp x dp = {self.world_size} processes; "
                f"valid: 0..{self.world_size - 1}", field="fail_rank"
            )
        s = f.slow_s
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s < math.inf:
            raise ConfigError(f"{owner}: slow_s must be a finite number of seconds >= 0, got {s!r}", field="slow_s")
        if (f.slow_rank is None) != (s == 0):
            raise ConfigError(f"{owner}: slow_rank and slow_s go together (a rank that sleeps slow_s > 0 seconds "
                              f"each step), got slow_rank {f.slow_rank!r} and slow_s {s!r}", field="slow_rank")
        if f.slow_rank is not None and (isinstance(f.slow_rank, bool) or not isinstance(f.slow_rank, int)
                                        or not 0 <= f.slow_rank < self.world_size):
            raise ConfigError(f"{owner}: slow_rank {f.slow_rank!r} is not a rank of the {self.world_size} processes; "
                              f"valid: 0..{self.world_size - 1}", field="slow_rank")

    @classmethod
    def of(cls, *, steps: int = 10, checkpoint: CheckpointConfig | None = None, **fields: Any) -> RunConfig:
        """``RunConfig.of(schedule="1f1b", pp=2, microbatches=4, lr=0.1)``: each field to its concern."""
        parts: dict[str, dict[str, Any]] = {name: {} for name in _PARTS}
        for key, value in fields.items():
            owner = next((n for n, c in _PARTS.items() if key in c.__dataclass_fields__), None)
            if owner is None:
                valid = sorted(k for c in _PARTS.values() for k in c.__dataclass_fields__)
                raise TypeError(f"RunConfig.of(): unknown field {key!r}; valid: {', '.join(valid)}")
            parts[owner][key] = value
        built = {name: _PARTS[name](**kw) for name, kw in parts.items() if kw or name == "layout"}
        return cls(steps=steps, checkpoint=checkpoint, **built)

    @property
    def schedule(self) -> str:
        return self.layout.schedule

    @property
    def world_size(self) -> int:
        """Processes: the pp x dp trainers and the parameter servers (ps)."""
        return self.layout.world_size + self.sync.servers

    @property
    def microbatch_size(self) -> int:
        return self.data.batch_size // (self.layout.dp * self.layout.microbatches)

    @property
    def traced_step(self) -> int:
        return self.runtime.trace_step % self.steps

    @property
    def traced_steps(self) -> range:
        """The steps traced: ``trace_steps`` of them, ending with :attr:`traced_step`."""
        return range(self.traced_step - self.runtime.trace_steps + 1, self.traced_step + 1)

    @property
    def metered_step(self) -> int:
        """The step whose activation memory is measured: not a traced one (the hooks cost time) if possible."""
        first = self.traced_steps.start
        return 0 if first != 0 else (self.traced_step + 1) % self.steps

    def to_dict(self) -> dict[str, Any]:
        """Nested: one table per concern (JSON-ready)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        """Inverse of :meth:`to_dict` (JSON round trip)."""
        d = dict(d)
        layout = dict(d.pop("layout"))
        for key in ("split", "boundaries"):
            if layout.get(key) is not None:
                layout[key] = tuple(layout[key])
        data = dict(d.pop("data", {}))
        data["model"] = ModelConfig(**data.get("model", {}))
        checkpoint = d.pop("checkpoint", None)
        return cls(layout=Layout(**layout), data=DataConfig(**data),
                   checkpoint=CheckpointConfig(**checkpoint) if checkpoint is not None else None,
                   **{k: _PARTS[k](**v) for k, v in d.items() if k in _PARTS},
                   **{k: v for k, v in d.items() if k not in _PARTS})


def partition(num_layers: int, num_stages: int, split: tuple[int, ...] | None = None,
              boundaries: tuple[int, ...] | None = None, *, what: str | None = None) -> tuple[range, ...]:
    """Contiguous layer ranges, one per stage: ``split`` layers each, stages starting at ``boundaries``, or as
    even as possible (:func:`schedules.partition.split_layers`; the first ``num_layers % num_stages`` stages get
    one layer more). ``what`` names the model's layers in errors (default: the built-in model's)."""
    if what is not None and num_layers < num_stages:
        raise ConfigError(f"{what} has {num_layers} blocks, fewer than the schedule's {num_stages} stages "
                          f"(pp x chunks); use at most {num_layers} stages, or split {what} into more blocks",
                          field="pp")
    if boundaries is not None:
        split = boundaries_to_split(boundaries, num_layers, num_stages, what or "the model")
    if what is None:
        return stage_ranges(split_layers(num_layers, num_stages, split, layers="layers (input layer, blocks, head)",
                                         fix=f"use layers {max(num_stages - 2, 1)} or more, or fewer stages"))
    return stage_ranges(split_layers(num_layers, num_stages, split, layers=f"blocks of {what}"))


def boundaries_to_split(boundaries: tuple[int, ...], num_layers: int, num_stages: int, what: str) -> tuple[int, ...]:
    """Layers per stage from the first layer of every stage but the first (increasing, within 1..num_layers-1)."""
    if len(boundaries) != num_stages - 1:
        raise ConfigError(f"{what}: {len(boundaries)} boundaries for {num_stages} stages; give {num_stages - 1} "
                          "(the first block of every stage but the first)", field="boundaries")
    edges = (0, *boundaries, num_layers)
    for k, b in enumerate(boundaries):
        if not isinstance(b, int) or isinstance(b, bool) or not edges[k] < b < num_layers:
            raise ConfigError(f"{what}: boundary {b!r} (stage {k + 1}) is out of range; {what} has blocks "
                              f"0..{num_layers - 1} and boundaries must increase within {edges[k] + 1}.."
                              f"{num_layers - 1}", field="boundaries")
    return tuple(edges[k + 1] - edges[k] for k in range(num_stages))


@dataclass(frozen=True, eq=False)
class Plan:
    """A run checked against its world: the task graph and where every layer lives.

    Global rank ``g`` is pipeline rank ``g % pp`` of data-parallel replica
    ``g // pp``: a pipeline's ranks are contiguous.
    """

    config: RunConfig
    graph: TaskGraph
    layers: tuple[range, ...]  # per stage

    @property
    def num_stages(self) -> int:
        return self.graph.schedule.num_stages

    def coords(self, rank: int) -> tuple[int, int]:
        """(dp replica, pipeline rank) of a global rank."""
        return divmod(rank, self.config.layout.pp)

    def global_rank(self, dp_rank: int, pp_rank: int) -> int:
        return dp_rank * self.config.layout.pp + pp_rank

    def stages_of(self, pp_rank: int) -> tuple[int, ...]:
        return self.graph.schedule.stages_of(pp_rank)


def make_plan(config: RunConfig, world_size: int, *, num_layers: int | None = None, what: str | None = None) -> Plan:
    """Check everything that needs no communication; raise ScheduleError naming the bad value.

    ``num_layers``/``what``: the blocks of a user model (:mod:`real.model_api`) instead of the built-in model's layers.
    """
    lay = config.layout  # a registered name, torch:CLASS, csv:FILE or the user's file.py:NAME
    import_schedules(lay.imports)
    graph = validate(load_graph(lay.schedule, pp=lay.pp, microbatches=lay.microbatches, chunks=lay.chunks))
    if lay.recompute != "none" or lay.recompute_limit is not None:
        graph = validate(lower(place_recompute(graph.schedule, lay.recompute, lay.recompute_limit)))
    if world_size != config.world_size:
        servers = " + servers" if config.sync.servers else ""
        servers_n = f" + {config.sync.servers}" if config.sync.servers else ""
        raise ConfigError(
            f"world size {world_size} (processes launched) does not equal pp x dp{servers} = "
            f"{config.layout.pp} x {config.layout.dp}{servers_n} = {config.world_size}; launch {config.world_size} "
            "processes or change pp/dp"
        )
    for task in graph.tasks:
        for part in task.action.parts():
            if part.kind not in SUPPORTED_KINDS:
                raise ScheduleError(
                    f"schedule {config.schedule!r}, rank {task.rank}, action {part}: the runtime does not run "
                    f"{part.kind.value} actions; it runs " + ", ".join(sorted(k.value for k in SUPPORTED_KINDS))
                )
    layers = partition(config.data.model.num_layers if num_layers is None else num_layers, graph.schedule.num_stages,
                       config.layout.split, config.layout.boundaries, what=what)
    return Plan(config=config, graph=graph, layers=layers)
