"""Schedule generators by name: one decorator line registers a generator.

A generator is a pure function ``(PipelineParams) -> Schedule``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from schedules.errors import ScheduleError
from schedules.ir import Schedule

__all__ = ["PipelineParams", "ScheduleSpec", "build", "names", "register", "spec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineParams:
    """Shape of a pipeline: p ranks, m microbatches, v chunks (stages) per rank."""

    pp: int
    microbatches: int
    chunks: int = 1

    def __post_init__(self) -> None:
        for flag, value in (("pp", self.pp), ("microbatches", self.microbatches), ("chunks", self.chunks)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ScheduleError(f"{flag} must be an integer >= 1, got {value!r}")

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

    @property
    def default_chunks(self) -> int:
        return 2 if self.multi_chunk else 1


_REGISTRY: dict[str, ScheduleSpec] = {}


def register(name: str, *, multi_chunk: bool = False, summary: str = "") -> Callable[[Generator], Generator]:
    """Decorator: ``@register("1f1b")`` makes a generator available to :func:`build`."""

    def deco(fn: Generator) -> Generator:
        if name in _REGISTRY:
            raise RuntimeError(f"schedule {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = ScheduleSpec(name, fn, multi_chunk, summary or (doc[0] if doc else ""))
        return fn

    return deco


def names() -> list[str]:
    """Registered schedule names, sorted."""
    return sorted(_REGISTRY)


def spec(name: str) -> ScheduleSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}; valid: {', '.join(names())}") from None


def build(name: str, *, pp: int, microbatches: int, chunks: int | None = None) -> Schedule:
    """Build a registered schedule; bad names and impossible parameters raise ScheduleError."""
    sp = spec(name)
    if chunks is None:
        chunks = sp.default_chunks
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
    return sp.fn(PipelineParams(pp=pp, microbatches=microbatches, chunks=chunks))
