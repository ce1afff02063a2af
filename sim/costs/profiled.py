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
  :class:`sim.costs.uniform.UniformCosts`; RECV costs nothing (it waits). A file
  without ``p2p`` (profiled by one process) cannot time messages, so a graph
  that sends any is refused rather than given free messages;
* OPTIM of stage s (data-parallel graphs): the measured optimizer step over
  stage s's parameters; in dp mode ps the parameter server's update of the
  stage (on the collective stream, on no link: it holds the whole stage, the
  grid's one server), the file's ``SERVER_UPDATE`` of the stage where it has
  one (:mod:`real.profile.server`: the last bucket's fold and the optimizer
  over the flat buckets, on a process alone), else its optimizer step;
* ALLREDUCE / REDUCE_SCATTER / ALL_GATHER of stage s: alpha + n / beta of
  that collective over the data-parallel group, n = one bucket's bytes (the
  stage's parameter bytes / its bucket count; fitted on the full buffer's
  bytes, so the ring's 2(d-1)/d is inside beta). In dp modes ps and async-ps
  (:data:`PS_MODES`) the REDUCE_SCATTER is a push and the ALL_GATHER a pull:
  the runtime sends the bucket to a server that posted its receive before the
  step (an ``isend``, and the server's ``isend`` back), with no ring and no
  rendezvous of the replicas, so each is one p2p message of the bucket's bytes
  (``message_time``), not the collective's fit (docs/dp-modes.md, "What a ps
  step costs"). A bucket becomes ready where
  the data-parallel pass says (part-way through the last backward, for ddp),
  and a rank's collectives run one at a time (gloo's one communication thread);
* a step, as the runtime times it (:func:`step_time`): every pipeline rank
  runs its program, then its stages' optimizer steps, then all ranks
  all-reduce the loss. So step time = max over ranks of (the rank's last
  compute end + its stages' OPTIM) + ``step_overhead`` (zero_grad and the
  loss all-reduce, measured together). A graph that has OPTIM tasks already
  (data parallel) ends with its last task, zero1/zero2's all-gathers after
  the optimizer step included (the runtime waits for them within the step),
  and adds only the overhead.

Two mechanisms of the CPU testbed, each with its measured parameter:

* ``send_cpu``: gloo posts a message on the caller's thread (it copies the
  tensor), so a compute task whose output goes to another rank keeps its
  core ``send_cpu`` longer before the next task can start (measured by the
  profiler as the time to post one activation-sized isend, or from a trace);
* the per-task and per-step overheads above;
* ``comm_slowdown``: compute runs this factor longer while a collective of its
  rank is in flight (gloo's communication thread takes the core's cycles and
  memory bandwidth). Measured by the profiler as a stage's passes timed with a
  bucket-sized all-reduce in flight over the same passes alone; the engine
  stretches the compute that overlaps a transfer (:mod:`sim.slowdown`). A file
  without it (or ``null``) gives 1.0: nothing is stretched;
* ``reduce_hook_ns_per_byte``: zero2/zero3 (``real.dp.zero``) copy each bucket's
  gradients into a flat buffer, launch its reduce-scatter and later add the
  result into the shard on the training thread, once per bucket per
  microbatch, inside the backward that completes the bucket (ddp and zero1
  accumulate into the flat buffer and launch once a step: no copy). The pass a
  reduce-scatter is anchored to (its B, or W where split) runs bucket bytes x
  this longer. Measured by the profiler (``reduce_hook.ns_per_byte``,
  :mod:`real.profile.hook`: those calls' thread CPU time per flat gradient byte
  on the run's own buckets); absent or null: 0.0, nothing charged;
* ``max_inflight`` (not in the file: a property of the runtime, set by the
  caller): a zero2/zero3 rank's compute waits while more of its gradient
  reduce-scatters are in flight than this (:mod:`sim.slowdown`); 0, the
  default, bounds nothing.

:func:`from_trace` builds the same model from a real run's trace instead of
a profile: the (5%-trimmed) mean in-run duration of each pass of each stage over every
traced step, the message latency from the moment the receiver waits, the gaps
that give ``task_overhead`` and ``send_cpu``, and ``step_overhead`` = step
time - the programs' span. A pass the trace lacks (I and W in a 1F1B trace),
or another stage count (interleaved from 1F1B), comes from a profile: when
each target stage lies inside one traced stage (4 stages from a run of 2),
that stage's in-run time is shared in the profile's proportions, so only the
profile's ratios count (it times every partition round-robin at one moment);
otherwise the profile is scaled by the trace's in-run/profiled ratio of each
pass kind.

Activations are counted in M_B as :class:`UniformCosts` counts them (the file
measures time, not memory).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import CostFileError, quote
from schedules import Action, Kind, Stream, Task, TaskGraph
from schedules.dp.modes import server_update
from schedules.formats import PROFILE_SCHEMA
from sim.costs.param_copy import ParamCopy, charge_param_copies, param_copy_section
from sim.costs.uniform import UniformCosts

if TYPE_CHECKING:
    from sim.engine import SimResult

__all__ = ["PROFILE_SCHEMA", "PS_MODES", "ProfiledCosts", "StageCosts", "TraceCalibration", "from_trace", "load_costs",
           "load_profile", "step_time", "trace_calibration"]

log = logging.getLogger(__name__)

_PASS_KINDS = (Kind.F, Kind.B, Kind.I, Kind.W)
_COLLECTIVES = {Kind.ALLREDUCE: "all_reduce", Kind.REDUCE_SCATTER: "reduce_scatter", Kind.ALL_GATHER: "all_gather"}
# dp modes whose runtime (real.dp.zero.ShardedSync) runs a copy-and-launch hook per bucket per microbatch
HOOKED_MODES = ("zero2", "zero3", "fsdp")
# dp modes whose gradient collectives are point-to-point messages with the parameter servers (real.dp.ps, real.dp.ps_async:
# a push is an isend of the bucket to a server that has posted its receive, a pull the server's isend back)
PS_MODES = ("ps", "async-ps")


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
    # dp mode ps: a parameter server's update of the stage (the cost file's SERVER_UPDATE, real.profile.server: the
    # last bucket's fold and the optimizer over the flat buckets, alone); 0.0: not measured, the optimizer step's
    server_update: float = 0.0

    def __post_init__(self) -> None:
        _finite("stage costs", f=self.f, b=self.b, i=self.i, w=self.w, optim=self.optim,
                param_bytes=self.param_bytes, server_update=self.server_update)

    def update_on_server(self) -> float:
        """Seconds of the parameter servers' update of the stage: the profiled server update, else the optimizer
        step."""
        return self.server_update or self.optim

    def of(self, kind: Kind) -> float:
        """A pass's seconds; a recomputation (R) re-runs the stage's forward, so it costs F's."""
        return {Kind.F: self.f, Kind.R: self.f, Kind.B: self.b, Kind.I: self.i, Kind.W: self.w}[kind]


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
    send_cpu: float = 0.0  # seconds a sender's core spends posting one message (gloo copies on the caller)
    missing: tuple[str, ...] = ()  # pass kinds with no measurement (a trace of 1F1B has no I or W)
    warnings: tuple[str, ...] = ()  # each guess in these costs, naming its field (the cost file's, the calibration's)
    comm_slowdown: float = 1.0  # compute x this while a collective of its rank is in flight (sim.slowdown)
    max_inflight: int = 0  # zero2/zero3: compute waits while more reduce-scatters are in flight (0: no bound)
    comm_stall: float = 1.0  # a collective is served at 1/this of its speed while its rank computes (sim.slowdown)
    # zero2/zero3: CPU of the per-microbatch reduce-scatter hook per gradient byte, on the pass that runs it (module
    # doc); measured by real.profile.hook (the cost file's reduce_hook.ns_per_byte); 0.0: not charged
    reduce_hook_ns_per_byte: float = 0.0
    # decentralized / local-sgd: CPU of the parameter copies around their exchanges (sim.costs.param_copy); measured by
    # real.profile.param_copy (the cost file's param_copy); all 0.0: not charged
    param_copy: ParamCopy = field(default_factory=ParamCopy)

    def __post_init__(self) -> None:
        if not self.stages:
            raise CostFileError("profiled costs need at least one stage")
        _finite("profiled costs", activation_bytes=self.activation_bytes, p2p_alpha=self.p2p_alpha,
                task_overhead=self.task_overhead, step_overhead=self.step_overhead, send_cpu=self.send_cpu)
        if isinstance(self.comm_slowdown, bool) or not isinstance(self.comm_slowdown, int | float) or \
                not 0 < self.comm_slowdown < math.inf:
            raise CostFileError(f"profiled costs: comm_slowdown must be a finite factor > 0 (1.0: communication "
                                f"does not slow compute), got {self.comm_slowdown!r}")
        if isinstance(self.comm_stall, bool) or not isinstance(self.comm_stall, int | float) or \
                not 0 < self.comm_stall < math.inf:
            raise CostFileError(f"profiled costs: comm_stall must be a finite factor > 0 (1.0: compute does not "
                                f"slow communication), got {self.comm_stall!r}")
        _hook_ns(self.reduce_hook_ns_per_byte, "profiled costs: reduce_hook_ns_per_byte")
        if isinstance(self.max_inflight, bool) or not isinstance(self.max_inflight, int) or self.max_inflight < 0:
            raise CostFileError(f"profiled costs: max_inflight must be a whole number of collectives >= 0 (0: no "
                                f"bound), got {self.max_inflight!r}")
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
        kinds = {a.kind.value for t in graph.tasks for a in (t.action.sub_actions or (t.action,))}
        lacking = sorted(kinds & set(self.missing))
        if lacking:
            raise CostFileError(
                f"{the_file} has no measurement of {', '.join(lacking)} passes, which schedule "
                f"{graph.schedule.name!r} runs; calibrate from a run that has them, or give a profile (real.profile)")
        if not self.p2p_measured and _point_to_point(graph):
            raise CostFileError(
                f"{the_file} has no p2p timing (p2p is missing or null: profiled by one process) but dp mode "
                f"{graph.plan.mode} pushes and pulls its buckets as messages to the servers; profile with 2 or more "
                "processes (real.profile)")
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

    def bucket_message_time(self, nbytes: float) -> float:
        """One point-to-point message of a gradient bucket (ps's push or pull, :data:`PS_MODES`): the p2p
        latency (``p2p_alpha``; no rendezvous: the receive is posted before the step) and the bucket's bytes over
        the all-gather's bandwidth, the profile's bulk transfer of bucket-sized buffers (the p2p fit covers
        activation sizes only). On the CPU testbed a transfer costs the bytes both processes copy through the
        loopback: a two-rank all-gather of n bytes sends n/2 and receives n/2 on each rank, n out and n in in
        all, as a message of n bytes does."""
        return self.p2p_alpha + nbytes / self._collective("all_gather", ", which times ps's pushes and pulls")[1]

    def _collective(self, op: str, what: str = "") -> tuple[float, float]:
        """(alpha, beta) of collective ``op``; a file without it is a CostFileError (``what``: what it times)."""
        for name, alpha, beta in self.collectives:
            if name == op:
                return alpha, beta
        raise CostFileError(f"the cost file has no {op} timing{what}; profile with dp > 1 (real.profile) for "
                            "data-parallel graphs")

    def duration(self, task: Task, graph: TaskGraph) -> float:
        action = task.action
        if action.sub_actions is not None:
            return sum(self._pass(a) for a in action.sub_actions) + self.task_overhead
        if action.kind in _PASS_KINDS:
            return self._pass(action) + self.task_overhead
        if action.kind in (Kind.SEND_F, Kind.SEND_B):
            return self.message_time(self.activation_bytes)
        if action.kind is Kind.OPTIM:
            st = self.stages[action.stage]
            return st.update_on_server() if server_update(task) else st.optim
        if action.kind in _COLLECTIVES and _point_to_point(graph):  # ps's push / pull: one message of the bucket
            return self.bucket_message_time(self._bucket_bytes(action.stage, graph))
        if action.kind in _COLLECTIVES:
            alpha, beta = self._collective(_COLLECTIVES[action.kind])
            return alpha + self._bucket_bytes(action.stage, graph) / beta
        if action.kind is Kind.EXCHANGE:  # decentralized SGD: one bucket to a peer, as a measured p2p message
            return self.message_time(self._bucket_bytes(action.stage, graph))
        return 0.0

    def _bucket_bytes(self, stage: int, graph: TaskGraph) -> float:
        plan = getattr(graph, "plan", None)
        return self.stages[stage].param_bytes / (plan.buckets[stage] if plan is not None else 1)

    def network(self, graph: TaskGraph, dur: list[float]) -> tuple[list[float], list[tuple[int, ...]]] | None:
        """Data-parallel graphs: each bucket's ready delay, and one link per rank for its collectives."""
        plan = getattr(graph, "plan", None)
        if plan is None:
            return None
        lag = [0.0] * len(graph.tasks)
        for c, (anchor, frac) in plan.ready.items():
            lag[c] = frac * dur[anchor]
        links = [(t.rank,) if t.stream is Stream.COLLECTIVE and not server_update(t) else ()
                 for t in graph.tasks]  # ps: the server's update is not a transfer of the rank
        return lag, links

    def durations(self, graph: TaskGraph) -> list[float]:
        self.check(graph)
        out = [self.duration(t, graph) for t in graph.tasks]
        self._charge_hooks(graph, out)
        charge_param_copies(self.param_copy, graph, [st.param_bytes for st in self.stages], out)
        if self.send_cpu:
            for t in graph.tasks:  # the compute task that produced a message also posts it
                if t.action.kind in (Kind.SEND_F, Kind.SEND_B):
                    for d in t.deps:
                        if graph.tasks[d].rank == t.rank and graph.tasks[d].stream is Stream.COMPUTE:
                            out[d] += self.send_cpu
        return out

    def _charge_hooks(self, graph: TaskGraph, out: list[float]) -> None:
        """zero2/zero3 (fsdp): each per-microbatch reduce-scatter's hook, bucket bytes x ``reduce_hook_ns_per_byte``,
        on the pass it is anchored to (the B or W that completes the bucket: the runtime runs the hook there).
        ddp and zero1 copy nothing per bucket (their gradients accumulate in the flat buffer), so none there."""
        plan = getattr(graph, "plan", None)
        if not self.reduce_hook_ns_per_byte or plan is None or plan.mode not in HOOKED_MODES:
            return
        for c, (anchor, _frac) in plan.ready.items():
            task = graph.tasks[c]
            if task.action.kind is Kind.REDUCE_SCATTER:
                out[anchor] += self._bucket_bytes(task.action.stage, graph) * self.reduce_hook_ns_per_byte * 1e-9

    def bytes(self, task: Task, graph: TaskGraph) -> float:
        if task.action.kind in (Kind.SEND_F, Kind.SEND_B):
            return self.activation_bytes
        if task.action.kind in _COLLECTIVES or task.action.kind is Kind.EXCHANGE:
            return self._bucket_bytes(task.action.stage, graph)
        return 0.0

    def activations(self, action: Action, graph: TaskGraph) -> tuple[float, float]:
        return UniformCosts().activations(action, graph)

    def describe(self) -> dict[str, Any]:
        return {
            "model": "profiled", "source": self.source, "stages": len(self.stages),
            "task_overhead": self.task_overhead, "step_overhead": self.step_overhead,
            "p2p_alpha": self.p2p_alpha, "p2p_beta": None if math.isinf(self.p2p_beta) else self.p2p_beta,
            "activation_bytes": self.activation_bytes, "send_cpu": self.send_cpu, "missing": list(self.missing),
            "p2p_measured": self.p2p_measured, "warnings": list(self.warnings), "comm_slowdown": self.comm_slowdown,
            "max_inflight": self.max_inflight, "comm_stall": self.comm_stall,
            "reduce_hook_ns_per_byte": self.reduce_hook_ns_per_byte,
            "param_copy": asdict(self.param_copy),
        }


def _point_to_point(graph: TaskGraph) -> bool:
    """The graph's gradient collectives are ps's pushes and pulls (:data:`PS_MODES`), timed as p2p messages."""
    plan = getattr(graph, "plan", None)
    return plan is not None and plan.mode in PS_MODES


def step_time(result: SimResult, costs: ProfiledCosts) -> float:
    """The step time the runtime would measure (see the module doc): programs, optimizer steps, loss all-reduce."""
    graph = result.graph
    has_optim = any(t.action.kind is Kind.OPTIM for t in graph.tasks)
    sched = graph.schedule
    if has_optim:  # the runtime waits for every collective of the step, zero1/zero2's all-gathers after OPTIM too
        return max(result.end, default=0.0) - min(result.start, default=0.0) + costs.step_overhead
    ends = []
    for r in result.ranks:
        ends.append(r.last_end + sum(costs.stages[s].optim for s in sched.stages_of(r.rank)))
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
            param_bytes=_number(r.get("param_bytes", 0.0), where, path + "param_bytes"),
            server_update=_median(r, "SERVER_UPDATE", where, path) if "SERVER_UPDATE" in r else 0.0))
    p2p = data.get("p2p")  # None (or absent): one process, no messages measured
    alpha, beta = _alpha_beta(p2p, where, "p2p") if p2p is not None else (0.0, math.inf)
    colls = data.get("collectives") or {}
    if not isinstance(colls, dict):
        raise CostFileError(f"{where}: collectives must be an object of op -> {{alpha, beta}} or null, "
                            f"got {quote(colls)}")
    warned = data.get("warnings", [])
    if not isinstance(warned, list) or not all(isinstance(w, str) for w in warned):
        raise CostFileError(f"{where}: warnings must be a list of strings (the profiler's guesses), got {quote(warned)}")
    for w in warned:
        _warn(f"{where}: {w}")
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
        send_cpu=_median(p2p, "send_cpu", where, "p2p.") if isinstance(p2p, dict) and "send_cpu" in p2p else 0.0,
        warnings=tuple(warned),
        comm_slowdown=_comm_slowdown(data.get("comm_slowdown"), where),
        reduce_hook_ns_per_byte=_reduce_hook(data.get("reduce_hook"), where),
        param_copy=param_copy_section(data.get("param_copy"), where),
    )


def _hook_ns(value: Any, name: str) -> float:
    """``value`` if it is a finite number of nanoseconds per byte >= 0, else CostFileError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise CostFileError(f"{name} must be a finite number of nanoseconds per gradient byte >= 0 (0: the "
                            f"reduce-scatter hook is not charged), got {quote(value)}")
    return float(value)


def _reduce_hook(section: Any, where: str) -> float:
    """The file's ``reduce_hook.ns_per_byte`` (absent or null: 0.0, not charged; profiled with dp 1)."""
    if section is None:
        return 0.0
    value = section.get("ns_per_byte") if isinstance(section, dict) else section
    return _hook_ns(value, f"{where}: reduce_hook.ns_per_byte")


def _comm_slowdown(section: Any, where: str) -> float:
    """The file's ``comm_slowdown.factor`` (absent or null: 1.0, nothing stretched)."""
    if section is None:
        return 1.0
    factor = section.get("factor") if isinstance(section, dict) else None
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor < math.inf:
        raise CostFileError(f"{where}: comm_slowdown.factor must be a finite factor > 0 (1.0: communication does "
                            f"not slow compute), got {quote(factor if isinstance(section, dict) else section)}")
    return float(factor)


_warned: set[str] = set()


def _warn(message: str) -> None:
    """Log a guess once per process (a calibration builds the same costs many times)."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


# -- calibration from a real run's trace -------------------------------------------------------------------------

_SENDER = {"RECV_F": ("SEND_F", -1), "RECV_B": ("SEND_B", 1)}


def occupancy(part: Any, pp: int = 1) -> dict[tuple[int, str], float]:
    """(rank, action) -> seconds of one step: each compute task held its rank from its start to the start of
    the rank's next compute task or receive wait (its own end for the last); each message the receiver waited
    for, from the later of the wait and the end of its producer's occupancy to its arrival."""
    out: dict[tuple[int, str], float] = {}
    ready: dict[tuple[int, str, int, int], tuple[int, str, float]] = {}  # send (pipeline, kind, stage, mb)
    recvs = []
    for rank, mine in part.sort_values(["start", "end"]).groupby("rank", sort=False):
        rows = list(zip(mine["stream"], mine["action"], mine["start"], mine["end"], mine["kind"], mine["stage"],
                        mine["microbatch"], strict=True))
        held = [r for r in rows if r[0] != "send"]
        for k, (stream, action, start, end, *_rest) in enumerate(held):
            if stream == "compute":
                nxt = held[k + 1][2] if k + 1 < len(held) else end
                out[(int(rank), str(action))] = float(max(nxt, end) - start)
        for stream, action, start, _end, kind, stage, mb in rows:
            if stream == "send":  # its producer's occupancy ends at the rank's next held row after the post
                after = [r[2] for r in held if r[2] >= start]
                ready[(int(rank) // pp, str(kind), int(stage), int(mb))] = (int(rank), str(action),
                                                                             after[0] if after else start)
            elif stream == "recv" and kind in _SENDER:
                recvs.append((int(rank), kind, int(stage), int(mb), start, _end))
    for rank, kind, stage, mb, start, end in recvs:
        send_kind, d = _SENDER[kind]
        key = (rank // pp, send_kind, stage + d, mb)
        if key in ready and end > start:  # the receiver waited for it
            src, action, t = ready[key]
            out[(src, action)] = float(max(end - max(start, t), 0.0))
    return out


@dataclass(frozen=True)
class TraceCalibration:
    """What :func:`trace_calibration` measures in real traces (seconds): the calibration's raw figures."""

    num_stages: int
    passes: dict[tuple[int, str], float]  # (stage, kind) -> trimmed-mean in-run duration
    latency: float | None  # median message latency: from the later of the receiver's wait and the post's end to
    # arrival; None when no receive waited for its message (nothing in the trace times one)
    task_overhead: float  # median gap after a compute task's body that posts no message (to the rank's next task)
    send_cpu: float  # median extra gap after one that posts a message (gloo copies it on the caller's thread)
    step_overhead: float  # median of step wall time - the programs' span (less one task overhead: see below)
    activation_bytes: float
    steps: int
    layers: tuple[int, ...] = ()  # layers per stage of the traced run (attrs layers_per_stage)


def _frames(trace: Any) -> list[Any]:
    import pandas as pd

    from schedules.trace import read_trace

    items = trace if isinstance(trace, list | tuple) else [trace]
    if not items:
        raise CostFileError("calibration needs at least one real trace")
    frames = [t if isinstance(t, pd.DataFrame) else read_trace(t) for t in items]
    for t, df in zip(items, frames, strict=True):
        where = f"trace {str(t)!r}" if not isinstance(t, pd.DataFrame) else "trace"
        if df.attrs.get("source") != "real":
            raise CostFileError(f"{where} is not a real run's trace (source {df.attrs.get('source')!r}); "
                                "calibrate from the trace file of a real run (schedlab run)")
        if not df.attrs.get("step_times"):
            raise CostFileError(f"{where} has no step_times; record it again with this version of schedlab run")
    layouts = {(str(df.attrs.get("schedule")), json.dumps(df.attrs.get("params"), sort_keys=True),
                json.dumps(df.attrs.get("model"), sort_keys=True), df.attrs.get("microbatch_size")) for df in frames}
    if len(layouts) > 1:
        raise CostFileError(f"the traces to calibrate from ran {len(layouts)} different configurations "
                            f"({', '.join(sorted(s for s, *_ in layouts))}); calibrate from runs of one "
                            "schedule, shape, model and microbatch size")
    return frames


TRIM = 0.05  # the fraction of samples left out at each end of a task time's mean


def _trimmed_mean(xs: list[float]) -> float:
    """The mean with the lowest and highest ``TRIM`` of the samples left out.

    A step is a sum of many task times along its critical path, and the median
    of such a sum lies near the sum of their means, not of their medians (the
    times are skewed to the right: a task is never faster than its work, often
    slower); the trim keeps one descheduled task from weighing on it.
    """
    xs = sorted(xs)
    k = int(len(xs) * TRIM)
    return statistics.fmean(xs[k:len(xs) - k] if len(xs) > 2 * k else xs)


def trace_calibration(trace: Any) -> TraceCalibration:
    """The calibration's figures from one or more real traces (paths or DataFrames) of one stage layout."""
    import statistics

    from schedules.trace import trace_steps, work_span

    frames = _frames(trace)
    passes: dict[tuple[int, str], list[float]] = {}
    latency, gaps, post_gaps, overheads = [], [], [], []
    num_stages, nbytes, steps = 0, [], 0
    for df in frames:
        pp = int(df.attrs.get("params", {}).get("pp", 1))
        walls = {int(k): float(v) for k, v in df.attrs["step_times"].items()}
        for step, part in trace_steps(df).items():
            steps += 1
            rows = part.sort_values(["rank", "start", "end"]).to_dict("records")
            num_stages = max(num_stages, 1 + max(r["stage"] for r in rows))
            if step in walls:
                overheads.append(walls[step] - work_span(part))
            held = occupancy(part, pp)
            for r in rows:
                if r["stream"] == "send" and (r["rank"], r["action"]) in held:
                    latency.append(held[(r["rank"], r["action"])])
                    nbytes.append(r["bytes"])
            by_rank: dict[int, list[dict[str, Any]]] = {}
            for r in rows:
                by_rank.setdefault(r["rank"], []).append(r)
                if r["stream"] == "compute" and r["kind"] in ("F", "B", "I", "W"):
                    passes.setdefault((r["stage"], r["kind"]), []).append(r["end"] - r["start"])
            for mine in by_rank.values():  # rows in start order: what follows each compute task's body
                last_held = max((k for k, r in enumerate(mine) if r["stream"] != "send"), default=-1)
                for k, (c, n) in enumerate(itertools.pairwise(mine)):
                    if c["stream"] != "compute" or k >= last_held or (c["rank"], c["action"]) not in held:
                        continue  # the rank's last task: nothing after it shows where its occupancy ends
                    gap = held[(c["rank"], c["action"])] - (c["end"] - c["start"])  # its occupancy less its body
                    (post_gaps if n["stream"] == "send" else gaps).append(gap)
    med = statistics.median
    task_overhead = _trimmed_mean(gaps) if gaps else 0.0
    return TraceCalibration(
        num_stages=num_stages,
        passes={k: _trimmed_mean(v) for k, v in sorted(passes.items())},
        latency=max(med(latency), 0.0) if latency else None,
        task_overhead=max(task_overhead, 0.0),
        send_cpu=max(_trimmed_mean(post_gaps) - task_overhead, 0.0) if post_gaps else 0.0,
        # the simulated span ends after the last task's overhead, the recorded one at its body's end
        step_overhead=max(float(med(overheads)) - max(task_overhead, 0.0), 0.0) if overheads else 0.0,
        activation_bytes=med(nbytes) if nbytes else 0.0,
        steps=steps,
        layers=tuple(int(x) for x in frames[0].attrs.get("layers_per_stage") or ()),
    )


def from_trace(trace: Any, profile: str | Path | None = None, *, num_stages: int | None = None,
               calibration: TraceCalibration | None = None) -> ProfiledCosts:
    """A cost model calibrated from real traces (see the module doc), for ``num_stages`` stages.

    ``trace``: a path or DataFrame, or a list of them (every traced step of
    every one counts). Passes the trace lacks, or a stage count other than the
    trace's, come from ``profile`` (a cost file of real.profile): shared in its
    proportions where the target partition refines the traced one, else scaled
    per pass kind by the trace's in-run/profiled ratio on the trace's own stages.

    What nothing measured is never a silent 0: a pass kind with no time on some
    stage is listed in ``missing`` (a graph that runs it is refused), and a
    trace in which no receive waited for its message times no message: the
    profile's p2p fit is used, or without one ``p2p_measured`` is False (a
    graph that sends is refused). Each such guess is a line of ``warnings``,
    naming the field, and is logged.
    """
    fit = calibration or trace_calibration(trace)
    n = num_stages or fit.num_stages
    source = ", ".join(str(t) for t in (trace if isinstance(trace, list | tuple) else [trace])
                       if not hasattr(t, "attrs"))[:200]
    target = load_profile(profile, n) if profile is not None else None
    if profile is None:
        if n != fit.num_stages:
            raise CostFileError(f"the trace runs {fit.num_stages} stages, the schedule {n}; give a profile "
                                f"(real.profile, stages={n}) to scale, or calibrate from a run of {n} stages")
        stages = tuple(StageCosts(**{k.lower(): fit.passes.get((s, k), 0.0) for k in _KINDS}) for s in range(n))
        lacking = [(s, k) for s in range(n) for k in _KINDS if (s, k) not in fit.passes]
    elif (groups := _refinement(fit, profile, n)) is not None:
        stages, lacking = _refined(fit, target, groups)
    else:
        stages, lacking = _scaled(fit, profile, target, n), []
    missing = tuple(k for k in _KINDS if any(k == kind for _, kind in lacking))
    warnings = list(target.warnings) if target is not None else []
    if lacking:
        warnings.append(f"stages[].{'/'.join(k.lower() for k in missing)}: no time for "
                        f"{', '.join(f'stage {s} {k}' for s, k in lacking)} in the trace"
                        f"{'' if profile is None else ' nor in its share of the profile'}; a graph that runs "
                        f"{'/'.join(missing)} passes is refused (calibrate from a run that has them, or give a "
                        "profile)")
    p2p = _trace_p2p(fit, target, warnings)
    for w in warnings[len(target.warnings) if target is not None else 0:]:
        _warn(f"calibration from {source or 'a trace'}: {w}")
    return ProfiledCosts(
        stages=stages, activation_bytes=p2p["activation_bytes"], p2p_alpha=p2p["alpha"], p2p_beta=p2p["beta"],
        p2p_measured=p2p["measured"], task_overhead=fit.task_overhead, step_overhead=fit.step_overhead,
        send_cpu=fit.send_cpu, collectives=target.collectives if target is not None else (),
        source=source or "trace", missing=missing, warnings=tuple(warnings),
        comm_slowdown=target.comm_slowdown if target is not None else 1.0)


_KINDS = ("F", "B", "I", "W")


def _scaled(fit: TraceCalibration, profile: str | Path, target: ProfiledCosts, n: int) -> tuple[StageCosts, ...]:
    """The profile's n stages, each pass kind scaled by the trace's in-run/profiled ratio of that kind (over
    the traced stages that have it); a kind the trace lacks scales as its backward (I, W) or forward."""
    base = load_profile(profile, fit.num_stages)
    ratio = {}
    for k in _KINDS:
        have = [s for s in range(fit.num_stages) if (s, k) in fit.passes]
        prof = sum(base.stages[s].of(Kind(k)) for s in have)
        if have:
            ratio[k] = sum(fit.passes[(s, k)] for s in have) / prof if prof else 1.0
    for k in _KINDS:
        ratio.setdefault(k, ratio.get("B", ratio.get("F", 1.0)))
    same = n == fit.num_stages
    return tuple(
        StageCosts(**{k.lower(): fit.passes[(s, k)] if same and (s, k) in fit.passes
                      else target.stages[s].of(Kind(k)) * ratio[k] for k in _KINDS},
                   optim=0.0, param_bytes=target.stages[s].param_bytes)
        for s in range(n))


def _trace_p2p(fit: TraceCalibration, target: ProfiledCosts | None, warnings: list[str]) -> dict[str, Any]:
    """The message timing: the trace's latency; else the profile's p2p fit; else none (messages refused)."""
    if fit.latency is not None:
        return {"alpha": fit.latency, "beta": math.inf, "measured": True, "activation_bytes": fit.activation_bytes}
    why = "p2p_alpha: no receive in the trace waited for its message, so the trace times no message"
    if target is not None and target.p2p_measured:
        warnings.append(f"{why}; the profile's p2p fit is used (alpha {target.p2p_alpha:.3g} s)")
        return {"alpha": target.p2p_alpha, "beta": target.p2p_beta, "measured": True,
                "activation_bytes": target.activation_bytes}
    warnings.append(f"{why}; a graph that sends messages is refused (give a profile with p2p, real.profile)")
    return {"alpha": 0.0, "beta": math.inf, "measured": False, "activation_bytes": fit.activation_bytes}


def _profile_layers(profile: str | Path, n: int) -> list[tuple[int, int]] | None:
    """The layer range [first, stop) of each stage of the profile's n-stage partition (None: not recorded)."""
    try:
        parts = json.loads(Path(profile).read_text())["partitions"]
        rows = next(q["stages"] for q in parts if q.get("num_stages") == n)
        by_stage = {int(r["stage"]): (int(r["layers"][0]), int(r["layers"][1])) for r in rows}
        return [by_stage[s] for s in range(n)]
    except (OSError, ValueError, KeyError, TypeError, IndexError, StopIteration):
        return None


def _refinement(fit: TraceCalibration, profile: str | Path, n: int) -> list[int] | None:
    """For each of the n target stages, the traced stage that holds all its layers; None unless every target
    stage lies within one traced stage (4 stages from a run of 2, or the same partition)."""
    target = _profile_layers(profile, n)
    if target is None or len(fit.layers) != fit.num_stages:
        return None
    bounds = list(itertools.accumulate(fit.layers, initial=0))
    owner = []
    for first, stop in target:
        t = next((t for t in range(fit.num_stages) if bounds[t] <= first and stop <= bounds[t + 1]), None)
        if t is None or stop <= first:
            return None
        owner.append(t)
    return owner


def _refined(fit: TraceCalibration, target: ProfiledCosts, owner: list[int]
             ) -> tuple[tuple[StageCosts, ...], list[tuple[int, str]]]:
    """Each traced stage's in-run time shared among the target stages inside it as the profile shares it
    (measured round-robin at one moment, so the profile's own speed cancels). A kind the trace lacks takes
    its profiled share of the trace's backward: I and W from B (1F1B), B from I + W (zero-bubble). Also
    returns the (target stage, kind) pairs with nothing to take a time from (their time is 0: refused)."""
    def of(s: int, *kinds: str) -> float:
        return sum(target.stages[s].of(Kind(k)) for k in kinds)

    out, lacking = [], []
    for s, t in enumerate(owner):
        group = [x for x, o in enumerate(owner) if o == t]
        costs = {}
        for k in _KINDS:
            if (t, k) in fit.passes:
                src, base = fit.passes[(t, k)], (k,)
            elif k in ("I", "W") and (t, "B") in fit.passes:
                src, base = fit.passes[(t, "B")], ("B",)
            elif k == "B" and (t, "I") in fit.passes and (t, "W") in fit.passes:
                src, base = fit.passes[(t, "I")] + fit.passes[(t, "W")], ("I", "W")
            else:
                src, base = 0.0, (k,)
                lacking.append((s, k))
            whole = sum(of(x, *base) for x in group)
            costs[k.lower()] = src * of(s, k) / whole if whole else src / len(group)
        out.append(StageCosts(**costs, optim=0.0, param_bytes=target.stages[s].param_bytes))
    return tuple(out), lacking


def load_costs(source: str | Path, num_stages: int | None = None, profile: str | Path | None = None) -> ProfiledCosts:
    """A cost file (JSON, :func:`load_profile`) or a real trace (.csv/.parquet, :func:`from_trace`, scaled to
    other stage counts with ``profile``)."""
    if Path(source).suffix in (".csv", ".parquet"):
        return from_trace(source, profile, num_stages=num_stages)
    if profile is not None:
        raise CostFileError(f"a profile to scale with goes with a trace; {str(source)!r} is a cost file already")
    return load_profile(source, num_stages)
