"""The flags of ``--elastic live`` (``python -m real`` / ``schedlab run``): see :mod:`real.faults.elastic`.

    torchft_lighthouse --min_replicas 1 --join_timeout_ms 10000 &          # once, on a host every replica reaches
    torchrun --standalone --nproc-per-node 1 --max-restarts 3 -m real --elastic live \\
             --lighthouse http://HOST:29510 --replica-id 0 --schedule 1f1b --pp 1 --steps 1000
"""

from __future__ import annotations

import argparse
import sys

from analysis.cli.common import given, print_json, refuse
from real.config import RunConfig
from real.faults.elastic import ELASTIC_MODES, QUORUM_TIMEOUT_S, LiveConfig, check_live_layout, train_live
from real.faults.elastic_pp import train_live_pipeline

__all__ = ["add_live_args", "live_config", "live_defaults", "refuse_live_flags", "run_live"]


def add_live_args(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("live elastic training (torchft; docs/elastic.md)")
    e.add_argument("--elastic", choices=ELASTIC_MODES,
                   help="live: this process is one data-parallel replica under torchft's per-step quorum")
    e.add_argument("--lighthouse", metavar="ADDR", help="with --elastic live: the torchft lighthouse, http://HOST:PORT")
    e.add_argument("--replica-id", type=int, metavar="N", help="with --elastic live: this replica group's number")
    e.add_argument("--wait-replicas", type=int, metavar="N",
                   help="with --elastic live: this process's first step commits only with N replicas (default 1)")
    e.add_argument("--min-replicas", type=int, metavar="N",
                   help="with --elastic live: a step commits with at least N replicas (default 1)")
    e.add_argument("--quorum-timeout", type=float, metavar="S",
                   help="with --elastic live: give up, in one line, when --wait-replicas have not joined or fewer "
                        f"than --min-replicas are in the quorum for S seconds (default {QUORUM_TIMEOUT_S:g})")
    e.add_argument("--min-step-time", type=float, metavar="S",
                   help="with --elastic live: each step lasts at least S seconds (a stand-in for a slower model)")
    e.add_argument("--events", metavar="FILE", help="with --elastic live: append this replica's events (JSON lines)")


def live_defaults(args: argparse.Namespace) -> None:
    """With --elastic live: 1f1b, pp 1 and one microbatch unless given (pp 1: one process per replica and one
    pass, microbatches other than 1 refused with the reason; pp > 1: a pipeline per replica, which runs its
    share of the microbatches with the schedule)."""
    if args.elastic is None:
        return
    args.schedule = args.schedule or "1f1b"
    args.pp = 1 if args.pp is None else args.pp
    args.microbatches = 1 if args.microbatches is None else args.microbatches


def refuse_live_flags(args: argparse.Namespace) -> None:
    """Live flags without ``--elastic live``, and flags live mode does not use, are errors (exit 2)."""
    if args.elastic is None:
        refuse(given(args, "lighthouse", "replica_id", "wait_replicas", "min_replicas", "events",
                     "min_step_time", "quorum_timeout"),
               "without --elastic live")
        return
    refuse(given(args, "trace", "plot", "log_dir", "dp_mode", "bucket_mb", "recv_ahead", "balance"),
           "with --elastic live (a replica syncs its gradients through torchft; no traces, logs or tuning "
           "of the runtime's own sync)")
    idle = given(args, "save_params", "slow_rank", "recompute_limit", "backend", "placement")
    idle += [f"--dtype {args.dtype}"] * (args.dtype != "float32") + [f"--recompute {args.recompute}"] * (
        args.recompute != "none") + [f"--fail-rank {args.fail_rank}"] * (args.pp == 1 and args.fail_rank != 0)
    refuse(idle, "with --elastic live (a replica trains in float32 on gloo, without recomputation, stragglers "
                 "or a parameter file; a fault is --fail-at-step, of pipeline rank --fail-rank at pp > 1)")
    check_live_layout(args.pp, args.dp, args.microbatches)
    live_config(args)  # its checks, before anything runs


def live_config(args: argparse.Namespace) -> LiveConfig:
    fields = {"replica_id": args.replica_id, "wait_replicas": args.wait_replicas, "min_replicas": args.min_replicas,
              "min_step_s": args.min_step_time, "quorum_timeout_s": args.quorum_timeout}
    return LiveConfig(lighthouse=args.lighthouse or "", events=args.events,
                      **{k: v for k, v in fields.items() if v is not None})


def run_live(config: RunConfig, args: argparse.Namespace) -> int:
    """Train this replica; with --json one JSON object (losses, parameters' digest, PID), else one line."""
    train = train_live_pipeline if config.layout.pp > 1 else train_live  # a pipeline per replica, or one process
    result = train(config, live_config(args))
    if args.json:
        print_json(result.to_json())
    else:
        print(f"param_norm {result.param_norm:.10g}  param_sha256 {result.param_sha256}  "
              f"states received {result.heals}", file=sys.stdout)
    return 0
