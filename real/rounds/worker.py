"""Run several configurations interleaved in rounds inside one process group: the measurement protocol's worker.

    torchrun --nproc-per-node 2 -m real.rounds SPEC.json

:func:`real.measure.measure_interleaved` writes SPEC.json and reads the
result; a user rarely starts this by hand. SPEC is::

    {"configs": [RunConfig.to_dict(), ...], "rounds": R, "attempts": A, "max_foreign": cores, "max_slow": fraction,
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

**Every rank takes the same decisions.** Which run comes next (this config
again, or the next one) is decided on every rank from the same numbers: after
each run one all-gather gives every rank every rank's CPU time and step count
and rank 0's machine-wide busy time and wall time, and each rank computes the
figure from those, in rank order. (Each rank once divided by its own wall time,
which differs by the milliseconds rank 0 spends writing the trace: near
``max_foreign`` one rank went on to the next config while the others ran this
one again, and the launch hung; ``docs/validation-protocol.md``.) A guard turns
any other disagreement into a :class:`DesyncError` instead of a hang: before
each run the ranks check, with one small all-gather, that they are about to run
the same round, config (by its digest) and attempt, and after it that they
ran the same number of steps.

**A slowed machine is a disturbed run too.** The shared host this project
measures on slows both cores by about a quarter for seconds to minutes at a
time (a backward of 11 ms takes 13.5-15; docs/validation-protocol.md, "The
host's slow spells"), which no process of the machine shows in ``/proc/stat``.
So every rank that trains times a fixed piece of work (:func:`probe_seconds`:
a few small matrix products and a tanh, the fastest of three timings of about
4 ms) just before and just after each run. A run's ``slowdown`` is its slowest probe over the fastest probe of
the launch so far (seeded by a few probes at the start); above ``1 +
max_slow`` the run is run again, as for other processes' load, keeping the
least disturbed. A slow spell that starts and ends inside a run escapes this.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common import parse
from common.errors import ConfigError, quote
from real.config import RunConfig, make_plan
from real.mesh import Mesh, env_world
from real.profile.probe import probe_seconds
from real.train import resolve_backend, run

__all__ = ["DesyncError", "check_spec", "fastest_probe", "foreign_cores", "machine_busy_seconds", "probe_seconds", "run_rounds",
           "slowdown"]

log = logging.getLogger(__name__)


def machine_busy_seconds() -> float:
    """CPU seconds all processes on this machine have used so far (from /proc/stat; 0.0 where unreadable)."""
    import os

    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0.0
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class DesyncError(RuntimeError):
    """The ranks of a rounds launch are not in the same run (or did not run the same steps): one line naming them."""


# One row per rank, all-gathered after each run: (steps run, -1 where the rank has none of its own: an async-ps
# server; CPU seconds of this process; machine-wide busy CPU seconds, rank 0's, 0.0 elsewhere; wall seconds;
# the probe's seconds before and after the run, 0.0 on a parameter server, which does not probe).
_STEPS, _CPU, _BUSY, _WALL, _PROBE0, _PROBE1 = range(6)
SEED_PROBES = 5  # probes at the launch's start, before the first run, to seed the fastest


def slowdown(rows: list[list[float]], fastest: float) -> float:
    """A run's slowdown from every rank's row: its slowest probe (before or after, over the ranks that probe)
    over ``fastest`` (the launch's fastest probe, this run's included); 1.0 when no rank probes."""
    probes = [row[k] for row in rows for k in (_PROBE0, _PROBE1) if row[k] > 0]
    return max(probes) / fastest if probes and fastest > 0 else 1.0


def fastest_probe(rows: list[list[float]], fastest: float = math.inf) -> float:
    """The fastest probe of ``rows`` and ``fastest`` (every rank computes it from the same gathered rows)."""
    return min([fastest, *(row[k] for row in rows for k in (_PROBE0, _PROBE1) if row[k] > 0)])


def foreign_cores(rows: list[list[float]]) -> float:
    """Cores' worth of CPU used by processes outside the group during a run, from every rank's row of figures
    (rank order): rank 0's busy time less every rank's own CPU time, over rank 0's wall time. Every rank computes
    it from the same gathered rows, so every rank takes the same decision."""
    own = sum(row[_CPU] for row in rows)
    return max(0.0, rows[0][_BUSY] - own) / max(rows[0][_WALL], 1e-9)


def _gather(mesh: Mesh, values: list[float], dtype: torch.dtype) -> list[list[float]]:
    """Every rank's ``values`` (rank order), the same on every rank (an all-gather copies, it does not add)."""
    mine = torch.tensor(values, dtype=dtype)
    if not mesh.distributed:
        return [mine.tolist()]
    rows = [torch.empty_like(mine) for _ in range(mesh.world_size)]
    dist.all_gather(rows, mine)
    return [row.tolist() for row in rows]


def _digest(config: RunConfig) -> int:
    """A config's identity for the guard: CRC-32 of its canonical JSON."""
    return zlib.crc32(json.dumps(config.to_dict(), sort_keys=True).encode())


def _same_run(mesh: Mesh, r: int, i: int, attempt: int, config: RunConfig) -> None:
    """The guard before a run: every rank is about to run round ``r``'s config ``i``, attempt ``attempt``."""
    rows = _gather(mesh, [r, i, attempt, _digest(config)], torch.int64)
    if any(row != rows[0] for row in rows):
        where = ", ".join(f"rank {k}: round {row[0] + 1} config {row[1]} attempt {row[2] + 1} digest {row[3]:08x}"
                          for k, row in enumerate(rows))
        raise DesyncError(f"round {r + 1}, config {i} ({_label(config)}): the ranks are not in the same run ({where}); "
                          "they took different decisions")


def _probe(mesh: Mesh) -> float:
    """This rank's probe (:func:`probe_seconds`); 0.0 on a parameter server, which shares a trainer's core."""
    return 0.0 if mesh.is_server else probe_seconds()


def _timed_run(config: RunConfig, mesh: Mesh, trace: Path | None, where: str) -> tuple[list[float], list[list[float]]]:
    """(step times of the run, every rank's row of figures: :data:`_STEPS` ... :data:`_PROBE1`)."""
    probe0 = _probe(mesh)
    busy0, own0, t0 = machine_busy_seconds(), time.process_time(), time.perf_counter()
    result = run(config, trace_path=trace, mesh=mesh)
    wall = time.perf_counter() - t0
    own = time.process_time() - own0
    busy = (machine_busy_seconds() - busy0) if mesh.rank == 0 else 0.0
    probe1 = _probe(mesh)
    steps = -1 if mesh.is_server and config.sync.dp_mode == "async-ps" else len(result.step_times)
    rows = _gather(mesh, [steps, own, busy, wall, probe0, probe1], torch.float64)
    _same_steps(rows, where)
    return result.step_times, rows


def _same_steps(rows: list[list[float]], where: str) -> None:
    """The guard after a run: every rank that counts steps (not an async-ps server, -1) ran as many."""
    if len({int(row[_STEPS]) for row in rows} - {-1}) > 1:
        raise DesyncError(f"{where}: the ranks ran different numbers of steps ("
                          + ", ".join(f"rank {k}: {int(row[_STEPS])}" for k, row in enumerate(rows)) + ")")


def _label(c: RunConfig) -> str:
    dp = f" dp={c.layout.dp} {c.sync.dp_mode}" if c.layout.dp > 1 else ""
    return f"{c.layout.schedule} pp={c.layout.pp} m={c.layout.microbatches}{dp}"


def _report(path: Path, done: int, total: int, label: str) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"done": done, "total": total, "label": label}) + "\n")


def _seed(mesh: Mesh) -> float:
    """The launch's first fastest probe: :data:`SEED_PROBES` probes on every rank that probes, gathered."""
    rows = _gather(mesh, [0.0, 0.0, 0.0, 0.0, min(_probe(mesh) for _ in range(SEED_PROBES)), 0.0], torch.float64)
    return fastest_probe(rows)


#: The keys of a SPEC, each with its default (None: required).
SPEC_KEYS = {"configs": None, "rounds": 5, "attempts": 3, "max_foreign": 0.1, "max_slow": None, "trace_dir": None,
             "result": None, "progress": None}
MAX_ROUNDS = 10_000  # rounds, and attempts of one run: far beyond any protocol (docs/validation-protocol.md uses 5)


def check_spec(spec: Any, where: str = "SPEC") -> dict[str, Any]:
    """``spec`` (see the module doc) with its defaults filled in and every field checked: ConfigError in one line
    naming the key and what would be valid, before any process group exists."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a JSON object with keys {', '.join(SPEC_KEYS)}, got {quote(spec)}")
    unknown = sorted(map(str, set(spec) - set(SPEC_KEYS)))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {quote(unknown)}; valid: {', '.join(SPEC_KEYS)}")
    out = {**SPEC_KEYS, **spec}
    configs, result = out["configs"], out["result"]
    if not isinstance(configs, list) or not configs or not all(isinstance(c, dict) for c in configs):
        raise ConfigError(f"{where}: configs must be a non-empty list of RunConfig.to_dict() objects, got "
                          f"{quote(configs)}")
    if not isinstance(result, str) or not result:
        raise ConfigError(f"{where}: result must be the path of the result file, got {quote(result)}")
    for key in ("trace_dir", "progress"):
        if out[key] is not None and not isinstance(out[key], str):
            raise ConfigError(f"{where}: {key} must be a path or null, got {quote(out[key])}")
    for key in ("rounds", "attempts"):
        out[key] = parse.integer(out[key], f"{where}: {key}", low=1, high=MAX_ROUNDS)
    out["max_foreign"] = parse.number(out["max_foreign"], f"{where}: max_foreign", low=0)
    if out["max_slow"] is not None:
        out["max_slow"] = parse.number(out["max_slow"], f"{where}: max_slow", low=0)
    built = []
    for i, c in enumerate(configs):
        try:
            built.append(RunConfig.from_dict(c))
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: configs[{i}] is not a RunConfig.to_dict() object "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    out["configs"] = built
    return out


def run_rounds(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Run ``spec`` (see the module doc; checked by :func:`check_spec` unless it was) on this rank; rank 0 returns
    the results, the others None."""
    if not all(isinstance(c, RunConfig) for c in spec.get("configs") or [None]):
        spec = check_spec(spec)
    configs = spec["configs"]
    rounds, attempts = spec["rounds"], spec["attempts"]
    max_foreign = spec["max_foreign"]
    max_slow = spec["max_slow"] if spec["max_slow"] is not None else math.inf
    trace_dir = Path(spec["trace_dir"]) if spec["trace_dir"] else None
    progress = Path(spec["progress"]) if spec["progress"] and env_world()[0] == 0 else None
    rank, world, _ = env_world()
    plans = [make_plan(c, world) for c in configs]  # every check before the group exists
    meshes: dict[tuple[int, int], Mesh] = {}
    out: list[dict[str, Any]] = [{"config": c.to_dict(), "rounds": []} for c in configs]
    fastest = math.inf
    try:
        for r in range(rounds):
            for i, (config, plan) in enumerate(zip(configs, plans, strict=True)):
                key = (config.layout.pp, config.layout.dp)
                if key not in meshes:
                    meshes[key] = Mesh.create(plan, resolve_backend(config.runtime.backend), config.runtime.timeout_s)
                    fastest = min(fastest, _seed(meshes[key]))
                safe = re.sub(r"[^A-Za-z0-9._-]+", "_", config.layout.schedule)  # a user's dir/file.py:NAME too
                name = f"{i}-{safe}-m{config.layout.microbatches}-r{r}.csv"
                trace = trace_dir / name if trace_dir is not None else None
                best: tuple[float, dict[str, Any]] | None = None
                for attempt in range(attempts):
                    _same_run(meshes[key], r, i, attempt, config)
                    times, rows = _timed_run(config, meshes[key], trace,
                                             f"round {r + 1}, config {i} ({_label(config)}), attempt {attempt + 1}")
                    fastest = fastest_probe(rows, fastest)
                    foreign, slow = foreign_cores(rows), slowdown(rows, fastest)
                    # how far past its limits the run was (<= 1: within both); the same figure on every rank
                    score = max(foreign / max_foreign if max_foreign > 0 else (math.inf if foreign > 0 else 0.0),
                                (slow - 1.0) / max_slow if max_slow > 0 else (math.inf if slow > 1.0 else 0.0))
                    if best is None or score < best[0]:
                        best = (score, {"step_times": times, "foreign_cores": foreign, "slowdown": slow})
                    if score <= 1.0:
                        break
                    log.warning("round %d, %s: %s; run again", r + 1, config.layout.schedule,
                                f"other processes used {foreign:.2f} cores meanwhile" if foreign > max_foreign else
                                f"the machine ran x{slow:.2f} slower than its fastest")
                best[1]["attempts"] = attempt + 1
                out[i]["rounds"].append({**best[1], "trace": str(trace) if trace is not None else None})
                if progress is not None:
                    _report(progress, r * len(configs) + i + 1, rounds * len(configs), f"round {r + 1}: {_label(config)}")
    finally:
        owner = next((m for m in meshes.values() if m.owns_process_group), None)
        if owner is not None:
            owner.close()
    return {"runs": out} if rank == 0 else None
