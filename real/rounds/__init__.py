"""Run several configurations interleaved in rounds inside one process group: the measurement protocol's worker.

    torchrun --nproc-per-node 2 -m real.rounds SPEC.json

:func:`real.measure.measure_interleaved` writes SPEC.json and reads the
result; a user rarely starts this by hand. SPEC is::

    {"configs": [RunConfig.to_dict(), ...], "rounds": R, "attempts": A, "max_foreign": cores,
     "trace_dir": DIR | null, "result": FILE, "progress": FILE | null}

Round r runs every config once, in the given order (A B C ... A B C ...), so
a machine's drift hits every config alike. Starting the process group once
saves torchrun's start-up (seconds) per run. Each run counts only if the other
processes on the machine used at most ``max_foreign`` cores' worth of CPU
meanwhile (``/proc/stat`` busy time less this group's own CPU time); else it
is run again, up to ``attempts`` times, keeping the least disturbed. Rank 0
writes FILE: per config and round, the run's step times, how many cores others
used, and its trace file (``DIR/{index}-{schedule}-m{microbatches}-r{round}.csv``,
every measured step). With ``progress``, rank 0 appends one JSON line per
finished run to that file (``{"done": k, "total": n, "label": ...}``), which
:func:`real.measure.measure_interleaved` follows. All configs need the same
world size.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from real.config import RunConfig, make_plan
from real.mesh import Mesh, env_world
from real.train import resolve_backend, run

__all__ = ["machine_busy_seconds", "run_rounds"]

log = logging.getLogger(__name__)


def machine_busy_seconds() -> float:
    """CPU seconds all processes on this machine have used so far (from /proc/stat; 0.0 where unreadable)."""
    import os

    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0.0
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _timed_run(config: RunConfig, mesh: Mesh, trace: Path | None) -> tuple[list[float], float]:
    """(step times of the run, cores' worth of CPU used by processes outside this group meanwhile)."""
    busy0, own0, t0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
    result = run(config, trace_path=trace, mesh=mesh)
    wall = time.perf_counter() - t0
    own = torch.tensor([time.process_time() - own0, (machine_busy_seconds() - busy0) if mesh.rank == 0 else 0.0],
                       dtype=torch.float64)
    if mesh.distributed:
        dist.all_reduce(own)  # every rank sees the same figures, so all take the same decision
    return result.step_times, max(0.0, float(own[1] - own[0])) / max(wall, 1e-9)


def _label(c: RunConfig) -> str:
    dp = f" dp={c.layout.dp} {c.sync.dp_mode}" if c.layout.dp > 1 else ""
    return f"{c.layout.schedule} pp={c.layout.pp} m={c.layout.microbatches}{dp}"


def _report(path: Path, done: int, total: int, label: str) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"done": done, "total": total, "label": label}) + "\n")


def run_rounds(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Run ``spec`` (see the module doc) on this rank; rank 0 returns the results, the others None."""
    configs = [RunConfig.from_dict(c) for c in spec["configs"]]
    rounds, attempts = int(spec.get("rounds", 5)), int(spec.get("attempts", 3))
    max_foreign = float(spec.get("max_foreign", 0.1))
    trace_dir = Path(spec["trace_dir"]) if spec.get("trace_dir") else None
    progress = Path(spec["progress"]) if spec.get("progress") and env_world()[0] == 0 else None
    rank, world, _ = env_world()
    plans = [make_plan(c, world) for c in configs]  # every check before the group exists
    meshes: dict[tuple[int, int], Mesh] = {}
    out: list[dict[str, Any]] = [{"config": c.to_dict(), "rounds": []} for c in configs]
    try:
        for r in range(rounds):
            for i, (config, plan) in enumerate(zip(configs, plans, strict=True)):
                key = (config.layout.pp, config.layout.dp)
                if key not in meshes:
                    meshes[key] = Mesh.create(plan, resolve_backend(config.runtime.backend), config.runtime.timeout_s)
                name = f"{i}-{config.layout.schedule}-m{config.layout.microbatches}-r{r}.csv"
                trace = trace_dir / name if trace_dir is not None else None
                best: tuple[list[float], float] | None = None
                for _ in range(attempts):
                    times, foreign = _timed_run(config, meshes[key], trace)
                    if best is None or foreign < best[1]:
                        best = (times, foreign)
                    if foreign <= max_foreign:
                        break
                    log.warning("round %d, %s: other processes used %.2f cores meanwhile; run again", r,
                                config.layout.schedule, foreign)
                out[i]["rounds"].append({"step_times": best[0], "foreign_cores": best[1],
                                         "trace": str(trace) if trace is not None else None})
                if progress is not None:
                    _report(progress, r * len(configs) + i + 1, rounds * len(configs), f"round {r + 1}: {_label(config)}")
    finally:
        owner = next((m for m in meshes.values() if m.owns_process_group), None)
        if owner is not None:
            owner.close()
    return {"runs": out} if rank == 0 else None

