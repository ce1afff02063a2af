"""Measurements of a real run: activation bytes held, task times, clock offsets between ranks.

* :class:`ActivationMeter` counts (during the step it is enabled for: its
  hooks cost time, so never the traced one when there is a choice) the bytes
  of the tensors autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``), per (stage,
  microbatch), from the forward until its backward frees them (a forward
  that will be recomputed saves nothing: the input it keeps is counted, and
  its R saves the rest). A tensor (by address and size) is counted once
  however many ops or stages save it; parameters and views of them are not
  activations. An I frees nothing here: it keeps the graph (``retain_graph``)
  for its W, and what it does let go (nodes above the stage's last weight op)
  stays counted until that W. A saved tensor that autograd has freed while
  still counted is known by its address no more, so a new tensor at that
  address (another microbatch's) is counted on its own. An overlapped pair's
  forward may save while its backward frees (two threads): one lock guards the counts.
* :class:`Recorder` stamps task starts and ends: ``time.perf_counter`` on the
  CPU, CUDA events on the compute stream on a GPU (resolved once per step);
  a :class:`Span` is a row on a stream of its own (an overlapped pair's
  passes, the all-to-alls of expert parallelism).
* :func:`clock_offset` estimates, NTP-style, what to add to this rank's clock
  to read rank 0's.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from schedules.util import percentile

__all__ = ["ActivationMeter", "Measured", "Recorder", "Span", "clock_offset", "held_bytes", "measure_interleaved"]


class ActivationMeter:
    """Bytes held by tensors saved for backward: now, at the peak, and per key."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self._params = list(params)
        self._exclude: set[int] = set()  # parameter storages, taken at begin(): ZeRO may move them
        self._owners: dict[tuple[int, int], set[Hashable]] = {}  # (address, bytes) -> keys that saved it
        self._size: dict[tuple[int, int], int] = {}
        self._keys: dict[Hashable, set[tuple[int, int]]] = {}
        self._live: dict[tuple[int, int], int] = {}  # (address, bytes) -> saved copies autograd still holds
        self._gone = itertools.count()  # ids for counted tensors autograd has freed (their address may be reused)
        self.current = 0
        self.peak = 0
        self.first_bytes: dict[Hashable, int] = {}  # bytes first counted under each key
        self.enabled = True
        self._lock = threading.RLock()  # re-entered when a collection inside a count frees a saved copy

    @contextmanager
    def saving(self, key: Hashable) -> Iterator[None]:
        """Count what autograd saves inside the block under ``key`` (nothing while disabled)."""
        if not self.enabled:
            yield
            return

        def pack(t: torch.Tensor) -> _Saved:
            with self._lock:
                return _pack(t)

        def _pack(t: torch.Tensor) -> _Saved:
            ident = self._count(key, t)
            # Not ``t`` itself: a node that saves its own output (softmax, log_softmax, tanh) would then hold, in
            # C++, a Python tensor whose grad_fn is that node. Such a cycle is invisible to Python's collector,
            # and after a split backward (I then W: retain_graph=True, so backward never frees what was saved)
            # it kept the metered step's whole graph, parameters included, alive for good: the rounds worker grew
            # by that graph per configuration. ``detach()`` shares the storage and the version counter.
            saved = _Saved(t.detach())
            if ident is not None:  # told when autograd lets this copy go
                self._live[ident] = self._live.get(ident, 0) + 1
                weakref.finalize(saved, self._let_go, ident)
            return saved

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved.tensor):
            yield

    def hold(self, key: Hashable, tensor: torch.Tensor) -> None:
        """Count ``tensor`` under ``key`` as if autograd had saved it: the input a recomputed forward keeps."""
        if self.enabled:
            with self._lock:
                self._count(key, tensor)

    def _count(self, key: Hashable, t: torch.Tensor) -> tuple[int, int] | None:
        """Count ``t`` under ``key``; returns its (address, bytes), or None for a parameter or an empty tensor."""
        mine = self._keys.setdefault(key, set())
        storage = t.untyped_storage()
        nbytes = min(t.numel() * t.element_size(), storage.nbytes())
        ident = (t.data_ptr(), nbytes)  # a view: slices of one batch are separate activations
        if not nbytes or storage.data_ptr() in self._exclude:
            return None
        if ident not in mine:
            mine.add(ident)
            owners = self._owners.setdefault(ident, set())
            if not owners:
                self._size[ident] = nbytes
                self.current += nbytes
                self.first_bytes[key] = self.first_bytes.get(key, 0) + nbytes
                self.peak = max(self.peak, self.current)
            owners.add(key)
        return ident

    def _let_go(self, ident: tuple[int, int]) -> None:
        """Autograd freed a saved copy of ``ident``; once none is left, a tensor still counted (its backward has
        not run) gives up its address, which the allocator may hand to another microbatch's tensor."""
        with self._lock:
            self._let_go_locked(ident)

    def _let_go_locked(self, ident: tuple[int, int]) -> None:
        left = self._live.get(ident, 0) - 1
        if left > 0:
            self._live[ident] = left
            return
        self._live.pop(ident, None)
        owners = self._owners.pop(ident, None)
        if owners:
            gone = (-1 - next(self._gone), ident[1])  # no address is negative
            self._owners[gone], self._size[gone] = owners, self._size.pop(ident)
            for k in owners:
                self._keys[k].discard(ident)
                self._keys[k].add(gone)

    def release(self, key: Hashable) -> None:
        """The backward of ``key`` is done: what only it held is freed."""
        with self._lock:
            self._release_locked(key)

    def _release_locked(self, key: Hashable) -> None:
        for ident in self._keys.pop(key, ()):
            owners = self._owners[ident]
            owners.discard(key)
            if not owners:
                del self._owners[ident]
                self.current -= self._size.pop(ident)

    def begin(self, enabled: bool) -> None:
        """Start counting afresh (a program is the same every step, so one step tells the peak)."""
        if self._keys:
            raise RuntimeError(f"activations of {sorted(self._keys)} were never released")
        self.enabled, self.current, self.peak, self.first_bytes = enabled, 0, 0, {}
        self._live.clear()
        if enabled:
            self.exclude_parameters()

    def exclude_parameters(self) -> None:
        """Take the parameters' storages anew (ZeRO-3 re-allocates them at every gather)."""
        self._exclude = {p.untyped_storage().data_ptr() for p in self._params}


class _Saved:
    """What autograd keeps of a saved tensor while metered: the tensor, in an object the meter can watch die."""

    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def held_bytes(params: Iterable[torch.Tensor], optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, int]:
    """Bytes this rank holds now for parameters, gradients and optimizer state, each storage counted once.

    Parameters: the model's parameters and what the optimizers step (a ZeRO shard of its own); gradients:
    their ``.grad``; optimizer state: every tensor in the optimizers' state. A freed storage (ZeRO-3's
    parameters between passes) counts 0.
    """
    stepped = [p for opt in optimizers for g in opt.param_groups for p in g["params"]]
    tensors = {
        "param_bytes": [*params, *stepped],
        "grad_bytes": [p.grad for p in [*params, *stepped] if p.grad is not None],
        "optimizer_bytes": [v for opt in optimizers for st in opt.state.values() for v in st.values()
                            if isinstance(v, torch.Tensor)],
    }
    out = {}
    for key, ts in tensors.items():
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}
        out[key] = sum(n for ptr, n in storages.items() if n)
    return out


@dataclass(frozen=True)
class Span:
    """A row the runtime adds to the trace on a stream of its own: ``name`` in the action column, ``kind`` in
    the kind column (an overlapped pair's forward ``1F3`` on ``pair-forward``, an all-to-all ``1DISPATCH3`` of
    kind ALL_TO_ALL on ``all-to-all-forward``)."""

    stream: str
    name: str
    kind: str
    stage: int
    microbatch: int | None

    def __str__(self) -> str:
        return self.name


@dataclass
class Recorder:
    """Task start/end stamps of one step, turned into seconds on this rank's perf_counter clock."""

    device: torch.device
    enabled: bool = False
    rows: list[list] = field(default_factory=list)  # [key, start stamp, end stamp, bytes]
    _base: tuple[float, torch.cuda.Event] | None = None

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def begin(self, enabled: bool) -> None:
        self.enabled, self.rows = enabled, []
        if enabled and self.on_gpu:
            torch.cuda.synchronize(self.device)
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._base = (time.perf_counter(), event)

    def stamp(self) -> float | torch.cuda.Event | None:
        if not self.enabled:
            return None
        if self.on_gpu:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, key: Hashable, start: object, end: object, nbytes: float) -> list | None:
        """Record one task; returns the row so an end stamp can be filled in later (sends)."""
        if not self.enabled:
            return None
        row = [key, start, end, float(nbytes)]
        self.rows.append(row)
        return row

    def resolve(self) -> list[tuple[Hashable, float, float, float]]:
        """Rows with stamps as perf_counter seconds (waits for the GPU)."""
        if not self.enabled:
            return []
        if self.on_gpu:
            torch.cuda.synchronize(self.device)
            wall, base = self._base

            def sec(e: object) -> float:
                return wall + base.elapsed_time(e) / 1e3
        else:
            def sec(e: object) -> float:
                return float(e)
        return [(key, sec(s), sec(e if e is not None else s), b) for key, s, e, b in self.rows]


def clock_offset(group: dist.ProcessGroup | None = None, rounds: int = 8) -> float:
    """Seconds to add to this rank's ``time.perf_counter()`` to read rank 0's (0.0 on rank 0).

    Each rank pings rank 0 ``rounds`` times; rank 0 answers with its clock. The
    round trip with the smallest delay gives offset = t0 - (t_send + t_recv) / 2,
    exact up to half that delay's asymmetry. CPU tensors: the group must have a
    CPU backend (gloo, or "cpu:gloo,cuda:nccl").
    """
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return 0.0
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    buf = torch.zeros(1, dtype=torch.float64)
    if rank == 0:
        for peer in range(1, world):
            for _ in range(rounds):
                dist.recv(buf, src=peer, group=group)
                buf[0] = time.perf_counter()
                dist.send(buf, dst=peer, group=group)
        return 0.0
    best_delay, best = float("inf"), 0.0
    for _ in range(rounds):
        t1 = time.perf_counter()
        dist.send(buf, dst=0, group=group)
        dist.recv(buf, src=0, group=group)
        t2 = time.perf_counter()
        if t2 - t1 < best_delay:
            best_delay, best = t2 - t1, float(buf[0]) - (t1 + t2) / 2
    return best


# -- the measurement protocol: configurations interleaved in rounds ---------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One configuration measured over rounds (seconds).

    ``step_time`` is the median over rounds of each round's median step time;
    ``spread`` the 10th and 90th percentiles of those round medians (a noisy
    machine's drift between rounds); ``traces`` one file per round (every
    measured step) when traces were asked for.
    """

    config: Any
    step_time: float
    spread: tuple[float, float]
    round_medians: tuple[float, ...]
    step_times: tuple[tuple[float, ...], ...]
    foreign_cores: tuple[float, ...]
    traces: tuple[str, ...] = ()
    slowdowns: tuple[float, ...] = ()  # per round: its slowest probe over the launch's fastest (real.rounds)
    attempts: tuple[int, ...] = ()  # per round: runs made (more than 1: the first were disturbed)


def measure_interleaved(
    configs: Any,
    *,
    rounds: int = 5,
    steps: int = 10,
    warmup: int = 1,
    trace_dir: str | None = None,
    attempts: int = 3,
    max_foreign: float = 0.1,
    max_slow: float | None = None,
    timeout: float = 900.0,
    on_run: Callable[[int, int, str], None] | None = None,
) -> list[Measured]:
    """Run every config ``rounds`` times, interleaved (A B C ... A B C ...), in one torchrun group.

    Each run trains ``warmup + steps`` steps and measures the last ``steps``
    (with ``trace_dir``: traces every one of them). A run disturbed by other
    processes (more than ``max_foreign`` cores used meanwhile), or run while
    the machine was more than ``max_slow`` (a fraction; None: not checked)
    slower than its fastest, is repeated, up to ``attempts`` times (see
    :mod:`real.rounds`). All configs must have the
    same world size (pp x dp). ``on_run(done, total, label)`` is called (from
    a helper thread, within about a second) as each run finishes: a progress
    line. Raises SchedlabError for bad input before anything runs,
    RuntimeError if the group fails.
    """
    import json
    import statistics
    import tempfile
    from dataclasses import replace
    from pathlib import Path

    from common.errors import check_positive_ints
    from real.config import RunConfig
    from real.launch import torchrun
    from schedules import ConfigError

    check_positive_ints("measurement protocol", rounds=rounds, steps=steps, attempts=attempts)
    if warmup < 0:
        raise ConfigError(f"measurement protocol: warmup must be an integer >= 0, got {warmup}", field="warmup")
    if max_slow is not None and not max_slow > 0:
        raise ConfigError(f"measurement protocol: max_slow must be a fraction > 0 (or None: not checked), got "
                          f"{max_slow!r}", field="max_slow")
    configs = list(configs)
    if not configs:
        raise ConfigError("measurement protocol: no configurations to measure; give at least one", field="configs")
    worlds = sorted({c.world_size for c in configs})
    if len(worlds) > 1:
        raise ConfigError(f"measurement protocol: configurations of world sizes {worlds} cannot share one "
                          "process group; measure each world size separately", field="configs")
    runs = []
    for c in configs:
        rt = replace(c.runtime, trace_step=-1, trace_steps=steps if trace_dir else 1)
        runs.append(RunConfig.from_dict({**replace(c, steps=warmup + steps, runtime=rt).to_dict()}))
    with tempfile.TemporaryDirectory(prefix="schedlab-rounds-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        if trace_dir:
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
        spec_path.write_text(json.dumps({"configs": [c.to_dict() for c in runs], "rounds": rounds,
                                         "attempts": attempts, "max_foreign": max_foreign, "max_slow": max_slow,
                                         "trace_dir": str(trace_dir) if trace_dir else None,
                                         "result": str(result_path),
                                         "progress": str(Path(tmp) / "progress.jsonl") if on_run else None}))
        with _following(Path(tmp) / "progress.jsonl", on_run):
            done = torchrun(worlds[0], ["-m", "real.rounds", str(spec_path)], timeout=timeout, capture=True)
        if done.returncode != 0 or not result_path.exists():
            lines = (done.stderr or "").strip().splitlines()
            # the worker's own exception line: torchrun's summary after it says only "exitcode 1"
            cause = [ln for ln in lines if ("Error" in ln or "Exception" in ln) and not ln.lstrip().startswith(
                ("error_file", "traceback", "torch.distributed.elastic"))][-3:]
            tail = "\n".join([*cause, *lines[-12:]])
            raise RuntimeError(f"measurement rounds failed (exit {done.returncode}):\n{tail}")
        result = json.loads(result_path.read_text())
    out = []
    for c, r in zip(configs, result["runs"], strict=True):
        per_round = [tuple(x["step_times"][warmup:]) for x in r["rounds"]]
        medians = [statistics.median(t) for t in per_round]
        out.append(Measured(c, statistics.median(medians), (percentile(medians, 0.1), percentile(medians, 0.9)),
                            tuple(medians), tuple(per_round), tuple(x["foreign_cores"] for x in r["rounds"]),
                            tuple(x["trace"] for x in r["rounds"] if x["trace"]),
                            tuple(x.get("slowdown", 1.0) for x in r["rounds"]),
                            tuple(x.get("attempts", 1) for x in r["rounds"])))
    return out


@contextmanager
def _following(path: Any, on_run: Callable[[int, int, str], None] | None) -> Iterator[None]:
    """Call ``on_run`` for each line the rounds worker appends to ``path``, until the block ends."""
    import json
    import threading

    if on_run is None:
        yield
        return
    stop, seen = threading.Event(), [0]

    def poll() -> None:
        while True:
            ended = stop.wait(1.0)
            lines = path.read_text().splitlines() if path.exists() else []
            for line in lines[seen[0]:]:
                if line.endswith("}"):
                    x = json.loads(line)
                    on_run(x["done"], x["total"], x["label"])
                    seen[0] += 1
            if ended:
                return

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
