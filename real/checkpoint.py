"""Checkpoints with torch.distributed.checkpoint (DCP): written atomically, read back with any dp.

Layout of ``--checkpoint-dir``::

    step_000004/            one complete checkpoint: the state before step 4 runs
        .metadata           DCP's index (written last by DCP's coordinator)
        __0_0.distcp ...    DCP's data files, one per writing rank
        COMPLETE            JSON, written last of all (atomically): step, layout, losses, file sizes
    .tmp-step_000006-a0/    a checkpoint being written (attempt 0); never read

A checkpoint is written into a temporary directory; once DCP has finished on
every rank, rank 0 renames it to ``step_NNNNNN`` and then writes ``COMPLETE``
(through a temporary file and ``os.replace``). ``COMPLETE`` lists every file
with its size, so a directory without it (killed mid-write) or with a file
of another size (truncated) is skipped and the previous complete one is used.

The state is keyed by the whole model's parameter names (``model.3.qkv.weight``,
``optim.3.qkv.weight.exp_avg``), replicated over data-parallel replicas: DCP
writes each tensor once and every rank reads what its stages need, so a run
resumes with another dp (pp fixed) and DCP reshards on load. The data
position is the step (a step's batch is a function of ``(seed, step)``), and
each rank's RNG state is saved under ``rng.rank{r}``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from schedules import CheckpointError
from schedules.errors import check_positive_ints

__all__ = [
    "MARKER", "CheckpointConfig", "Checkpointer", "Restored", "complete_checkpoints", "latest_complete", "load",
    "state_dict",
]

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig:
    """Where and how often to checkpoint: every ``every`` steps into ``directory``, keeping the last ``keep_last``."""

    directory: str
    every: int = 0
    keep_last: int = 2
    async_save: bool = False

    def __post_init__(self) -> None:
        if not self.directory:
            raise CheckpointError("checkpoint: give a directory, e.g. out/ckpt", field="directory")
        if not isinstance(self.every, int) or self.every < 0:
            raise CheckpointError(f"checkpoint: every must be an integer >= 0 steps (0: never save), got {self.every!r}",
                                  field="every")
        check_positive_ints("checkpoint", CheckpointError, keep_last=self.keep_last)
        path = Path(self.directory)
        if path.exists() and not path.is_dir():
            raise CheckpointError(f"checkpoint directory {self.directory!r} is a file; give a directory",
                                  field="directory")


@dataclass(frozen=True)
class Restored:
    """A complete checkpoint found on disk: its directory and its ``COMPLETE`` record."""

    path: Path
    info: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.info["step"])


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:06d}"


def _files(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file() and p.name != MARKER}


def _check(path: Path) -> dict[str, Any]:
    """The COMPLETE record of ``path``; ValueError saying what is wrong if the checkpoint is partial or corrupt."""
    marker = path / MARKER
    if not marker.is_file():
        raise ValueError("no COMPLETE marker (written last): the save did not finish")
    try:
        info = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable COMPLETE marker: {exc}") from None
    have = _files(path)
    for name, size in info.get("files", {}).items():
        if have.get(name) != size:
            raise ValueError(f"file {name} has {have.get(name, 'no')} bytes, {size} were written")
    if ".metadata" not in have:
        raise ValueError("no DCP .metadata file")
    return info


def complete_checkpoints(directory: str | Path) -> list[Restored]:
    """Every complete checkpoint under ``directory``, oldest first; partial or corrupt ones are logged and skipped."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        if not (path.is_dir() and _STEP_DIR.match(path.name)):
            continue
        try:
            found.append(Restored(path, _check(path)))
        except ValueError as exc:
            log.warning("skipping checkpoint %s: %s", path, exc)
    return sorted(found, key=lambda r: r.step)


def latest_complete(directory: str | Path) -> Restored | None:
    """The newest complete checkpoint, or None. Reads files only: every rank decides alike, before any communication."""
    found = complete_checkpoints(directory)
    return found[-1] if found else None


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns that it assumes one process when no group exists: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _optim_key(name: str, key: str) -> str:
    return f"optim.{name}.{key}"


def state_dict(named: list[tuple[str, torch.nn.Parameter]], optimizers: list[torch.optim.Optimizer],
               rank: int) -> dict[str, Any]:
    """This rank's share of the state, keyed by whole-model names (tensors are live: DCP loads in place)."""
    state: dict[str, Any] = {f"model.{n}": p.data for n, p in named}
    by_param = {id(p): n for n, p in named}
    for opt in optimizers:
        for p, s in opt.state.items():
            for k, v in s.items():
                if isinstance(v, torch.Tensor):
                    state[_optim_key(by_param[id(p)], k)] = v
    state[f"rng.rank{rank}"] = torch.get_rng_state()
    return state


def _allocate_optimizer_state(named: list[tuple[str, torch.nn.Parameter]], optimizers: list[torch.optim.Optimizer],
                              path: Path) -> None:
    """Create empty optimizer state of the saved shapes and dtypes, for DCP to load into."""
    meta = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    owned = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    for name, p in named:
        if id(p) not in owned:
            continue
        opt = next(o for o in optimizers if any(q is p for g in o.param_groups for q in g["params"]))
        prefix = _optim_key(name, "")
        for key, m in meta.items():
            if key.startswith(prefix) and isinstance(m, TensorStorageMetadata) and "." not in key[len(prefix):]:
                opt.state[p][key[len(prefix):]] = torch.empty(m.size, dtype=m.properties.dtype, device=p.device)


def load(restored: Restored, named: list[tuple[str, torch.nn.Parameter]], optimizers: list[torch.optim.Optimizer],
         rank: int) -> None:
    """Load ``restored`` into the parameters and optimizers of this rank (every rank calls it)."""
    _allocate_optimizer_state(named, optimizers, restored.path)
    state = state_dict(named, optimizers, rank)
    meta = FileSystemReader(str(restored.path)).read_metadata().state_dict_metadata
    rng_key = f"rng.rank{rank}"
    if rng_key not in meta:  # a rank the saving run did not have (dp grew): the step reseeds it anyway
        del state[rng_key]
    else:
        state[rng_key] = torch.empty_like(state[rng_key])
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=str(restored.path), no_dist=not dist.is_initialized())
    if rng_key in state:
        torch.set_rng_state(state[rng_key])


@dataclass(eq=False)
class Checkpointer:
    """Saves every ``config.every`` steps (at most one asynchronous save in flight) and keeps the last few."""

    config: CheckpointConfig
    rank: int
    attempt: int = 0
    _pending: tuple[Future, Path, Path, dict[str, Any]] | None = field(default=None, init=False)
    _group: dist.ProcessGroup | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        # The background save runs its own collectives: on a group of its own, never interleaved with training's.
        if self.config.async_save and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")

    @property
    def root(self) -> Path:
        return Path(self.config.directory)

    def due(self, steps_done: int) -> bool:
        return self.config.every > 0 and steps_done % self.config.every == 0

    def save(self, steps_done: int, state: dict[str, Any], info: dict[str, Any]) -> None:
        """Write the state before step ``steps_done``; ``info`` (JSON) goes into the COMPLETE marker."""
        self.wait()
        tmp = self.root / f".tmp-step_{steps_done:06d}-a{self.attempt}"
        final = _step_dir(self.root, steps_done)
        info = {**info, "step": steps_done}
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
        if dist.is_initialized():
            dist.barrier()
        if self.config.async_save:
            with _quiet_single_process():
                future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._group,
                                        no_dist=not dist.is_initialized())
            self._pending = (future, tmp, final, info)
            return
        with _quiet_single_process():
            dcp.save(state, checkpoint_id=str(tmp), no_dist=not dist.is_initialized())
        self._finalize(tmp, final, info)

    def poll(self) -> None:
        """Finalize the asynchronous save in flight if it is done (called between steps)."""
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Finish the asynchronous save in flight, if any."""
        if self._pending is None:
            return
        future, tmp, final, info = self._pending
        self._pending = None
        future.result()
        self._finalize(tmp, final, info)

    def _finalize(self, tmp: Path, final: Path, info: dict[str, Any]) -> None:
        """Rank 0, once DCP is done on every rank (its coordinator wrote .metadata): rename, then mark complete."""
        if self.rank != 0:
            return
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        record = {**info, "files": _files(final)}
        part = final / f".{MARKER}.part"
        part.write_text(json.dumps(record))
        os.replace(part, final / MARKER)
        log.info("checkpoint %s complete (%d files)", final, len(record["files"]))
        self._prune()

    def _prune(self) -> None:
        done = complete_checkpoints(self.root)
        for old in done[: max(0, len(done) - self.config.keep_last)]:
            shutil.rmtree(old.path, ignore_errors=True)
        newest = done[-1].step if done else -1
        for path in self.root.glob(".tmp-step_*"):
            step = int(path.name.split("_")[1].split("-")[0])
            if step <= newest:
                shutil.rmtree(path, ignore_errors=True)
