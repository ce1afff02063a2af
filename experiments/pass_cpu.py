"""What each pass costs its own thread, per data-parallel mode: CPU time, not wall time.

    torchrun --nproc-per-node 2 experiments/pass_cpu.py --out DIR -- <python -m real flags>

e.g. (the grid's model and buckets, docs/dp-modes.md "What a zero3 pass costs on the CPU testbed")::

    timeout 300 torchrun --nproc-per-node 2 experiments/pass_cpu.py --out /tmp/pc -- --schedule 1f1b --pp 1 \\
        --dp 2 --microbatches 8 --steps 8 --layers 6 --dim 128 --heads 4 --vocab 256 --seq 64 \\
        --optimizer adamw --bucket-mb 1 --batch-size 64 --dp-mode zero3

Each rank runs ``python -m real`` with the flags after ``--``, and times every forward and backward pass
(``real.executor.Executor._forward`` / ``_backward``) and the pieces of zero2/zero3's sync
(``real.dp.zero.ShardedSync``: the gradient hook's ``_reduce``, the gathers' launch and wait, the free) three
ways: wall time, the thread's CPU time (``time.thread_time``: what a loaded machine does not inflate) and
its minor page faults. It writes ``DIR/rank{R}.json``: {name: {calls, wall_ms, cpu_ms, minor_faults}} per
call, and prints rank 0's table. Wall time over CPU time says how much of a pass went to waiting for the core.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analysis.cli.train import main as train_main
from real.dp.zero import ShardedSync
from real.executor import Executor

PIECES = {"F": (Executor, "_forward"), "B": (Executor, "_backward"), "reduce": (ShardedSync, "_reduce"),
          "launch_gather": (ShardedSync, "_launch_gather"), "wait_gather": (ShardedSync, "_wait_gather"),
          "free": (ShardedSync, "_free")}


def timed(name: str, fn: Callable[..., Any], acc: dict[str, list[float]]) -> Callable[..., Any]:
    """``fn``, adding each call's wall and thread CPU seconds and minor faults to ``acc[name]``."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        try:
            return fn(*args, **kwargs)
        finally:
            row = acc.setdefault(name, [0, 0.0, 0.0, 0])
            row[0] += 1
            row[1] += time.perf_counter() - wall
            row[2] += time.thread_time() - cpu
            row[3] += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
    return wrapper


def per_call(acc: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: {"calls": n, "wall_ms": w / n * 1e3, "cpu_ms": c / n * 1e3, "minor_faults": f / n}
            for k, (n, w, c, f) in sorted(acc.items())}


def main(argv: list[str]) -> int:
    if "--out" not in argv or "--" not in argv or argv.index("--out") + 1 >= argv.index("--"):
        print(f"usage: torchrun ... {Path(__file__).name} --out DIR -- <python -m real flags>; got {argv!r}",
              file=sys.stderr)
        return 2
    out = Path(argv[argv.index("--out") + 1])
    acc: dict[str, list[float]] = {}
    for name, (cls, attr) in PIECES.items():
        setattr(cls, attr, timed(name, getattr(cls, attr), acc))
    rc = train_main(argv[argv.index("--") + 1:])
    rank = int(os.environ.get("RANK", "0"))
    out.mkdir(parents=True, exist_ok=True)
    table = per_call(acc)
    (out / f"rank{rank}.json").write_text(json.dumps(table, indent=1) + "\n")
    if rank == 0:
        for k, v in table.items():
            print(f"{k:14s} calls {v['calls']:4d}  wall {v['wall_ms']:8.3f} ms  cpu {v['cpu_ms']:8.3f} ms  "
                  f"minor faults {v['minor_faults']:7.1f}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
