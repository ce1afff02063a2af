"""combined-1f1b: Megatron-Core's EP A2A overlap (``--overlap-moe-expert-parallel-comm``) as a schedule.

Its programs (Megatron-LM's own order: one more warm-up forward than interleaved 1F1B, then every steady-state
forward and backward one overlapped pair), its rules, what the pairs save in the simulator (hand arithmetic
from the passes' segments), the planner searching it for a MoE model, and the Megatron-LM line, checked by
megatron-core's own TransformerConfig.
"""

from __future__ import annotations

import dataclasses
import shlex
import warnings

import pytest
import torch

from analysis.plan.exports import plan_layout, plan_schedule
from analysis.plan.megatron import FLAG_SOURCES, megatron_script
from common.errors import ConfigError, ScheduleError
from schedules import Kind, build, validate
from sim import UniformCosts, simulate
from sim.costs.cluster import cluster_preset
from sim.costs.moe import two_stream_time
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.space import PlanConfig, PlanSpace, enumerate_configs
from tests.test_plan_moe import MOE


def _text(sched) -> list[str]:
    return [" ".join(map(str, prog)) for prog in sched.programs]


def test_pp1_is_megatrons_no_pipelining_order():
    """combined_1f1b_schedule_for_no_pipelining: F0, then (F i+1; B i), then the last B."""
    assert _text(build("combined-1f1b", pp=1, microbatches=4)) == [
        "0F0 (0F1;0B0)OVERLAP_F_B (0F2;0B1)OVERLAP_F_B (0F3;0B2)OVERLAP_F_B 0B3"]


def test_pp2_is_interleaved_1f1b_with_one_more_warmup_forward_and_pairs():
    """Rank r warms up with (v-1)p + 2(p-1-r) + 1 forwards (get_pp_rank_microbatches), then pairs each
    steady-state forward with its backward, in interleaved 1F1B's order."""
    inter = build("interleaved-1f1b", pp=2, microbatches=4, chunks=2)
    comb = build("combined-1f1b", pp=2, microbatches=4, chunks=2)
    assert comb.stage_to_rank == inter.stage_to_rank == (0, 1, 0, 1)
    assert _text(comb) == [
        "0F0 0F1 2F0 2F1 0F2 (0F3;2B0)OVERLAP_F_B (2F2;2B1)OVERLAP_F_B (2F3;0B0)OVERLAP_F_B 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 (3F1;3B0)OVERLAP_F_B (1F2;3B1)OVERLAP_F_B (1F3;1B0)OVERLAP_F_B (3F2;1B1)OVERLAP_F_B "
        "(3F3;3B2)OVERLAP_F_B 3B3 1B2 1B3"]
    for c, i in zip(comb.programs, inter.programs, strict=True):  # the same passes, forwards and backwards each
        flat = [a for x in c for a in x.parts()]                      # in interleaved 1F1B's order
        for kind in (Kind.F, Kind.B):
            assert [a for a in flat if a.kind is kind] == [a for a in i if a.kind is kind]
    validate(comb)  # no pair's backward waits for its own forward: each pair is independent (no cycle)


def test_rules_are_one_line_each():
    with pytest.raises(ScheduleError, match=r"combined-1f1b: pp 2 needs chunks >= 2 .*give chunks 2 or more, or pp 1"):
        build("combined-1f1b", pp=2, microbatches=4)
    with pytest.raises(ScheduleError, match="multiple of"):
        build("combined-1f1b", pp=2, microbatches=3, chunks=2)


@pytest.mark.parametrize("times", [(1.0, 2.0, 0.5), (1.0, 1.0, 1.0), (2.0, 1.0, 0.0)])
def test_closed_forms(times):
    """Pairs at their sum: interleaved 1F1B's bubble, (p-1)(tf+tb+tw)/v (0 at pp 1), and one more chunk's
    activations held on rank 0 than interleaved 1F1B's p + (p-1)/v: p + p/v microbatches (at most m)."""
    tf, tb, tw = times
    for p, vs in ((1, (1, 2, 3)), (2, (2, 3)), (3, (2, 4)), (4, (2, 4)), (6, (2,))):
        for v in vs:
            for m in (p, 2 * p, 3 * p):
                r = simulate(build("combined-1f1b", pp=p, microbatches=m, chunks=v), UniformCosts(tf=tf, tb=tb, tw=tw))
                assert r.makespan == pytest.approx((m + (p - 1) / v) * (tf + tb + tw)), (p, m, v)
                assert r.ranks[0].peak_activations == pytest.approx(min(p + p / v, m)), (p, m, v)


def test_uniform_pairs_cost_their_sum_unless_an_overlap_is_given():
    """Without all-to-alls a pair is its two passes; pp 1: 4 F + 4 B in any order."""
    sched = build("combined-1f1b", pp=1, microbatches=4)
    assert simulate(sched, UniformCosts(tf=1.0, tb=2.0, tw=0.0)).makespan == pytest.approx(12.0)
    assert simulate(sched, UniformCosts(tf=1.0, tb=2.0, tw=0.0, pair_overlap=0.5)).makespan == pytest.approx(10.5)


def _moe_costs(ep: int) -> TransformerCosts:
    return TransformerCosts(model=MOE, cluster=cluster_preset("dgx-h100:1"),
                            parallel=ParallelConfig(pp=1, dp=8, ep=ep, dp_mode="none"), microbatch_size=1)


def test_pairs_save_what_the_two_streams_hide():
    """pp 1, m 4, dp mode none (no collectives, no optimizer task): the step is F + 3 pairs + B, and each pair lasts the two-stream
    makespan of the forward's and the backward's segments (sim.costs.moe.two_stream_time), less than their sum
    by the all-to-all time hidden under the other's compute."""
    costs = _moe_costs(ep=8)
    f, b = costs.pass_time(Kind.F, 0, 1), costs.pass_time(Kind.B, 0, 1)
    pair = two_stream_time([costs.segments(Kind.F, 0, 1), costs.segments(Kind.B, 0, 1)])
    assert costs.all_to_all_time() > 0 and pair < f + b
    step = simulate(build("combined-1f1b", pp=1, microbatches=4), costs).makespan
    plain = simulate(build("1f1b", pp=1, microbatches=4), costs).makespan
    assert step == pytest.approx(f + 3 * pair + b, rel=1e-9)
    assert plain == pytest.approx(4 * (f + b), rel=1e-9)
    assert plain - step == pytest.approx(3 * (f + b - pair), rel=1e-9)


def test_the_planner_searches_it_for_a_moe_model_only():
    space = PlanSpace(model=MOE, cluster=cluster_preset("dgx-h100:1"), global_batch=16, chunks=(2,),
                      dp_modes=("zero1",), recompute=("none",), ep=(2,))
    found = {(c.pp, c.chunks) for c in enumerate_configs(space) if c.schedule == "combined-1f1b"}
    assert (1, 1) in found and (2, 2) in found and (2, 1) not in found
    pp1 = next(c for c in enumerate_configs(space) if c.schedule == "combined-1f1b" and c.pp == 1)
    assert pp1.pipeline == "combined-1f1b" and pp1.label().endswith("combined-1f1b m2x1 zero1 rc-none")
    dense = dataclasses.replace(MOE, name="dense", moe=None)
    assert "combined-1f1b" not in PlanSpace(model=dense, cluster=cluster_preset("dgx-h100:1"),
                                            global_batch=16).schedule_names
    assert "combined-1f1b" not in dataclasses.replace(space, ep=(1,)).schedule_names


def _line(c: PlanConfig) -> str:
    return megatron_script(c, MOE, 16, plan_layout(c, MOE, plan_schedule(c))).splitlines()[-1]


def _megatron_config(line: str):
    """megatron-core's TransformerConfig from the line's flags (its own __post_init__ checks them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig

    words = shlex.split(line)
    flags = {w[2:].replace("-", "_"): (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--")
                                       else True) for i, w in enumerate(words) if w.startswith("--")}
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    kw = {k: (int(v) if isinstance(v, str) and v.isdigit() else v) for k, v in flags.items() if k in fields}
    kw["num_moe_experts"] = int(flags["num_experts"])
    kw["moe_grouped_gemm"] = False  # needs the grouped_gemm kernels, which a CPU lacks; no rule of the overlap's
    kw["params_dtype"] = kw["pipeline_dtype"] = torch.bfloat16  # what Megatron-LM's --bf16 sets
    if "pipeline_model_parallel_layout" in flags:  # Megatron-LM derives the virtual stages from the layout
        stages = flags.pop("pipeline_model_parallel_layout").count("|") + 1
        kw.pop("pipeline_model_parallel_layout", None)
        vp = stages // kw["pipeline_model_parallel_size"]
        kw["virtual_pipeline_model_parallel_size"] = vp if vp > 1 else None
    return TransformerConfig(**kw)


@pytest.mark.parametrize("layout", [(1, 1, 8), (2, 2, 4)])
def test_the_megatron_line_is_what_megatron_core_accepts(layout):
    pp, v, dp = layout
    c = PlanConfig(1, pp, dp, "combined-1f1b", v, 1, 16 // dp, "zero1", "none", False, 2)
    line = _line(c)
    assert "--overlap-moe-expert-parallel-comm" in shlex.split(line)
    assert {t for t in shlex.split(line) if t.startswith("--")} <= set(FLAG_SOURCES)
    config = _megatron_config(line)
    assert config.overlap_moe_expert_parallel_comm and config.expert_model_parallel_size == 2
    assert config.virtual_pipeline_model_parallel_size == (v if pp > 1 else None)


def test_what_megatron_core_refuses_is_refused_first_in_one_line():
    """ep 1 and full recomputation: megatron-core asserts; the export says so before writing anything."""
    c = PlanConfig(1, 1, 8, "combined-1f1b", 1, 1, 2, "zero1", "none", False, 2)
    with pytest.raises(AssertionError, match="only supported with expert model parallelism"):
        _megatron_config(_line(c).replace("--expert-model-parallel-size 2", "--expert-model-parallel-size 1"))
    with pytest.raises(ConfigError, match=r"needs expert parallelism \(ep > 1\), got ep 1"):
        _line(c._replace(ep=1))
    with pytest.raises(ConfigError, match="refuses full recomputation; use recompute none or selective"):
        _line(c._replace(recompute="full"))
