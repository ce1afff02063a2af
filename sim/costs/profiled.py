"""The profiled cost model: durations measured on the machine by ``python -m real.profile``.

The cost file (schema in :mod:`real.profile`, read by :mod:`sim.costs.cost_file`) holds, for one model and
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

Activations are counted in M_B as :class:`UniformCosts` counts them (the file
measures time, not memory).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from common.errors import CostFileError, quote
from schedules import Action, Kind, Stream, Task, TaskGraph
from schedules.dp.modes import server_update
from schedules.formats import PROFILE_SCHEMA
from sim.costs.moe import Segment, threaded_pair_time
from sim.costs.param_copy import ParamCopy, charge_param_copies
from sim.costs.uniform import UniformCosts

if TYPE_CHECKING:
    from sim.engine import SimResult

__all__ = ["PROFILE_SCHEMA", "PS_MODES", "ProfiledCosts", "StageCosts", "step_time"]


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


def checked_hook_ns(value: Any, name: str) -> float:
    """``value`` if it is a finite number of nanoseconds per byte >= 0, else CostFileError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise CostFileError(f"{name} must be a finite number of nanoseconds per gradient byte >= 0 (0: the "
                            f"reduce-scatter hook is not charged), got {quote(value)}")
    return float(value)


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
    # expert parallelism: seconds of the all-to-alls inside one F (dispatch, combine and the counts of each MoE
    # layer; R's are F's) and one B or I (both backwards), part of f, b and i; the stage's MoE layers
    a2a_f: float = 0.0
    a2a_b: float = 0.0
    moe_layers: int = 0

    def __post_init__(self) -> None:
        _finite("stage costs", f=self.f, b=self.b, i=self.i, w=self.w, optim=self.optim,
                param_bytes=self.param_bytes, server_update=self.server_update, a2a_f=self.a2a_f,
                a2a_b=self.a2a_b)

    def update_on_server(self) -> float:
        """Seconds of the parameter servers' update of the stage: the profiled server update, else the optimizer
        step."""
        return self.server_update or self.optim

    def of(self, kind: Kind) -> float:
        """A pass's seconds; a recomputation (R) re-runs the stage's forward, so it costs F's."""
        return {Kind.F: self.f, Kind.R: self.f, Kind.B: self.b, Kind.I: self.i, Kind.W: self.w}[kind]

    def segments(self, kind: Kind) -> list[Segment]:
        """A pass as the pieces its thread runs: per MoE layer compute, its first all-to-all(s), compute, its last
        (the stage's compute and all-to-all time split evenly over its MoE layers); one compute piece without."""
        a2a = {Kind.F: self.a2a_f, Kind.R: self.a2a_f, Kind.B: self.a2a_b, Kind.I: self.a2a_b}.get(kind, 0.0)
        total = self.of(kind)
        if not (a2a and self.moe_layers):
            return [Segment(total)]
        c, t = (total - a2a) / (2 * self.moe_layers), a2a / (2 * self.moe_layers)
        return [seg for _ in range(2 * self.moe_layers) for seg in (Segment(c), Segment(t, comm=True))]


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
    # expert parallelism on the CPU: an OVERLAP_F_B runs its forward in a thread beside its backward, each part's
    # all-to-alls on an ep group of its own (real.executor); the pair is timed by sim.costs.moe.threaded_pair_time
    # with comm_slowdown and comm_stall. False: its parts one after the other
    pair_threads: bool = False
    # with pair_threads: while both parts of a pair compute at once they take this times as long as the two one
    # after the other (thread switches, the interpreter lock, caches; the cost file's pair_threads.factor,
    # real.profile.pair)
    pair_share: float = 1.0

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
        if isinstance(self.pair_share, bool) or not isinstance(self.pair_share, int | float) or \
                not 0 < self.pair_share < math.inf:
            raise CostFileError(f"profiled costs: pair_share must be a finite factor > 0 (1.0: two threads' compute "
                                f"costs the two in turn), got {self.pair_share!r}")
        checked_hook_ns(self.reduce_hook_ns_per_byte, "profiled costs: reduce_hook_ns_per_byte")
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
            if self.pair_threads:
                chains = [self.stages[a.stage].segments(a.kind) for a in action.sub_actions]
                return threaded_pair_time(chains, self.comm_slowdown, self.comm_stall, self.pair_share) + self.task_overhead
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
            "pair_share": self.pair_share,
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
