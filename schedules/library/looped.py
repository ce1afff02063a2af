"""Multi-chunk schedules on the looped placement: interleaved 1F1B, its combined (EP A2A overlap) form, looped BFS.

Rank r holds v chunks, stages r, r+p, ..., r+(v-1)p (stage s on rank s mod p),
so every microbatch loops through the ranks v times.
"""

from __future__ import annotations

from common.errors import ScheduleError, check_multiple_of_pp
from schedules.ir import Action, Kind, Schedule
from schedules.registry import PipelineParams, make_schedule, register

__all__ = ["combined_1f1b", "interleaved_1f1b", "looped_bfs", "looped_placement"]


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
    return _looped_schedule("interleaved-1f1b", params, _interleaved_programs(params, combined=False))


def _interleaved_programs(params: PipelineParams, combined: bool) -> list[list[Action]]:
    """Each rank's interleaved 1F1B program; ``combined``: one more warm-up forward, and every steady-state
    forward and backward one OVERLAP_F_B pair (:func:`combined_1f1b`)."""
    p, m, v = params.pp, params.microbatches, params.chunks
    check_multiple_of_pp("combined-1f1b" if combined else "interleaved-1f1b", p, m)
    total = m * v  # chunk passes per rank in each direction

    def work(k: int, backward: bool) -> tuple[int, int]:
        # k-th chunk pass of a direction: rounds of p microbatches cycle through the chunks.
        chunk = (k // p) % v
        mb = (k // (p * v)) * p + k % p
        return ((v - 1 - chunk) if backward else chunk), mb

    programs = []
    for r in range(p):
        warmup = min((v - 1) * p + 2 * (p - 1 - r) + combined, total)

        def fwd(k: int, r: int = r) -> Action:
            chunk, mb = work(k, backward=False)
            return Action(Kind.F, chunk * p + r, mb)

        def bwd(k: int, r: int = r) -> Action:
            chunk, mb = work(k, backward=True)
            return Action(Kind.B, chunk * p + r, mb)

        prog = [fwd(k) for k in range(warmup)]
        for i in range(total - warmup):
            steady = (fwd(warmup + i), bwd(i))
            prog += [Action(Kind.OVERLAP_F_B, -1, None, steady)] if combined else list(steady)
        prog += [bwd(i) for i in range(total - warmup, total)]
        programs.append(prog)
    return programs


@register("combined-1f1b", any_chunks=True)
def combined_1f1b(params: PipelineParams) -> Schedule:
    """Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``, its "EP A2A overlap"): interleaved
    1F1B whose steady-state forward and backward run as one overlapped pair, so that one microbatch's expert
    all-to-alls hide behind the other's compute.

    Megatron-LM megatron/core/pipeline_parallel/schedules.py (d98e8a64dd), ``get_pp_rank_microbatches``: one
    warm-up forward more than interleaved 1F1B, "to ensure the forward and backward computations are independent
    in all 1f1b steps"; then each step's forward and backward are one ``combined_forward_backward_step``
    (combined_1f1b.py). With pp 1 (``combined_1f1b_schedule_for_no_pipelining``): F0, then (F1;B0) ... (F m-1;
    B m-2), then B m-1. Megatron needs virtual stages when pp > 1 (transformer_config.py: "virtual_pipeline_
    model_parallel_size must be specified when pipeline_model_parallel_size > 1"): so does this.
    """
    if params.pp > 1 and params.chunks < 2:
        raise ScheduleError(f"combined-1f1b: pp {params.pp} needs chunks >= 2 (Megatron-Core's EP A2A overlap "
                            "runs on interleaved 1F1B when pp > 1); give chunks 2 or more, or pp 1")
    return _looped_schedule("combined-1f1b", params, _interleaved_programs(params, combined=True))


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
