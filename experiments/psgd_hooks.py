"""PowerSGD's hooks three ways in one 2-process run: back to back (the profile's ``wall``), inside a real backward
(what a run waits for, the profile's ``in_backward``), and inside a backward with the ranks aligned before each
hook (a barrier, not timed: no replica drift in it).

    timeout 120 torchrun --nproc-per-node 2 experiments/psgd_hooks.py [--reps 10] [--rounds 3] [--microbatch-size 4]

The grid's model (``real.profile.protocol.MODEL_SHAPE``) as one stage, its buckets at ``real.profile.protocol.BUCKET_MB``,
``powersgd:4``, gloo. Rank 0 logs one line per round, the three ways in turn (ms a step, median over repetitions and both ranks):
inside - aligned is the drift's share, aligned - back to back what a backward in progress does to the hooks
(the future callbacks' hand-offs with autograd's engine in the pass, the caches the compute leaves). Timings
are the machine's at the time: compare the three within one run (docs/compression.md).
"""

from __future__ import annotations

import argparse
import logging

import torch
import torch.distributed as dist

from real import ModelConfig
from real.profile.comm import _fit_alpha_beta, _gathered
from real.profile.machine import _StageBench
from real.profile.powersgd import powersgd_section
from real.profile.protocol import BUCKET_MB, MODEL_SHAPE, POWERSGD_RANK
from real.profile.psgd_backward import hooks_in_backward

log = logging.getLogger("psgd_hooks")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="the three ways in turn, this many times")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--microbatch-size", type=int, default=4)
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model = ModelConfig(**MODEL_SHAPE)
    bench = _StageBench(model, range(model.num_layers), a.microbatch_size, torch.device("cpu"), seed=0)
    group, spec = dist.group.WORLD, f"powersgd:{POWERSGD_RANK}"
    for r in range(a.rounds):
        section, _ = powersgd_section([bench.params], group, BUCKET_MB, a.warmup, a.reps, _gathered,
                                      _fit_alpha_beta)
        inside = hooks_in_backward(spec, bench, group, BUCKET_MB, a.warmup, a.reps, _gathered)
        aligned = hooks_in_backward(spec, bench, group, BUCKET_MB, a.warmup, a.reps, _gathered, lockstep=True)
        if dist.get_rank() == 0:
            log.info("round %d: %s, %d buckets, ms a step (median of %d reps x 2 ranks): back to back (profile "
                     "wall) %.2f | inside a backward %.2f (backward longer by %.2f) | inside, ranks aligned per "
                     "hook %.2f (backward longer by %.2f, barriers included)", r, spec, inside["buckets"], a.reps,
                     section[spec]["wall"] * 1e3, inside["hooks"]["median"] * 1e3, inside["extra"]["median"] * 1e3,
                     aligned["hooks"]["median"] * 1e3, aligned["extra"]["median"] * 1e3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
