"""Multi-chunk schedules on the looped placement: interleaved 1F1B and looped BFS.

Rank r holds v chunks, stages r, r+p, ..., r+(v-1)p (stage s on rank s mod p),
so every microbatch loops through the ranks v times.
"""

from __future__ import annotations

from common.errors import check_multiple_of_pp
from schedules.ir import Action, Kind, Schedule
from schedules.registry import PipelineParams, make_schedule, register

__all__ = ["interleaved_1f1b", "looped_bfs", "looped_placement"]


def looped_placement(pp: int, chunks: int) -> tuple[int, ...]:
    """Stage -> rank on the looped placement: stage s on rank s mod p."""
    return tuple(s % pp for s in range(pp * chunks))


def _looped_schedule(name: str, params: PipelineParams, programs: list[list[Action]]) -> Schedule:
    return make_schedule(name, params, programs, looped_placement(params.pp, params.chunks))


@register("interleaved-1f1b", multi_chunk=True)
def interleaved_1f1b(params: PipelineParams) -> Schedule:
    """Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021): depth-first over v looped chunks.

    Microbatches go through the chunks in rounds of p. Rank r first runs
    (v-1)p + 2(p-1-r) warm-up forwards, so rank 0 holds (v+1)p-1 chunk
    activations of M_B/v each: p + (p-1)/v microbatches' worth, the published
    figure. Bubble time with uniform costs is (p-1)(t_f+t_b+t_w)/v.
    """
    p, m, v = params.pp, params.microbatches, params.chunks
    check_multiple_of_pp("interleaved-1f1b", p, m)
    total = m * v  # chunk passes per rank in each direction

    def work(k: int, backward: bool) -> tuple[int, int]:
        # k-th chunk pass of a direction: rounds of p microbatches cycle through the chunks.
        chunk = (k // p) % v
        mb = (k // (p * v)) * p + k % p
        return ((v - 1 - chunk) if backward else chunk), mb

    programs = []
    for r in range(p):
        warmup = min((v - 1) * p + 2 * (p - 1 - r), total)

        def fwd(k: int, r: int = r) -> Action:
            chunk, mb = work(k, backward=False)
            return Action(Kind.F, chunk * p + r, mb)

        def bwd(k: int, r: int = r) -> Action:
            chunk, mb = work(k, backward=True)
            return Action(Kind.B, chunk * p + r, mb)

        prog = [fwd(k) for k in range(warmup)]
        for i in range(total - warmup):
            prog += [fwd(warmup + i), bwd(i)]
        prog += [bwd(i) for i in range(total - warmup, total)]
        programs.append(prog)
    return _looped_schedule("interleaved-1f1b", params, programs)


@register("looped-bfs", multi_chunk=True)
def looped_bfs(params: PipelineParams) -> Schedule:
    """Looped BFS (Lamy-Poirier 2023, "Breadth-First Pipeline Parallelism"): all microbatches chunk by chunk.

    Forwards run chunk 0..v-1, each over every microbatch; backwards run the
    chunks in reverse, microbatches last-first (torch's ScheduleLoopedBFS order).
    Every rank holds all m microbatches at its peak.
    """
    p, m = params.pp, params.microbatches
    programs = []
    for r in range(p):
        stages = [c * p + r for c in range(params.chunks)]
        prog = [Action(Kind.F, s, mb) for s in stages for mb in range(m)]
        prog += [Action(Kind.B, s, mb) for s in reversed(stages) for mb in reversed(range(m))]
        programs.append(prog)
    return _looped_schedule("looped-bfs", params, programs)
