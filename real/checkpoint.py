"""Checkpoints with torch.distributed.checkpoint (DCP): written atomically, read back with any dp.

Layout of ``--checkpoint-dir``::

    step_000004/            one complete checkpoint: the state before step 4 runs
        .metadata           DCP's index (written last by DCP's coordinator)
        __0_0.distcp ...    DCP's data files, one per writing rank
        COMPLETE            JSON, written last of all (atomically): step, layout, losses, each file's size and CRC-32
    .tmp-step_000006-a0/    a checkpoint being written (attempt 0); never read
    LOCK                    the run using the directory (rank 0): host, PID, its start time, since when

Only what a save wrote is ever removed (DCP's files, the marker, their
temporaries): a file of the user's in a checkpoint's folder stays, and so
does its folder. One run uses a directory at a time (:func:`lock`); a lock
whose holder has ended (this host: PID gone or reused) is taken over. The
replicas of one live elastic job are one run: they share the lock (its
``run`` names the job), and each checks it again before every save. A
COMPLETE whose losses are not a list of ``step`` numbers is not trusted.
Each COMPLETE names the run that wrote it (``run``: a run that resumes from
a checkpoint continues its run), and ``keep_last`` removes only that run's
checkpoints: another run's, or one without a ``run`` (older schedlab), stay.

A checkpoint is written into a temporary directory; once DCP has finished on
every rank, rank 0 renames it to ``step_NNNNNN`` and then writes ``COMPLETE``
(through a temporary file and ``os.replace``). ``COMPLETE`` lists every file
with its size and checksum. A checkpoint is used only if it verifies: a
directory without the marker (killed mid-write), a file of another size
(truncated), another checksum (its bytes changed) or a ``.metadata`` that
cannot be read is skipped, with one warning per rank naming the file, and the
previous complete one is used; with none left, training starts at step 0.

The state is keyed by the whole model's parameter names (``model.3.qkv.weight``,
``optim.3.qkv.weight.exp_avg``), replicated over data-parallel replicas: DCP
writes each tensor once and every rank reads what its stages need, so a run
resumes with another dp (pp fixed) and DCP reshards on load. With expert parallelism an expert is named as in
the whole model too (``model.3.experts.5.fc.weight``): written once, by one rank of the expert data-parallel group
that holds it, and read by the ranks that hold it on resume, so ep may change as dp does. The data
position is the step (a step's batch is a function of ``(seed, step)``), and
each rank's RNG state is saved under ``rng.rank{r}``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import uuid
import warnings
import zlib
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
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from common.errors import MAX_QUOTE, check_positive_ints
from schedules import CheckpointError

__all__ = [
    "LOCK", "MARKER", "CheckpointConfig", "Checkpointer", "Restored", "check_unlocked", "complete_checkpoints",
    "latest_complete", "load", "load_state", "lock", "read_metadata", "run_id", "state_dict", "unlock",
]

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
METADATA = ".metadata"
LOCK = "LOCK"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")
_TMP_DIR = re.compile(r"^\.tmp-step_(\d{6,})-a(\d+)$")
# What a save writes into a checkpoint's directory: DCP's index (and its temporary), DCP's data files
# (``__{rank}_{n}.distcp``; ``__{rank}.metadata`` without a coordinator), the marker and its temporary.
# Nothing else in a checkpoint directory is ever removed.
_RUNTIME_FILE = re.compile(r"^(\.metadata(\.tmp)?|__\d+(\.metadata(\.tmp)?|_\d+\.distcp)|COMPLETE|\.COMPLETE\.part)$")
_CHUNK = 1 << 20  # bytes read at a time for a checksum
_warned: set[str] = set()  # warnings this process has logged: each once per rank, however often a directory is scanned


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


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _crc32(path: Path) -> str:
    """The CRC-32 of the file's bytes (read in chunks), as 8 hex digits."""
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _files(path: Path) -> dict[str, dict[str, Any]]:
    """Every file DCP wrote into the checkpoint: its size and CRC-32, for COMPLETE."""
    return {p.name: {"bytes": p.stat().st_size, "crc32": _crc32(p)} for p in sorted(path.iterdir())
            if p.is_file() and p.name != MARKER and _RUNTIME_FILE.match(p.name)}


def _remove_runtime_files(path: Path) -> list[str]:
    """Remove what a save wrote into ``path`` (the marker first) and ``path`` itself if nothing else is left.

    Returns the names of the entries left (files or folders the runtime did not write); they are never removed.
    """
    marker = path / MARKER
    if marker.is_file():
        marker.unlink()
    left = []
    for p in sorted(path.iterdir()):
        if p.is_file() and _RUNTIME_FILE.match(p.name):
            p.unlink(missing_ok=True)
        else:
            left.append(p.name)
    if left:
        _warn_once(f"{path}: kept {', '.join(left)} (not written by schedlab); the checkpoint's own files are removed")
    else:
        path.rmdir()
    return left


def _one_line(exc: BaseException) -> str:
    """``Type: first sentence`` of an exception: none of torch's advice (such as ``weights_only=False``) follows."""
    lines = str(exc).strip().splitlines()
    first = repr(lines[0].split(". ")[0])[1:-1] if lines else ""  # repr: a garbled file's bytes stay printable
    if len(first) > MAX_QUOTE:
        first = first[: MAX_QUOTE - 3] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _read_metadata(path: Path) -> Metadata:
    """DCP's index of the checkpoint at ``path``; ValueError naming the file if it cannot be read."""
    try:
        return FileSystemReader(str(path)).read_metadata()
    except Exception as exc:  # a garbled pickle raises any of a dozen types; none may escape as a traceback
        raise ValueError(f"file {METADATA} cannot be read ({_one_line(exc)})") from None


def _record(path: Path) -> dict[str, Any]:
    """The COMPLETE record of ``path``; ValueError if it is missing or malformed."""
    marker = path / MARKER
    if not marker.is_file():
        raise ValueError(f"no {MARKER} marker (written last): the save did not finish")
    try:
        info = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable {MARKER} marker ({_one_line(exc)})") from None
    files = info.get("files") if isinstance(info, dict) else None
    if not isinstance(files, dict) or not all(isinstance(f, dict) and {"bytes", "crc32"} <= f.keys()
                                               for f in files.values()):
        raise ValueError(f"its {MARKER} marker lists no checksum per file (written by an older schedlab?); "
                         "it cannot be verified")
    step = int(_STEP_DIR.match(path.name)[1])
    if info.get("step") != step or isinstance(info.get("step"), bool):
        raise ValueError(f"its {MARKER} marker is of step {info.get('step')!r}, not of this directory's")
    losses = info.get("losses")
    if not isinstance(losses, list) or len(losses) != step or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses):
        what = (f"{len(losses)} losses" if isinstance(losses, list) else
                f"losses {_quote_json(losses)}" if "losses" in info else "no losses")
        raise ValueError(f"its {MARKER} marker holds {what}; a checkpoint of step {step} holds a list of {step} numbers")
    if METADATA not in files:
        raise ValueError(f"no DCP {METADATA} file")
    return info


def _quote_json(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


def _check_sizes(path: Path, info: dict[str, Any]) -> None:
    for name, rec in info["files"].items():
        file = path / name
        size = file.stat().st_size if file.is_file() else None
        if size != rec["bytes"]:
            raise ValueError(f"file {name} has {'no' if size is None else size} bytes, {rec['bytes']} were written")


def _check(path: Path) -> dict[str, Any]:
    """The COMPLETE record of ``path`` once every file verifies; ValueError naming what is wrong otherwise."""
    info = _record(path)
    _check_sizes(path, info)
    for name, rec in info["files"].items():
        crc = _crc32(path / name)
        if crc != rec["crc32"]:
            raise ValueError(f"file {name} has CRC-32 {crc}, {rec['crc32']} was written: its bytes changed")
    _read_metadata(path)
    return info


def _step_dirs(root: Path) -> list[Path]:
    """The ``step_NNNNNN`` directories under ``root``, oldest first."""
    if not root.is_dir():
        return []
    dirs = [p for p in root.iterdir() if p.is_dir() and _STEP_DIR.match(p.name)]
    return sorted(dirs, key=lambda p: int(_STEP_DIR.match(p.name)[1]))


def _verified(path: Path) -> Restored | None:
    """``path`` as a Restored if it verifies; None (and one warning per rank naming the problem) if not."""
    try:
        return Restored(path, _check(path))
    except (OSError, ValueError) as exc:
        _warn_once(f"skipping checkpoint {path}: {exc}")
        return None


def complete_checkpoints(directory: str | Path) -> list[Restored]:
    """Every complete checkpoint under ``directory`` that verifies, oldest first; the others are logged and skipped."""
    return [r for r in map(_verified, _step_dirs(Path(directory))) if r is not None]


def latest_complete(directory: str | Path) -> Restored | None:
    """The newest checkpoint that verifies, or None. Reads files only: every rank decides alike, before any communication.

    Checksums are computed newest first, and only until one checkpoint verifies.
    """
    dirs = _step_dirs(Path(directory))
    for path in reversed(dirs):
        restored = _verified(path)
        if restored is not None:
            return restored
    if dirs:
        _warn_once(f"checkpoint directory {directory}: none of its {len(dirs)} checkpoints verifies; "
                   "training starts at step 0")
    return None


# -- one run per directory ---------------------------------------------------------------------------------------


_RUN_ID: list[str] = []


def run_id() -> str:
    """This run's id: torchrun's (``TORCHELASTIC_RUN_ID``: the same on every rank and across its restarts), else one
    made once for this process. Checkpoints and metrics lines name the run that wrote them."""
    given = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if given and given != "none":  # torchrun's default id without --standalone or --rdzv-id is "none"
        return given
    if not _RUN_ID:
        _RUN_ID.append(uuid.uuid4().hex)
    return _RUN_ID[0]


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), None if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces: fields 3, 4, ...
    return fields[19] if len(fields) > 19 else None


def _holder(path: Path) -> dict[str, Any] | None:
    """The record of the lock file ``path``: None if there is none, {} if it cannot be read."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def _alive(holder: dict[str, Any]) -> bool | None:
    """Whether the lock's holder still runs: None if it runs on another host (this one cannot tell)."""
    if holder.get("host") != socket.gethostname():
        return None if holder.get("host") else False
    pid = holder.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        pass
    start = holder.get("start")
    return start is None or _start_time(pid) in (None, start)  # another start time: the PID was reused


def _refuse_held(directory: Path, holder: dict[str, Any]) -> None:
    alive = _alive(holder)
    if alive is False:
        return
    since = holder.get("since", "?")
    if alive is None:
        raise CheckpointError(f"checkpoint directory {str(directory)!r} is locked by PID {holder.get('pid')} on host "
                              f"{holder.get('host')!r} (since {since}); if that run has ended, remove "
                              f"{directory / LOCK}", field="directory")
    raise CheckpointError(f"checkpoint directory {str(directory)!r} is in use by another run (PID {holder['pid']} "
                          f"on this host, since {since}); wait for it to end or give another checkpoint directory",
                          field="directory")


def _shared(holder: dict[str, Any], run: str | None) -> bool:
    """The lock is held by another process of the same run (a replica of the same live job)."""
    return run is not None and holder.get("run") == run and holder.get("pid") != os.getpid()


def check_unlocked(directory: str | Path, run: str | None = None) -> None:
    """CheckpointError if a run that still runs holds ``directory``'s lock (reads only); ``run``: this run's id,
    whose own processes may hold it (:func:`lock`)."""
    holder = _holder(Path(directory) / LOCK)
    if holder and not _shared(holder, run):
        _refuse_held(Path(directory), holder)


def lock(directory: str | Path, run: str | None = None) -> Path | None:
    """Take ``directory``'s lock for this process (rank 0 of a run): a file naming the host, PID and start time.

    A lock whose holder has ended (this host: its PID is gone or reused) is taken over, with a warning;
    CheckpointError if a live run holds it (or one on another host: this host cannot tell whether it ended).
    ``run``: the id of a run of several processes that share the directory (the replicas of a live elastic
    job): a lock another live process of the same ``run`` holds is shared, and None is returned (this process
    holds nothing to unlock).
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK
    record = {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid()),
              "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "run": run}
    part = root / f".{LOCK}.{os.getpid()}"
    part.write_text(json.dumps(record))
    try:
        for _ in range(2):
            try:
                os.link(part, path)  # atomic: fails if the lock exists, and the lock is never seen half written
                return path
            except FileExistsError:
                holder = _holder(path)
                if holder is None:
                    continue
                if _shared(holder, run) and _alive(holder) is not False:
                    return None
                if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                    return path  # this process holds it already
                _refuse_held(root, holder)
                log.warning("checkpoint directory %s: taking over the lock of PID %s, which has ended", root,
                            holder.get("pid"))
                path.unlink(missing_ok=True)
        raise CheckpointError(f"checkpoint directory {str(root)!r}: another run took its lock meanwhile; give "
                              "another checkpoint directory", field="directory")
    finally:
        part.unlink(missing_ok=True)


def unlock(path: Path) -> None:
    """Remove the lock ``path`` if this process holds it."""
    holder = _holder(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)


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
    meta = _read_metadata(path).state_dict_metadata
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
    """Load ``restored`` into the parameters and optimizers of this rank (every rank calls it).

    CheckpointError if it cannot be read after all (it verified when it was chosen: it changed since).
    """
    try:
        _allocate_optimizer_state(named, optimizers, restored.path)
        state = state_dict(named, optimizers, rank)
        meta = _read_metadata(restored.path).state_dict_metadata
        rng_key = f"rng.rank{rank}"
        if rng_key not in meta:  # a rank the saving run did not have (dp grew): the step reseeds it anyway
            del state[rng_key]
        else:
            state[rng_key] = torch.empty_like(state[rng_key])
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {restored.path}: {exc}; remove it to resume from the one before",
                              field="directory") from None
    load_state(restored, state, rank)
    if rng_key in state:
        torch.set_rng_state(state[rng_key])


def read_metadata(path: Path) -> Metadata:
    """DCP's index of the checkpoint at ``path``."""
    return _read_metadata(path)


def load_state(restored: Restored, state: dict[str, Any], rank: int) -> None:
    """DCP-load ``restored`` into ``state`` (tensors of the saved shapes) in place; CheckpointError if it cannot."""
    try:
        with _quiet_single_process():
            dcp.load(state, checkpoint_id=str(restored.path), no_dist=not dist.is_initialized())
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {restored.path}: {exc}; remove it to resume from the one before",
                              field="directory") from None
    except CheckpointException as exc:  # DCP gathers every rank's failure: each rank raises the same error
        rank_failed, (cause, _) = next(iter(sorted(exc.failures.items())))
        raise CheckpointError(f"checkpoint {restored.path} cannot be loaded (rank {rank_failed}: {_one_line(cause)}); "
                              "remove it to resume from the one before", field="directory") from None


@dataclass(eq=False)
class Checkpointer:
    """Saves every ``config.every`` steps (at most one asynchronous save in flight) and keeps the last few."""

    config: CheckpointConfig
    rank: int
    attempt: int = 0
    run: str | None = None  # the run the saves belong to (COMPLETE's run; keep_last prunes only its own)
    shared: bool = False  # a run of several jobs (live elastic replicas): the lock is checked before each save
    _pending: tuple[Future, Path, Path, dict[str, Any]] | None = field(default=None, init=False)
    _group: dist.ProcessGroup | None = field(default=None, init=False)
    last: str | None = field(default=None, init=False)  # the newest checkpoint marked complete (rank 0 knows)

    def __post_init__(self) -> None:
        # The background save runs its own collectives: on a group of its own, never interleaved with training's.
        if self.config.async_save and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        if self.run is None:
            self.run = run_id()

    def resumed(self, restored: Restored) -> None:
        """This run continues ``restored``: its saves belong to the run that wrote it (keep_last prunes them)."""
        self.last = restored.path.name
        if isinstance(restored.info.get("run"), str) and not self.shared:
            self.run = restored.info["run"]

    @property
    def root(self) -> Path:
        return Path(self.config.directory)

    def due(self, steps_done: int) -> bool:
        return self.config.every > 0 and steps_done % self.config.every == 0

    def save(self, steps_done: int, state: dict[str, Any], info: dict[str, Any]) -> None:
        """Write the state before step ``steps_done``; ``info`` (JSON) goes into the COMPLETE marker.

        ``info`` is copied now: an asynchronous save records what a synchronous one at this step would,
        however the caller's lists (the losses) grow while it is in flight.
        """
        self.wait()
        tmp = self.root / f".tmp-step_{steps_done:06d}-a{self.attempt}"
        final = _step_dir(self.root, steps_done)
        info = json.loads(json.dumps({**info, "step": steps_done}))
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if self.shared:  # another run may have taken a lock this job's replicas left
                lock(self.root, self.run)
            if tmp.is_dir() and _remove_runtime_files(tmp):
                raise CheckpointError(f"checkpoint: {tmp} holds files schedlab did not write; move them out of "
                                      "the checkpoint directory", field="directory")
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
        if final.is_dir() and _remove_runtime_files(final):  # the user's files stay: move DCP's in beside them
            for p in tmp.iterdir():
                os.replace(p, final / p.name)
            tmp.rmdir()
        else:
            os.replace(tmp, final)
        record = {**info, "run": self.run, "files": _files(final)}
        part = final / f".{MARKER}.part"
        part.write_text(json.dumps(record))
        os.replace(part, final / MARKER)
        self.last = final.name
        log.info("checkpoint %s complete (%d files)", final, len(record["files"]))
        self._prune()

    def _prune(self) -> None:
        """Keep the last ``keep_last`` checkpoints with a marker and the right sizes (no checksums: they were
        just written; a checkpoint is verified when it is chosen), and drop the temporaries they supersede.

        Only what a save wrote is removed (see :func:`_remove_runtime_files`): a user's file stays where it is,
        and so does a checkpoint of another run.
        """
        done = []
        for path in _step_dirs(self.root):
            try:
                info = _record(path)
                _check_sizes(path, info)
            except (OSError, ValueError):
                continue
            if info.get("run") == self.run:
                done.append(Restored(path, info))
        for old in done[: max(0, len(done) - self.config.keep_last)]:
            _remove_runtime_files(old.path)
        newest = done[-1].step if done else -1
        for path in self.root.iterdir():
            m = _TMP_DIR.match(path.name)
            if m and path.is_dir() and int(m[1]) <= newest:
                _remove_runtime_files(path)
