"""Memory of the rounds worker: RSS and live tensors after each configuration run in one process group.

    torchrun --nproc-per-node 2 experiments/rounds_memory.py [--rounds 3]

What :mod:`real.rounds` does for the validation grid (configurations one after
another on one mesh), on a small gpt: each rank prints, after every run, its
resident memory (/proc/self/statm) and the tensors Python's collector still
tracks. A flat line is the goal; a run that leaves its graph alive shows as
tensors that never go away.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import torch

from real import ModelConfig, RunConfig, make_plan
from real.launch import die_with_launcher
from real.mesh import Mesh, env_world
from real.train import run

MODEL = ModelConfig(kind="gpt", layers=4, dim=64, heads=4, vocab=128, seq=32)
CONFIGS = (("1f1b", 4), ("gpipe", 4), ("zb-h1", 4), ("1f1b", 8), ("interleaved-1f1b", 4), ("zb-h2", 8))


def rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def main() -> None:
    die_with_launcher()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rank, world, _ = env_world()
    configs = [RunConfig.of(schedule=s, pp=2, microbatches=m, batch_size=16, model=MODEL, steps=4, backend="gloo")
               for s, m in CONFIGS]
    mesh = Mesh.create(make_plan(configs[0], world), "gloo", 60)
    try:
        for r in range(args.rounds):
            for i, config in enumerate(configs):
                run(config, mesh=mesh)
                print(f"rank {rank} round {r} config {i} ({config.schedule}): rss {rss_mib():.1f} MiB, "
                      f"live tensors {live_tensors()}", flush=True)
    finally:
        mesh.close()


if __name__ == "__main__":
    main()
