"""Train any ``nn.Module``: the model as blocks, as stage modules, or traced; a loss; a batch source.

    >>> from real import UserModel, fit
    >>> net = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))
    >>> fit(UserModel(model=net, loss=F.cross_entropy, batches=lambda step: make(step)),
    ...       schedule="1f1b", pp=2, microbatches=4, batch_size=16, steps=10)

:class:`UserModel` takes the model in one of three forms, told apart by type:

* **blocks**: an ``nn.Sequential`` or an ``nn.ModuleList`` (blocks applied in
  order). Stages take contiguous runs of blocks: as even as possible, by
  counts (``split``), by ``boundaries`` (the first block of every stage but
  the first) or balanced by profiled time (``balance="time"``). Parameter
  names are the whole ``nn.Sequential``'s (``"3.weight"``);
* **stage modules**: a Python list or tuple of modules, one per stage, as
  torch's ``PipelineStage`` takes them; parameters are ``"{stage}.{name}"``;
* **traced**: any other module, split by torch.distributed.pipelining's
  tracer (``pipeline()``) at its ``pipe_split()`` calls or at ``split_spec``
  (``{"layers.2": SplitPoint.BEGINNING}``); a ``Pipe`` already traced is taken
  as it is. Parameters are ``"{stage}.{qualified name in the module}"``.

``loss(output, targets)`` is the mean loss of a microbatch; ``batches(step)``
returns the whole global batch of a step, ``(inputs, targets)`` with
``batch_size`` rows (replicas and microbatches take contiguous slices of it);
``batches=None`` takes the data from ``token_file``. Every rank builds the
whole model (the factory runs with the global RNG seeded from ``seed``, so
every rank builds the same parameters), keeps its stages' blocks, and infers
the shape and dtype of every stage boundary by running one microbatch through
the blocks without gradients: a stage but the last must return one tensor.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from common.usercode import call, import_user
from real import usercode
from real.config import Plan, RunConfig, make_plan
from real.data.sources import DataSource, GlobalBatches, SyntheticData
from real.models import activation_shape, build_layers, loss_fn
from schedules import ConfigError, Kind

__all__ = [
    "Boundaries",
    "StagedModel",
    "UserModel",
    "autocast_for",
    "balance_split",
    "builtin_model",
    "from_factory",
    "infer_boundaries",
    "linear_partition",
    "load_factory",
    "plan_for",
    "prepare",
]

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
BatchFn = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
Boundaries = dict[int, tuple[tuple[int, ...], torch.dtype]]  # stage -> (shape, dtype) of its output


@dataclass(frozen=True, eq=False, kw_only=True)
class UserModel:
    """A model, its loss and its batch source: what ``--model pkg.module:factory``'s factory returns."""

    model: nn.Module | Sequence[nn.Module]
    loss: Loss
    batches: BatchFn | None = None
    split_spec: dict[str, Any] | None = None  # traced form: torch's {qualified name: SplitPoint}

    def __post_init__(self) -> None:
        if not callable(self.loss):
            raise ConfigError(f"user model: loss must be a function (output, targets) -> loss, got "
                              f"{type(self.loss).__name__}", field="loss")
        if self.batches is not None and not callable(self.batches):
            raise ConfigError(f"user model: batches must be a function step -> (inputs, targets), got "
                              f"{type(self.batches).__name__}", field="batches")
        ok = isinstance(self.model, nn.Module) or (
            isinstance(self.model, (list, tuple)) and self.model and all(isinstance(m, nn.Module) for m in self.model))
        if not ok:
            raise ConfigError(f"user model: model must be an nn.Module or a non-empty list of stage modules, got "
                              f"{type(self.model).__name__}", field="model")

    @property
    def form(self) -> str:
        """blocks, stages or traced (see the module doc)."""
        if isinstance(self.model, (list, tuple)):
            return "stages"
        if isinstance(self.model, (nn.Sequential, nn.ModuleList)):
            return "blocks"
        return "traced"

    @property
    def name(self) -> str:
        if self.form == "stages":
            return f"stage list [{', '.join(type(m).__name__ for m in self.model)}]"
        return type(self.model).__name__


@dataclass(frozen=True, eq=False)
class StagedModel:
    """A model as ``num_layers`` blocks that stages take contiguous runs of, and its loss.

    ``what`` names the model in errors ("model Net"; None: the built-in model, whose blocks are layers);
    ``blocks`` are the modules themselves (None: built from the config on demand).
    """

    num_layers: int
    layers: Callable[[range], list[nn.Module]]
    loss: Loss = loss_fn
    what: str | None = None
    blocks: tuple[nn.Module, ...] | None = None


def builtin_model(config: RunConfig) -> StagedModel:
    cfg = config.data.model
    return StagedModel(cfg.num_layers, lambda r: build_layers(cfg, config.data.seed, r))


def load_factory(spec: str) -> Callable[[], Any]:
    """``pkg.module:factory`` or ``path/to/file.py:factory`` -> the factory; ConfigError naming what is missing."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"model {spec!r}: give pkg.module:factory or path/file.py:factory", field="factory")
    module = import_user(module_name, f"model {spec!r}", "factory", spec=spec)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"model {spec!r}: {module_name} has no function {attr!r}", field="factory")
    return factory


def from_factory(spec: str, seed: int) -> UserModel:
    """Call the factory of ``spec`` with the global RNG seeded from ``seed`` (the same model on every rank)."""
    factory = load_factory(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        made = call(f"model {spec!r}: the factory", factory, field="factory")
    if not isinstance(made, UserModel):
        raise ConfigError(f"model {spec!r}: the factory returned {type(made).__name__}; it must return "
                          "real.UserModel(model=..., loss=..., batches=...)", field="factory")
    return made


def autocast_for(dtype: str, device: torch.device) -> Callable[[], AbstractContextManager]:
    """What wraps every forward: bfloat16 autocast on ``device``'s type, or nothing for float32."""
    if dtype == "bfloat16":
        return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext


def _sample_microbatch(data: DataSource, config: RunConfig) -> torch.Tensor:
    x, _ = data.sample(config.microbatch_size)
    return x


def prepare(user: UserModel, config: RunConfig, data: DataSource) -> StagedModel:
    """The user's model as blocks (tracing it if it is in the traced form); checks what needs no plan."""
    if user.form == "blocks":
        blocks = tuple(user.model)
        if not blocks:
            raise ConfigError(f"model {user.name} has no blocks to split into stages", field="model")
    elif user.form == "stages":
        blocks = tuple(user.model)
        if config.layout.split is not None or config.layout.boundaries is not None or config.layout.balance:
            raise ConfigError(f"model {user.name}: a list of stage modules is split already; give no split, "
                              "boundaries or balance", field="split")
    else:
        blocks = _traced(user, config, data)
        if config.layout.split is not None or config.layout.boundaries is not None or config.layout.balance:
            raise ConfigError(f"model {user.name} is split by its pipe_split()/SplitPoint marks; give no split, "
                              "boundaries or balance", field="split")
    return StagedModel(len(blocks), lambda r: [blocks[i] for i in r], usercode.checked_loss(user.loss),
                       f"model {user.name}", blocks)


def _traced(user: UserModel, config: RunConfig, data: DataSource) -> tuple[nn.Module, ...]:
    from torch.distributed.pipelining import Pipe, pipeline

    pipe = user.model
    if not isinstance(pipe, Pipe):
        try:
            pipe = pipeline(user.model, mb_args=(_sample_microbatch(data, config),), split_spec=user.split_spec)
        except Exception as exc:  # torch.export's errors are long; the first line says what it could not trace
            raise ConfigError(f"model {user.name}: torch.distributed.pipelining could not trace it "
                              f"({type(exc).__name__}: {str(exc).strip().splitlines()[0]})", field="model") from exc
    return tuple(pipe.get_stage_module(i) for i in range(pipe.num_stages))


def check_stages(model: StagedModel, plan: Plan) -> None:
    """Every stage of a user model has trainable parameters (its optimizer and its backward need them)."""
    if model.what is None:
        return
    has_w = {t.action.stage for t in plan.graph.tasks for p in t.action.parts() if p.kind is Kind.W}
    for s, r in enumerate(plan.layers):
        mods = model.layers(r)
        if any(p.requires_grad for m in mods for p in m.parameters()):
            continue
        names = ", ".join(type(m).__name__ for m in mods)
        why = "its weight-gradient pass W" if s in has_w else "its optimizer"
        if s == 0:
            why += " (and the first stage's backward would have nothing to differentiate)"
        raise ConfigError(f"{model.what}: stage {s} (blocks {r.start}..{r.stop - 1}: {names}) has no trainable "
                          f"parameters, but {why} needs them; move its blocks into a neighbouring stage",
                          field="split")


def infer_boundaries(model: StagedModel, plan: Plan, sample: torch.Tensor, dtype: str) -> Boundaries:
    """(shape, dtype) of every stage's output but the last's, from one microbatch run without gradients.

    Under bfloat16 every floating boundary travels as bfloat16.
    """
    out: Boundaries = {}
    x: Any = sample
    blocks = model.layers(range(plan.layers[-1].start))
    modes = [(m, m.training) for b in blocks for m in b.modules()]
    try:
        for b in blocks:
            b.eval()  # no running statistics move (batch norm), no dropout mask drawn from the global RNG
        with torch.no_grad(), autocast_for(dtype, sample.device)():
            for s, r in enumerate(plan.layers[:-1]):
                x = call(f"{model.what}: stage {s} (blocks {r.start}..{r.stop - 1})", _run, model.layers(r), x)
                out[s] = _boundary(model, s, r, x, dtype)
                x = x.to(out[s][1])
    finally:
        for m, training in modes:
            m.training = training
    return out


def _run(blocks: Sequence[nn.Module], x: torch.Tensor) -> Any:
    for block in blocks:
        x = block(x)
    return x


def _boundary(model: StagedModel, s: int, r: range, x: Any, dtype: str) -> tuple[tuple[int, ...], torch.dtype]:
    """(shape, dtype) stage ``s``'s output ``x`` travels with; ConfigError if it cannot travel."""
    if not isinstance(x, torch.Tensor):
        raise ConfigError(f"{model.what}: stage {s} (blocks {r.start}..{r.stop - 1}) returns "
                          f"{type(x).__name__}; a stage but the last must return one tensor", field="model")
    if not x.is_floating_point():
        raise ConfigError(f"{model.what}: stage {s} returns a {x.dtype} tensor; a stage's output "
                          "needs a gradient, so it must be floating point", field="model")
    return tuple(x.shape), torch.bfloat16 if dtype == "bfloat16" else x.dtype


def builtin_boundaries(config: RunConfig, num_stages: int) -> Boundaries:
    dtype = torch.bfloat16 if config.runtime.dtype == "bfloat16" else torch.float32
    shape = activation_shape(config.data.model, config.microbatch_size)
    return {s: (shape, dtype) for s in range(num_stages - 1)}


def linear_partition(times: Sequence[float], parts: int) -> tuple[int, ...]:
    """Blocks per part: ``parts`` contiguous non-empty runs of ``times`` minimizing the largest sum.

    Dynamic programming over (blocks used, parts used); ties go to the split with
    more blocks early (the first stages), as the even split does.
    """
    n = len(times)
    prefix = [0.0]
    for t in times:
        prefix.append(prefix[-1] + t)
    inf = float("inf")
    best = [[inf] * (parts + 1) for _ in range(n + 1)]  # best[i][k]: first i blocks in k parts
    cut = [[0] * (parts + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(i - 1, k - 2, -1):  # last part: blocks j..i-1
                cost = max(best[j][k - 1], prefix[i] - prefix[j])
                if cost < best[i][k] - 1e-12 * max(1.0, best[i][k] if best[i][k] < inf else 1.0):
                    best[i][k], cut[i][k] = cost, j
    sizes, i = [], n
    for k in range(parts, 0, -1):
        j = cut[i][k]
        sizes.append(i - j)
        i = j
    return tuple(reversed(sizes))


def block_times(blocks: Sequence[nn.Module], sample: torch.Tensor, reps: int = 5, warmup: int = 1) -> list[float]:
    """Median seconds of each block's forward + backward on ``sample`` (the blocks' input, run in order).

    It runs on copies: the model's parameters, gradients and buffers stay as they were.
    """
    blocks = [copy.deepcopy(b) for b in blocks]
    inputs, x = [], sample
    with torch.no_grad():
        for block in blocks:
            inputs.append(x)
            x = block(x)
    times = []
    for block, inp in zip(blocks, inputs, strict=True):
        samples = []
        for rep in range(warmup + reps):
            leaf = inp.detach().requires_grad_(inp.is_floating_point())
            t = time.perf_counter()
            out = block(leaf)
            if out.requires_grad:
                out.float().sum().backward()
            if rep >= warmup:
                samples.append(time.perf_counter() - t)
        block.zero_grad(set_to_none=True)
        times.append(statistics.median(samples))
    return times


def balance_split(blocks: Sequence[nn.Module], sample: torch.Tensor, num_stages: int) -> tuple[int, ...]:
    """Blocks per stage balancing the profiled forward+backward time of each block (rank 0's profile decides)."""
    return linear_partition(block_times(blocks, sample), num_stages)


def resolve_balance(config: RunConfig, model: StagedModel, num_stages: int, sample: torch.Tensor,
                    agree: Callable[[tuple[int, ...]], tuple[int, ...]]) -> RunConfig:
    """``balance="time"`` -> a config with ``split`` (``agree`` makes every rank use rank 0's)."""
    if config.layout.balance is None:
        return config
    if model.num_layers < num_stages:
        raise ConfigError(f"{model.what or 'the built-in model'}: {model.num_layers} blocks cannot fill {num_stages} "
                          "stages (pp x chunks); use fewer stages or more blocks", field="pp")
    blocks = model.blocks if model.blocks is not None else tuple(model.layers(range(model.num_layers)))
    split = agree(balance_split(blocks, sample, num_stages))
    return replace(config, layout=replace(config.layout, balance=None, split=split))


def data_for(config: RunConfig, user: UserModel | None) -> DataSource:
    """The batch source of a run: the user's function, a token file, or the built-in synthetic data."""
    if config.data.token_file is not None:
        from real.data.tokens import TokenBatches

        tokens = TokenBatches.open(config)
        if config.data.data_master:
            from real.data.datamaster import MasterBatches

            return MasterBatches(tokens, dp=config.layout.dp, lease_timeout_s=config.runtime.timeout_s)
        return tokens
    if user is not None:
        if user.batches is None:
            raise ConfigError(f"model {user.name}: batches is None and no token file is given; return a batch "
                              "function from the factory or give a token file", field="token_file")
        return GlobalBatches(user.batches, config.data.batch_size)
    return SyntheticData(config.data.model, config.data.seed, config.data.batch_size)


def plan_for(config: RunConfig, world: int, user: UserModel | None = None
             ) -> tuple[Plan, StagedModel, DataSource]:
    """The plan of a run of ``user`` (None: the built-in model), its model as blocks and its data source.

    Every check that needs no communication: the split (a profiled ``balance`` is even here; :func:`resolve_balance`
    replaces it once the ranks can agree) and, unless balanced, every stage having parameters.
    """
    data = data_for(config, user)
    model = prepare(user, config, data) if user is not None else builtin_model(config)
    plan = make_plan(config, world, num_layers=model.num_layers, what=model.what)
    if config.layout.balance is None:
        check_stages(model, plan)
    return plan, model, data

