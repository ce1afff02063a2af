"""``python -m real`` (under torchrun) and ``schedlab run``: train a model for real with a registered schedule.

    torchrun --nproc-per-node 4 -m real --schedule 1f1b --pp 2 --dp 2 --microbatches 8 --steps 20 \\
             --trace out/real.csv
    schedlab run --schedule 1f1b --pp 2 --microbatches 8      # starts torchrun with pp x dp processes

The flags are parsed into a :class:`real.RunConfig` and :func:`real.run`
runs it. Bad input is one line on stderr (on every rank) and exit
status 2, before any communication.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import torch

from analysis.cli.common import (
    OneLineParser,
    add_schedule_args,
    errors_to_exit,
    fail,
    given,
    guarded,
    int_list,
    print_json,
    refuse,
    schedule_source,
    with_flag,
)
from analysis.cli.live import add_live_args, live_config, live_defaults, refuse_live_flags, run_live
from analysis.cli.progress import format_seconds
from analysis.timeline import check_figure_path, plot_timeline
from common import parse
from common.outputs import Output, atomic_write, check_paths
from common.usercode import UserCodeError, raised, user_frames
from real import stop
from real.checkpoint import CheckpointConfig, check_unlocked
from real.config import (
    BACKENDS,
    BALANCE,
    DP_MODES,
    DTYPES,
    FAIL_MODES,
    MODEL_FLAGS,
    MODEL_KINDS,
    OPTIMIZERS,
    DataConfig,
    FaultConfig,
    Layout,
    ModelConfig,
    OptimConfig,
    RunConfig,
    RuntimeConfig,
    SyncConfig,
    model_argv,
)
from real.data.tokens import sidecar_vocab
from real.dp.ps_async import read_ps_order
from real.faults.elastic import job_run
from real.launch import die_with_launcher, launch
from real.mesh import env_world
from real.metrics_log import MetricsLog, check_log_dir, metrics_file
from real.model_api import UserModel, from_factory, plan_for
from real.p2p import PeerError
from real.train import resolve_backend, resume_point, run
from real.trainer import RunResult, restart_count
from real.usercode import check_model
from schedules import ConfigError, SchedlabError
from schedules.dp.modes import PEER_SELECTIONS
from schedules.library.recompute import RECOMPUTE_PLACEMENTS
from schedules.trace import check_trace_path
from sim.costs.cluster import parse_devices

__all__ = ["add_model_args", "config_from_args", "launch_main", "main", "model_argv", "model_from_args", "parser",
           "refuse_model_flags"]



def add_model_args(p: argparse.ArgumentParser, defaults: ModelConfig | None = None) -> None:
    """The built-in model's flags (``python -m real``, ``python -m real.profile``, the experiments)."""
    d = defaults or ModelConfig()
    p.set_defaults(model_defaults=d)  # the flags default to None, so that a flag given can be told from one not
    m = p.add_argument_group("model")
    m.add_argument("--model", type=_model_kind, default=d.kind, metavar="{gpt,mlp,pkg.module:factory}",
                   help=f"gpt decoder, mlp, or a factory returning a real.UserModel (default {d.kind})")
    m.add_argument("--layers", type=int, help=f"decoder blocks / hidden layers (default {d.layers})")
    m.add_argument("--dim", type=int, help=f"hidden size (default {d.dim})")
    m.add_argument("--heads", type=int, help=f"attention heads (default {d.heads})")
    m.add_argument("--vocab", type=int, help=f"vocabulary (gpt) or classes (mlp) (default {d.vocab})")
    m.add_argument("--seq", type=int, help=f"sequence length (gpt; default {d.seq})")
    m.add_argument("--moe-experts", type=int, metavar="E",
                   help=f"gpt: a mixture of E expert MLPs in every block (default {d.moe_experts}: dense)")
    m.add_argument("--moe-top-k", type=int, metavar="K",
                   help=f"with --moe-experts: the experts each token goes to (default {d.moe_top_k})")


def _model_kind(text: str) -> str:
    if text in MODEL_KINDS or (":" in text and all(text.partition(":")[::2])):
        return text
    raise argparse.ArgumentTypeError(f"invalid choice {text!r}: give {', '.join(MODEL_KINDS)} or pkg.module:factory "
                                     "(a function returning a real.UserModel)")


def model_from_args(args: argparse.Namespace, vocab: int | None = None) -> ModelConfig:
    """The built-in model's config (the defaults when ``--model`` names a factory); ``vocab``: the vocabulary
    when ``--vocab`` is not given (a token file's)."""
    d = getattr(args, "model_defaults", None) or ModelConfig()
    kind = args.model if args.model in MODEL_KINDS else d.kind
    values = {k: getattr(args, k) if getattr(args, k) is not None else getattr(d, k) for k in MODEL_FLAGS}
    if args.vocab is None and vocab is not None:
        values["vocab"] = vocab
    return ModelConfig(kind=kind, **values)


def refuse_model_flags(args: argparse.Namespace) -> None:
    """The built-in model's flags do nothing with ``--model pkg.module:factory``: an error."""
    if args.model not in MODEL_KINDS:
        refuse(given(args, *MODEL_FLAGS), f"with --model {args.model} (the factory builds the model; leave them out)")


def _factory(args: argparse.Namespace) -> str | None:
    return None if args.model in MODEL_KINDS else args.model


def parser(prog: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description="Train a model with a pipeline schedule on torch.distributed.")
    add_schedule_args(p, required=False)
    p.set_defaults(prog=prog)
    p.set_defaults(dp_given=False)  # an explicit --dp 1 is not the default 1: a placement must agree with it
    p.add_argument("--dp", type=_dp, default=1, metavar="D", action=_Given,
                   help="data-parallel replicas, or auto: world size / pp (elastic runs; default 1)")
    p.add_argument("--ep", type=int, default=1, metavar="N",
                   help="expert parallelism over the replicas, with --moe-experts: N consecutive replicas share "
                   "each stage's experts (N divides dp and the experts; default 1)")
    p.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    p.add_argument("--batch-size", type=int, default=32, metavar="B", help="global batch per step (default 32)")
    p.add_argument("--seed", type=int, default=0, help="fixes the model and the data (default 0)")
    add_model_args(p)
    p.add_argument("--split", type=int_list, metavar="N,N,...", help="layers per stage, e.g. 2,2,1,1 (default: even)")
    p.add_argument("--boundaries", type=int_list, metavar="N,N,...",
                   help="the first layer (block) of every stage but the first, e.g. 3,5")
    p.add_argument("--balance", choices=BALANCE, help="split the blocks by their profiled forward+backward time")
    p.add_argument("--data", metavar="PATH", help="a token file (python -m real.data prepare) instead of synthetic data")
    p.add_argument("--data-master", action="store_true",
                   help="with --data: each replica leases its per-step shard of windows from a data master on rank 0")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="bfloat16: autocast passes, bf16 messages, float32 master weights (default float32)")
    o = p.add_argument_group("training")
    o.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="default adamw")
    o.add_argument("--lr", type=float, default=3e-3, help="learning rate (default 3e-3)")
    o.add_argument("--dp-mode", choices=DP_MODES, help="gradient sync, with dp > 1 (default ddp)")
    o.add_argument("--bucket-mb", type=float, help="gradient bucket cap in MiB, with dp > 1 (default 25)")
    o.add_argument("--placement", metavar="DEVICES",
                   help="parameter servers and trainers, e.g. '/pserver/CPU:0-1,/trainer/CPU:0-3': dp mode ps, "
                   "dp = trainers / pp, world = trainers + servers (CPU, gloo)")
    o.add_argument("--staleness", type=int, metavar="S",
                   help="with --dp-mode async-ps: the steps a trainer may run ahead of the slowest (default 0)")
    o.add_argument("--ps-order", metavar="FILE",
                   help="with --dp-mode async-ps: the servers fold pushes and answer requests in the order a run "
                   "recorded (its --json output, \"ps_order\"), so that run is repeated bit for bit")
    o.add_argument("--grad-compression", metavar="CODEC",
                   help="codec of the gradient collectives, with dp > 1: none (default), fp16, bf16, int8, "
                   "powersgd:R (sync/ddp only); only none is exact (docs/compression.md)")
    o.add_argument("--sync-every", type=int, metavar="K",
                   help="with --dp-mode local-sgd: average the replicas' parameters once every K steps (default 1)")
    o.add_argument("--peer-selection", choices=PEER_SELECTIONS,
                   help="with --dp-mode decentralized: average with both ring neighbours (ring, the default) or "
                   "with one peer per step drawn from the seed (random, even dp)")
    o.add_argument("--recompute", choices=RECOMPUTE_PLACEMENTS, default="none",
                   help="activation recomputation: none (default); full: an R (the forward again, with grad) right "
                   "before every backward, its F keeps only its input; bubbles: each R moved into idle time "
                   "before its backward within --recompute-limit")
    o.add_argument("--recompute-limit", type=float, metavar="M",
                   help="with --recompute bubbles: activation memory per rank, in microbatches' worth (M_B)")
    r = p.add_argument_group("runtime and output")
    r.add_argument("--backend", choices=BACKENDS, help="default: nccl with CUDA, gloo otherwise")
    r.add_argument("--timeout", type=float, default=300.0, metavar="S", help="collective timeout (default 300 s)")
    r.add_argument("--recv-ahead", type=int, metavar="K",
                   help="receives posted ahead per peer, with pp > 1 (default: all)")
    r.add_argument("--trace", metavar="FILE", help="write the merged trace of the traced steps (.csv or .parquet)")
    r.add_argument("--trace-step", type=int, default=-1, metavar="K", help="step to trace (default -1: the last)")
    r.add_argument("--trace-steps", type=int, default=1, metavar="N",
                   help="trace N steps ending with --trace-step (default 1; a `step` column tells them apart)")
    r.add_argument("--plot", metavar="FILE", help="draw the traced step's timeline (.png, .svg or .pdf; rank 0)")
    r.add_argument("--save-params", metavar="FILE", help="rank 0 saves the final parameters (torch.save)")
    r.add_argument("--json", action="store_true", help="print exactly one JSON object at the end (rank 0)")
    r.add_argument("--log-dir", metavar="DIR", help="rank 0 writes TensorBoard event files and metrics.jsonl "
                   "(loss, step time, tokens/s, lr, memory per rank) here")
    f = p.add_argument_group("fault tolerance (see README: torchrun --max-restarts)")
    f.add_argument("--checkpoint-dir", metavar="DIR", help="save DCP checkpoints here and resume from the newest")
    f.add_argument("--checkpoint-every", type=int, metavar="K",
                   help="with --checkpoint-dir: save every K steps (default 0: only resume)")
    f.add_argument("--keep-last", type=int, metavar="N",
                   help="with --checkpoint-dir: complete checkpoints kept (default 2)")
    f.add_argument("--async-checkpoint", action="store_true", help="with --checkpoint-dir: save with dcp.async_save (one in flight)")
    f.add_argument("--fail-at-step", type=int, metavar="S", help="inject a fault at step S (first attempt only)")
    f.add_argument("--fail-rank", type=int, default=0, metavar="R", help="the rank that fails (default 0)")
    f.add_argument("--fail-mode", choices=FAIL_MODES, default="kill", help="kill (SIGKILL) or hang (default kill)")
    f.add_argument("--slow-rank", type=int, metavar="R", help="a straggler: rank R sleeps --slow-s seconds before "
                   "each step (e.g. to see async-ps's staleness bound; python -m sim --trainer-speeds models it)")
    f.add_argument("--slow-s", type=float, default=0.0, metavar="SEC", help="with --slow-rank: seconds per step")
    r.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    add_live_args(p)
    return p


def _dp(text: str) -> int | str:
    if text.strip().casefold() == "auto":
        return "auto"
    value = parse.int_text(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: give an integer or auto")
    return value


class _Given(argparse.Action):
    """Store the value and mark ``DEST_given``: the flag was on the command line, not its default."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def _resolve_dp(dp: int | str, pp: int, world: int | None) -> int:
    """``--dp auto``: as many replicas as the launched processes hold pipelines (pp fixed)."""
    if dp != "auto":
        return dp
    if world is None:
        return 1
    if world % pp:
        raise ConfigError(f"dp auto: world size {world} is not a multiple of pp={pp}; "
                          f"launch a multiple of {pp} processes", field="dp")
    return world // pp


def _shape_from_file(args: argparse.Namespace) -> None:
    """--pp and --microbatches: required, except that a csv: schedule file carries its own (or --elastic live)."""
    live_defaults(args)
    if args.schedule is None:
        fail(f"{args.prog}: the following arguments are required: --schedule (see --help)")
    if args.schedule.startswith("csv:") and (args.pp is None or args.microbatches is None):
        from schedules import read_torch_csv

        schedule = read_torch_csv(args.schedule[len("csv:"):])
        args.pp = args.pp if args.pp is not None else schedule.num_ranks
        args.microbatches = args.microbatches if args.microbatches is not None else schedule.num_microbatches
    missing = [f"--{k}" for k in ("pp", "microbatches") if getattr(args, k) is None]
    if missing:
        fail(f"{args.prog}: the following arguments are required: {', '.join(missing)} (see --help)")


def config_from_args(args: argparse.Namespace, world: int | None = None) -> RunConfig:
    """Flags -> RunConfig (``world``: the launched processes, for ``--dp auto``); a SchedlabError names the bad value.

    A ``csv:FILE`` schedule gives pp and microbatches when the flags leave them out.
    """
    _shape_from_file(args)
    _refuse_idle_flags(args)
    model = model_from_args(args, sidecar_vocab(args.data) if args.data else None)
    checkpoint = None
    if args.checkpoint_dir is not None:
        checkpoint = CheckpointConfig(directory=args.checkpoint_dir, every=_or(args.checkpoint_every, 0),
                                      keep_last=_or(args.keep_last, 2), async_save=args.async_checkpoint)
    dp = _resolve_dp(args.dp, args.pp, world)
    servers = 0
    if args.placement is not None:
        dp, servers = _placement(args.placement, args.pp, args.dp if args.dp_given else "auto")
    return RunConfig(
        layout=Layout(schedule=args.schedule, pp=args.pp, dp=dp,
                      microbatches=args.microbatches, chunks=args.chunks, split=args.split,
                      boundaries=args.boundaries, balance=args.balance, recompute=args.recompute,
                      recompute_limit=args.recompute_limit, imports=tuple(args.imports), ep=args.ep),
        steps=args.steps,
        data=DataConfig(model=model, batch_size=args.batch_size, seed=args.seed, factory=_factory(args),
                        token_file=args.data, data_master=args.data_master),
        optim=OptimConfig(optimizer=args.optimizer, lr=args.lr),
        sync=SyncConfig(dp_mode=_or(args.dp_mode, "ps" if servers else "ddp"), bucket_mb=_or(args.bucket_mb, 25.0),
                        servers=servers, staleness=_or(args.staleness, 0),
                        grad_compression=_or(args.grad_compression, "none"),
                        sync_every=_or(args.sync_every, 1), peer_selection=_or(args.peer_selection, "ring")),
        runtime=RuntimeConfig(backend=args.backend, timeout_s=args.timeout, recv_ahead=args.recv_ahead,
                              trace_step=args.trace_step, trace_steps=args.trace_steps, dtype=args.dtype),
        checkpoint=checkpoint,
        faults=FaultConfig(fail_at_step=args.fail_at_step, fail_rank=args.fail_rank, fail_mode=args.fail_mode,
                           slow_rank=args.slow_rank, slow_s=args.slow_s),
    )


def _placement(text: str, pp: int, dp: int | str) -> tuple[int, int]:
    """``--placement``: (dp, servers) from its trainer and parameter-server devices (:func:`sim.costs.cluster.parse_placement`)."""
    devices = parse_devices(text)
    trainers = [d for d in devices if d.job == "trainer"]
    servers = [d for d in devices if d.job == "pserver"]
    if not servers:
        raise ConfigError(f"placement {text!r} has no parameter servers; add one, e.g. '/pserver/CPU:0,{text}'",
                          field="placement")
    if not trainers or len(trainers) % pp:
        raise ConfigError(f"placement {text!r} has {len(trainers)} trainer devices, not a multiple of pp {pp} "
                          f"(each trainer replica is a pipeline of pp ranks); give e.g. '/trainer/CPU:0-{2 * pp - 1}'",
                          field="placement")
    gpu = sorted({d.type for d in devices} - {"CPU"})
    if gpu:
        raise ConfigError(f"placement {text!r}: the parameter-server runtime runs CPU processes (gloo) only, not "
                          f"{', '.join(gpu)}; use /trainer/CPU and /pserver/CPU devices", field="placement")
    if dp not in ("auto", len(trainers) // pp):
        raise ConfigError(f"--dp {dp} does not match placement {text!r}: {len(trainers)} trainers at pp {pp} are "
                          f"dp {len(trainers) // pp}; leave --dp out", field="dp")
    return len(trainers) // pp, len(servers)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _refuse_idle_flags(args: argparse.Namespace) -> None:
    """A flag that would do nothing in this run is an error (exit 2), never silently accepted."""
    if args.checkpoint_dir is None:
        refuse(given(args, "checkpoint_every", "keep_last") + (["--async-checkpoint"] if args.async_checkpoint else []),
               "without --checkpoint-dir (nothing would be saved; give --checkpoint-dir DIR)")
    if args.dp == 1 and args.placement is None:  # with --dp auto the same command may run at dp 1 or more
        refuse(given(args, "dp_mode", "bucket_mb", "grad_compression", "sync_every", "peer_selection"),
               "at dp 1 (one replica: no gradients to synchronize)")
    if args.dp_mode != "async-ps":
        refuse(given(args, "staleness", "ps_order"), "without --dp-mode async-ps (the other modes do not run ahead)")
    if args.pp == 1:
        refuse(given(args, "recv_ahead"), "at pp 1 (one pipeline rank: no messages between stages)")
    if not args.moe_experts:
        refuse(given(args, "moe_top_k"), "without --moe-experts (a dense model routes no tokens)")
    if args.elastic is not None and args.ep != 1:
        fail("--ep has no effect with --elastic live (a replica syncs its gradients through torchft); leave it out")
    refuse_model_flags(args)
    refuse_live_flags(args)


def _user(config: RunConfig) -> UserModel | None:
    """The model of ``--model pkg.module:factory`` (built with the global RNG seeded from ``--seed``), or None."""
    return from_factory(config.data.factory, config.data.seed) if config.data.factory else None


def _checked(args: argparse.Namespace, world: int) -> tuple[RunConfig, UserModel | None]:
    """Every check of the flags that needs no communication and no checkpoint read (run() checks the plan
    again and picks the checkpoint to resume from); the user's model, if ``--model`` names a factory."""
    config = config_from_args(args, world)
    _check_paths(args)
    user = _user(config)
    plan_for(config, world, user)
    resolve_backend(config.runtime.backend)
    return config, user


def _inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """Every file a run reads: no output, appended or written, may be one of them."""
    model = args.model.rpartition(":")[0] if args.model not in MODEL_KINDS else None
    return {"--data": args.data, "the sidecar of --data": f"{args.data}.json" if args.data else None,
            "--schedule": schedule_source(args.schedule), "--ps-order": args.ps_order,
            "--model": model if model and model.endswith(".py") else None}


def _check_paths(args: argparse.Namespace) -> None:
    """Every input and output of the run through the one output policy (:func:`common.outputs.check_paths`),
    before anything runs or is written: the files it writes whole, the files it appends to (--events, the
    metrics file of --log-dir) and its folders."""
    if args.trace:
        check_trace_path(args.trace)
    if args.plot:
        check_figure_path(args.plot)
    if args.log_dir:
        check_log_dir(args.log_dir)
    check_paths({
        "--trace": Output(args.trace, "trace file") if args.trace else None,
        "--plot": Output(args.plot, "figure file") if args.plot else None,
        "--save-params": Output(args.save_params, "parameter file") if args.save_params else None,
        "--events": Output(args.events, "events file", "append") if args.events else None,
        "the metrics file of --log-dir": Output(metrics_file(args.log_dir), "metrics file", "append")
        if args.log_dir else None,
        "--log-dir": Output(args.log_dir, "log directory", "folder") if args.log_dir else None,
        "--checkpoint-dir": Output(args.checkpoint_dir, "checkpoint directory", "folder")
        if args.checkpoint_dir else None,
    }, _inputs(args))


def _on_step(config: RunConfig, quiet: bool, metrics: MetricsLog | None):
    """Rank 0's per-step output: a line with the time left (stderr with --json), and the metrics log.

    The time left is the mean time of the steps run so far times the steps left.
    """
    out = sys.stderr if quiet else sys.stdout
    model = config.data.model
    per_step = config.data.batch_size * model.seq if model.kind == "gpt" and not config.data.factory else None
    spent = []

    def show(step: int, loss: float, seconds: float) -> None:
        spent.append(seconds)
        left = sum(spent) / len(spent) * (config.steps - step - 1)
        print(f"step {step:>4} of {config.steps}  loss {loss:.4f}  {seconds * 1e3:8.1f} ms  left {format_seconds(left)}",
              file=out, flush=True)
        if metrics is not None:
            metrics.log(step, {"loss": loss, "step_time_s": seconds, "lr": config.optim.lr,
                               "tokens_per_s": per_step / seconds if per_step and seconds > 0 else None})

    return show


def _log_memory(metrics: MetricsLog, config: RunConfig, result: RunResult) -> None:
    """Every rank's measured memory, at the step it was measured."""
    values = {}
    for m in result.memory or ():
        if m:
            for key in ("peak_activation_bytes", "max_memory_allocated"):
                values[f"memory/rank{m['rank']}/{key}"] = m[key]
    if values:
        metrics.log(max(config.metered_step, result.start_step), values)


def _log_staleness(metrics: MetricsLog, result: RunResult) -> None:
    """async-ps: every trainer's staleness of every step (steps ahead of the slowest), gathered at the end."""
    for r, history in sorted((result.staleness or {}).items()):
        for i, ahead in enumerate(history):
            metrics.log(result.start_step + i, {f"staleness/rank{r}": ahead})


def _report(result: RunResult, args: argparse.Namespace) -> None:
    if args.save_params:
        atomic_write(args.save_params, lambda tmp: torch.save(result.parameters, tmp), "parameter file")
    if args.plot:
        plot_timeline(result.trace, args.plot)
    if args.json:
        print_json(result.to_json())
        return
    if result.resumed_from:
        print(f"resumed from {result.resumed_from} at step {result.start_step} (restart {restart_count()})")
    print(f"param_norm {result.param_norm:.10g}  param_sha256 {result.param_sha256}")
    measured = [m for m in result.memory if m and m.get("server") is None]  # none if the checkpoint was at --steps
    peak = ", ".join(f"rank {m['rank']}: {m['peak_activation_bytes'] / 2**20:.2f} MiB ({m['peak_activations_mb']:.2f} M_B)"
                     for m in measured)
    if measured:
        print(f"peak activations {peak}")
    for what, path in (("trace", result.trace_path), ("timeline", args.plot)):
        if path:
            print(f"wrote {what}: {path}")


@guarded
def main(argv: Sequence[str] | None = None, prog: str = "python -m real") -> int:
    die_with_launcher()  # under torchrun: no worker outlives it
    p = parser(prog)
    args = p.parse_args(argv)
    rank, world, _ = env_world()
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    prefix = f"[rank {rank}] " if world > 1 else ""
    with stop.handle_signals(), errors_to_exit(p, prefix):
        metrics, halted = None, None
        try:
            config, user = _checked(args, world)
            try:
                if args.elastic:
                    return run_live(config, args)
                if rank == 0 and user is not None and user.batches is not None and config.data.token_file:
                    sys.stderr.write(f"warning: --data {config.data.token_file} trains the model; the batches "
                                     f"function of {config.data.factory} is not used\n")
                order = read_ps_order(args.ps_order) if args.ps_order else None
                metrics = MetricsLog(args.log_dir, _inputs(args)) if args.log_dir and rank == 0 else None
                result = run(config, trace_path=args.trace, on_step=_on_step(config, args.json, metrics), user=user,
                             ps_order=order)
            except Exception as exc:  # after a signal, whatever failed is the run stopping (its peers leaving)
                if (halt := stop.stopping(exc)) is None:
                    raise
                raise halt from None
            if metrics is not None:
                _log_memory(metrics, config, result)
                _log_staleness(metrics, result)
        except stop.Interrupted as exc:  # every rank stopped after the same step (async-ps: its own); rank 0 says where
            if rank == 0:
                sys.stderr.write(f"{exc}\n")
            halted = stop.exit_status(exc.signum)
            return halted
        except PeerError as exc:  # a peer died or hangs (torchrun restarts the group, if allowed): one line
            sys.stderr.write(f"error: {prefix}{str(exc).splitlines()[0]}\n")
            return 1
        except SchedlabError as exc:
            if getattr(exc, "every_rank", False) and rank != 0:  # the same error on every rank: rank 0 says it
                return 2
            if isinstance(exc, UserCodeError):
                return _user_error(str(exc), exc.field, exc.frames, p, prefix, args.verbose)
            raise
        except Exception as exc:  # a user's block failed mid-training: one line naming the user's frame, if any
            frames = user_frames(exc)
            if not frames:
                raise
            error = raised("the model's code", exc, "model")
            return _user_error(str(error), None, error.frames, p, prefix, args.verbose)
        finally:
            if metrics is not None:
                metrics.close()
            if halted is not None and world > 1:  # peers may be gone: no teardown of the process group
                stop.leave(halted)
        if rank == 0:
            _report(result, args)
    return 0


def _user_error(message: str, field: str | None, frames: list[str], p: OneLineParser, prefix: str,
                verbose: int) -> int:
    """The user's code failed: one line, and under -v the user's own traceback frames (never the runtime's)."""
    text = f"error: {prefix}{with_flag(message, field, p)}\n"
    if verbose and frames:
        text += "the traceback's frames in your code (most recent call last):\n" + "".join(frames)
    sys.stderr.write(text)
    sys.stderr.flush()
    return 2


def _precheck_user_model(config: RunConfig, user: UserModel | None, world: int) -> None:
    """``schedlab run``, before torchrun starts: one microbatch through the user's whole model (as rank 0 will)."""
    if user is None:
        return
    plan, model, data = plan_for(config, world, user)
    blocks = model.blocks if model.blocks is not None else tuple(model.layers(range(model.num_layers)))
    check_model(blocks, plan.layers, model.loss, data.sample(config.microbatch_size), model.what)


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


@guarded
def launch_main(argv: Sequence[str] | None = None, prog: str = "schedlab run") -> int:
    """``schedlab run``: check the flags, then start torchrun with ``--nproc-per-node`` (default pp x dp)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher = argparse.ArgumentParser(add_help=False)
    launcher.add_argument("--nproc-per-node", type=int)
    known, rest = launcher.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        parser(prog).print_help()
        print("\n  --nproc-per-node N    processes to start with torchrun (default pp x dp)")
        return 0
    p = parser(prog)
    args = p.parse_args(rest)
    with errors_to_exit(p):
        config = config_from_args(args, known.nproc_per_node)
        nproc = known.nproc_per_node if known.nproc_per_node is not None else config.world_size
    if _under_torchrun() or (nproc == 1 and known.nproc_per_node is None):
        return main(rest, prog=prog)  # checks everything itself
    with errors_to_exit(p):  # refuse here, before any process starts: the same checks every rank makes
        config, user = _checked(args, nproc)
        _precheck_user_model(config, user, nproc)
        if config.checkpoint is not None:
            check_unlocked(config.checkpoint.directory, job_run(live_config(args)) if args.elastic else None)
        resume_point(config)
        if args.ps_order:
            read_ps_order(args.ps_order)
    return launch(nproc, ["-m", "real", *rest], checkpoint_dir=args.checkpoint_dir)
