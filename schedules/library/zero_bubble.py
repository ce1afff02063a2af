"""Zero-bubble schedules: the backward split into I (input gradient) and W (weight gradient).

W of a microbatch may run any time after its I on the same stage, so W passes
fill what would otherwise be pipeline bubbles (Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024). Per-rank orders follow the ones
torch.distributed.pipelining generates for ScheduleInterleavedZeroBubble,
ScheduleZBVZeroBubble and ScheduleDualPipeV (tests compare them action by
action); the construction here is our own.
"""

from __future__ import annotations

from collections import defaultdict, deque

from common.errors import ScheduleError, check_multiple_of_pp
from schedules.ir import Action, Kind, Schedule
from schedules.library.looped import looped_placement
from schedules.registry import PipelineParams, make_schedule, register

__all__ = ["dualpipe_v", "interleaved_zb", "v_placement", "zb_h1", "zb_v"]


def v_placement(pp: int) -> tuple[int, ...]:
    """Stage -> rank for two chunks per rank in a V: rank r holds stages r and 2p-1-r."""
    return tuple(s if s < pp else 2 * pp - 1 - s for s in range(2 * pp))


class _Counters:
    """Next microbatch per (stage, kind): passes of one stage run microbatches in order."""

    def __init__(self) -> None:
        self.next: dict[tuple[int, Kind], int] = defaultdict(int)

    def take(self, stage: int, kind: Kind) -> Action:
        mb = self.next[(stage, kind)]
        self.next[(stage, kind)] = mb + 1
        return Action(kind, stage, mb)


def _zb1p_rank(p: int, m: int, v: int, rank: int) -> list[Action]:
    """One rank of ZB1P on the looped placement (v = 1: ZB-H1).

    The 1F1B skeleton of interleaved 1F1B, with one warm-up forward per hop
    instead of two: (v-1)p + (p-1-rank) warm-up forwards, then pairs of F and I
    (input gradient only). Rank r defers its first r W passes: W passes follow
    the I passes in the same order, r behind, and the deferred ones run at the
    end, filling the tail bubble. Rank r thus holds p - r activations plus r
    W-only remnants (M_W each) at its peak.
    """
    total = m * v
    per_round = p if v > 1 else m  # microbatches per round of the looped chunks
    warmup = min((v - 1) * per_round + (p - 1 - rank), total)

    def stage(k: int, backward: bool) -> int:
        chunk = (k // per_round) % v
        return ((v - 1 - chunk) if backward else chunk) * p + rank

    count = _Counters()
    prog = [count.take(stage(k, False), Kind.F) for k in range(warmup)]
    w_queue: deque[int] = deque()  # stages whose I ran and whose W is pending, in order
    for i in range(total):
        if warmup + i < total:
            prog.append(count.take(stage(warmup + i, False), Kind.F))
        s = stage(i, True)
        prog.append(count.take(s, Kind.I))
        w_queue.append(s)
        if i >= rank:
            prog.append(count.take(w_queue.popleft(), Kind.W))
    prog += [count.take(s, Kind.W) for s in w_queue]
    return prog


@register("zb-h1")
def zb_h1(params: PipelineParams) -> Schedule:
    """ZB-H1 (Qi et al. 2024): 1F1B with I/W split; bubble (p-1)(tf+tb-tw) at 1F1B's memory.

    Rank i (1-based) holds (p-i+1) M_B + (i-1) M_W at its peak.
    """
    p, m = params.pp, params.microbatches
    programs = [_zb1p_rank(p, m, 1, r) for r in range(p)]
    return make_schedule("zb-h1", params, programs)


@register("interleaved-zb", multi_chunk=True)
def interleaved_zb(params: PipelineParams) -> Schedule:
    """ZB1P on the looped placement (torch's ScheduleInterleavedZeroBubble): interleaved 1F1B with I/W."""
    p, m, v = params.pp, params.microbatches, params.chunks
    check_multiple_of_pp("interleaved-zb", p, m)
    programs = [_zb1p_rank(p, m, v, r) for r in range(p)]
    return make_schedule("interleaved-zb", params, programs, looped_placement(p, v))


def _zbv_rank(p: int, m: int, rank: int) -> list[Action]:
    """One rank of ZB-V (Qi et al. 2024, sec. 6): two chunks in a V, I/W split.

    Built for n = max(m, 2p-1) microbatches (the steady state needs at least
    2p-1 in flight), then the passes of microbatches >= m are dropped.
    """
    n = max(m, 2 * p - 1)
    c0, c1 = rank, 2 * p - 1 - rank  # down leg, up leg of the V
    count = _Counters()

    def F0() -> Action:
        return count.take(c0, Kind.F)

    def F1() -> Action:
        return count.take(c1, Kind.F)

    prog: list[Action] = []
    prog += [F0() for _ in range(2 * (p - rank) - 1)]  # fill the down leg
    for _ in range(rank):
        prog += [F1(), F0()]
    for _ in range(p - rank):  # first backwards of the up leg, W right behind
        prog += [F1(), count.take(c1, Kind.I), count.take(c1, Kind.W)]
    while count.next[(c1, Kind.F)] < count.next[(c0, Kind.F)] or count.next[(c0, Kind.F)] < n:
        if count.next[(c0, Kind.F)] < n:
            prog.append(F0())
        prog += [count.take(c0, Kind.I), count.take(c0, Kind.W)]
        prog += [F1(), count.take(c1, Kind.I), count.take(c1, Kind.W)]
    for _ in range(rank):  # cool down: input gradients first, weights later
        prog += [count.take(c0, Kind.I), count.take(c1, Kind.I)]
    for _ in range(p - rank):
        prog += [count.take(c0, Kind.I), count.take(c0, Kind.W)]
    for c in (c1, c0):
        while count.next[(c, Kind.W)] < count.next[(c, Kind.I)]:
            prog.append(count.take(c, Kind.W))
    return [a for a in prog if a.microbatch < m]


@register("zb-v", fixed_chunks=2)
def zb_v(params: PipelineParams) -> Schedule:
    """ZB-V (Qi et al. 2024): V placement with I/W split; zero bubble at p M_B when tf=tb=tw and m >= 2p-1."""
    p = params.pp
    programs = [_zbv_rank(p, params.microbatches, r) for r in range(p)]
    return make_schedule("zb-v", params, programs, v_placement(p))


class _DualPipeVRank:
    """Builds one rank's DualPipeV program (DeepSeek-V3 report, 2024; torch's ScheduleDualPipeV order).

    A backward is either full (B) or split (I now, W from a FIFO later); both
    advance the stage's backward counter. Overlapped pairs run the forward of
    one chunk with the backward of the other.
    """

    def __init__(self, p: int, rank: int) -> None:
        self.c0, self.c1 = rank, 2 * p - 1 - rank
        self.prog: list[Action] = []
        self.count = _Counters()
        self.w_fifo: deque[Action] = deque()

    def fwd(self, stage: int) -> Action:
        return self.count.take(stage, Kind.F)

    def bwd(self, stage: int, split: bool) -> Action:
        a = self.count.take(stage, Kind.I)  # B and I share the backward counter
        if split:
            self.w_fifo.append(Action(Kind.W, stage, a.microbatch))
            return a
        return Action(Kind.B, stage, a.microbatch)

    def emit(self, *actions: Action) -> None:
        self.prog.extend(actions)

    def overlap(self, f_stage: int, b_stage: int) -> None:
        pair = (self.fwd(f_stage), self.bwd(b_stage, split=False))
        self.prog.append(Action(Kind.OVERLAP_F_B, -1, None, pair))

    def weight(self) -> None:
        if self.w_fifo:
            self.prog.append(self.w_fifo.popleft())


def _dualpipev_rank(p: int, m: int, rank: int) -> list[Action]:
    b = _DualPipeVRank(p, rank)
    c0, c1 = b.c0, b.c1
    for _ in range(2 * (p - rank - 1)):
        b.emit(b.fwd(c0))
    for _ in range(rank + 1):
        b.emit(b.fwd(c0), b.fwd(c1))
    for _ in range(p - rank - 1):
        b.emit(b.bwd(c1, split=True))
        b.weight()
        b.emit(b.fwd(c1))
    for i in range(m - 2 * p + rank + 1):  # steady state: overlapped F/B pairs across the two chunks
        if i == 0 and rank == p - 1:
            b.emit(b.fwd(c0), b.bwd(c1, split=False))
        else:
            b.overlap(c0, c1)
        b.overlap(c1, c0)
    for _ in range(p - rank - 1):
        b.emit(b.bwd(c1, split=False))
        b.overlap(c1, c0)
    split = False  # from the middle of this phase on, backwards split to let W fill the tail
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        b.emit(b.bwd(c1, split))
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        b.emit(b.bwd(c0, split))
    for _ in range(p - rank - 1):
        b.weight()
        b.emit(b.bwd(c0, split))
    for _ in range(rank + 1):
        b.weight()
    return b.prog


@register("dualpipe-v", fixed_chunks=2)
def dualpipe_v(params: PipelineParams) -> Schedule:
    """DualPipeV (DeepSeek-V3, 2024): V placement, overlapped forward/backward pairs of the two chunks."""
    p, m = params.pp, params.microbatches
    if m < 2 * p:
        raise ScheduleError(f"dualpipe-v needs microbatches >= 2*pp = {2 * p} (one per stage), got {m}")
    programs = [_dualpipev_rank(p, m, r) for r in range(p)]
    return make_schedule("dualpipe-v", params, programs, v_placement(p))

