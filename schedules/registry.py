"""Schedule generators by name: one decorator line registers a generator.

A generator is a pure function ``(PipelineParams) -> Schedule``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schedules.errors import ScheduleError
from schedules.ir import Schedule

__all__ = ["PipelineParams", "ScheduleSpec", "build", "check_uniform_times", "names", "register", "spec"]


def check_uniform_times(*, mw: float, **times: float) -> None:
    """Pass and message times finite and >= 0, ``mw`` a fraction; the flag is named in the error."""
    for flag, value in times.items():
        if not 0 <= value < float("inf"):  # also catches NaN
            raise ScheduleError(f"{flag} (--{flag}) must be a finite time >= 0, got {value!r}")
    if not 0 <= mw <= 1:
        raise ScheduleError(f"mw (--mw) must be a fraction of M_B in [0, 1], got {mw!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineParams:
    """Shape of a pipeline: p ranks, m microbatches, v chunks (stages) per rank.

    Schedules that adapt to pass times or memory (zb-auto) also read the
    uniform pass times ``tf, tb, tw, tcomm`` (per microbatch through a rank's
    whole share), the W-held fraction ``mw`` and ``mem_limit`` (in M_B).
    """

    pp: int
    microbatches: int
    chunks: int = 1
    tf: float = 1.0
    tb: float = 1.0
    tw: float = 1.0
    tcomm: float = 0.0
    mw: float = 0.0
    mem_limit: float | None = None

    def __post_init__(self) -> None:
        for flag, value in (("pp", self.pp), ("microbatches", self.microbatches), ("chunks", self.chunks)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ScheduleError(f"{flag} must be an integer >= 1, got {value!r}")
        check_uniform_times(tf=self.tf, tb=self.tb, tw=self.tw, tcomm=self.tcomm, mw=self.mw)
        if self.mem_limit is not None and not self.mem_limit > 0:
            raise ScheduleError(f"mem_limit (--mem-limit) must be > 0 M_B, got {self.mem_limit!r}")

    @property
    def num_stages(self) -> int:
        return self.pp * self.chunks


Generator = Callable[[PipelineParams], Schedule]


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


def spec(name: str) -> ScheduleSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}; valid: {', '.join(names())}") from None


def build(
    name: str,
    *,
    pp: int,
    microbatches: int,
    chunks: int | None = None,
    mem_limit: float | None = None,
    tf: float = 1.0,
    tb: float = 1.0,
    tw: float = 1.0,
    tcomm: float = 0.0,
    mw: float = 0.0,
) -> Schedule:
    """Build a registered schedule; bad names and impossible parameters raise ScheduleError.

    The pass times and ``mem_limit`` matter only to adaptive schedules (zb-auto).
    """
    sp = spec(name)
    if chunks is None:
        chunks = sp.default_chunks
    if sp.fixed_chunks is not None and chunks != sp.fixed_chunks:
        raise ScheduleError(
            f"schedule {name!r} places exactly {sp.fixed_chunks} stages per rank (chunks={sp.fixed_chunks}), "
            f"got chunks={chunks}"
        )
    if mem_limit is not None and not sp.adaptive:
        adaptive = ", ".join(n for n in names() if _REGISTRY[n].adaptive)
        raise ScheduleError(f"--mem-limit applies only to adaptive schedules ({adaptive}), not to {name!r}")
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
    params = PipelineParams(
        pp=pp, microbatches=microbatches, chunks=chunks, tf=tf, tb=tb, tw=tw, tcomm=tcomm, mw=mw, mem_limit=mem_limit
    )
    return sp.fn(params)
