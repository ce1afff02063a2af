"""The profiled cost model: durations measured on the machine by ``python -m real.profile``.

The cost file (schema in :mod:`real.profile`) holds, for one model and
microbatch size, the median time of every pass of every stage of one or more
partitions. :func:`load_profile` picks the partition whose stage count is the
schedule's, so uneven stages (the embedding on the first, the head and loss on
the last) cost what they cost. The formulas:

* a compute task F, I, W or B of stage s: the measured median of that pass of
  stage s, plus ``task_overhead``, the executor's own per-task cost (stamps,
  polls, bookkeeping), measured by timing its loop around an empty body;
  I and W are measured as the runtime runs them (their sum is more than B:
  the split backward walks the graph twice and captures intermediates);
* OVERLAP_F_B: the runtime runs its forward and then its backward, so the sum
  of the two passes plus one task overhead;
* SEND_F / SEND_B: alpha + n / beta, the one-way time of an n-byte message
  (n = ``activation_bytes``, one float32 boundary tensor) fitted from a
  ping-pong over sizes around n; the flight time sits on the send, as in
  :class:`sim.costs.UniformCosts`; RECV costs nothing (it waits). A file
  without ``p2p`` (profiled by one process) cannot time messages, so a graph
  that sends any is refused rather than given free messages;
* OPTIM of stage s (data-parallel graphs): the measured optimizer step over
  stage s's parameters;
* ALLREDUCE / REDUCE_SCATTER / ALL_GATHER of stage s: alpha + n / beta of
  that collective over the data-parallel group, n = the stage's parameter
  bytes (fitted on the full buffer's bytes, so the ring's 2(d-1)/d is inside beta);
* a step, as the runtime times it (:func:`step_time`): every pipeline rank
  runs its program, then its stages' optimizer steps, then all ranks
  all-reduce the loss. So step time = max over ranks of (the rank's last
  compute end + its stages' OPTIM) + ``step_overhead`` (zero_grad and the
  loss all-reduce, measured together). A graph that has OPTIM tasks already
  (data parallel) adds only the overhead.

Activations are counted in M_B as :class:`UniformCosts` counts them (the file
measures time, not memory).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedules import Action, Kind, Task, TaskGraph
from schedules.errors import CostFileError, quote
from schedules.formats import PROFILE_SCHEMA
from sim.costs import UniformCosts

if TYPE_CHECKING:
    from sim.engine import SimResult

__all__ = ["PROFILE_SCHEMA", "ProfiledCosts", "StageCosts", "load_profile", "step_time"]

_PASS_KINDS = (Kind.F, Kind.B, Kind.I, Kind.W)
_COLLECTIVES = {Kind.ALLREDUCE: "all_reduce", Kind.REDUCE_SCATTER: "reduce_scatter", Kind.ALL_GATHER: "all_gather"}


def _finite(owner: str, **values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise CostFileError(f"{owner}: {name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StageCosts:
    """Median seconds of one microbatch's passes through one stage, and of its optimizer step."""

    f: float
    b: float
    i: float
    w: float
    optim: float = 0.0
    param_bytes: float = 0.0

    def __post_init__(self) -> None:
        _finite("stage costs", f=self.f, b=self.b, i=self.i, w=self.w, optim=self.optim,
                param_bytes=self.param_bytes)

    def of(self, kind: Kind) -> float:
        return {Kind.F: self.f, Kind.B: self.b, Kind.I: self.i, Kind.W: self.w}[kind]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfiledCosts:
    """Measured per-stage pass times, message alpha/beta and per-task/per-step overheads (formulas: module doc)."""

    stages: tuple[StageCosts, ...]
    activation_bytes: float = 0.0
    p2p_alpha: float = 0.0
    p2p_beta: float = math.inf  # bytes per second; inf: size does not matter
    task_overhead: float = 0.0
    step_overhead: float = 0.0
    collectives: tuple[tuple[str, float, float], ...] = ()  # (op, alpha, beta)
    source: str = ""
    p2p_measured: bool = True  # False: the file has no p2p section, so a graph with messages is refused

    def __post_init__(self) -> None:
        if not self.stages:
            raise CostFileError("profiled costs need at least one stage")
        _finite("profiled costs", activation_bytes=self.activation_bytes, p2p_alpha=self.p2p_alpha,
                task_overhead=self.task_overhead, step_overhead=self.step_overhead)
        for name, beta in (("p2p_beta", self.p2p_beta), *((f"{op} beta", b) for op, _, b in self.collectives)):
            if not beta > 0:  # also NaN
                raise CostFileError(f"profiled costs: {name} must be a bandwidth > 0 bytes/s, got {beta!r}")

    def check(self, graph: TaskGraph) -> None:
        """The graph's stages are the profiled partition's; its messages, if any, have a p2p timing."""
        n = graph.schedule.num_stages
        the_file = f"the cost file{' ' + repr(self.source) if self.source else ''}"
        if n != len(self.stages):
            raise CostFileError(
                f"{the_file} profiles {len(self.stages)} stages "
                f"but schedule {graph.schedule.name!r} has {n}; profile that partition "
                f"(real.profile, stages={n})"
            )
        if not self.p2p_measured:
            sends = sum(t.action.kind in (Kind.SEND_F, Kind.SEND_B) for t in graph.tasks)
            if sends:
                raise CostFileError(
                    f"{the_file} has no p2p timing (p2p is missing or null: profiled by one process) but schedule "
                    f"{graph.schedule.name!r} sends {sends} messages between ranks; profile with 2 or more "
                    "processes (real.profile)")

    def _pass(self, action: Action) -> float:
        return self.stages[action.stage].of(action.kind)

    def message_time(self, nbytes: float) -> float:
        """alpha + n / beta: one message of n bytes from one rank to another."""
        return self.p2p_alpha + nbytes / self.p2p_beta

    def duration(self, task: Task, graph: TaskGraph) -> float:
        action = task.action
        if action.sub_actions is not None:
            return sum(self._pass(a) for a in action.sub_actions) + self.task_overhead
        if action.kind in _PASS_KINDS:
            return self._pass(action) + self.task_overhead
        if action.kind in (Kind.SEND_F, Kind.SEND_B):
            return self.message_time(self.activation_bytes)
        if action.kind is Kind.OPTIM:
            return self.stages[action.stage].optim
        if action.kind in _COLLECTIVES:
            op = _COLLECTIVES[action.kind]
            for name, alpha, beta in self.collectives:
                if name == op:
                    return alpha + self.stages[action.stage].param_bytes / beta
            raise CostFileError(f"the cost file has no {op} timing; profile with dp > 1 (real.profile) for data-parallel graphs")
        return 0.0

    def durations(self, graph: TaskGraph) -> list[float]:
        self.check(graph)
        return [self.duration(t, graph) for t in graph.tasks]

    def bytes(self, task: Task, graph: TaskGraph) -> float:
        if task.action.kind in (Kind.SEND_F, Kind.SEND_B):
            return self.activation_bytes
        return 0.0

    def activations(self, action: Action, graph: TaskGraph) -> tuple[float, float]:
        return UniformCosts().activations(action, graph)

    def describe(self) -> dict[str, Any]:
        return {
            "model": "profiled", "source": self.source, "stages": len(self.stages),
            "task_overhead": self.task_overhead, "step_overhead": self.step_overhead,
            "p2p_alpha": self.p2p_alpha, "p2p_beta": None if math.isinf(self.p2p_beta) else self.p2p_beta,
            "activation_bytes": self.activation_bytes,
        }


def step_time(result: SimResult, costs: ProfiledCosts) -> float:
    """The step time the runtime would measure (see the module doc): programs, optimizer steps, loss all-reduce."""
    graph = result.graph
    has_optim = any(t.action.kind is Kind.OPTIM for t in graph.tasks)
    sched = graph.schedule
    ends = []
    for r in result.ranks:
        optim = 0.0 if has_optim else sum(costs.stages[s].optim for s in sched.stages_of(r.rank))
        ends.append(r.last_end + optim)
    return max(ends, default=0.0) - min(result.start, default=0.0) + costs.step_overhead


def _median(d: dict[str, Any], key: str, where: str, path: str = "") -> float:
    value = d.get(key)
    if isinstance(value, dict):
        value = value.get("median")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CostFileError(f"{where}: {path}{key} must be a number or {{\"median\": number}}, got {quote(value)}")
    return _number(value, where, path + key, what="a finite time >= 0 s")


def _number(value: Any, where: str, name: str, *, bandwidth: bool = False, what: str = "") -> float:
    """A finite number >= 0 (``bandwidth``: > 0 bytes/s, inf allowed: the profiler's "size does not matter")."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and (
        0 < value <= math.inf if bandwidth else 0 <= value < math.inf)
    if not ok:
        what = what or ("a bandwidth > 0 bytes/s" if bandwidth else "a finite number >= 0")
        raise CostFileError(f"{where}: {name} must be {what}, got {quote(value)}")
    return float(value)


def _alpha_beta(section: Any, where: str, name: str) -> tuple[float, float]:
    """A fitted ``{"alpha": s, "beta": bytes/s, ...}``."""
    if not isinstance(section, dict):
        raise CostFileError(f"{where}: {name} must be an object {{\"alpha\": s, \"beta\": bytes/s}}, got "
                            f"{quote(section)}")
    if "beta" not in section:
        raise CostFileError(f"{where}: {name}.beta is missing: give a bandwidth > 0 bytes/s, or null for "
                            "\"size does not matter\"")
    beta = section["beta"]  # null: the profiler's "size does not matter" (JSON has no inf)
    return (_number(section.get("alpha"), where, f"{name}.alpha"),
            math.inf if beta is None else _number(beta, where, f"{name}.beta", bandwidth=True))


def _partition(parts: list[dict[str, Any]], num_stages: int | None, where: str) -> tuple[int, list[int]]:
    """The chosen partition's index and, for stage 0, 1, ..., the index of its row (by each row's "stage" field)."""
    seen: dict[int, int] = {}
    for k, q in enumerate(parts):
        n = q.get("num_stages")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CostFileError(f"{where}: partitions[{k}].num_stages must be an integer >= 1, got {quote(n)}")
        if n in seen:
            raise CostFileError(f"{where}: partitions[{seen[n]}] and partitions[{k}] both profile {n} stages; "
                                "keep one of them")
        seen[n] = k
    if num_stages is None:
        c = 0
    elif num_stages in seen:
        c = seen[num_stages]
    else:
        raise CostFileError(
            f"{where} profiles partitions of {', '.join(map(str, seen))} stages, not {num_stages}; "
            f"profile that many stages with the profiler (real.profile, stages={num_stages})"
        )
    n, rows = parts[c]["num_stages"], parts[c].get("stages")
    if not isinstance(rows, list) or len(rows) != n:
        raise CostFileError(f"{where}: partition of {n} stages must list that many stages")
    at: dict[int, int] = {}
    for j, r in enumerate(rows):
        field = f"partitions[{c}].stages[{j}]"
        if not isinstance(r, dict):
            raise CostFileError(f"{where}: {field} must be an object of a stage's timings, got {quote(r)}")
        if "stage" not in r:
            raise CostFileError(f"{where}: {field} has no \"stage\" field; give each stage its index, 0..{n - 1}")
        s = r["stage"]
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < n:
            raise CostFileError(f"{where}: {field}.stage must be an integer in 0..{n - 1}, got {quote(s)}")
        if s in at:
            raise CostFileError(f"{where}: partitions[{c}].stages[{at[s]}] and [{j}] are both stage {s}; "
                                f"list each of 0..{n - 1} once")
        at[s] = j
    return c, [at[s] for s in range(n)]


def load_profile(path: str | Path, num_stages: int | None = None) -> ProfiledCosts:
    """The cost model of the partition with ``num_stages`` stages (None: the file's only or first partition).

    A partition's stages are taken in the order of their ``"stage"`` fields,
    not of the list. Raises CostFileError, one line naming the file and the
    field, for a missing or malformed file, a stage count the file does not
    have, two partitions of one stage count, or a stage index that is missing,
    not an integer, out of 0..n-1 or listed twice. A file without ``p2p`` loads;
    :meth:`ProfiledCosts.check` refuses it for a graph that sends messages.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise CostFileError(f"cost file {str(p)!r} not found; write one with the profiler (real.profile)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CostFileError(f"cost file {str(p)!r} is not readable JSON: {str(exc).splitlines()[0]}") from None
    where = f"cost file {str(p)!r}"
    if not isinstance(data, dict) or data.get("schema") != PROFILE_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise CostFileError(f"{where}: schema must be {PROFILE_SCHEMA!r}, got {got!r}")
    parts = data.get("partitions")
    if not isinstance(parts, list) or not parts or not all(isinstance(q, dict) for q in parts):
        raise CostFileError(f"{where}: 'partitions' must be a non-empty list of objects")
    c, order = _partition(parts, num_stages, where)
    stages = []
    for j in order:  # stage order, whatever the list order
        r, path = parts[c]["stages"][j], f"partitions[{c}].stages[{j}]."
        stages.append(StageCosts(
            f=_median(r, "F", where, path), b=_median(r, "B", where, path), i=_median(r, "I", where, path),
            w=_median(r, "W", where, path), optim=_median(r, "OPTIM", where, path) if "OPTIM" in r else 0.0,
            param_bytes=_number(r.get("param_bytes", 0.0), where, path + "param_bytes")))
    p2p = data.get("p2p")  # None (or absent): one process, no messages measured
    alpha, beta = _alpha_beta(p2p, where, "p2p") if p2p is not None else (0.0, math.inf)
    colls = data.get("collectives") or {}
    if not isinstance(colls, dict):
        raise CostFileError(f"{where}: collectives must be an object of op -> {{alpha, beta}} or null, "
                            f"got {quote(colls)}")
    return ProfiledCosts(
        stages=tuple(stages),
        activation_bytes=_number(data.get("activation_bytes", 0.0), where, "activation_bytes"),
        p2p_alpha=alpha,
        p2p_beta=beta,
        task_overhead=_median(data, "task_overhead", where) if "task_overhead" in data else 0.0,
        step_overhead=_median(data, "step_overhead", where) if "step_overhead" in data else 0.0,
        collectives=tuple((op, *_alpha_beta(v, where, f"collectives.{op}")) for op, v in colls.items()),
        source=str(p),
        p2p_measured=p2p is not None,
    )
