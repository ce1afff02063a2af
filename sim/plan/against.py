"""A named layout on the planner's question: parsed from the plan table's row label, simulated as the planner would.

``schedlab plan ... --against LAYOUT`` compares the planner's best with a layout
someone trained with (e.g. Meta's Llama 3 405B layout). ``LAYOUT`` is the plan
table's row label (:meth:`PlanConfig.label`), its tokens separated by spaces or
commas, in any order::

    tp8+sp pp16 dp64 interleaved-1f1b v8 m32x1 zero2 rc-none
    tp8,sp,pp16,dp64,interleaved-1f1b,v8,mb32x1,zero2,rc-none

``tpN`` (``+sp`` or a separate ``sp`` for sequence parallelism), ``ppN``,
``dpN``, a registered schedule (or a merged row's ``gpipe/1f1b``: its first,
the one exported; ``no-pipeline`` at pp 1, the accumulation loop the planner runs there), ``mMxB`` (or ``mbMxB``: M microbatches of B
sequences), and a data-parallel mode are required; ``vN`` (default 1) and
``rc-MODE`` (default none) are optional. The layout must use the space's
devices (tp x pp x dp) and global batch (dp x M x B); it may lie outside the
searched choices (another schedule, dp mode, recomputation), which the report
says.
"""

from __future__ import annotations

import re

from common.errors import ConfigError, quote
from schedules.registry import lookup
from sim.costs.recompute_modes import check_recompute
from sim.plan.bounds import Bounds
from sim.plan.search import PlanEntry, entry_of
from sim.plan.space import (
    _PLAN_ALIASES,
    _PLANNABLE,
    ACCUMULATION,
    EXPERT_OVERLAP,
    NO_PIPELINE,
    PlanConfig,
    PlanSpace,
    chunk_choices,
    ep_choices,
    shape_ok,
    tp_choices,
)
from sim.plan.study import Study, run_study

__all__ = ["in_space", "parse_layout", "simulate_layout"]

_FORMS = "tpN[+sp], sp, ppN, dpN, a schedule, vN, mMxB, a dp mode, rc-MODE"
_NUMBERED = {"tp": re.compile(r"tp(\d+)(\+sp)?"), "pp": re.compile(r"pp(\d+)"), "dp": re.compile(r"dp(\d+)"), "ep": re.compile(r"ep(\d+)"),
             "chunks": re.compile(r"v(\d+)"), "batch": re.compile(r"mb?(\d+)x(\d+)")}


def _fail(text: str, why: str) -> ConfigError:
    return ConfigError(f"plan: --against {quote(text)}: {why}", field="against")


def _tokens(text: str) -> dict[str, object]:
    """Each token of ``text`` read into its field; an unknown or repeated token is refused."""
    got: dict[str, object] = {}

    def put(key: str, value: object, token: str) -> None:
        if key in got:
            raise _fail(text, f"{quote(token)} gives {key} a second time")
        got[key] = value

    for token in (t for t in re.split(r"[\s,]+", text.strip()) if t):
        low = token.lower()
        match = next(((k, m) for k, rx in _NUMBERED.items() if (m := rx.fullmatch(low))), None)
        if match is not None:
            key, m = match
            if key == "batch":
                put("batch", (int(m.group(1)), int(m.group(2))), token)
            else:
                put(key, int(m.group(1)), token)
                if key == "tp" and m.group(2):
                    put("sp", True, token)
        elif low in ("sp", "+sp"):
            put("sp", True, token)
        elif low.startswith("rc-"):
            try:
                put("recompute", check_recompute("plan", low[3:]), token)
            except ConfigError as exc:
                raise _fail(text, str(exc).removeprefix("plan: ")) from None
        elif low in (*_PLANNABLE, *_PLAN_ALIASES, "none"):
            put("dp_mode", _PLAN_ALIASES.get(low, low), token)
        elif low == NO_PIPELINE:
            put("schedule", NO_PIPELINE, token)
        elif lookup(low) is not None:
            put("schedule", lookup(low).name, token)
        elif "/" in low and all(lookup(x) is not None for x in low.split("/")):
            put("schedule", lookup(low.split("/")[0]).name, token)  # a merged row: its first, the one exported
        else:
            raise _fail(text, f"token {quote(token)} is none of: {_FORMS}")
    return got


def parse_layout(text: str, space: PlanSpace) -> PlanConfig:
    """``text`` as a configuration of ``space`` (module docstring); one-line ConfigError for bad input."""
    got = _tokens(text)
    missing = [k for k in ("tp", "pp", "dp", "schedule", "batch") if k not in got]
    if missing:
        names = {"batch": "mMxB (microbatches x size)"}
        raise _fail(text, f"gives no {', '.join(names.get(k, k) for k in missing)}; e.g. "
                          "'tp8+sp pp16 dp64 interleaved-1f1b v8 m32x1 zero2 rc-none'")
    tp, pp, dp, (m, b) = got["tp"], got["pp"], got["dp"], got["batch"]
    if min(tp, pp, dp, m, b, got.get("chunks", 1)) < 1:
        raise _fail(text, "every degree and count must be at least 1")
    if tp * pp * dp != space.devices:
        raise _fail(text, f"tp x pp x dp = {tp * pp * dp:,} devices, the cluster has {space.devices:,}")
    if dp * m * b != space.global_batch:
        raise _fail(text, f"dp x microbatches x size = {dp * m * b:,} sequences, the global batch is "
                          f"{space.global_batch:,}")
    if tp not in tp_choices(space.model, space.cluster):
        raise _fail(text, f"tp {tp} does not split {space.model.name} within a node; valid: "
                          f"{', '.join(map(str, tp_choices(space.model, space.cluster)))}")
    mode = got.get("dp_mode", "none" if dp == 1 else None)
    if mode is None:
        raise _fail(text, f"dp {dp} needs a data-parallel mode: one of {', '.join(_PLANNABLE)}")
    if (mode == "none") != (dp == 1):
        raise _fail(text, f"dp mode {mode} at dp {dp}: 'none' is the mode of dp 1 only")
    schedule = got["schedule"]
    if schedule == NO_PIPELINE:
        if pp != 1 or got.get("chunks", 1) != 1:
            raise _fail(text, f"{NO_PIPELINE} is the layout of pp 1 with v 1 (got pp {pp}, v {got.get('chunks', 1)}); "
                              "name a schedule for pp > 1")
        schedule = ACCUMULATION
    ep = got.get("ep", 1)
    if ep > 1 and (space.model.moe is None or dp % ep or space.model.moe.experts % ep):
        raise _fail(text, f"ep {ep} must divide dp {dp} and a MoE model's experts"
                          + ("" if space.model.moe is None else f" ({space.model.moe.experts})"))
    return _shape(text, space, PlanConfig(tp, pp, dp, schedule, got.get("chunks", 1), b, m, mode,
                                          got.get("recompute", "none"), got.get("sp", False), ep))


def _shape(text: str, space: PlanSpace, c: PlanConfig) -> PlanConfig:
    if c.sp and c.tp == 1:
        raise _fail(text, "sequence parallelism needs tp > 1")
    valid = chunk_choices(c.schedule, (c.chunks,))
    if c.chunks not in valid:
        raise _fail(text, f"{c.schedule} takes v in {', '.join(map(str, chunk_choices(c.schedule, range(1, 17))))}, "
                          f"not {c.chunks}")
    layers = space.model.layers
    if c.pp * c.chunks > layers and c.pp * c.chunks != layers + 2:
        raise _fail(text, f"pp x v = {c.pp * c.chunks} stages for {layers} layers (at most {layers}, or {layers + 2} "
                          "with the embedding and the output alone)")
    if not shape_ok(c.schedule, c.pp, c.microbatches, c.chunks):
        raise _fail(text, f"{c.schedule} does not take pp {c.pp}, {c.microbatches} microbatches, v {c.chunks}")
    return c


def in_space(c: PlanConfig, space: PlanSpace) -> list[str]:
    """The choices of ``c`` that the search did not try (empty: ``c`` is one of its candidates)."""
    out = []
    searched_pp1 = (c.schedule, c.chunks) == (ACCUMULATION, 1) or (
        c.chunks == 1 and c.schedule in EXPERT_OVERLAP and c.schedule in space.schedule_names)
    if c.pp == 1 and not searched_pp1:
        out.append(f"schedule {c.schedule}{f' v{c.chunks}' if c.chunks > 1 else ''} at pp 1, where the planner runs "
                   f"{NO_PIPELINE} (each microbatch's forward and backward in turn)"
                   + (" and combined-1f1b for a MoE model with ep > 1" if space.model.moe is not None else ""))
    elif c.pp > 1 and c.schedule not in space.schedule_names:
        out.append(f"schedule {c.schedule}")
    if c.pp > 1 and c.chunks > 1 and c.chunks not in chunk_choices(c.schedule, space.chunks):
        out.append(f"v {c.chunks}")
    if c.dp > 1 and c.dp_mode not in space.dp_modes:
        out.append(f"dp mode {c.dp_mode}")
    if c.recompute not in space.recompute:
        out.append(f"recompute {c.recompute}")
    if space.microbatch_sizes is not None and c.microbatch_size not in space.microbatch_sizes:
        out.append(f"microbatch size {c.microbatch_size}")
    for key in ("tp", "pp"):
        allowed = getattr(space, key)
        if allowed is not None and getattr(c, key) not in allowed:
            out.append(f"{key} {getattr(c, key)}")
    if c.tp > 1 and c.sp not in space.sp:
        out.append("sp " + ("on" if c.sp else "off"))
    if c.ep not in ep_choices(space, c.dp):
        out.append(f"ep {c.ep}")
    return out


def simulate_layout(c: PlanConfig, space: PlanSpace) -> PlanEntry:
    """``c`` simulated with the costs the planner gives its candidates, whether or not it fits in memory."""
    bounds = Bounds(space)
    study = Study(schedule=c.schedule, microbatches=c.microbatches, costs=bounds.costs(c), chunks=c.chunks)
    return entry_of(c, run_study(study), bounds, bounds.lower_bound(c))
