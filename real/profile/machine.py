"""Profile this machine for the simulator: pass times per stage, messages, collectives, optimizer.

    torchrun --nproc-per-node 2 -m real.profile --model gpt --layers 6 --dim 128 --seq 64 \\
             --microbatch-size 4 --stages 2,4 --out out/profile.json

Every rank runs the same measurements at the same time, so the load on the
machine is the one a pipeline run puts on it (on a CPU host with one core per
rank, two ranks compete for memory bandwidth exactly as they do in a run).
Each quantity is timed ``warmup`` times unrecorded, then ``reps`` times; the
file keeps the median over all ranks' samples and the spread (10th and 90th
percentile, n).

Measured, with the same code the executor runs (:mod:`real.backward`):

* per stage of each partition (``--stages``: stage counts, e.g. 2 for
  gpipe/1f1b at pp=2 and 4 for two chunks per rank): F (the last stage
  includes the loss), the full backward B, its split I and W (the first
  stage has no input gradient: its I is empty and W is the whole backward,
  as in the executor), and the optimizer step over the stage's parameters;
  ``SERVER_UPDATE``: a parameter server's update of the stage (dp mode ps:
  the last bucket's fold and the optimizer over the stage's flat buckets, on
  one process while the others wait: :mod:`real.profile.server`);
* ``step_overhead``: the work of a step outside its pipeline program, timed
  as the runtime does it: zero_grad of every stage and the all-reduce of the
  loss (one float64) over all ranks;
* ``task_overhead``: the executor's own cost per task (recorder stamps,
  polls of outstanding sends, the bookkeeping dicts), timed by running the
  executor loop's per-task steps around an empty body;
* ``p2p``: one-way time of a message of n bytes between ranks 0 and 1,
  fitted as alpha + n / beta (least squares over sizes around one
  activation); ``send_cpu`` the time the sender's own core spends posting
  one activation-sized isend (gloo copies and queues it on the caller);
* ``collectives`` (``--dp`` > 1): all_reduce, reduce_scatter and all_gather
  over each data-parallel group (ranks with equal ``rank % pp``), fitted as
  alpha + n / beta with n the bytes of the full buffer, per collective of a
  burst of :data:`BURST` issued back to back (``async_op``) and waited for
  together, as the runtime issues its gradient buckets. On gloo a collective
  in such a burst takes about twice as long per byte as one called alone
  (``single``: those timings, kept for reference);
* ``comm_slowdown`` (``--dp`` > 1): compute slowed by concurrent
  communication, each stage's passes of the first partition timed alone and
  with a chain of all-reduces of one bucket (``--bucket-mb``, capped at the
  stage's parameters) in flight over the data-parallel group
  (:mod:`real.profile.overlap`); ``factor`` = the with-collective medians'
  sum over the alone medians' sum;
* ``reduce_hook`` (``--dp`` > 1): the CPU time zero2/zero3's per-bucket
  reduce-scatter hook takes on the training thread per gradient byte (copy
  into a flat buffer, launch, add into the shard), inside the first
  partition's backward passes on its buckets at ``--bucket-mb``
  (:mod:`real.profile.hook`);
* ``powersgd`` (``--dp`` > 1): PowerSGD's hook (torch's ``powerSGD_hook``, as :mod:`real.dp.compress` calls it)
  on each of the first stage's buckets at ``--bucket-mb``: its compute alone and its wall on the
  data-parallel group, waited for at once as the runtime waits for it; and ``collectives.all_reduce.small``,
  plain blocking all-reduces of the sizes the hook sends (a few KB), fitted as alpha + n / beta over that
  range (:mod:`real.profile.powersgd`); and ``in_backward``: the same hooks launched from inside the first
  stage's real backward, as a run launches them (:mod:`real.profile.psgd_backward`);
* ``zero3`` (``--dp`` > 1): every bucket of the first stage freed and all-gathered at once (the ``burst``)
  and its forward and backward right after one, against the same passes with the parameters whole
  (:mod:`real.profile.zero3`);
* ``pair_threads``: each stage of the first partition's forward of one microbatch in a thread beside the
  backward of another, as the executor runs an overlapped pair, against the two one after the other
  (:mod:`real.profile.pair`); ``factor`` = the paired medians' sum over the one-after-the-other medians' sum;
* ``machine_speed``: every rank's probe of the host's speed (:mod:`real.profile.probe`) at the start, between
  the parts and at the end, and ``spell``, the slowest over the fastest.

File schema (JSON, ``"schema": "schedlab.profile/1"``)::

    {"schema", "machine": {host, cpus, torch, threads, world_size, backend, device},
     "model": ModelConfig fields, "microbatch_size", "dtype": "float32",
     "activation_bytes": bytes of one boundary message (microbatch x seq x dim x 4),
     "reps", "warmup",
     "partitions": [{"num_stages", "stages": [{"stage", "layers": [first, stop],
                     "param_bytes", "F"|"B"|"I"|"W"|"OPTIM"|"SERVER_UPDATE": {"median", "p10", "p90", "n"}}]}],
     "step_overhead": {...stat}, "task_overhead": {...stat},
     "p2p": {"alpha", "beta" (null: inf), "send_cpu": {...stat}, "sizes": [{"bytes", ...stat}]} | null,
     "collectives": {"all_reduce"|"reduce_scatter"|"all_gather": {"alpha", "beta", "burst", "sizes": [...],
                     "single": {"alpha", "beta", "sizes": [...]}},
                     all_reduce only: "small": {"alpha", "beta", "sizes": [...]}} | null,
     "comm_slowdown": {"factor", "bucket_bytes", "in_flight", "passes", "alone"|"with_collective":
                       {"F"|"B"|"I"|"W": {...stat}}, "short": repetitions the chain ended early} | null,
     "codecs": {"fp16"|"bf16"|"int8"|"powersgd:1"|"powersgd:4": nanoseconds per gradient element},
     "reduce_hook": {"ns_per_byte", "bucket_bytes": [int], "cpu"|"wall": {...stat}} | null,
     "param_copy": {"flatten_ns_per_byte", "average_ns_per_byte", "local_sgd_ns_per_byte", "bucket_bytes": [int],
                    "cpu": {"flatten"|"average"|"local_sgd": {...stat}}, "wall": {"flatten"|"average": {...stat}}}
                   | null: decentralized's and local-sgd's parameter copies on the training thread
                   (real.profile.param_copy, --dp > 1),
     "powersgd": {"powersgd:R": {"bucket_bytes": [int], "buckets": [{"elements", "messages": [whole, P, Q bytes],
                  "compute"|"wall": {...stat}}], "compute", "wall": seconds per step (sums of the medians),
                  "in_backward": {"buckets": int, "hooks"|"extra": {...stat} seconds per backward}}} | null,
     "zero3": {"buckets", "bytes": [int], "burst": {...stat}, "alone"|"gathered": {"F"|"B": {...stat}},
               "factor": {"F"|"B": gathered median / alone median}} | null,
     "pair_threads": {"factor", "serial"|"paired": [seconds per stage], "reps"},
     "machine_speed": {"probes": [seconds], "spell": slowest / fastest},
     "warnings": [str]: every guess an alpha/beta fit made, each naming its field (also under the
                 section's own "warnings"; the small all-reduce fit's too): a time that did not grow with the size (beta null, alpha the
                 fastest time) or a negative intercept (alpha 0). sim.costs.profiled logs them on loading.}

All times in seconds, beta in bytes per second. :class:`sim.costs.profiled.ProfiledCosts` loads it.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from common import parse
from common.errors import ConfigError, check_positive, check_positive_ints, quote
from real.backward import backward_full, backward_input, backward_weight
from real.config import OPTIMIZERS, ModelConfig, partition
from real.data.sources import make_batch
from real.data.sources import microbatches as microbatches_of
from real.dp.compress import profile_codecs
from real.measure import Recorder
from real.mesh import env_world
from real.models import activation_shape, build_layers, loss_fn, make_optimizer
from real.profile.comm import _collectives, _dp_group, _fit_alpha_beta, _gathered, _p2p, _repeat, fit_warnings
from real.profile.pair import pair_share
from real.profile.probe import probe_seconds, spell
from real.profile.server import server_update_samples
from real.profile.stats import stat as _stat
from schedules.formats import PROFILE_SCHEMA

__all__ = ["PROFILE_SCHEMA", "ProfileConfig", "StageProfile", "profile", "profile_stage"]

log = logging.getLogger(__name__)

_PASSES = ("F", "B", "I", "W")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileConfig:
    """What to profile: a model, the partitions (stage counts) and the microbatch size.

    ``split`` fixes the layers per stage of a single partition (as ``--split``
    of ``python -m real``); otherwise each partition is as even as possible,
    exactly as the runtime splits it.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    stages: tuple[int, ...] = (2,)
    split: tuple[int, ...] | None = None
    microbatch_size: int = 4
    microbatches: int = 1  # per step: the batch the runtime makes each step is microbatch_size x this
    pp: int | None = None  # pipeline ranks, for the data-parallel groups (default: world size / dp)
    dp: int = 1
    bucket_mb: float = 25.0  # the collective in flight while comm_slowdown times the passes (the runtime's default)
    optimizer: str = "adamw"
    lr: float = 3e-3
    reps: int = 10
    warmup: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive_ints("profile", microbatch_size=self.microbatch_size, microbatches=self.microbatches,
                            dp=self.dp, reps=self.reps)
        if not isinstance(self.warmup, int) or isinstance(self.warmup, bool) or self.warmup < 0:
            raise ConfigError(f"profile: warmup must be an integer >= 0, got {quote(self.warmup)}", field="warmup")
        if not self.stages or any(not isinstance(s, int) or s < 1 for s in self.stages):
            raise ConfigError(f"profile: stages must be stage counts >= 1, e.g. 2,4; got {quote(self.stages)}",
                              field="stages")
        if self.split is not None and len(self.stages) != 1:
            raise ConfigError(f"profile: split fixes one partition; give one stage count, not {self.stages}",
                              field="split")
        parse.canonical_field(self, "optimizer", "profile", OPTIMIZERS)
        check_positive("profile", "lr", self.lr)  # a negative rate would be timed as if it trained
        if isinstance(self.bucket_mb, bool) or not isinstance(self.bucket_mb, int | float) or \
                not 0 < self.bucket_mb < math.inf:
            raise ConfigError(f"profile: bucket_mb must be a size > 0 MiB, got {quote(self.bucket_mb)}",
                              field="bucket_mb")
        for n in self.stages:
            partition(self.model.num_layers, n, self.split)  # raises naming the bad split / too few layers


# -- passes of one stage -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageProfile:
    """Median seconds per microbatch of each pass of stage ``index`` (layers ``layers``)."""

    layers: range
    microbatch: int
    device: str
    f: float
    b: float
    i: float
    w: float

    def row(self) -> dict[str, float | int | str]:
        return {"layers": f"{self.layers.start}..{self.layers.stop - 1}", "microbatch": self.microbatch,
                "device": self.device, "F": self.f, "B": self.b, "I": self.i, "W": self.w,
                "I+W/B": (self.i + self.w) / self.b if self.b else float("nan")}


class _StageBench:
    """One stage built as the runtime builds it, fed as the executor feeds it."""

    def __init__(self, model: ModelConfig, layers: range, microbatch: int, device: torch.device, seed: int,
                 microbatches: int = 1) -> None:
        self.stage = torch.nn.Sequential(*build_layers(model, seed, layers)).to(device)
        self.params = list(self.stage.parameters())
        self.first, self.last = layers.start == 0, layers.stop == model.num_layers
        self.divisor = microbatches
        self.shape = activation_shape(model, microbatch)
        self.device = device
        x, y = make_batch(model, seed, 0, microbatch)
        self.tokens, self.targets = x.to(device), y.to(device)
        self.grad = None if self.last else torch.randn(self.shape, device=device)

    def _input(self) -> torch.Tensor | None:
        return None if self.first else torch.randn(self.shape, device=self.device, requires_grad=True)

    def _forward(self, inp: torch.Tensor | None) -> torch.Tensor:
        out = self.stage(self.tokens if inp is None else inp)
        return loss_fn(out, self.targets) / self.divisor if self.last else out

    def one_rep(self, timed: Callable[[Callable[[], object]], float]) -> tuple[float, float, float, float]:
        """(F, B, I, W) seconds: one forward timed with a full backward, one with the split backward."""
        inp, out = self._input(), []
        tf = timed(lambda: out.append(self._forward(inp)))
        tb = timed(lambda: backward_full(out[0], self.grad))
        inp2 = self._input()
        out2 = self._forward(inp2)
        work: list = []
        ti = timed(lambda: work.append(backward_input(out2, self.grad, inp2, self.params)[1]))
        tw = timed(lambda: backward_weight(work[0]))
        return tf, tb, ti, tw


def _timer(device: torch.device) -> Callable[[Callable[[], object]], float]:
    if device.type == "cuda":
        def timed(fn: Callable[[], object]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def timed(fn: Callable[[], object]) -> float:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
    return timed


def _stage_samples(bench: _StageBench, timed: Callable, warmup: int, reps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in _PASSES}
    for rep in range(warmup + reps):
        sample = bench.one_rep(timed)
        if rep >= warmup:
            for k, v in zip(_PASSES, sample, strict=True):
                times[k].append(v)
    return times


def profile_stage(model: ModelConfig, layers: range, microbatch: int, device: torch.device,
                  *, reps: int = 20, warmup: int = 3, seed: int = 0) -> StageProfile:
    """Median F, B, I and W of the stage holding ``layers`` (first, middle or last), on this process alone."""
    if layers.start < 0 or layers.stop > model.num_layers or not len(layers):
        raise ValueError(f"layers must lie within 0..{model.num_layers - 1}, got {layers}")
    times = _stage_samples(_StageBench(model, layers, microbatch, device, seed), _timer(device), warmup, reps)
    med = {k.lower(): statistics.median(v) for k, v in times.items()}
    return StageProfile(layers, microbatch, str(device), **med)


def _optimizer_samples(bench: _StageBench, optimizer: str, lr: float, warmup: int, reps: int) -> list[float]:
    backward_full(bench._forward(bench._input()), bench.grad)  # gradients exist, as after a step's backward
    opt = make_optimizer(optimizer, bench.params, lr)
    timed = _timer(bench.device)
    return _repeat(lambda: timed(opt.step), warmup, reps)


# -- the executor's own cost per task -----------------------------------------------------------------------------


def _task_overhead_samples(device: torch.device, warmup: int, reps: int, tasks: int = 200) -> list[float]:
    """Seconds per task of the executor loop around an empty body (stamps, record, polls, dict traffic).

    Mirrors :meth:`real.executor.Executor.run_step`: per task two stamps, one
    ``Recorder.add``, a parts() walk and dispatch, one poll of the data-parallel
    sync and of the outstanding sends, and a put/pop of the value in a dict.
    """
    rec = Recorder(device)
    rec.begin(True)
    box: dict[int, int] = {}
    table = {"F": lambda: None}

    def loop() -> float:
        t = time.perf_counter()
        for i in range(tasks):
            start = rec.stamp()
            for _ in (0,):
                table["F"]()
            box[i] = i
            box.pop(i)
            (lambda: None)()
            (lambda: None)()
            rec.add(i, start, rec.stamp(), 0)
        rec.begin(True)
        return (time.perf_counter() - t) / tasks

    return _repeat(loop, warmup, reps)


def _step_overhead_samples(cfg: ProfileConfig, benches: Sequence[_StageBench], batch: int, microbatches: int,
                           warmup: int, reps: int) -> list[float]:
    """Per step outside the program, as :mod:`real.train` does it: zero_grad of the stages, the step's batch
    made and cut into microbatches (ranks holding the first or last stage), the all-reduce of the loss."""
    value = torch.zeros(1, dtype=torch.float64)
    opts = [make_optimizer("sgd", b.params, 1e-3) for b in benches]

    def once() -> float:
        if dist.is_initialized():
            dist.barrier()
        t = time.perf_counter()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        microbatches_of(make_batch(cfg.model, cfg.seed, 0, batch), 1, 0, microbatches)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(value)
        return time.perf_counter() - t

    return _repeat(once, warmup, reps)


# -- the whole profile --------------------------------------------------------------------------------------------


def _machine(world: int, backend: str, device: torch.device) -> dict[str, Any]:
    return {"host": platform.node(), "cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "world_size": world,
            "backend": backend, "device": device.type}


def profile(cfg: ProfileConfig, device: torch.device | None = None) -> dict[str, Any]:
    """Measure everything (every rank calls this at once); returns the cost file's dict on every rank."""
    device = device or torch.device("cpu")
    _, world, _ = env_world()
    timed = _timer(device)
    model, mb = cfg.model, cfg.microbatch_size
    act_bytes = 4 * int(torch.Size(activation_shape(model, mb)).numel())  # float32 boundary tensor
    layouts = [(n, s, layers) for n in cfg.stages for s, layers in enumerate(partition(model.num_layers, n, cfg.split))]
    benches = [_StageBench(model, layers, mb, device, cfg.seed, cfg.microbatches) for _, _, layers in layouts]
    # Round robin over the stages, one repetition each at a time: a load that comes and goes on a shared
    # machine then shifts every stage's samples alike instead of one stage's.
    samples: list[dict[str, list[float]]] = [{k: [] for k in _PASSES} for _ in benches]
    probes = [probe_seconds()]  # the machine's speed around each part (real.profile.probe): a slow spell shows
    for rep in range(cfg.warmup + cfg.reps):
        for bench, times in zip(benches, samples, strict=True):
            sample = bench.one_rep(timed)
            if rep >= cfg.warmup:
                for k, v in zip(_PASSES, sample, strict=True):
                    times[k].append(v)
    rows_of: dict[int, list[dict[str, Any]]] = {}
    for (n, s, layers), bench, times in zip(layouts, benches, samples, strict=True):
        times["OPTIM"] = _optimizer_samples(bench, cfg.optimizer, cfg.lr, cfg.warmup, cfg.reps)
        times["SERVER_UPDATE"] = server_update_samples(bench.params, cfg.optimizer, cfg.lr, cfg.bucket_mb, cfg.dp,
                                                       _timer(bench.device), cfg.warmup, cfg.reps)
        row = {"stage": s, "layers": [layers.start, layers.stop],
               "param_bytes": sum(p.numel() * p.element_size() for p in bench.params)}
        row.update({k: _stat(_gathered(v)) for k, v in times.items()})
        rows_of.setdefault(n, []).append(row)
        log.info("%d stages, stage %d (layers %s): %s", n, s, row["layers"],
                 " ".join(f"{k}={row[k]['median'] * 1e3:.3f}ms" for k in (*_PASSES, "OPTIM")))
    partitions = [{"num_stages": n, "stages": rows} for n, rows in rows_of.items()]
    probes.append(probe_seconds())
    pp = cfg.pp or max(world // cfg.dp, 1)
    if cfg.dp > 1 and pp * cfg.dp != world:
        raise ConfigError(f"profile: dp {cfg.dp} x pp {pp} must equal the world size {world}", field="dp")
    max_params = max(s["param_bytes"] for p in partitions for s in p["stages"])
    step_overhead = _stat(_gathered(_step_overhead_samples(
        cfg, benches[: cfg.stages[0]], mb * cfg.microbatches, cfg.microbatches, cfg.warmup, cfg.reps)))
    task_overhead = _stat(_gathered(_task_overhead_samples(device, cfg.warmup, cfg.reps)))
    p2p = _p2p(act_bytes, cfg.warmup, cfg.reps)
    colls = _collectives(pp, cfg.dp, max_params, cfg.warmup, cfg.reps)
    probes.append(probe_seconds())
    slow = _slowdown(cfg, pp, benches[: cfg.stages[0]], timed)
    reduce_hook = _reduce_hook(cfg, pp, benches[: cfg.stages[0]])
    param_copy = _param_copy(cfg, pp, benches[: cfg.stages[0]])
    probes.append(probe_seconds())
    powersgd = _powersgd(cfg, pp, benches[: cfg.stages[0]], colls)
    zero3 = _zero3(cfg, pp, benches[0])
    pair = pair_share(benches[: cfg.stages[0]], timed, cfg.warmup, cfg.reps)
    probes.append(probe_seconds())
    probes = _gathered(probes)
    return {
        "schema": PROFILE_SCHEMA,
        "machine": _machine(world, dist.get_backend() if dist.is_initialized() else "none", device),
        "model": model.to_dict(), "microbatch_size": mb, "dtype": "float32", "activation_bytes": act_bytes,
        "optimizer": cfg.optimizer, "reps": cfg.reps, "warmup": cfg.warmup,
        "partitions": partitions,
        "step_overhead": step_overhead,
        "task_overhead": task_overhead,
        "p2p": p2p,
        "collectives": colls,
        "comm_slowdown": slow,
        "reduce_hook": reduce_hook,
        "param_copy": param_copy,
        "powersgd": powersgd,
        "zero3": zero3,
        "pair_threads": pair,
        "warnings": fit_warnings(p2p, colls, slow),
        # nanoseconds per gradient element of each codec's compress + decompress (the first stage's parameters
        # as one bucket): the simulator's parallel.codec_ns_per_param (real.dp.compress.profile_codecs)
        "codecs": profile_codecs([tuple(p.shape) for p in benches[0].params], warmup=cfg.warmup, reps=cfg.reps,
                                 device=device),
        # every rank's probes (real.profile.probe) at the start, after the passes, after the collectives, after the
        # overlap sections and at the end: how much slower than its fastest the host ran meanwhile
        "machine_speed": {"probes": probes, "spell": spell(probes)},
    }


def _slowdown(cfg: ProfileConfig, pp: int, benches: Sequence[_StageBench], timed: Callable) -> dict[str, Any] | None:
    """The ``comm_slowdown`` section (dp > 1): the first partition's passes alone and with a bucket in flight."""
    if cfg.dp < 2:
        return None
    from real.profile.overlap import comm_slowdown

    stage_bytes = max(sum(p.numel() * p.element_size() for p in b.params) for b in benches)
    bucket = int(min(cfg.bucket_mb * 2**20, stage_bytes)) // (4 * cfg.dp) * (4 * cfg.dp)
    return comm_slowdown(benches, _dp_group(pp, cfg.dp), max(bucket, 4 * cfg.dp), timed, cfg.warmup, cfg.reps,
                         _gathered)


def _reduce_hook(cfg: ProfileConfig, pp: int, benches: Sequence[_StageBench]) -> dict[str, Any] | None:
    """The ``reduce_hook`` section (dp > 1): zero2/zero3's per-bucket hook on the first partition's buckets."""
    if cfg.dp < 2:
        return None
    from real.profile.hook import reduce_hook

    return reduce_hook(benches, _dp_group(pp, cfg.dp), cfg.bucket_mb, cfg.warmup, cfg.reps, _gathered)


def _param_copy(cfg: ProfileConfig, pp: int, benches: Sequence[_StageBench]) -> dict[str, Any] | None:
    """The ``param_copy`` section (dp > 1): decentralized's and local-sgd's copies on the first partition's buckets."""
    if cfg.dp < 2:
        return None
    from real.profile.param_copy import param_copy

    return param_copy(benches, _dp_group(pp, cfg.dp), cfg.bucket_mb, cfg.warmup, cfg.reps, _gathered)


def _zero3(cfg: ProfileConfig, pp: int, bench: _StageBench) -> dict[str, Any] | None:
    """The ``zero3`` section (dp > 1): the first stage's gathers and its passes after them (:mod:`real.profile.zero3`)."""
    if cfg.dp < 2:
        return None
    from real.profile.zero3 import zero3_section

    return zero3_section(bench, _dp_group(pp, cfg.dp), cfg.bucket_mb, cfg.reps, _gathered)


def _powersgd(cfg: ProfileConfig, pp: int, benches: Sequence[_StageBench], colls: dict[str, Any] | None
              ) -> dict[str, Any] | None:
    """The ``powersgd`` section (dp > 1), and ``collectives.all_reduce.small`` put into ``colls``
    (:mod:`real.profile.powersgd`)."""
    if cfg.dp < 2 or colls is None:
        return None
    from real.profile.powersgd import powersgd_section

    section, small = powersgd_section([b.params for b in benches], _dp_group(pp, cfg.dp), cfg.bucket_mb,
                                      cfg.warmup, cfg.reps, _gathered, _fit_alpha_beta)
    colls["all_reduce"]["small"] = small
    from real.profile.psgd_backward import hooks_in_backward

    for spec, entry in section.items():  # the hooks inside a real backward: what the simulator charges
        entry["in_backward"] = hooks_in_backward(spec, benches[0], _dp_group(pp, cfg.dp), cfg.bucket_mb,
                                                 cfg.warmup, cfg.reps, _gathered)
    return section
