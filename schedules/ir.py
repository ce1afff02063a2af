"""The schedule IR: actions, per-rank programs, schedules.

An :class:`Action` prints and parses exactly like torch.distributed.pipelining's
``_Action``: ``2F0`` (stage 2, forward, microbatch 0), ``1I3`` (input-gradient
backward), ``1W3`` (weight-gradient backward), ``0B1`` (full backward),
``2R0`` (recompute stage 2's forward of microbatch 0 before its backward; ours, not torch's),
``0SEND_F1`` / ``1RECV_F1`` (activations), ``1SEND_B2`` / ``0RECV_B2``
(gradients), ``(0F7;7B3)OVERLAP_F_B`` (an overlapped pair).

A :class:`Schedule` is immutable data: which stage lives on which rank, and one
ordered tuple of compute actions per rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from common.errors import ScheduleError, quote

__all__ = ["BACKWARD_KINDS", "COMM_KINDS", "COMPUTE_KINDS", "Action", "Kind", "Schedule"]


class Kind(StrEnum):
    """What an action does. Values are torch's ``_ComputationType`` strings."""

    F = "F"  # forward
    I = "I"  # backward w.r.t. the stage input only  # noqa: E741
    W = "W"  # backward w.r.t. the stage weights only
    B = "B"  # full backward (I then W)
    R = "R"  # recompute: re-run a forward to rebuild the activations its backward needs (not torch's notation)
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    OVERLAP_F_B = "OVERLAP_F_B"  # a forward and a backward run as one overlapped pair
    ALLREDUCE = "ALLREDUCE"
    REDUCE_SCATTER = "REDUCE_SCATTER"
    ALL_GATHER = "ALL_GATHER"
    OPTIM = "OPTIM"
    # A bucket's parameters sent to one data-parallel peer while the peer's arrive (one send/receive pair, the
    # neighbour averaging of decentralized SGD, schedules.dp.modes); its microbatch field numbers the neighbour.
    EXCHANGE = "EXCHANGE"


COMPUTE_KINDS = frozenset({Kind.F, Kind.I, Kind.W, Kind.B, Kind.R, Kind.OVERLAP_F_B})
COMM_KINDS = frozenset({Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B})
BACKWARD_KINDS = frozenset({Kind.I, Kind.B})  # the kinds that produce an input gradient

# Longest alternatives first so that "SEND_F" is not read as "S" + ...
_ACTION_RE = re.compile(
    r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|ALLREDUCE|REDUCE_SCATTER|ALL_GATHER|OPTIM|EXCHANGE|F|I|W|B|R)(\d*)(?:_b(\d+))?$"
)


_NO_MICROBATCH = frozenset({"ALLREDUCE", "REDUCE_SCATTER", "ALL_GATHER", "OPTIM", "EXCHANGE"})  # whole-step actions


@dataclass(frozen=True, slots=True)
class Action:
    """One unit of work of one stage, e.g. ``Action(Kind.F, stage=2, microbatch=0)``.

    ``sub_actions`` is set only for ``OVERLAP_F_B``: the forward and the backward
    that run together; the container itself has no stage or microbatch (-1, None).
    ``bucket`` is set only for collectives (data parallelism): which gradient or
    parameter bucket of the stage they move; it prints as a suffix, ``0ALLREDUCE_b3``
    (``1REDUCE_SCATTER5_b0`` with a microbatch), and is not part of torch's notation.
    """

    kind: Kind
    stage: int
    microbatch: int | None = None
    sub_actions: tuple[Action, ...] | None = None
    bucket: int | None = None

    def __str__(self) -> str:
        if self.sub_actions is not None:
            return "(" + ";".join(str(a) for a in self.sub_actions) + ")" + self.kind.value
        mb = "" if self.microbatch is None else str(self.microbatch)
        bucket = "" if self.bucket is None else f"_b{self.bucket}"
        return f"{self.stage}{self.kind.value}{mb}{bucket}"

    def __repr__(self) -> str:
        return f"Action({self})"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    def parts(self) -> tuple[Action, ...]:
        """The plain actions this action performs (itself, or an overlap's sub-actions)."""
        return self.sub_actions if self.sub_actions is not None else (self,)

    @staticmethod
    def parse(text: str) -> Action:
        """Parse torch's action notation; raises ScheduleError naming the bad text."""
        s = text.strip()
        if s.startswith("("):
            close = s.find(")")
            kind = s[close + 1 :] if close > 0 else ""
            if close < 0 or kind != Kind.OVERLAP_F_B.value:
                raise ScheduleError(
                    f"invalid action {quote(text)}: a bracketed action must be "
                    "'(<action>;<action>)OVERLAP_F_B', e.g. '(0F7;7B3)OVERLAP_F_B'"
                )
            subs = tuple(Action.parse(p) for p in s[1:close].split(";"))
            kinds = sorted(a.kind.value for a in subs)
            if kinds not in (["B", "F"], ["F", "I"]):
                raise ScheduleError(
                    f"invalid action {quote(text)}: OVERLAP_F_B pairs one forward with one "
                    "backward (B or I), e.g. '(0F7;7B3)OVERLAP_F_B'"
                )
            return Action(Kind.OVERLAP_F_B, -1, None, subs)
        m = _ACTION_RE.match(s)
        if m is None:
            raise ScheduleError(
                f"invalid action {quote(text)}: expected <stage><kind><microbatch> with kind one of "
                "F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, e.g. '2F0', '1I3', '0SEND_F1'"
            )
        stage, kind, mb, bucket = m.groups()
        if not mb and kind not in _NO_MICROBATCH:
            raise ScheduleError(f"invalid action {quote(text)}: {kind} needs a microbatch index, e.g. '{stage}{kind}0'")
        if bucket is not None and kind not in _NO_MICROBATCH:
            raise ScheduleError(
                f"invalid action {quote(text)}: only collectives and OPTIM take a bucket suffix, e.g. '{stage}ALLREDUCE_b0'"
            )
        return Action(Kind(kind), int(stage), int(mb) if mb else None, bucket=int(bucket) if bucket else None)


def F(stage: int, mb: int) -> Action:
    return Action(Kind.F, stage, mb)


def B(stage: int, mb: int) -> Action:
    return Action(Kind.B, stage, mb)


def I(stage: int, mb: int) -> Action:  # noqa: E743
    return Action(Kind.I, stage, mb)


def W(stage: int, mb: int) -> Action:
    return Action(Kind.W, stage, mb)


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: placement plus one ordered program of compute actions per rank.

    ``stage_to_rank[s]`` is the rank that holds stage ``s``; ``programs[r]`` is
    rank r's compute actions in the order it runs them. Communication is not
    part of a Schedule: :func:`schedules.lower` adds it.
    """

    name: str
    num_ranks: int
    num_stages: int
    num_microbatches: int
    stage_to_rank: tuple[int, ...]
    programs: tuple[tuple[Action, ...], ...]
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage_to_rank", tuple(self.stage_to_rank))
        object.__setattr__(self, "programs", tuple(tuple(p) for p in self.programs))
        # Every schedule records its shape, however it was built (make_schedule, from_programs, the constructor):
        # traces, reports and titles read pp, microbatches and chunks from ``params``.
        shape = {"pp": self.num_ranks, "microbatches": self.num_microbatches,
                 "chunks": max(1, self.num_stages // max(self.num_ranks, 1))}
        object.__setattr__(self, "params", MappingProxyType({**shape, **dict(self.params)}))
        if len(self.stage_to_rank) != self.num_stages:
            raise ScheduleError(
                f"schedule {self.name!r}: stage_to_rank places {len(self.stage_to_rank)} stage(s) "
                f"but the schedule has {self.num_stages}; give one rank per stage"
            )
        if len(self.programs) != self.num_ranks:
            raise ScheduleError(
                f"schedule {self.name!r}: got programs for {len(self.programs)} ranks, "
                f"the schedule has {self.num_ranks}; give one program per rank"
            )
        for s, r in enumerate(self.stage_to_rank):
            if not 0 <= r < self.num_ranks:
                raise ScheduleError(
                    f"schedule {self.name!r}: stage {s} is placed on rank {r}, "
                    f"valid ranks are 0..{self.num_ranks - 1}"
                )

    @property
    def chunks(self) -> int:
        """Stages per rank (v); 1 for one stage per rank."""
        return max(1, self.num_stages // self.num_ranks)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    def to_text(self) -> str:
        """One line per rank, actions comma-separated (torch's CSV layout)."""
        return "\n".join(",".join(str(a) for a in prog) for prog in self.programs) + "\n"

    @staticmethod
    def from_programs(
        programs: Sequence[Iterable[Action | str]],
        *,
        name: str = "custom",
        stage_to_rank: Sequence[int] | None = None,
        num_microbatches: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Schedule:
        """Build a Schedule from per-rank programs (Actions or action strings).

        Placement and microbatch count are inferred from the programs when not
        given: each stage goes to the rank whose program mentions it.
        """
        progs = [
            tuple(a if isinstance(a, Action) else Action.parse(a) for a in prog) for prog in programs
        ]
        plain = [(r, p) for r, prog in enumerate(progs) for a in prog for p in a.parts()]
        if stage_to_rank is None:
            placement: dict[int, int] = {}
            for r, a in plain:
                if placement.setdefault(a.stage, r) != r:
                    raise ScheduleError(
                        f"schedule {name!r}: stage {a.stage} appears on rank {placement[a.stage]} "
                        f"and on rank {r} ({a}); a stage must live on exactly one rank"
                    )
            n_stages = max(placement, default=-1) + 1
            missing = [s for s in range(n_stages) if s not in placement]
            if missing:
                raise ScheduleError(
                    f"schedule {name!r}: no rank runs stage(s) {missing}; stages must be "
                    f"numbered 0..{n_stages - 1} without gaps"
                )
            stage_to_rank = [placement[s] for s in range(n_stages)]
        if num_microbatches is None:
            num_microbatches = max((a.microbatch or 0 for _, a in plain), default=-1) + 1
        return Schedule(
            name=name,
            num_ranks=len(progs),
            num_stages=len(stage_to_rank),
            num_microbatches=num_microbatches,
            stage_to_rank=tuple(stage_to_rank),
            programs=tuple(progs),
            params=params or {},
        )

    @staticmethod
    def from_text(text: str, **kwargs: Any) -> Schedule:
        """Parse :meth:`to_text` output (empty cells are ignored, as torch's loader does)."""
        rows = [line for line in text.splitlines() if line.strip()]
        programs = [[cell for cell in row.split(",") if cell.strip()] for row in rows]
        return Schedule.from_programs(programs, **kwargs)
