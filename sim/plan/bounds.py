"""What the planner knows about a configuration before simulating it: memory per device and a lower bound on the step.

Both use the cost model's own per-stage figures (:class:`TransformerCosts`'
``time_of``, ``params_of``, ``activations_of``, ``optim_time``, bucket sizes and
dp-group collectives), so they agree with what the simulation would charge.

**Memory** (exact, the simulation's own accounting): per pipeline rank, model
states (ZeRO, :func:`sim.memory.model_state_bytes`) + FSDP's gathered weights +
the activation peak. The engine's peak walks the rank's compute program: a pass
holds its bytes from its start, B frees them, I all but the fraction ``mw`` that
W still needs, W the rest. Only positions with a forward can be a maximum, so
:func:`memory_rows` keeps, per rank, the count vectors (P, Q) at each forward:
held = sum_s a_s (P_s + mw Q_s), P = forwards so far less backwards (B or I)
before, Q = I before less W before; dominated rows are dropped.

**Lower bound** on the step time, valid for every schedule (a rank's compute
stream is serial, messages and collectives take at least their alpha-beta time,
waiting only adds): for rank r with stages S_r,

* head_r: no pass of r starts before the forward of microbatch 0 reached its
  lowest stage: sum over earlier stages of F_s plus each cross-rank message;
* busy_r = m * sum_{s in S_r} (F_s + I_s + W_s) (B = I + W; overlapped pairs at
  ``pair_overlap`` 0 cost the sum);
* after r's last pass (a B or W, a gradient producer): its optimizer steps, and
  before the step of that stage its last gradient bucket's collective (ready at
  the pass's end; sync all-reduces every bucket after the rank's last pass, so
  at least this too; ps: the optimizer steps alone, which the step adds after the
  pulls), and with zero1/zero2 the all-gathers of the stage's buckets after
  its optimizer step (one port, serial): dp_tail_r = max(sum of optim,
  max_s(optim_s + ag_s), min_s(c_s + optim_s + ag_s));
* with full backwards only (no I/W split), r's last pass is a B of a stage
  >= min S_r, and the input gradient still has to run back through every lower
  stage: tail_r = sum_{s < min S_r} (B_s + message), then stage 0's rank's dp tail;
* with the embedding gradient all-reduce (:mod:`schedules.dp.modes`), it starts after
  the last pass of both the first and the last stage's ranks a and b, and both
  stages' optimizer steps follow it (on a, every stage's: stage 0's comes first):
  max(head + busy over a, b) + its alpha-beta time + the larger of a's optimizer
  steps and the last stage's.

LB = max_r max(head_r + busy_r + dp_tail_r, head_r + busy_r + tail_r + dp_tail_{rank of stage 0}).
For uniform stages and no communication this is the closed-form bubble of
GPipe, 1F1B and interleaved 1F1B ((p-1)(tf+tb+tw)/v) exactly; for the I/W
schedules it keeps only the warm-up (p-1) tf.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from common.errors import ConfigError
from schedules import Action, Kind, Schedule, ScheduleError, build
from schedules.library.controllable import v_half_cap, v_list_schedule
from schedules.library.zero_bubble import v_placement
from schedules.timing import CompiledTiming, rank_ends
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import partition_layers
from sim.costs.transformer_costs import TransformerCosts
from sim.memory import moe_state_bytes
from sim.plan.space import PlanConfig, PlanSpace, shape_ok

__all__ = ["Bounds", "MemoryRows", "memory_rows", "peak_activations"]

_F, _I, _W, _B = Kind.F, Kind.I, Kind.W, Kind.B
_PEAKS_KEPT = 256  # activation rows whose peaks Bounds.memory keeps
#: Per rank: the (P, Q) count vectors over the rank's stages (in stage order) at every forward, Pareto-maximal.
MemoryRows = tuple[tuple[tuple[tuple[int, ...], tuple[int, ...]], ...], ...]


def _pareto(rows: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Rows not dominated componentwise by another (held is a nonnegative combination of the components)."""
    kept: list[tuple[int, ...]] = []
    for row in sorted(rows, key=lambda r: (-sum(r), r)):
        if not any(all(k >= x for k, x in zip(other, row, strict=True)) for other in kept):
            kept.append(row)
    return kept


def _one_stage_rows(prog: Sequence[Action]) -> set[tuple[int, ...]] | None:
    """:func:`memory_rows` of a rank with one stage, on plain counters; None if it has an overlapped pair."""
    f = gone = pending = 0
    rows = set()
    for a in prog:
        k = a.kind
        if k is _F:
            f += 1
            rows.add((f - gone, pending))
        elif k is _B:
            gone += 1
        elif k is _I:
            gone += 1
            pending += 1
        elif k is _W:
            pending -= 1
        else:
            return None
    return rows


def _rows(prog: Sequence[Action], stages: Sequence[int]) -> set[tuple[int, ...]]:
    local = {s: i for i, s in enumerate(stages)}
    v = len(stages)
    f = [0] * v
    gone = [0] * v  # B or I done
    pending = [0] * v  # I done, W not yet
    rows: set[tuple[int, ...]] = set()
    for action in prog:
        parts = action.parts()
        has_f = False
        for a in parts:
            if a.kind is _F:
                f[local[a.stage]] += 1
                has_f = True
        if has_f:
            rows.add(tuple(f[i] - gone[i] for i in range(v)) + tuple(pending))
        for a in parts:
            i = local[a.stage]
            if a.kind is _B:
                gone[i] += 1
            elif a.kind is _I:
                gone[i] += 1
                pending[i] += 1
            elif a.kind is _W:
                pending[i] -= 1
            elif a.kind is not _F:
                raise ConfigError(f"plan: action {a} of kind {a.kind.value}: the planner's memory rows know F, I, W "
                                  "and B only (a schedule with R actions is not planned)", field="schedule")
    return rows


def memory_rows(schedule: Schedule) -> MemoryRows:
    """The activation count vectors of every rank at each position that can be its peak (see the module doc)."""
    return programs_rows(schedule.programs, [schedule.stages_of(rank) for rank in range(len(schedule.programs))])


def programs_rows(programs: Sequence[Sequence[Action]], rank_stages: Sequence[Sequence[int]]) -> MemoryRows:
    """:func:`memory_rows` of per-rank programs, rank r holding ``rank_stages[r]`` (ascending). Of a prefix of
    each program: rows that the whole programs' dominate (every position of a prefix is one of the whole's)."""
    out = []
    for prog, stages in zip(programs, rank_stages, strict=True):
        rows = _one_stage_rows(prog) if len(stages) == 1 else None
        if rows is None:
            rows = _rows(prog, stages)
        v = len(stages)
        out.append(tuple((r[:v], r[v:]) for r in _pareto(rows)))
    return tuple(out)


def peak_activations(rows: MemoryRows, sizes: Sequence[Sequence[float]], mw: float) -> list[float]:
    """Per rank: the largest sum_s a_s (P_s + mw Q_s) over its rows; ``sizes[r]`` = bytes of each of its stages."""
    peaks = []
    for rank_rows, a in zip(rows, sizes, strict=True):
        best = 0.0
        for p, q in rank_rows:
            held = sum(x * (pi + mw * qi) for x, pi, qi in zip(a, p, q, strict=True))
            if held > best:
                best = held
        peaks.append(best)
    return peaks


#: Schedules whose activation rows only grow with m (every row at m' <= m is dominated by a row at m), checked
#: by tests/test_plan.py over a grid: for them the rows at a small m' give a memory floor without building m.
MONOTONE_IN_M = frozenset({"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "interleaved-zb", "zb-v",
                           "dualpipe-v", "zb-h2", "v-min"})  # not v-half: its list scheduler's rows at pp 3, m 2 exceed m 3's


def small_m(name: str, pp: int, m: int, v: int) -> int | None:
    """The m' <= m whose rows bound those at m from below, cheap to build: min(m, 2 pp), valid for the schedule."""
    if name not in MONOTONE_IN_M:
        return None
    return next((k for k in range(min(m, 2 * pp), 0, -1) if shape_ok(name, pp, k, v)), None)


def floor_key(name: str, pp: int, m: int, v: int) -> tuple | None:
    """What :func:`floor_rows` builds (configurations of one key share their floor), None where it has none."""
    if name == "v-half":
        return (name, pp, m, v) if m > 2 * pp else None  # at m <= 2 pp the prefix would be the whole
    k = small_m(name, pp, m, v)
    return None if k is None or k == m else (name, pp, k, v)  # at k = m the floor is the schedule's own rows


def floor_rows(key: tuple) -> MemoryRows:
    """Rows that the schedule's rows at m dominate, at a fraction of the cost of building it (``key`` from
    :func:`floor_key`): for a schedule whose rows grow with m (:data:`MONOTONE_IN_M`) its rows at m' = min(m, 2 pp);
    for V-Half, whose rows do not (its list scheduler's rows at pp 3, m 2 exceed m 3's), the rows of its programs at
    m up to stage 0's max(2 pp, m / 4)-th forward, a prefix of each rank's program (:func:`programs_rows`). Both
    reach the forwards' peak (P) of the whole schedule. V-Half's W's wait for idle time, so those pending (Q) keep
    growing to the end of the step: a quarter of it is where they already overflow every Llama 3 405B V-Half
    layout on 64 nodes that the whole schedule's rows rule out, at 40% of its cost (pp 64, m 1024: 2.2 s, 5.4 s)."""
    name, pp, m, v = key
    if name == "v-half":
        progs = v_list_schedule(pp, m, v_half_cap(pp), admitted=max(2 * pp, m // 4))
        return programs_rows(progs, shape_info(name, pp, v).rank_stages)
    return memory_rows(build(name, pp=pp, microbatches=m, chunks=v))


@dataclass(frozen=True, slots=True)
class ShapeInfo:
    """What a schedule's shape fixes regardless of m: the placement, each rank's stages, whether every backward is a B."""

    placement: tuple[int, ...]
    rank_stages: tuple[tuple[int, ...], ...]
    full_backward: bool


#: The built-in schedules' placement (``loop``: stage s on rank s mod pp; ``v``: rank r holds stages r and 2p-1-r)
#: and whether every backward is a B, known without building one (v-half or zb-h2 at pp 64 takes seconds even at
#: m = 1); tests/test_plan.py checks this table against build() over a grid of shapes.
KNOWN_SHAPES: dict[str, tuple[str, bool]] = {
    "gpipe": ("loop", True), "1f1b": ("loop", True), "interleaved-1f1b": ("loop", True), "looped-bfs": ("loop", True),
    "zb-h1": ("loop", False), "zb-h2": ("loop", False), "interleaved-zb": ("loop", False),
    "zb-v": ("v", False), "v-half": ("v", False), "v-min": ("v", False), "dualpipe-v": ("v", False),
    "combined-1f1b": ("loop", True),
}


@lru_cache(maxsize=4096)
def shape_info(name: str, pp: int, v: int) -> ShapeInfo:
    """From :data:`KNOWN_SHAPES`, else from the smallest instance the schedule takes (m = 1, else pp, else 2 pp):
    the placement is m-independent."""
    known = KNOWN_SHAPES.get(name)
    if known is not None and (known[0] == "loop" or v == 2):
        placement = tuple(s % pp for s in range(pp * v)) if known[0] == "loop" else v_placement(pp)
        stages = tuple(tuple(s for s, r in enumerate(placement) if r == rank) for rank in range(pp))
        return ShapeInfo(placement, stages, known[1])
    for m in (1, pp, 2 * pp):
        try:
            sched = build(name, pp=pp, microbatches=m, chunks=v)
            break
        except ScheduleError:
            if m == 2 * pp:
                raise
    full = all(p.kind in (Kind.F, Kind.B) for prog in sched.programs for a in prog for p in a.parts())
    return ShapeInfo(sched.stage_to_rank, tuple(sched.stages_of(r) for r in range(pp)), full)


@dataclass(frozen=True, slots=True)
class _Stages:
    """Per stage of one split under one (tp, sp, b, recompute): pass times, parameters, activation bytes."""

    f: tuple[float, ...]
    i: tuple[float, ...]
    w: tuple[float, ...]
    params: tuple[float, ...]
    act: tuple[float, ...]
    experts: tuple[float, ...]  # of params, the routed experts' (a MoE model): sharded over dp / ep, not dp


@dataclass(frozen=True, slots=True)
class _Ranks:
    """Per rank of one placement: the figures the bound and the memory need, summed over its stages."""

    work: tuple[float, ...]  # F + I + W of one microbatch over the rank's stages
    params: tuple[float, ...]
    gather: tuple[float, ...]  # FSDP: twice the largest stage's parameters
    act_min: tuple[float, ...]
    sizes: tuple[tuple[float, ...], ...]  # activation bytes of each of the rank's stages
    recompute: tuple[float, ...]  # seconds of recomputation per microbatch
    experts: tuple[float, ...]  # of params, the routed experts'


class Bounds:
    """Memory and step-time lower bounds of configurations of one :class:`PlanSpace`, with the shared pieces cached.

    Everything that does not depend on the microbatch count or the schedule's
    order is computed once per (tp, sp, b, recompute, stages, placement, dp).
    """

    def __init__(self, space: PlanSpace) -> None:
        self.space = space
        self._unit: dict[tuple, TransformerCosts] = {}
        self._full: dict[PlanConfig, TransformerCosts] = {}
        self._stages: dict[tuple, _Stages] = {}
        self._ranks: dict[tuple, _Ranks] = {}
        self._paths: dict[tuple, tuple] = {}
        self._dp: dict[tuple, tuple[float, ...]] = {}
        self._states: dict[tuple, tuple[float, ...]] = {}
        self._queues: dict[tuple, tuple[tuple[float, float], ...]] = {}
        # rank_ends of the last schedule timed, per (durations, hops): the data-parallel modes and the layouts of one
        # schedule that time its passes alike share one timeline (a refinement job's configurations share a schedule)
        self._ends_of: CompiledTiming | None = None
        self._peaks: OrderedDict[int, tuple[MemoryRows, dict[tuple, list[float]]]] = OrderedDict()
        self._ends: dict[tuple, list[float]] = {}

    # --- cost models ------------------------------------------------------------------------------------
    def unit_costs(self, tp: int, sp: bool, b: int, recompute: str, ep: int = 1) -> TransformerCosts:
        """Pass times and activations depend only on (tp, sp, b, recompute, ep): one model per combination."""
        key = (tp, sp, b, recompute, ep)
        c = self._unit.get(key)
        if c is None:
            s = self.space
            c = self._unit[key] = TransformerCosts(
                model=s.model, cluster=s.cluster, parallel=ParallelConfig(pp=1, tp=tp, sp=sp, dp=ep, ep=ep),
                microbatch_size=b, recompute=recompute)
        return c

    def costs(self, c: PlanConfig) -> TransformerCosts:
        """The configuration's full cost model (what the simulation runs under)."""
        key = c._replace(schedule="", chunks=0, microbatches=0)
        found = self._full.get(key)
        if found is None:
            s = self.space
            found = self._full[key] = TransformerCosts(
                model=s.model, cluster=s.cluster,
                parallel=ParallelConfig(pp=c.pp, dp=c.dp, tp=c.tp, sp=c.sp, ep=c.ep, dp_mode=c.dp_mode,
                                        bucket_mb=s.bucket_for(c.tp), link_model=s.link_model,
                                        grad_compression=s.grad_compression if c.dp_mode != "none" else "none"),
                microbatch_size=c.microbatch_size, recompute=c.recompute, reduce_dtype=s.reduce_dtype)
        return found

    def _stage_figs(self, tp: int, sp: bool, b: int, rc: str, n: int, ep: int = 1) -> _Stages:
        """Per stage: pass times, parameters, activations, and the routed experts' parameters. With expert
        parallelism a pass's all-to-alls are left out of its time: an overlapped pair may hide them all
        (sim.costs.moe.two_stream_time), and a bound must not count what a schedule can hide."""
        key = (tp, sp, b, rc, n, ep)
        found = self._stages.get(key)
        if found is None:
            unit = self.unit_costs(tp, sp, b, rc, ep)
            split = partition_layers(self.space.model.layers, n)
            a2a = unit.all_to_all_time()
            memo: dict[tuple, tuple] = {}
            cols = []
            for s, layers in enumerate(split):
                moe = unit.stage_moe(s, n)
                k = (layers, s == 0, s == n - 1, moe)
                if k not in memo:
                    times = [unit.time_of(kind, *k) - moe * unit.all_to_alls(kind) * a2a
                             for kind in (Kind.F, Kind.I, Kind.W)]
                    memo[k] = (*times, unit.params_of(*k[:3], n > 1, moe=moe),
                               unit.activations_of(layers, k[2], moe=moe), unit.stage_expert_params(s, n))
                cols.append(memo[k])
            found = self._stages[key] = _Stages(*(tuple(col) for col in zip(*cols, strict=True)))
        return found

    def _rank_figs(self, c: PlanConfig) -> tuple[ShapeInfo, _Ranks]:
        info = shape_info(c.schedule, c.pp, c.chunks)
        key = (c.tp, c.sp, c.microbatch_size, c.recompute, info.placement, c.ep)
        found = self._ranks.get(key)
        if found is None:
            n = len(info.placement)
            st = self._stage_figs(c.tp, c.sp, c.microbatch_size, c.recompute, n, c.ep)
            plain = st if c.recompute == "none" else self._stage_figs(c.tp, c.sp, c.microbatch_size, "none", n, c.ep)
            cols = []
            for stages in info.rank_stages:
                params = [st.params[s] for s in stages]
                sizes = tuple(st.act[s] for s in stages)
                cols.append((sum(st.f[s] + st.i[s] + st.w[s] for s in stages), sum(params), 2 * max(params),
                             min(sizes), sizes, sum(st.i[s] - plain.i[s] for s in stages),
                             sum(st.experts[s] for s in stages)))
            found = self._ranks[key] = _Ranks(*(tuple(col) for col in zip(*cols, strict=True)))
        return info, found

    # --- memory -----------------------------------------------------------------------------------------
    def states(self, c: PlanConfig) -> tuple[float, ...]:
        """Per pipeline rank: model states plus FSDP's gathered weights (bytes), without activations."""
        info, ranks = self._rank_figs(c)
        key = (c.tp, info.placement, c.dp_mode, c.dp, c.ep)
        found = self._states.get(key)
        if found is None:
            fsdp = c.dp_mode in ("zero3", "fsdp")
            grad = 4 if self.space.reduce_dtype == "fp32" else 2  # an fp32 accumulator, as sim.plan.study counts it
            found = self._states[key] = tuple(  # the routed experts over their dp / ep replicas, as held_bytes counts
                moe_state_bytes(p, e, c.dp_mode, c.dp, c.dp // c.ep, grad) + (g if fsdp else 0.0)
                for p, g, e in zip(ranks.params, ranks.gather, ranks.experts, strict=True))
        return found

    def stage_sizes(self, c: PlanConfig) -> tuple[tuple[float, ...], ...]:
        """Per rank: activation bytes of each of its stages (in stage order, as in :func:`memory_rows`)."""
        return self._rank_figs(c)[1].sizes

    def memory_floor(self, c: PlanConfig) -> float:
        """A lower bound on the largest device's memory: states plus one microbatch of its smallest stage."""
        ranks = self._rank_figs(c)[1]
        return max(st + a for st, a in zip(self.states(c), ranks.act_min, strict=True))

    def memory_ceiling(self, c: PlanConfig) -> float:
        """An upper bound: states plus every microbatch of every stage of the rank in flight at once."""
        ranks = self._rank_figs(c)[1]
        return max(st + c.microbatches * sum(a) for st, a in zip(self.states(c), ranks.sizes, strict=True))

    def memory(self, c: PlanConfig, rows: MemoryRows) -> float:
        """The largest device's memory (bytes) with the schedule's activation rows."""
        mw = self.space.model.w_held_fraction(c.recompute)
        sizes = self.stage_sizes(c)
        # the data-parallel modes (and dp degrees) of one layout hold the same activations: one peak per
        # (rows, sizes, mw); the entry keeps its rows alive, so their id is not reused while it is cached
        kept = self._peaks.get(id(rows))
        if kept is None or kept[0] is not rows:
            kept = self._peaks[id(rows)] = (rows, {})
            while len(self._peaks) > _PEAKS_KEPT:
                self._peaks.popitem(last=False)
        else:
            self._peaks.move_to_end(id(rows))
        act = kept[1].get((sizes, mw))
        if act is None:
            act = kept[1][(sizes, mw)] = peak_activations(rows, sizes, mw)
        return max(st + a for st, a in zip(self.states(c), act, strict=True))

    # --- the lower bound ----------------------------------------------------------------------------------
    def _dp_tails(self, c: PlanConfig, info: ShapeInfo) -> tuple[float, ...]:
        key = (c.tp, c.pp, c.dp, c.dp_mode, info.placement, c.ep)  # optimizer steps and buckets: not b, sp, recompute
        found = self._dp.get(key)
        if found is not None:
            return found
        costs, n = self.costs(c), len(info.placement)
        tails = []
        for r, stages in enumerate(info.rank_stages):
            optim = [costs.optim_time(s, n) for s in stages]
            if c.dp_mode == "ps":  # the servers update the stage of the rank's last pass after it (schedules.dp.modes)
                tails.append(min(costs.server_update_time(s, n) for s in stages))
                continue
            if c.dp <= 1:
                tails.append(sum(optim))
                continue
            group = costs.group(r)
            last, extra = [], []
            for s in stages:
                buckets = costs.bucket_sizes(s, n)
                kind = Kind.ALLREDUCE if c.dp_mode in ("ddp", "sync") else Kind.REDUCE_SCATTER
                k = len(buckets) - 1
                nb = costs.collective_bytes(kind, s, n, k)  # the bucket's bytes, or its codec's (grad_compression)
                last.append(costs.codec_time(kind, s, n, k) + (group.allreduce(nb) if kind is Kind.ALLREDUCE
                                                               else group.gather(nb)))
                # the all-gathers after the step: every bucket but the last is full-size
                extra.append((len(buckets) - 1) * group.gather(buckets[0]) + group.gather(buckets[-1])
                             if c.dp_mode in ("zero1", "zero2") else 0.0)
            tails.append(max(sum(optim), max(o + e for o, e in zip(optim, extra, strict=True)),
                             min(x + o + e for x, o, e in zip(last, optim, extra, strict=True))))
        found = self._dp[key] = tuple(tails)
        return found

    def _chains(self, c: PlanConfig, info: ShapeInfo) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per rank: the forward chain before its lowest stage (head) and the input-gradient chain below it (back)."""
        key = (c.tp, c.sp, c.microbatch_size, c.recompute, c.dp, info.placement, c.ep)
        found = self._paths.get(key)
        if found is not None:
            return found
        placement, n = info.placement, len(info.placement)
        st = self._stage_figs(c.tp, c.sp, c.microbatch_size, c.recompute, n, c.ep)
        costs = self.costs(c)
        p, nbytes = costs.parallel, self.space.model.boundary_bytes(c.microbatch_size) / c.tp
        head, back = [0.0] * n, [0.0] * n
        for s in range(1, n):
            a, b = placement[s - 1], placement[s]
            hop = 0.0 if a == b else costs.cluster.link_between(p.device(a), p.device(b)).time(nbytes)
            head[s] = head[s - 1] + st.f[s - 1] + hop
            back[s] = back[s - 1] + st.i[s - 1] + st.w[s - 1] + hop
        lows = [min(stages) for stages in info.rank_stages]
        found = self._paths[key] = (tuple(head[s] for s in lows), tuple(back[s] for s in lows))
        return found

    def _queue_terms(self, c: PlanConfig, info: ShapeInfo) -> tuple[tuple[float, float], ...]:
        """Per rank ``(a, b)``: its data-parallel communicator is busy at least ``a + m b`` seconds per step.

        The collectives of a rank's data-parallel group run one at a time (one queue, :mod:`sim.network`) and a
        flow never moves faster than its full speed, so each takes at least its own duration: per bucket of each
        of the rank's stages, ddp/sync one all-reduce, zero1 one reduce-scatter and one all-gather, zero2 a
        reduce-scatter per microbatch (every gradient pass) and one all-gather, zero3/fsdp a reduce-scatter per
        microbatch and an all-gather before its forward and before its backward (only the forward's when the
        parameters stay gathered, ``fsdp_reshard_after_forward`` off; W's gathers are not counted). Other
        modes: (0, 0).
        """
        key = (c.tp, c.pp, c.dp, c.dp_mode, info.placement, c.ep)
        found = self._queues.get(key)
        if found is not None:
            return found
        costs, n, mode = self.costs(c), len(info.placement), c.dp_mode
        terms = []
        for r, stages in enumerate(info.rank_stages):
            a = b = 0.0
            if c.dp > 1 and mode in ("ddp", "sync", "zero1", "zero2", "zero3", "fsdp"):
                group = costs.group(r)
                for s in stages:
                    for k in range(len(costs.bucket_sizes(s, n))):
                        if mode in ("ddp", "sync"):
                            a += costs.codec_time(Kind.ALLREDUCE, s, n, k) + group.allreduce(
                                costs.collective_bytes(Kind.ALLREDUCE, s, n, k))
                            continue
                        rs = costs.codec_time(Kind.REDUCE_SCATTER, s, n, k) + group.gather(
                            costs.collective_bytes(Kind.REDUCE_SCATTER, s, n, k))
                        ag = group.gather(costs.collective_bytes(Kind.ALL_GATHER, s, n, k))
                        if mode == "zero1":
                            a += rs + ag
                        elif mode == "zero2":
                            a, b = a + ag, b + rs
                        else:
                            b += rs + ag * (2 if costs.parallel.fsdp_reshard_after_forward else 1)
            terms.append((a, b))
        found = self._queues[key] = tuple(terms)
        return found

    def comm_floor(self, c: PlanConfig) -> float:
        """The step's floor from each rank's data-parallel communication: at least its communicator's busy time
        C, and, as compute runs 1 + kappa times slower while the rank communicates (the fair links'
        ``contention``, :mod:`sim.network`), at least its compute work W plus C kappa / (1 + kappa) (of W, at
        most C / (1 + kappa) is done while it communicates, the rest outside those C seconds)."""
        info, ranks = self._rank_figs(c)
        costs, m = self.costs(c), c.microbatches
        kappa = costs.compute_contention if costs.parallel.link_model == "fair" else 0.0
        best = 0.0
        for (a, b), w in zip(self._queue_terms(c, info), ranks.work, strict=True):
            comm = a + m * b
            best = max(best, comm, m * w + comm * kappa / (1.0 + kappa))
        return best

    def lower_bound(self, c: PlanConfig) -> float:
        """A step time no simulation of ``c`` can beat (see the module docstring)."""
        info, ranks = self._rank_figs(c)
        tails = self._dp_tails(c, info)
        head, back = self._chains(c, info)
        m = c.microbatches
        ends = [h + m * w for h, w in zip(head, ranks.work, strict=True)]
        best = max(max(e + t for e, t in zip(ends, tails, strict=True)), self.comm_floor(c))
        if info.full_backward:  # stage 0's last B follows every rank's last pass and the chain back to stage 0
            r0 = info.placement[0]
            ends[r0] = max(e + b for e, b in zip(ends, back, strict=True))
            best = max(best, ends[r0] + tails[r0])
        emb = self._embedding_tail(c, info)
        if emb is not None:
            a, b, t = emb
            best = max(best, max(ends[a], ends[b]) + t)
        return best

    def _embedding_tail(self, c: PlanConfig, info: ShapeInfo) -> tuple[int, int, float] | None:
        """The embedding gradient all-reduce (schedules.dp.modes): the ranks of the first and the last stage, and what
        follows the later of their last passes at least: the all-reduce, then on the first stage's rank all its
        optimizer steps (stage 0's is its first), on the last stage's the last stage's. None when there is none."""
        costs, n = self.costs(c), len(info.placement)
        a, b = info.placement[0], info.placement[-1]
        if a == b or not costs.parallel.embedding_sync(self.space.model.tied_embeddings):
            return None
        p = costs.parallel
        t = costs.embedding_allreduce(costs.cluster.link_between(p.device(a), p.device(b)))
        first = sum(costs.optim_time(s, n) for s in info.rank_stages[a])
        return a, b, t + max(first, costs.optim_time(n - 1, n))

    def tight_bound(self, c: PlanConfig, ct: CompiledTiming) -> float:
        """A step time no simulation of ``c`` can beat, from its schedule's own order (:func:`schedules.timing.compile_timing`).

        Every compute action starts once its rank's previous one and its inputs
        are done (a cross-rank input one message's alpha-beta time later, with
        no queueing); the step is at least each rank's last end plus its dp
        tail. At least :meth:`lower_bound`, and far tighter for the I/W
        schedules, whose bubble has no closed form.
        """
        info, _ = self._rank_figs(c)
        n = ct.num_stages
        st = self._stage_figs(c.tp, c.sp, c.microbatch_size, c.recompute, n, c.ep)
        costs = self.costs(c)
        overlap = costs.pair_overlap
        unit = {_F: st.f, _I: st.i, _W: st.w}
        durations = []
        for parts in ct.slots:
            times = [st.i[s] + st.w[s] if k is _B else unit[k][s] for k, s in parts]
            durations.append(times[0] if len(times) == 1 else sum(times) - overlap * min(times))
        p, nbytes = costs.parallel, self.space.model.boundary_bytes(c.microbatch_size) / c.tp
        hops = [0.0] * (1 + 2 * n)
        placement = info.placement
        for s in range(n - 1):
            a, b = placement[s], placement[s + 1]
            if a != b:
                hops[1 + 2 * s] = costs.cluster.link_between(p.device(a), p.device(b)).time(nbytes)
                hops[2 + 2 * s] = costs.cluster.link_between(p.device(b), p.device(a)).time(nbytes)
        if ct is not self._ends_of:
            self._ends_of, self._ends = ct, {}
        key = (tuple(durations), tuple(hops))
        ends = self._ends.get(key)
        if ends is None:
            ends = self._ends[key] = rank_ends(ct, durations, hops)
        tails = self._dp_tails(c, info)
        best = max(self.lower_bound(c), max(e + t for e, t in zip(ends, tails, strict=True)))
        emb = self._embedding_tail(c, info)
        if emb is not None:
            a, b, t = emb
            best = max(best, max(ends[a], ends[b]) + t)
        return best

    def recompute_time(self, c: PlanConfig) -> float:
        """Seconds per step the busiest rank spends recomputing (I with recomputation less I without)."""
        return c.microbatches * max(self._rank_figs(c)[1].recompute)
