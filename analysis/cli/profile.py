"""``python -m real.profile`` (under torchrun): profile this machine into a cost file for ``python -m sim --costs``.

    torchrun --nproc-per-node 2 -m real.profile --model gpt --layers 6 --dim 128 --seq 64 \\
             --microbatch-size 4 --stages 2,4 --out out/profile.json

What is measured and the file's schema: :mod:`real.profile`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from analysis.cli.common import OneLineParser, errors_to_exit, guarded, int_list
from analysis.cli.train import add_model_args, model_from_args
from common.errors import check_positive_ints
from real.config import MODEL_KINDS, OPTIMIZERS
from real.launch import die_with_launcher
from real.mesh import env_world
from real.profile.machine import ProfileConfig, profile
from schedules import ConfigError
from schedules.util import atomic_write, check_output_file

__all__ = ["config_from_args", "main"]


def _parser() -> OneLineParser:
    p = OneLineParser(prog="python -m real.profile", description="Profile this machine into a cost file for "
                      "python -m sim --costs (run under torchrun; every rank measures at once).")
    p.add_argument("--out", required=True, metavar="FILE.json", help="cost file to write (rank 0)")
    p.add_argument("--stages", type=int_list, default=(2,), metavar="N,N", help="stage counts to profile, e.g. 2,4 (default 2)")
    p.add_argument("--split", type=int_list, metavar="N,N,...", help="layers per stage of the one partition (default: even)")
    p.add_argument("--microbatch-size", type=int, metavar="B", help="samples per microbatch (default 4)")
    p.add_argument("--batch-size", type=int, metavar="B", help="with --microbatches: microbatch = B / (M x dp)")
    p.add_argument("--microbatches", type=int, metavar="M")
    p.add_argument("--pp", type=int, help="pipeline ranks, for the data-parallel groups (default world / dp)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel replicas: collectives over each dp group")
    p.add_argument("--bucket-mb", type=float, default=25.0, metavar="MIB",
                   help="with --dp > 1: the all-reduce kept in flight while comm_slowdown times the passes "
                        "(default 25, the runtime's bucket)")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions first (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--lr", type=float, default=3e-3)
    add_model_args(p)
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="collective timeout (default 300 s)")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def _microbatch_size(args: argparse.Namespace) -> int:
    """--microbatch-size as given (a bad one is refused by ProfileConfig, never replaced by the default), or
    --batch-size / (--microbatches x --dp) when that is a whole number >= 1, or 4."""
    if args.batch_size is None:
        return 4 if args.microbatch_size is None else args.microbatch_size
    if args.microbatch_size is not None:
        raise ConfigError("batch_size and microbatch_size both set the microbatch: give one of them",
                          field="batch_size")
    if args.microbatches is None:
        raise ConfigError("batch_size needs microbatches (microbatch = batch / (microbatches x dp))",
                          field="microbatches")
    check_positive_ints("profile", microbatches=args.microbatches, dp=args.dp)
    share = args.microbatches * args.dp
    if args.batch_size < share or args.batch_size % share:
        raise ConfigError(f"batch_size {args.batch_size} does not split into microbatches x dp = "
                          f"{args.microbatches} x {args.dp} equal microbatches of at least one sample; give a "
                          f"multiple of {share}", field="batch_size")
    return args.batch_size // share


def config_from_args(args: argparse.Namespace) -> ProfileConfig:
    if args.model not in MODEL_KINDS:  # never profile the built-in model in its place
        raise ConfigError(f"python -m real.profile profiles the built-in models ({', '.join(MODEL_KINDS)}), not "
                          f"{args.model}; for your model's costs, train it with schedlab run --trace FILE.csv and give "
                          "the trace as --costs", field="factory")
    return ProfileConfig(model=model_from_args(args), stages=args.stages, split=args.split,
                         microbatch_size=_microbatch_size(args),
                         microbatches=1 if args.microbatches is None else args.microbatches, pp=args.pp, dp=args.dp,
                         bucket_mb=args.bucket_mb, optimizer=args.optimizer, lr=args.lr, reps=args.reps, warmup=args.warmup, seed=args.seed)


@guarded
def main(argv: Sequence[str] | None = None) -> int:
    die_with_launcher()
    parser = _parser()
    args = parser.parse_args(argv)
    rank, world, _ = env_world()
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
                        format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    prefix = f"[rank {rank}] " if world > 1 else ""
    with errors_to_exit(parser, prefix):
        out = check_output_file(args.out, "cost file", (".json",))
        cfg = config_from_args(args)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    try:
        with errors_to_exit(parser, f"[rank {rank}] "):
            result = profile(cfg)
        if dist.is_initialized():  # every rank's last collective done before the groups are torn down
            dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        with errors_to_exit(parser, prefix):
            atomic_write(out, lambda tmp: tmp.write_text(json.dumps(result, indent=1, allow_nan=False)), "cost file")
        sys.stdout.write(f"wrote cost file: {out}\n")
    return 0
