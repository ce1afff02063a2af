"""The planner: the fastest configurations of a model on a cluster, searched in simulation.

    >>> from sim.plan.search import plan
    >>> from sim.plan.space import PlanSpace
    >>> result = plan(PlanSpace(model=..., cluster=..., global_batch=2048), top=5, workers=2)  # doctest: +SKIP
    >>> result.top[0].config, result.top[0].step_time                                           # doctest: +SKIP

1. Enumerate every valid configuration (:mod:`sim.plan.space`).
2. Memory, first bound: drop those whose model states plus one microbatch
   already overflow (``Bounds.memory_floor``).
3. Best first on the bound: take the rest in order of the lower bound
   (:meth:`Bounds.lower_bound`). The configuration with the smallest bound
   left is first refined in a worker, with the others of its schedule: its
   exact memory from the schedule's activation rows (:func:`memory_rows`,
   kept once learnt; one that does not fit is dropped) and its tight bound
   (:meth:`Bounds.tight_bound`, the schedule's own order timed), and goes
   back in the queue; once it is the smallest again, it is simulated. When
   the smallest bound left exceeds the K-th best step time found, no
   remaining configuration can enter the top K, so they are dropped: the top
   K is exactly what simulating everything would give. Of those dropped by
   the bound, the memory is counted where the rows are known; the others are
   reported as ``memory_unchecked`` (their states plus one microbatch fit;
   building every schedule just to count them would cost more than the
   search).
4. A lowered, validated graph is shared by every configuration with the same
   (schedule, pp, microbatches, chunks, dp mode, buckets): only the costs differ.
   Work goes to ``workers`` processes in groups that share one graph.
5. Exact ties merge: two candidates that differ only in the schedule's name and
   whose schedules are the same data (each rank's program and the stage
   placement: at pp=1 gpipe and 1f1b are F0 B0 F1 B1 ... only at m=1, but
   interleaved-zb and zb-v at v=2 are one order for any m; at m=1
   interleaved-1f1b and looped-bfs are) lower to the same task graph under the
   same costs, and nothing the simulator or the costs compute reads the name, so
   their results are the same, bit for bit. They are one plan: one entry (the
   simplest of them, :data:`SIMPLEST_FIRST`, is the one exported) that names
   the others (``same_as``), and the top K holds K distinct plans.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import logging
import multiprocessing
import os
import signal
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from common.errors import ConfigError, check_positive_ints
from common.procs import die_with_parent
from schedules import Schedule, TaskGraph, build, validate
from schedules.dp.modes import add_data_parallel
from schedules.registry import lookup
from schedules.timing import CompiledTiming, compile_timing
from sim.engine import simulate
from sim.plan.bounds import Bounds, MemoryRows, floor_key, floor_rows, memory_rows
from sim.plan.extrapolate import StepFigures, extend, short_sizes
from sim.plan.space import PlanConfig, PlanSpace, enumerate_configs, why_empty
from sim.plan.study import Study, StudyResult, dp_options

__all__ = ["SIMPLEST_FIRST", "PlanEntry", "PlanResult", "entry_of", "merge_ties", "order_digest", "plan"]

#: Which of schedules that tie exactly stands for them (and is exported): flush schedules first, then looped ones
#: (interleaved 1F1B, which Megatron-LM and torch both run, before breadth-first), then zero-bubble ones, each
#: family's plainest first; a schedule not listed comes after these, by name.
SIMPLEST_FIRST = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "interleaved-zb", "zb-v",
                  "v-half", "v-min", "dualpipe-v", "combined-1f1b", "zb-auto")

log = logging.getLogger(__name__)

# The most configurations one search takes (the 405B example on 512 H100s has ~54,000): each is kept with its
# bounds, so a space of millions would take minutes and gigabytes before the first simulation.
MAX_CANDIDATES = 1_000_000
_START_TIMEOUT = 120.0  # seconds for a pool's workers to start and answer (forked: well under one)
_SLACK = 1e-9  # the bound and the simulation sum the same times in different orders
_GROUP_SPREAD = 0.05  # a simulation job takes the graph's configurations whose bound is within 5% of the first's
_OPEN, _TAKEN, _DONE = 0, 1, 2  # a candidate: waiting (for refinement or simulation), in a worker, settled


@dataclass(frozen=True, slots=True)
class PlanEntry:
    """A simulated configuration: the figures of the top-K table and what explains them."""

    config: PlanConfig
    step_time: float
    tokens_per_s: float
    mfu: float
    peak_memory_bytes: float
    bubble_ratio: float
    exposed_comm: float
    recompute_time: float
    lower_bound: float
    order: str = ""  # order_digest of the pipeline schedule simulated: equal orders, equal results
    same_as: tuple[str, ...] = ()  # the other schedules whose order is this one's (merged exact ties)
    extrapolated_from: tuple[int, ...] = ()  # the microbatch counts its time figures were extended from (extrapolate)

    @property
    def schedules(self) -> tuple[str, ...]:
        """The schedules this entry stands for: its own (the simplest, exported) first."""
        return (self.config.schedule, *self.same_as)

    @property
    def schedule_label(self) -> str:
        """``gpipe/1f1b`` for a merged entry, the schedule's name otherwise, ``no-pipeline`` at pp = 1."""
        return "/".join((self.config.pipeline, *self.same_as))

    def tie_reason(self) -> str:
        """Why a merged entry's schedules are one plan (empty for one that is not merged)."""
        if not self.same_as:
            return ""
        c = self.config
        where = f" at m={c.microbatches}" if c.microbatches == 1 else ""
        return (f"{self.schedule_label}: the same order on every rank{where}, so the same simulation; {c.schedule}, "
                "the simplest, is exported")

    def tied_configs(self) -> tuple[PlanConfig, ...]:
        """The configuration of every schedule this entry stands for."""
        return tuple(self.config._replace(schedule=n) for n in self.schedules)

    @property
    def bubble_time(self) -> float:
        """Idle compute time per rank, averaged: bubble ratio x step time."""
        return self.bubble_ratio * self.step_time

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "step_time": self.step_time, "tokens_per_s": self.tokens_per_s,
                "mfu": self.mfu, "peak_memory_bytes": self.peak_memory_bytes, "bubble_ratio": self.bubble_ratio,
                "bubble_time": self.bubble_time, "exposed_comm": self.exposed_comm,
                "recompute_time": self.recompute_time, "lower_bound": self.lower_bound,
                "same_as": list(self.same_as), "extrapolated_from": list(self.extrapolated_from)}


@dataclass(frozen=True, eq=False)
class PlanResult:
    space: PlanSpace
    candidates: int
    feasible: int
    simulated: int
    pruned_memory: int
    pruned_bound: int
    memory_unchecked: int  # dropped by the bound before their schedule's activation peak was known
    seconds: float
    top: tuple[PlanEntry, ...]
    entries: tuple[PlanEntry, ...] = field(repr=False)  # every simulated plan, fastest first, exact ties merged
    merged: int = 0  # simulated configurations merged into another's entry (the same order: an exact tie)

    def to_dict(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "feasible": self.feasible, "simulated": self.simulated,
                "merged": self.merged,
                "seconds": self.seconds, "top": [e.to_dict() for e in self.top],
                "pruned_memory": self.pruned_memory, "pruned_bound": self.pruned_bound,
                "memory_unchecked": self.memory_unchecked}


# ------------------------------------------------------------------------------------------------ worker side
_STATE: dict[str, Any] = {}
_GRAPH_CACHE = 5  # lowered graphs kept per process (a 100k-task graph is ~60 MB); 5: an extrapolation's three short
# graphs and schedules, the whole schedule and one more


def _init_worker(space: PlanSpace, extrapolate: bool, parent: int) -> None:
    """A pool worker's first call: die with the planner (SIGKILL: a worker holds nothing to clean up, and a SIGTERM
    handler of the planner's, inherited by the fork, would run in the worker), then the search's state."""
    die_with_parent(signal.SIGKILL, parent)
    _init(space, extrapolate)


def _init(space: PlanSpace, extrapolate: bool = False) -> None:
    _STATE.clear()
    _STATE.update(space=space, bounds=Bounds(space), schedules=OrderedDict(), pipelines=OrderedDict(),
                  graphs=OrderedDict(), timings=OrderedDict(), rows=OrderedDict(), orders=OrderedDict(),
                  floors=OrderedDict(), extrapolate=extrapolate)


def _cached(cache: OrderedDict, key: Any, make: Callable[[], Any]) -> Any:
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    while len(cache) > _GRAPH_CACHE:
        cache.popitem(last=False)
    return value


def _adaptive(name: str) -> bool:
    found = lookup(name)
    return found is not None and found.adaptive


def _study(c: PlanConfig) -> Study:
    return Study(schedule=c.schedule, microbatches=c.microbatches, costs=_STATE["bounds"].costs(c), chunks=c.chunks)


def _shape_key(study: Study) -> tuple:
    """What a schedule is built from: its name and shape, and an adaptive one's options (its pass times, memory)."""
    return (study.schedule, study.pipeline(), study.schedule_options())


def _schedule(study: Study) -> Schedule:
    params, options = study.pipeline(), study.schedule_options()
    return _cached(_STATE["schedules"], _shape_key(study), lambda: build(study.schedule, params, options))


def _timing(study: Study) -> CompiledTiming:
    sched = _schedule(study)
    return _cached(_STATE["timings"], _shape_key(study), lambda: compile_timing(sched))


def _graph(study: Study) -> TaskGraph:
    sched = _schedule(study)
    pipe = _cached(_STATE["pipelines"], _shape_key(study), lambda: validate(sched))
    buckets = tuple(study.costs.buckets(sched.num_stages))
    mode, options = study.parallel.dp_mode, dp_options(study.costs)
    key = (*_shape_key(study), mode, buckets, tuple(options.items()))

    def make() -> TaskGraph:
        graph = add_data_parallel(pipe, mode, buckets, **options)
        return graph if graph is pipe else validate(graph)

    return _cached(_STATE["graphs"], key, make)


def _rows(study: Study) -> MemoryRows:
    """The whole schedule's activation rows (an entry's memory)."""
    sched = _schedule(study)
    return _cached(_STATE["rows"], _shape_key(study), lambda: memory_rows(sched))


def _order(study: Study) -> str:
    """The whole schedule's order digest (an extrapolated entry's, which simulates shorter ones)."""
    sched = _schedule(study)
    return _cached(_STATE["orders"], _shape_key(study), lambda: order_digest(sched))


def _row_key(c: PlanConfig) -> tuple:
    """What a schedule's activation rows depend on: its shape, and for an adaptive one its options too (pass times:
    tp, sp, recompute; with pp and m they fix dp, b and the placement, so tcomm)."""
    key = (c.schedule, c.pp, c.microbatches, c.chunks)
    return (*key, c.tp, c.sp, c.recompute, c.ep) if _adaptive(c.schedule) else key


def _floor_of(c: PlanConfig) -> tuple | None:
    return floor_key(c.schedule, c.pp, c.microbatches, c.chunks)


def _group_key(c: PlanConfig) -> tuple:
    """Configurations that share one lowered graph (the buckets follow from tp)."""
    return (*_row_key(c), c.dp_mode, c.tp, c.ep)


def _refine_job(configs: Sequence[PlanConfig], rows: MemoryRows | None, floor: MemoryRows | None = None
                ) -> tuple[MemoryRows | None, MemoryRows | None, list[tuple[PlanConfig, float | None]]]:
    """The tight bound of each configuration that fits (one shared schedule); None for one that does not fit.

    Without the schedule's ``rows``, its memory floor first (:func:`sim.plan.bounds.floor_rows`, cheap): where no
    configuration fits on it, the schedule is never built. Returns (rows or None, the floor or None, bounds)."""
    space, bounds = _STATE["space"], _STATE["bounds"]
    if rows is None:
        key = _floor_of(configs[0])
        if floor is None and key is not None:
            floor = _cached(_STATE["floors"], key, lambda: floor_rows(key))
        if floor is not None and all(bounds.memory(c, floor) > space.capacity for c in configs):
            return None, floor, [(c, None) for c in configs]
        rows = _rows(_study(configs[0]))
    out: list[tuple[PlanConfig, float | None]] = []
    for c in configs:
        if bounds.memory(c, rows) > space.capacity:
            out.append((c, None))
        else:
            out.append((c, bounds.tight_bound(c, _timing(_study(c)))))
    return rows, floor, out


def _simulate_job(configs: Sequence[PlanConfig], lower: Sequence[float], rows: MemoryRows | None = None
                  ) -> list[PlanEntry]:
    """Simulate each configuration (they share one graph and are known to fit): its steady phase over two periods,
    extended to its microbatches (:mod:`sim.plan.extrapolate`), or where that does not apply or hold, its whole step.
    Memory comes from the schedule's activation ``rows`` (the simulation's own accounting, ``tests/test_plan.py``),
    so the simulations skip theirs."""
    bounds = _STATE["bounds"]
    out: list[PlanEntry] = []
    for c, lb in zip(configs, lower, strict=True):
        study = _study(c)
        if rows is None:
            rows = _rows(study)
        sizes = short_sizes(c) if _STATE["extrapolate"] else None
        if sizes is not None:
            short = []
            for k in sizes:
                s = _study(c._replace(microbatches=k))
                short.append(StepFigures.of(StudyResult(s, simulate(_graph(s), s.costs, check=False, peaks=False))))
            figures = extend(c, sizes, tuple(short))
            if figures is not None:
                out.append(_entry(c, study, figures, bounds.memory(c, rows), bounds, lb, _order(study), sizes))
                continue
            log.debug("plan: %s not steady at m = %s; simulated whole", c.label(), sizes)
        result = StudyResult(study, simulate(_graph(study), study.costs, check=False, peaks=False))
        out.append(_entry(c, study, StepFigures.of(result), bounds.memory(c, rows), bounds, lb,
                          order_digest(result.sim.graph.schedule)))
    return out


def order_digest(schedule: Schedule) -> str:
    """A fingerprint of what the simulator reads of a schedule: each rank's program and the stage placement (not
    its name or parameters); equal digests, equal task graphs."""
    text = repr((schedule.num_stages, schedule.stage_to_rank, schedule.programs))
    return hashlib.sha256(text.encode()).hexdigest()


def entry_of(c: PlanConfig, result: StudyResult, bounds: Bounds, lower_bound: float) -> PlanEntry:
    """The table's figures of ``c`` from its simulation."""
    return _entry(c, result.study, StepFigures.of(result), max(d.memory_bytes for d in result.devices()), bounds,
                  lower_bound, order_digest(result.sim.graph.schedule))


def _entry(c: PlanConfig, study: Study, f: StepFigures, memory: float, bounds: Bounds, lower_bound: float, order: str,
           extrapolated_from: tuple[int, ...] = ()) -> PlanEntry:
    tokens = c.microbatches * c.microbatch_size * study.model.seq_len * c.dp  # StudyResult.tokens_per_step
    flops = study.model.model_flops_per_token() * tokens  # StudyResult.mfu's numerator
    return PlanEntry(
        config=c, step_time=f.step, tokens_per_s=tokens / f.step,
        mfu=flops / (study.parallel.world * study.cluster.spec.peak_flops * f.step), peak_memory_bytes=memory,
        bubble_ratio=f.bubble_ratio, exposed_comm=f.exposed_comm, recompute_time=bounds.recompute_time(c),
        lower_bound=lower_bound, order=order, extrapolated_from=extrapolated_from)


def _simplest(name: str) -> tuple[int, str]:
    return (SIMPLEST_FIRST.index(name) if name in SIMPLEST_FIRST else len(SIMPLEST_FIRST), name)


def _tie_key(e: PlanEntry) -> tuple:
    """Entries with the same key are one plan: the same configuration but for the schedule's name, the same order."""
    return (e.config._replace(schedule=""), e.order)


def merge_ties(entries: Sequence[PlanEntry]) -> list[PlanEntry]:
    """One entry per plan, fastest first: exact ties (:func:`_tie_key`) as the simplest one's, naming the others."""
    groups: dict[tuple, list[PlanEntry]] = {}
    for e in entries:
        groups.setdefault(_tie_key(e), []).append(e)
    out = []
    for group in groups.values():
        group.sort(key=lambda e: _simplest(e.config.schedule))
        out.append(dataclasses.replace(group[0], same_as=tuple(e.config.schedule for e in group[1:])))
    return sorted(out, key=lambda e: (e.step_time, e.config))


# ------------------------------------------------------------------------------------------------ the search
class _Inline:
    """The executor interface, run in this process (workers=1: no pool, same results)."""

    def submit(self, fn: Callable, *args: Any) -> Future:
        fut: Future = Future()
        fut.set_result(fn(*args))
        return fut

    def shutdown(self) -> None:
        pass


def _ready() -> bool:
    return True


def _abandon(pool: ProcessPoolExecutor) -> None:
    """A pool whose workers could not all start: end the ones that did (else they wait for work forever, and the
    interpreter waits for them at exit)."""
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.terminate()
        proc.join(timeout=5)
    pool.shutdown(wait=False, cancel_futures=True)


def _executor(space: PlanSpace, workers: int, extrapolate: bool = False) -> Any:
    """A pool of ``workers`` processes, started and answering; if the system refuses processes (a fork fails under
    a process or memory limit), half as many, down to this process alone, with a warning: never a hang.

    Each worker dies with this process (:func:`common.procs.die_with_parent`, SIGKILL included). Linux sends
    that signal when the *thread* that forked the worker ends; with fork, the pool forks every worker at the first
    submit, in the calling thread (the one running :func:`plan`, which shuts the pool down before it returns),
    never in the pool's own management thread, which could outlive it or end first. The test SIGKILLs a
    planning command and finds no process of it left."""
    _init(space, extrapolate)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    while workers > 1:
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                                   initializer=_init_worker, initargs=(space, extrapolate, os.getpid()))
        try:
            pool.submit(_ready).result(timeout=_START_TIMEOUT)  # with fork, every worker starts at the first submit
            return pool
        except (OSError, BrokenProcessPool, TimeoutError) as exc:
            _abandon(pool)
            log.warning("plan: %d worker processes could not start (%s); trying %d", workers,
                        type(exc).__name__ if not str(exc) else exc, workers // 2)
            workers //= 2
    return _Inline()


def plan(space: PlanSpace, *, top: int = 5, workers: int | None = None,
         progress: Callable[[int, int], None] | None = None, extrapolate: bool = False) -> PlanResult:
    """Search ``space``; the ``top`` fastest simulated configurations, exactly.

    ``workers``: processes (None: every core; fewer if the system refuses
    them); ``progress(done, total)`` is called as candidates are settled
    (dropped or simulated). ``extrapolate`` (off by default: not exact, see
    :mod:`sim.plan.extrapolate`): a configuration of many microbatches is
    simulated over two periods of its steady phase and extended
    (``PlanEntry.extrapolated_from``) where those agree. A space with no configuration, or none that fits in
    memory, raises :class:`ConfigError` naming the constraint that leaves
    nothing (:func:`sim.plan.space.why_empty`); so does one of more than
    :data:`MAX_CANDIDATES` configurations.
    """
    check_positive_ints("plan", top=top)
    workers = (os.cpu_count() or 1) if workers is None else workers
    check_positive_ints("plan", workers=workers)
    t0 = time.perf_counter()
    search = _Search(space, top, workers, progress)
    configs = list(itertools.islice(enumerate_configs(space), MAX_CANDIDATES + 1))
    if len(configs) > MAX_CANDIDATES:
        raise ConfigError(f"plan: the search space holds more than {MAX_CANDIDATES:,} configurations; narrow it "
                          "(schedules, microbatch_sizes, dp_modes, chunks)", field="schedules")
    if not configs:
        raise why_empty(space)
    search.total = len(configs)
    floors = [search.bounds.memory_floor(c) for c in configs]
    floor_ok = [c for c, f in zip(configs, floors, strict=True) if f <= space.capacity]
    search.settle(len(configs) - len(floor_ok), memory=len(configs) - len(floor_ok))
    log.info("plan: %d candidates, %d pass the memory floor (%.1f s)", len(configs), len(floor_ok),
             time.perf_counter() - t0)
    pool = _executor(space, workers, extrapolate)
    try:
        search.run(pool, floor_ok)
    except BrokenProcessPool:  # a worker killed (out of memory?) after the pool started
        raise ConfigError(f"plan: a worker process died during the search (killed for memory?); run again with "
                          f"fewer workers than {workers}", field="workers") from None
    finally:
        pool.shutdown()
    simulated = [e for e in search.entries if e is not None]
    done = merge_ties(simulated)
    if not done:
        least = min(floors) / 1e9
        why = (f"the smallest needs at least {least:.4g} GB (model states and one microbatch)"
               if least > space.capacity / 1e9 else
               f"model states and one microbatch fit ({least:.4g} GB at least), the microbatches each schedule "
               "holds in flight do not")
        raise ConfigError(f"plan: no configuration fits in {space.capacity / 1e9:.3g} GB per device: {why}; raise "
                          "memory_limit, add nodes or give smaller microbatch sizes", field="memory_limit")
    return PlanResult(space=space, candidates=len(configs), feasible=len(configs) - search.pruned_memory - search.unchecked,
                      simulated=len(simulated), pruned_memory=search.pruned_memory, pruned_bound=search.pruned_bound,
                      memory_unchecked=search.unchecked, seconds=time.perf_counter() - t0, top=tuple(done[:top]),
                      entries=tuple(done), merged=len(simulated) - len(done))


class _Search:
    """Branch and bound in lower-bound order, with activation rows learnt from the workers as shapes are built."""

    GROUP, REFINE = 8, 32  # at most this many configurations per simulation job, per refinement job

    def __init__(self, space: PlanSpace, top: int, workers: int, progress: Callable[[int, int], None] | None) -> None:
        self.space, self.top, self.workers, self.progress = space, top, workers, progress
        self.bounds = Bounds(space)
        self.total = self.settled = 0
        self.pruned_memory = self.pruned_bound = self.unchecked = 0
        self.rows: dict[tuple, MemoryRows] = {}
        self.floor_rows: dict[tuple, MemoryRows] = {}  # by floor_key, as the workers return them
        self.fit: dict[PlanConfig, bool] = {}
        self.best: list[float] = []  # max-heap (negated) of the top step times found, one per distinct plan
        self.entries: list[PlanEntry | None] = []
        self.plans: set[tuple] = set()  # the tie keys seen: an exact tie of a plan found is not another plan

    def settle(self, n: int, memory: int = 0) -> None:
        self.settled += n
        self.pruned_memory += memory
        if self.progress is not None and n:
            self.progress(self.settled, self.total)

    def kth(self) -> float:
        return -self.best[0] if len(self.best) >= self.top else float("inf")

    def fits(self, c: PlanConfig) -> bool | None:
        """True or False where the schedule's rows are known; False where its memory floor (from a worker) already
        overflows; else None (unknown). Never builds anything: this process only orders the search."""
        known = self.fit.get(c)
        if known is not None:
            return known
        rows = self.rows.get(_row_key(c))
        if rows is not None:
            known = self.fit[c] = self.bounds.memory(c, rows) <= self.space.capacity
            return known
        floor = self.floor_rows.get(_floor_of(c))
        if floor is not None and self.bounds.memory(c, floor) > self.space.capacity:
            self.fit[c] = False
            return False
        return None

    def push_entries(self, results: list[PlanEntry]) -> None:
        for e in results:
            self.entries.append(e)
            if _tie_key(e) in self.plans:
                continue
            self.plans.add(_tie_key(e))
            heapq.heappush(self.best, -e.step_time)
            if len(self.best) > self.top:
                heapq.heappop(self.best)
        self.settle(len(results))

    def run(self, pool: Any, configs: list[PlanConfig]) -> None:
        """Best first on the bound: a configuration is first refined (its schedule's own timing, in a worker),
        then simulated once its refined bound is the smallest left; everything stops when the smallest bound
        left exceeds the K-th best step time found."""
        lb1 = [self.bounds.lower_bound(c) for c in configs]
        order = sorted(range(len(configs)), key=lambda i: (lb1[i], configs[i]))
        configs = [configs[i] for i in order]
        bound = [lb1[i] for i in order]
        refined = [False] * len(configs)
        state = [_OPEN] * len(configs)
        heap = [(b, i) for i, b in enumerate(bound)]  # already in heap order (sorted)
        by_row: dict[tuple, list[int]] = {}
        for i, c in enumerate(configs):
            by_row.setdefault(_row_key(c), []).append(i)
        by_group: dict[tuple, list[int]] = {}  # refined, not yet simulated
        inflight: dict[Future, tuple[str, tuple]] = {}
        # configurations whose schedule's floor (a floor_key) a worker is building, to be checked against it
        # first: a floor is shared by every m >= 2 pp of a schedule shape, so it is built once
        parked: dict[tuple, list[int]] = {}
        while True:
            while heap and len(inflight) < 2 * self.workers:
                b, i = heap[0]
                if state[i] != _OPEN or b != bound[i]:
                    heapq.heappop(heap)
                    continue
                cut = self.kth() * (1 + _SLACK)
                if b > cut:
                    break
                heapq.heappop(heap)
                c = configs[i]
                if self.fits(c) is False:
                    state[i] = _DONE
                    self.settle(1, memory=1)
                    continue
                if refined[i]:
                    gkey = _group_key(c)
                    # a graph's other configurations go with it only where their bounds are near this one's: before
                    # the top K is known, the cut is infinite, and a recompute=full neighbour 30% slower would be
                    # simulated for nothing (it stays in the queue, to be simulated if its bound is ever reached)
                    near = min(cut, b * (1 + _GROUP_SPREAD))
                    group = [i, *[j for j in by_group.get(gkey, ()) if j != i and state[j] == _OPEN
                                     and bound[j] <= near][:self.GROUP - 1]]
                    for j in group:
                        state[j] = _TAKEN
                    fut = pool.submit(_simulate_job, [configs[j] for j in group], [bound[j] for j in group],
                                      self.rows.get(_row_key(c)))
                    inflight[fut] = ("sim", tuple(group))
                else:
                    key, fkey = _row_key(c), _floor_of(c)
                    if key not in self.rows and fkey in parked:  # its floor is being built: wait for it
                        parked[fkey].append(i)
                        continue
                    if key not in self.rows and fkey is not None and fkey not in self.floor_rows:
                        parked[fkey] = []
                    group = [i, *[j for j in by_row[key] if j != i and state[j] == _OPEN and not refined[j]
                                     and bound[j] <= cut and self.fits(configs[j]) is not False][:self.REFINE - 1]]
                    for j in group:
                        state[j] = _TAKEN
                    fut = pool.submit(_refine_job, [configs[j] for j in group], self.rows.get(key),
                                      self.floor_rows.get(_floor_of(c)))
                    inflight[fut] = ("refine", tuple(group))
            if not inflight:
                break
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            for fut in done:
                what, group = inflight.pop(fut)
                if what == "sim":
                    for j in group:
                        state[j] = _DONE
                    self.push_entries(fut.result())
                    continue
                rows, floor, tight = fut.result()
                if rows is not None:
                    self.rows[_row_key(configs[group[0]])] = rows
                fkey = _floor_of(configs[group[0]])
                if floor is not None:
                    self.floor_rows[fkey] = floor
                for j in parked.pop(fkey, ()):
                    heapq.heappush(heap, (bound[j], j))
                unfit = 0
                for j, (c, t) in zip(group, tight, strict=True):
                    if t is None:
                        state[j] = _DONE
                        self.fit[c] = False
                        unfit += 1
                        continue
                    state[j], refined[j], bound[j] = _OPEN, True, max(bound[j], t)
                    by_group.setdefault(_group_key(c), []).append(j)
                    heapq.heappush(heap, (bound[j], j))
                self.settle(unfit, memory=unfit)
                log.debug("plan: refined %d (%d do not fit); k-th best %.4g s", len(group), unfit, self.kth())
        rest = [c for c, st in zip(configs, state, strict=True) if st == _OPEN]
        for c in rest:  # dropped by the bound: count the memory where it is known
            fit = self.fits(c)
            if fit is None:
                self.unchecked += 1
            elif not fit:
                self.pruned_memory += 1
        self.pruned_bound = sum(1 for c in rest if self.fits(c) is not False)
        self.settle(len(rest))
