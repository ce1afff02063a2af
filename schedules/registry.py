"""Schedule generators by name: one decorator line registers a generator.

A generator is a pure function ``(PipelineParams) -> Schedule``; an adaptive
one (zb-auto) is ``(PipelineParams, options) -> Schedule`` and registers the
frozen dataclass of its own options (:class:`schedules.library.zb_auto.ZBAutoOptions`),
which no other schedule sees.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from common.errors import SchedlabError, ScheduleError, check_fraction, check_positive_ints, quote
from common.usercode import describe, import_user, is_file_or_module_ref, is_user_file, raised
from schedules.ir import Action, Schedule

__all__ = [
    "PipelineParams",
    "ScheduleSpec",
    "build",
    "build_from",
    "check_built",
    "check_uniform_times",
    "is_user_ref",
    "lookup",
    "make_schedule",
    "names",
    "register",
    "spec",
    "spec_of",
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

    Every schedule reads these and only these; an adaptive schedule's own inputs
    (zb-auto's pass times and limits) are its options, apart.
    """

    pp: int
    microbatches: int
    chunks: int | None = None

    def __post_init__(self) -> None:
        check_positive_ints("pipeline", ScheduleError, pp=self.pp, microbatches=self.microbatches)
        if self.chunks is not None:
            check_positive_ints("pipeline", ScheduleError, chunks=self.chunks)

    @property
    def num_stages(self) -> int:
        return self.pp * (self.chunks or 1)


Generator = Callable[..., Schedule]  # (PipelineParams) -> Schedule, or (PipelineParams, options) if adaptive
_SHAPE_FIELDS = frozenset(f.name for f in fields(PipelineParams))

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
    options: type | None = None  # an adaptive schedule's options (a frozen dataclass, defaults for every field)
    any_chunks: bool = False  # it takes the chunks it is given (default 1): a user's unregistered generator, combined-1f1b

    @property
    def adaptive(self) -> bool:
        """It plans with pass times and limits of its own (zb-auto): its generator takes ``options`` too."""
        return self.options is not None

    @property
    def default_chunks(self) -> int:
        if self.fixed_chunks is not None:
            return self.fixed_chunks
        return 2 if self.multi_chunk else 1

    @property
    def takes_chunks(self) -> bool:
        """It builds with more than one stage per rank: a multi-chunk schedule, or one that takes any v."""
        return self.multi_chunk or self.any_chunks

    def chunks_for(self, pp: int) -> int:
        """A chunks value it builds with at ``pp``: its default, or 2 for an any-chunks schedule at pp > 1
        (combined-1f1b needs v >= 2 there, as in Megatron-LM; a user's generator takes what it is given)."""
        return 2 if self.any_chunks and pp > 1 else self.default_chunks


_REGISTRY: dict[str, ScheduleSpec] = {}


def register(
    name: str,
    *,
    multi_chunk: bool = False,
    fixed_chunks: int | None = None,
    options: type | None = None,
    summary: str = "",
    any_chunks: bool = False,
) -> Callable[[Generator], Generator]:
    """Decorator: ``@register("1f1b")`` makes a generator available to :func:`build`.

    ``multi_chunk``: the schedule needs v >= 2 stages per rank; ``fixed_chunks``:
    exactly that many (V placements: 2); ``options``: the schedule is adaptive,
    and its generator takes an instance of this dataclass after the params;
    ``any_chunks``: it takes any v >= 1 (default 1) and checks its own rule.
    """

    def deco(fn: Generator) -> Generator:
        if name in _REGISTRY and not _same_function(_REGISTRY[name].fn, fn):
            raise RuntimeError(f"schedule {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        multi = multi_chunk or (fixed_chunks is not None and fixed_chunks > 1)
        _REGISTRY[name] = ScheduleSpec(name, fn, multi, summary or (doc[0] if doc else ""), fixed_chunks, options,
                                       any_chunks)
        return fn

    return deco


def _same_function(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """The same function of the same file, imported again (a user's file by its path and as a module)."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (code_a is not None and code_b is not None and a.__qualname__ == b.__qualname__
            and code_a.co_filename == code_b.co_filename)


def names(*, by_family: bool = False) -> list[str]:
    """Registered schedule names, sorted; ``by_family``: in registration order (families together)."""
    return list(_REGISTRY) if by_family else sorted(_REGISTRY)


def lookup(name: str) -> ScheduleSpec | None:
    """The registered schedule called ``name`` (case-insensitive), or None."""
    if not isinstance(name, str):
        return None
    return _REGISTRY.get(name) or _REGISTRY.get(name.lower())


def spec(name: str) -> ScheduleSpec:
    """The registered schedule called ``name`` (case-insensitive), or the user's ``file.py:NAME`` /
    ``pkg.module:NAME`` (the file imported once per process); an unknown name suggests the closest."""
    found = lookup(name)
    if found is not None:
        return found
    if is_user_ref(name):
        return _user_spec(name)
    close = difflib.get_close_matches(str(name).lower(), names(), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ScheduleError(f"unknown schedule {quote(name)}{hint}; valid: {', '.join(names())}, or your own as "
                        "FILE.py:NAME", field="schedule")


def _check_chunks(sp: ScheduleSpec, chunks: object) -> None:
    name = sp.name
    if sp.any_chunks:
        return
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


def build(name: str, *args: Any, **fields: Any) -> Schedule:
    """Build a registered schedule: ``build("1f1b", 4, 8)`` (pp, microbatches[, chunks]),
    ``build("1f1b", pp=4, microbatches=8)`` or ``build("1f1b", params)``.

    The keywords are :class:`PipelineParams`' fields and, for an adaptive
    schedule, its options' (``build("zb-auto", pp=4, microbatches=8,
    mem_limit=6, tf=1.1)``), or ``options`` itself after the params
    (``build("zb-auto", params, ZBAutoOptions(mem_limit=6))``). Bad names and
    impossible parameters raise ScheduleError, and so do options given to a
    schedule that is not adaptive.
    """
    params, options = _positional(name, args, fields)
    return build_from(spec(name), params, options, **fields)


def build_from(sp: ScheduleSpec, params: PipelineParams | None = None, options: Any = None, /,
               **fields: Any) -> Schedule:
    """:func:`build` of a spec (a registered one, or a user's generator that :mod:`schedules.load` found)."""
    shape = {k: v for k, v in fields.items() if k in _SHAPE_FIELDS}
    extra = {k: v for k, v in fields.items() if k not in _SHAPE_FIELDS}
    if extra or options is not None:
        _check_adaptive(sp, sorted(extra) or ["options"])
    if params is None:
        given = shape.get("chunks")
        _check_chunks(sp, sp.default_chunks if given is None else given)  # the schedule's own message first
        params = PipelineParams(**shape)
    elif shape:
        raise TypeError(f"build() takes a PipelineParams or its fields as keywords, not both (got {sorted(shape)})")
    if options is None and sp.options is not None:
        options = sp.options(**extra)
    elif extra:
        raise TypeError(f"build() takes the options or their fields as keywords, not both (got {sorted(extra)})")
    chunks = sp.default_chunks if params.chunks is None else params.chunks
    _check_chunks(sp, chunks)
    check_size(sp.name, params.pp, chunks, params.microbatches)
    params = replace(params, chunks=chunks)
    try:
        made = sp.fn(params, options) if sp.adaptive else sp.fn(params)
    except SchedlabError:
        raise
    except (Exception, SystemExit) as exc:
        if not is_user_code(sp.fn):
            raise
        raise raised(describe(sp.fn, f"schedule {sp.name!r}: its generator"), exc, "schedule") from exc
    return check_built(sp.name, made, params, sp.fn)


def is_user_code(fn: Callable[..., Any]) -> bool:
    """``fn`` is defined in the user's files (not schedlab's, not an installed package's)."""
    try:
        return is_user_file(inspect.getsourcefile(inspect.unwrap(fn)) or "<unknown>")
    except TypeError:
        return False


def check_built(name: str, made: Any, params: PipelineParams, fn: Callable[..., Any]) -> Schedule:
    """What a generator returned, if it is a Schedule of the shape it was asked for; else one line naming it."""
    if not isinstance(made, Schedule):
        raise ScheduleError(f"{describe(fn, f'schedule {name!r}: its generator')} returned {type(made).__name__}; it "
                            "must return a schedules.Schedule (build one with schedules.make_schedule)",
                            field="schedule")
    if made.num_ranks != params.pp or made.num_microbatches != params.microbatches:
        raise ScheduleError(f"schedule {name!r}: its generator was asked for pp={params.pp}, microbatches="
                            f"{params.microbatches} and returned pp={made.num_ranks}, microbatches="
                            f"{made.num_microbatches}; build the programs from the params it is given",
                            field="schedule")
    return made


def is_user_ref(ref: object) -> bool:
    """``file.py:NAME`` or ``pkg.module:NAME``: a schedule in the user's own code."""
    return isinstance(ref, str) and not ref.startswith(("torch:", "csv:")) and is_file_or_module_ref(ref)


def _user_spec(ref: str) -> ScheduleSpec:
    """The generator ``ref`` names in the user's file or module, imported once per process: a function the file
    registered (or the registered name itself), else a plain ``(PipelineParams) -> Schedule`` taking any chunks."""
    module_name, _, attr = ref.rpartition(":")
    what = f"schedule {quote(ref)}"
    module = import_user(module_name, what, "schedule", spec=ref)
    found = getattr(module, attr, None)
    if found is None:  # NAME may be the name the file registered its function under
        registered = lookup(attr)
        if registered is not None:
            return registered
        raise ScheduleError(f"{what}: {module_name} defines no {attr!r} and registers no schedule of that name",
                            field="schedule")
    if not callable(found):
        raise ScheduleError(f"{what}: {attr!r} in {module_name} is a {type(found).__name__}, not a function "
                            "(PipelineParams) -> Schedule", field="schedule")
    registered = spec_of(found)
    if registered is not None:
        return registered
    doc = (found.__doc__ or "").strip().splitlines()
    return ScheduleSpec(name=attr, fn=found, multi_chunk=False, summary=doc[0] if doc else "", any_chunks=True)


def canonical_name(ref: str) -> str:
    """A registered name in its registered case; a user's ``file.py:NAME`` as given (checked: it resolves).

    The reference, not the generator's name, is what travels (to a pool's or torchrun's processes, into a plan's
    exports): a plain function in the user's file is found again by it, and only by it."""
    found = lookup(ref)
    if found is not None:
        return found.name
    spec(ref)  # an unknown name or a missing function: one line
    return ref


def spec_of(fn: Callable[..., Any]) -> ScheduleSpec | None:
    """The registered schedule whose generator is ``fn`` (a function the user registered in their file), or None."""
    return next((sp for sp in _REGISTRY.values() if sp.fn is fn or inspect.unwrap(sp.fn) is fn), None)


_POSITIONAL = ("pp", "microbatches", "chunks")


def _positional(name: str, args: tuple[Any, ...], fields: dict[str, Any]) -> tuple[Any, Any]:
    """``build``'s positional arguments: (params[, options]), or up to three ints (pp, microbatches, chunks) that
    join ``fields``; returns (params, options)."""
    if not args or isinstance(args[0], PipelineParams) or args[0] is None:
        if len(args) > 2:
            raise TypeError(f"build({name!r}, params, options) takes at most 2 arguments after the name, "
                            f"got {len(args)}")
        return (*args, None, None)[:2]
    if len(args) > len(_POSITIONAL) or not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        raise TypeError(f"build({name!r}, ...) takes a PipelineParams or up to three ints (pp, microbatches, "
                        f"chunks) after the name, got {', '.join(quote(a) for a in args)}")
    for key, value in zip(_POSITIONAL, args, strict=False):
        if key in fields:
            raise TypeError(f"build({name!r}, ...) got {key} both by position and as a keyword")
        fields[key] = value
    return None, None


def _check_adaptive(sp: ScheduleSpec, given: list[str]) -> None:
    if sp.adaptive:
        return
    adaptive = ", ".join(n for n in names() if _REGISTRY[n].adaptive)
    raise ScheduleError(f"{given[0]} applies only to adaptive schedules ({adaptive}), not to {sp.name!r}",
                        field=given[0])
