"""An idea of one's own: 1F1B with the backward split into I and W, rank r's W passes held back r + 1 slots.

Holding W back frees the critical path (a rank's I is all the previous rank waits for) at the cost of memory:
the activations a W needs stay until it runs. Used by docs/your-schedule.md.
"""

from schedules import Action, Kind, PipelineParams, build, make_schedule, register


@register("1f1b-lazyw", summary="1F1B with I/W split, rank r's W held back r+1 slots")
def lazyw(params: PipelineParams):
    base = build("1f1b", pp=params.pp, microbatches=params.microbatches)
    programs = []
    for r, prog in enumerate(base.programs):
        out, held = [], []
        for a in prog:
            if a.kind is Kind.B:  # B = I + W: run I now, W later
                out.append(Action(Kind.I, a.stage, a.microbatch))
                held.append(Action(Kind.W, a.stage, a.microbatch))
                if len(held) > r + 1:
                    out.append(held.pop(0))
            else:
                out.append(a)
        programs.append(out + held)
    return make_schedule("1f1b-lazyw", params, programs)


def too_lazy(params: PipelineParams):
    """A mistake to show the checks: every W moved before its own I."""
    good = lazyw(params)
    programs = [[Action(Kind.W, a.stage, a.microbatch) if a.kind is Kind.I else
                 Action(Kind.I, a.stage, a.microbatch) if a.kind is Kind.W else a for a in prog]
                for prog in good.programs]
    return make_schedule("too-lazy", params, programs)
