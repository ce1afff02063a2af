"""``schedlab plan --against LAYOUT``: a named layout parsed, simulated as the planner's candidates and explained."""

from __future__ import annotations

import pytest

from analysis.cli.plan import plan_main
from analysis.plan.report import why_against
from schedules import ConfigError
from sim.costs.cluster import cluster_preset
from sim.costs.transformer import model_preset
from sim.plan.against import in_space, parse_layout, simulate_layout
from sim.plan.search import plan
from sim.plan.space import PlanConfig, PlanSpace

# gpt-tiny on 4 CPU cores (a constant 0.6 of peak: no fitted device curve in these figures), limit 32 MB
SPACE = PlanSpace(model=model_preset("gpt-tiny"), cluster=cluster_preset("cpu-host:2"), global_batch=8,
                  schedules=("1f1b", "gpipe"), dp_modes=("ddp", "zero1"), memory_limit=0.032e9)


@pytest.fixture(scope="module")
def best():
    return plan(SPACE, top=2, workers=1).top[0]


def _why(best, text: str) -> str:
    c = parse_layout(text, SPACE)
    return why_against(best, simulate_layout(c, SPACE), SPACE.capacity, in_space(c, SPACE))


def test_both_spellings_of_a_layout_read_alike():
    label = "tp2+sp pp2 dp1 gpipe m8x1 rc-selective"
    assert parse_layout(label, SPACE) == parse_layout("tp2,sp,pp2,dp1,gpipe,mb8x1,rc-selective", SPACE) == \
        PlanConfig(2, 2, 1, "gpipe", 1, 1, 8, "none", "selective", True)
    assert parse_layout(label, SPACE).label() == "tp2+sp pp2 dp1 gpipe m8x1 none rc-selective"
    assert parse_layout("zero3 m2x1 1f1b dp4 pp1 tp1", SPACE).dp_mode == "fsdp"  # any order; zero3 is fsdp


def test_why_best_beats_a_pipeline_layout(best):
    """A 4-stage GPipe with full recomputation against #1 (pp1 dp4 zero1): the bubble, the sends and the
    recomputation make the difference; compute without recomputation is the same work."""
    assert _why(best, "tp1 pp4 dp1 gpipe m8x1 rc-full").splitlines() == [
        "why #1 beats LAYOUT (0.1403 s per step, 47.41% of LAYOUT's step):",
        "  #1 tp1 pp1 dp4 no-pipeline m2x1 zero1 rc-none",
        "  LAYOUT tp1 pp4 dp1 gpipe m8x1 none rc-full",
        "                                        #1 s     LAYOUT s  LAYOUT - #1",
        "  step time                           0.1556       0.2959      +0.1403",
        "  bubble (idle per rank)              0.0064       0.1017      +0.0953",
        "  exposed communication               0.0064       0.0519      +0.0455",
        "  recomputation (busiest rank)        0.0000       0.0454      +0.0454",
        "  compute without recomputation       0.1492       0.1488      -0.0004",
        "  LAYOUT fits: peak memory 0.0216 GB per device <= the limit 0.032 GB (#1: 0.0305 GB)"]


def test_a_layout_that_does_not_fit_or_was_not_searched_says_so(best):
    lines = _why(best, "tp1,pp1,dp4,gpipe,mb1x2,sync").splitlines()
    assert lines[0] == "why #1 beats LAYOUT (0.0073 s per step, 4.45% of LAYOUT's step):"
    assert lines[-2:] == [
        "  LAYOUT does NOT fit: peak memory 0.0679 GB per device > the limit 0.032 GB (#1: 0.0305 GB)",
        "  LAYOUT is outside the searched space (schedule gpipe at pp 1, where the planner runs no-pipeline (each "
        "microbatch's forward and backward in turn), dp mode sync)"]
    for named in ("no-pipeline", "1f1b"):  # at pp 1 the accumulation loop is 1F1B's order on one rank
        assert _why(best, f"tp1 pp1 dp4 {named} m2x1 zero1") == \
            "LAYOUT is the planner's #1: tp1 pp1 dp4 no-pipeline m2x1 zero1 rc-none"


@pytest.mark.parametrize(("text", "why"), [
    ("tp1 pp4 dp1 gpipe", "gives no mMxB (microbatches x size); e.g. 'tp8+sp pp16 dp64 interleaved-1f1b v8 m32x1 "
                          "zero2 rc-none'"),
    ("tp1 pp4 dp2 gpipe m4x1 ddp", "tp x pp x dp = 8 devices, the cluster has 4"),
    ("tp1 pp4 dp1 gpipe m4x1", "dp x microbatches x size = 4 sequences, the global batch is 8"),
    ("tp1 pp4 dp1 foo m8x1", "token 'foo' is none of: tpN[+sp], sp, ppN, dpN, a schedule, vN, mMxB, a dp mode, "
                             "rc-MODE"),
    ("tp1 pp1 dp4 1f1b m2x1", "dp 4 needs a data-parallel mode: one of sync, ddp, zero1, zero2, fsdp, ps"),
    ("tp1 pp1 dp4 1f1b m2x1 none", "dp mode none at dp 4: 'none' is the mode of dp 1 only"),
    ("tp1 tp2 pp4 dp1 gpipe m8x1", "'tp2' gives tp a second time"),
    ("tp1 pp4 dp1 gpipe m8x1 rc-most", "unknown recompute 'most'; valid: none, selective, full, selective-op, "
                                       "layer:N (N >= 1: every N-th layer in full)"),
    ("tp1+sp pp4 dp1 gpipe m8x1", "sequence parallelism needs tp > 1"),
    ("tp1 pp4 dp1 gpipe v2 m8x1", "gpipe takes v in 1, not 2"),
])
def test_bad_layouts_are_one_line_errors(text, why):
    with pytest.raises(ConfigError) as info:
        parse_layout(text, SPACE)
    assert str(info.value) == f"plan: --against {text!r}: {why}"


def test_cli_refuses_a_bad_layout_before_the_search(capsys, tmp_path):
    with pytest.raises(SystemExit) as info:
        plan_main(["--model", "gpt-tiny", "--cluster", "cpu-host:2", "--global-batch", "8", "--out", str(tmp_path),
                   "--against", "tp1 pp4 dp1 gpipe m4x1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == ("error: plan: --against 'tp1 pp4 dp1 gpipe m4x1': dp x microbatches x size = 4 sequences, "
                   "the global batch is 8\n")
    assert list(tmp_path.iterdir()) == []


def test_fp32_gradient_reductions_cost_memory_and_wire_time_in_the_plan():
    """--reduce-dtype fp32 (Llama 3's setting): the same layout holds 2 more bytes per gradient (ddp keeps
    whole gradients: 2 x its parameters more) and sends twice the gradient bytes, so it is no faster."""
    import dataclasses
    c = parse_layout("tp1 pp1 dp4 1f1b m2x1 ddp rc-none", SPACE)
    fp32 = dataclasses.replace(SPACE, reduce_dtype="fp32")
    a, b = simulate_layout(c, SPACE), simulate_layout(c, fp32)
    params = SPACE.model.params
    assert b.peak_memory_bytes - a.peak_memory_bytes == pytest.approx(2 * params, rel=1e-9)
    assert b.exposed_comm > a.exposed_comm and b.step_time > a.step_time
    with pytest.raises(ConfigError, match="unknown reduce dtype 'fp16'; valid: bf16, fp32"):
        dataclasses.replace(SPACE, reduce_dtype="fp16")
