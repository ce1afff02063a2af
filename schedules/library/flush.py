"""Synchronous-flush schedules with one stage per rank: GPipe and 1F1B.

Stage s lives on rank s. With uniform costs and no communication delay both
have bubble ratio (p-1)/(m+p-1); they differ in activation memory.
"""

from __future__ import annotations

from schedules.ir import Action, Kind, Schedule
from schedules.registry import PipelineParams, make_schedule, register

__all__ = ["gpipe", "one_f_one_b"]


@register("gpipe")
def gpipe(params: PipelineParams) -> Schedule:
    """GPipe (Huang et al. 2019): all forwards, then all backwards; holds m microbatches."""
    m = params.microbatches
    programs = [
        [Action(Kind.F, r, mb) for mb in range(m)] + [Action(Kind.B, r, mb) for mb in range(m)]
        for r in range(params.pp)
    ]
    return make_schedule("gpipe", params, programs)


@register("1f1b")
def one_f_one_b(params: PipelineParams) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021): warm up, alternate, cool down; rank r holds p-r."""
    p, m = params.pp, params.microbatches
    programs = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        prog = [Action(Kind.F, r, mb) for mb in range(warmup)]
        for i in range(m - warmup):
            prog += [Action(Kind.F, r, warmup + i), Action(Kind.B, r, i)]
        prog += [Action(Kind.B, r, mb) for mb in range(m - warmup, m)]
        programs.append(prog)
    return make_schedule("1f1b", params, programs)
