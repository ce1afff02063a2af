"""Schedule generators by name: one decorator line registers a generator.

A generator is a pure function ``(PipelineParams) -> Schedule``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from schedules.errors import ScheduleError, check_fraction, check_positive_ints, quote
from schedules.ir import Action, Schedule

__all__ = [
    "PipelineParams", "ScheduleSpec", "build", "check_uniform_times", "lookup", "make_schedule", "names", "register",
    "spec",
]


def check_uniform_times(*, mw: float, **times: float) -> None:
    """Pass and message times finite and >= 0, ``mw`` a fraction; the error names the field."""
    for name, value in times.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
            raise ScheduleError(f"{name} must be a finite time >= 0, got {quote(value)}", field=name)
    check_fraction("uniform costs", "mw", mw, "a fraction of M_B", error=ScheduleError)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineParams:
    """Shape of a pipeline: p ranks, m microbatches, v chunks (stages) per rank (None: the schedule's default).

    Schedules that adapt to pass times or memory (zb-auto) also read the
    uniform pass times ``tf, tb, tw, tcomm`` (per microbatch through a rank's
    whole share), the W-held fraction ``mw``, ``mem_limit`` (in M_B) and
    ``time_limit`` (seconds of exact search).
    """

    pp: int
    microbatches: int
    chunks: int | None = None
    tf: float = 1.0
    tb: float = 1.0
    tw: float = 1.0
    tcomm: float = 0.0
    mw: float = 0.0
    mem_limit: float | None = None
    time_limit: float = 10.0  # seconds zb-auto's exact refinement may search (0: the heuristic alone)

    def __post_init__(self) -> None:
        check_positive_ints("pipeline", ScheduleError, pp=self.pp, microbatches=self.microbatches)
        if self.chunks is not None:
            check_positive_ints("pipeline", ScheduleError, chunks=self.chunks)
        check_uniform_times(tf=self.tf, tb=self.tb, tw=self.tw, tcomm=self.tcomm, mw=self.mw)
        if self.mem_limit is not None and not self.mem_limit > 0:
            raise ScheduleError(f"mem_limit must be > 0 M_B, got {quote(self.mem_limit)}", field="mem_limit")
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, int | float) \
                or not 0 <= self.time_limit <= MAX_TIME_LIMIT:
            raise ScheduleError(f"time_limit must be seconds in [0, {MAX_TIME_LIMIT:g}], got {quote(self.time_limit)}",
                                field="time_limit")

    @property
    def num_stages(self) -> int:
        return self.pp * (self.chunks or 1)


Generator = Callable[[PipelineParams], Schedule]

MAX_TIME_LIMIT = 3600.0  # an hour of search: beyond that a typo, not a plan

# The largest task graph built: about 0.6 KB and 10 us to lower and validate per task on this project's
# 2-core machine (experiments/bench_sim.py), so 4M tasks is ~2.5 GB and under a minute; beyond that a
# typo (--microbatches 10000000) would grow memory for minutes before printing anything.
MAX_TASKS = 4_000_000
TASKS_PER_PASS = 7  # upper bound per (stage, microbatch): F, I, W and four messages


def check_size(name: str, pp: int, chunks: int, microbatches: int) -> None:
    """Refuse a shape whose task graph would not fit in memory or time, before building anything."""
    estimate = TASKS_PER_PASS * pp * chunks * microbatches
    if estimate > MAX_TASKS:
        raise ScheduleError(
            f"schedule {name!r} at pp={pp}, chunks={chunks}, microbatches={microbatches} would have about "
            f"{estimate:,} tasks, above the limit of {MAX_TASKS:,} (about 2.5 GB); use fewer microbatches or ranks"
        )


def make_schedule(
    name: str,
    params: PipelineParams,
    programs: Iterable[Iterable[Action]],
    placement: Sequence[int] | None = None,
    **extra: object,
) -> Schedule:
    """The Schedule a generator returns: ``placement[s]`` is stage s's rank (default: stage r on rank r).

    ``params`` records pp, microbatches, the chunks the placement implies, and ``extra``.
    """
    placement = tuple(range(params.pp)) if placement is None else tuple(placement)
    return Schedule(
        name=name,
        num_ranks=params.pp,
        num_stages=len(placement),
        num_microbatches=params.microbatches,
        stage_to_rank=placement,
        programs=tuple(tuple(p) for p in programs),
        params={"pp": params.pp, "microbatches": params.microbatches, "chunks": len(placement) // params.pp, **extra},
    )


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    name: str
    fn: Generator
    multi_chunk: bool  # True: v >= 2 chunks per rank; False: exactly one stage per rank
    summary: str
    fixed_chunks: int | None = None  # e.g. 2 for V-shaped schedules
    adaptive: bool = False  # reads pass times and mem_limit (zb-auto)

    @property
    def default_chunks(self) -> int:
        if self.fixed_chunks is not None:
            return self.fixed_chunks
        return 2 if self.multi_chunk else 1


_REGISTRY: dict[str, ScheduleSpec] = {}


def register(
    name: str,
    *,
    multi_chunk: bool = False,
    fixed_chunks: int | None = None,
    adaptive: bool = False,
    summary: str = "",
) -> Callable[[Generator], Generator]:
    """Decorator: ``@register("1f1b")`` makes a generator available to :func:`build`.

    ``multi_chunk``: the schedule needs v >= 2 stages per rank; ``fixed_chunks``:
    exactly that many (V placements: 2); ``adaptive``: it reads the pass times
    and the memory limit of :class:`PipelineParams`.
    """

    def deco(fn: Generator) -> Generator:
        if name in _REGISTRY:
            raise RuntimeError(f"schedule {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        multi = multi_chunk or (fixed_chunks is not None and fixed_chunks > 1)
        _REGISTRY[name] = ScheduleSpec(name, fn, multi, summary or (doc[0] if doc else ""), fixed_chunks, adaptive)
        return fn

    return deco


def names(*, by_family: bool = False) -> list[str]:
    """Registered schedule names, sorted; ``by_family``: in registration order (families together)."""
    return list(_REGISTRY) if by_family else sorted(_REGISTRY)


def lookup(name: str) -> ScheduleSpec | None:
    """The registered schedule called ``name`` (case-insensitive), or None."""
    if not isinstance(name, str):
        return None
    return _REGISTRY.get(name) or _REGISTRY.get(name.lower())


def spec(name: str) -> ScheduleSpec:
    """The registered schedule called ``name`` (case-insensitive); an unknown name suggests the closest."""
    found = lookup(name)
    if found is not None:
        return found
    close = difflib.get_close_matches(str(name).lower(), names(), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ScheduleError(f"unknown schedule {quote(name)}{hint}; valid: {', '.join(names())}", field="schedule")


def _check_chunks(sp: ScheduleSpec, chunks: object) -> None:
    name = sp.name
    if sp.fixed_chunks is not None and chunks != sp.fixed_chunks:
        raise ScheduleError(
            f"schedule {name!r} places exactly {sp.fixed_chunks} stages per rank (chunks={sp.fixed_chunks}), "
            f"got chunks={chunks}"
        )
    if sp.multi_chunk and isinstance(chunks, int) and chunks < 2:
        raise ScheduleError(
            f"schedule {name!r} needs chunks (v) >= 2 stages per rank, got {chunks}; "
            "use gpipe or 1f1b for one stage per rank"
        )
    if not sp.multi_chunk and chunks != 1:
        raise ScheduleError(
            f"schedule {name!r} runs one stage per rank (chunks=1), got chunks={chunks}; "
            "multi-chunk schedules: " + ", ".join(n for n in names() if _REGISTRY[n].multi_chunk)
        )


def build(name: str, params: PipelineParams | None = None, /, **fields: Any) -> Schedule:
    """Build a registered schedule: ``build("1f1b", params)`` or ``build("1f1b", pp=4, microbatches=8)``.

    The keywords are :class:`PipelineParams`' fields. Bad names and impossible
    parameters raise ScheduleError. The pass times and ``mem_limit`` matter
    only to adaptive schedules (zb-auto).
    """
    sp = spec(name)
    if params is None:
        given = fields.get("chunks")
        _check_chunks(sp, sp.default_chunks if given is None else given)  # the schedule's own message first
        params = PipelineParams(**fields)
    elif fields:
        raise TypeError(f"build() takes a PipelineParams or its fields as keywords, not both (got {sorted(fields)})")
    chunks = sp.default_chunks if params.chunks is None else params.chunks
    _check_chunks(sp, chunks)
    check_size(sp.name, params.pp, chunks, params.microbatches)
    if params.mem_limit is not None and not sp.adaptive:
        adaptive = ", ".join(n for n in names() if _REGISTRY[n].adaptive)
        raise ScheduleError(f"mem_limit applies only to adaptive schedules ({adaptive}), not to {name!r}",
                            field="mem_limit")
    return sp.fn(replace(params, chunks=chunks))
