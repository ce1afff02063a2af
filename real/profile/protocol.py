"""The real side of the calibration protocol (docs/validation-protocol.md): profile this machine, and the runs.

:mod:`analysis.validation.calibration` turns what these produce into cost models and
scores; ``experiments/validate_sim.py`` and ``experiments/plan_check.py`` call
both. Nothing here prints.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from real.config import ModelConfig, RunConfig, model_argv

log = logging.getLogger(__name__)

__all__ = [
    "BUCKET_MB",
    "GRID_DP_MODES",
    "GRID_EXTRA_DP_MODES",
    "MODEL_SHAPE",
    "POWERSGD_RANK",
    "STALENESS",
    "SYNC_EVERY",
    "dp_buckets",
    "dp_config",
    "dp_shapes",
    "pipeline_config",
    "profile_machine",
]

# The validation's default model (a real.ModelConfig's fields): a GPT small enough for 2 CPU ranks.
MODEL_SHAPE: dict[str, Any] = {"kind": "gpt", "layers": 6, "dim": 128, "heads": 4, "vocab": 256, "seq": 64}
BUCKET_MB = 1.0  # the data-parallel rows' gradient buckets: several per model, so ddp has something to overlap
# The data-parallel modes of the validation grid, one pp=1 dp=2 row each (fsdp is zero3 by another name): the exact
# modes, then (analysis.validation.dp_modes) the parameter server (2 trainers + 1 server: 3 processes, measured in a process
# group of their own), decentralized and local SGD, and ddp with a gradient codec (MODE+CODEC; PowerSGD at rank
# POWERSGD_RANK). Each of the latter costs about as much as a ddp row (ps more: a second torchrun group), well
# under 40 s on a quiet machine.
POWERSGD_RANK = 4  # as experiments/compression_loss.py and the profile's codecs (real.dp.compress.PROFILED) take it
GRID_EXTRA_DP_MODES = ("ps", "decentralized", "local-sgd", "ddp+int8", "ddp+fp16", "ddp+bf16",
                       f"ddp+powersgd:{POWERSGD_RANK}", "async-ps")
GRID_DP_MODES = ("ddp", "sync", "zero1", "zero2", "zero3", *GRID_EXTRA_DP_MODES)
SYNC_EVERY = 2  # local-sgd's K in the grid: its averaging step and its plain step alternate
STALENESS = 1  # async-ps's bound in the grid (2 trainers + 1 server, measured with ps's group)

def profile_machine(model: ModelConfig, microbatch_size: int, stages: Sequence[int], reps: int, path: Path, *,
                    dp: int = 1, timeout: float = 600.0, max_slow: float | None = None, attempts: int = 1) -> Path:
    """``python -m real.profile`` on 2 processes (pp=2, or pp=1 x ``dp``), written to ``path``.

    With ``max_slow``, a profile during which the host ran more than that fraction slower at its slowest
    probe than at its fastest (the file's ``machine_speed.spell``, :mod:`real.profile.probe`) is taken again, up to
    ``attempts`` times; the least slowed is kept (each retake logged as a warning). Raises RuntimeError with the profiler's
    last lines if it fails."""
    import json
    import shutil

    from real.launch import torchrun

    flags = ["-m", "real.profile", *model_argv(model), "--microbatch-size", str(microbatch_size),
             "--stages", ",".join(map(str, stages)), "--reps", str(reps)]
    if dp > 1:
        flags += ["--dp", str(dp), "--pp", "1", "--bucket-mb", str(BUCKET_MB)]
    best: tuple[float, Path] | None = None
    for attempt in range(max(attempts, 1)):
        out = path if attempt == 0 else path.with_name(f"{path.stem}.attempt{attempt + 1}{path.suffix}")
        done = torchrun(2, [*flags, "--out", str(out)], timeout=timeout, capture=True)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or "").strip().splitlines()[-12:])
            raise RuntimeError(f"the profile failed (exit {done.returncode}):\n{tail}")
        slow = json.loads(out.read_text()).get("machine_speed", {}).get("spell", 1.0)
        if best is None or slow < best[0]:
            best = (slow, out)
        if max_slow is None or slow <= 1 + max_slow:
            break
        last = attempt == max(attempts, 1) - 1
        log.warning("profile %s: the host ran x%.2f slower at its slowest than at its fastest; %s", path.name, slow,
                    f"keeping the least slowed (x{best[0]:.2f})" if last else "profiling again")
    if best[1] != path:
        shutil.copyfile(best[1], path)
    return path


def pipeline_config(model: ModelConfig, schedule: str, m: int, microbatch_size: int) -> RunConfig:
    """A pp=2 run of ``schedule`` with ``m`` microbatches (gloo, AdamW)."""
    return RunConfig.of(schedule=schedule, pp=2, microbatches=m, batch_size=microbatch_size * m, model=model,
                        optimizer="adamw", backend="gloo")


def dp_config(model: ModelConfig, schedule: str, m: int, microbatch_size: int, mode: str) -> RunConfig:
    """A pp=1, dp=2 run of ``schedule`` under ``mode`` (ddp, sync, ..., ps with one server, local-sgd with
    ``sync_every`` :data:`SYNC_EVERY`, async-ps with one server and ``staleness`` :data:`STALENESS`, MODE+CODEC with that ``grad_compression``), buckets of :data:`BUCKET_MB`."""
    dp_mode, _, codec = mode.partition("+")
    extra: dict[str, Any] = {"servers": 1} if dp_mode in ("ps", "async-ps") else {}
    extra.update({"staleness": STALENESS} if dp_mode == "async-ps" else {})
    extra.update({"sync_every": SYNC_EVERY} if dp_mode == "local-sgd" else {})
    extra.update({"grad_compression": codec} if codec else {})
    return RunConfig.of(schedule=schedule, pp=1, dp=2, microbatches=m, batch_size=microbatch_size * m * 2,
                        model=model, optimizer="adamw", backend="gloo", dp_mode=dp_mode, bucket_mb=BUCKET_MB,
                        **extra)


def dp_buckets(model: ModelConfig) -> int:
    """How many gradient buckets of :data:`BUCKET_MB` the runtime makes for ``model``."""
    from real.dp.sync import make_buckets
    from real.models import build_model

    return len(make_buckets(list(build_model(model, 0).parameters()), BUCKET_MB * 2**20))


def dp_shapes(model: ModelConfig) -> list[tuple[int, ...]]:
    """The shapes of ``model``'s parameters, in the runtime's order (a powersgd row's bytes: the IR's
    :func:`schedules.dp.codecs.buffer_bytes` of them)."""
    from real.models import build_model

    return [tuple(p.shape) for p in build_model(model, 0).parameters()]
