"""schedlab plan merges exact ties: schedules that run the same order at a layout are one row, exported as the simplest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.plan.exports import plan_schedule
from analysis.plan.report import format_plan, why_against
from common.errors import ConfigError
from schedules import build
from schedules.interop.torch_csv import write_torch_csv
from sim.costs.cluster import cluster_preset
from sim.costs.transformer import TransformerConfig
from sim.plan.against import in_space, parse_layout, simulate_layout
from sim.plan.search import order_digest, plan
from sim.plan.space import PlanSpace

ROOT = Path(__file__).resolve().parents[1]
TINY = TransformerConfig(name="plan-tiny", layers=4, hidden=256, heads=4, vocab=1024, seq_len=128)
FLUSH = ("1f1b", "gpipe", "zb-h1", "zb-h2")


def _space(**kw) -> PlanSpace:
    base = dict(model=TINY, cluster=cluster_preset("dgx-h100:1"), global_batch=8, schedules=FLUSH, tp=(1,), pp=(1,),
                recompute=("none",), dp_modes=("ddp",))
    return PlanSpace(**{**base, **kw})


def _figures(e) -> tuple:
    return (e.step_time, e.tokens_per_s, e.mfu, e.peak_memory_bytes, e.bubble_ratio, e.exposed_comm, e.recompute_time)


@pytest.fixture(scope="module")
def m1():
    """pp=2, dp=4, one sequence per replica: m=1, where gpipe and 1f1b are both F0 B0 on each rank, zb-h1 and zb-h2
    both F0 I0 W0."""
    return plan(_space(pp=(2,), global_batch=4), top=5, workers=1)


def test_schedules_with_one_order_are_one_row(m1):
    assert [(e.config.schedule, e.same_as) for e in m1.top] == [("zb-h1", ("zb-h2",)), ("gpipe", ("1f1b",))]
    assert m1.simulated == 4 and m1.merged == 2 and len(m1.entries) == 2
    for e in m1.top:
        assert e.config.pp == 2 and e.config.microbatches == 1
        assert e.tie_reason() == (f"{e.schedule_label}: the same order on every rank at m=1, so the same "
                                  f"simulation; {e.config.schedule}, the simplest, is exported")


def test_a_merged_row_stands_for_identical_simulations(m1):
    """Each schedule a row stands for, simulated on its own as --against does: the same figures, bit for bit."""
    for e in m1.top:
        alone = [simulate_layout(c, m1.space) for c in e.tied_configs()]
        assert {_figures(a) for a in alone} == {_figures(e)}
        assert {a.order for a in alone} == {e.order}


def test_the_top_k_holds_distinct_plans():
    """With m=2 at pp=2 gpipe and 1f1b are different orders (gpipe's last rank holds 2 microbatches, 1f1b's one):
    two rows (zb-h1 and zb-h2 are still one order there), and the top K never lists one order twice."""
    result = plan(_space(pp=(2,), global_batch=8, microbatch_sizes=(1,)), top=5, workers=1)
    assert sorted((e.config.schedule, e.same_as) for e in result.top) == \
        [("1f1b", ()), ("gpipe", ()), ("zb-h1", ("zb-h2",))] and result.merged == 1
    gpipe, f1b = (next(e for e in result.top if e.config.schedule == n) for n in ("gpipe", "1f1b"))
    assert gpipe.peak_memory_bytes > f1b.peak_memory_bytes
    wide = plan(_space(schedules=None, pp=(1, 2), global_batch=8, chunks=(2,)), top=8, workers=1)
    keys = [(e.config._replace(schedule=""), e.order) for e in wide.top]
    assert len(keys) == len(set(keys)) == 8 and wide.merged > 0


def test_the_table_names_the_schedules_and_why(m1):
    text = format_plan(m1)
    assert " gpipe/1f1b " in text and " zb-h1/zb-h2 " in text
    assert ", 2 exact ties merged (the same order under another name), in " in text
    assert "merged rows (exact ties):\n  #1: " in text


def test_the_export_is_the_simplest_schedule(m1, tmp_path):
    e = next(e for e in m1.top if e.same_as)
    assert plan_schedule(e.config).programs == build(e.config.schedule, pp=2, microbatches=1).programs
    assert order_digest(build("1f1b", pp=2, microbatches=1)) == order_digest(build("gpipe", pp=2, microbatches=1))
    path = write_torch_csv(plan_schedule(e.config), tmp_path / "s.csv")
    assert path.read_text() == write_torch_csv(build(e.same_as[0], pp=2, microbatches=1), tmp_path / "t.csv").read_text()


def test_against_a_merged_row(m1):
    """A merged row's label reads back as its first schedule; a layout naming a tied schedule is the #1."""
    best = m1.top[0]
    other = best.same_as[0]
    label = best.config.label().replace(f" {best.config.schedule} ", f" {best.schedule_label} ")
    assert parse_layout(label, m1.space) == best.config
    layout = parse_layout(best.config.label().replace(f" {best.config.schedule} ", f" {other} "), m1.space)
    assert layout.schedule == other
    text = why_against(best, simulate_layout(layout, m1.space), m1.space.capacity, [])
    assert text == (f"LAYOUT is the planner's #1: {layout.label()} runs the same order as #1's "
                    f"{best.config.schedule} ({best.tie_reason()})")


def test_cli_says_which_schedule_it_exported(tmp_path):
    argv = [sys.executable, "-m", "analysis", "plan", "--model", "gpt-tiny", "--cluster", "dgx-h100:1",
            "--global-batch", "8", "--schedules", "gpipe,1f1b", "--dp-modes", "zero1", "--workers", "1",
            "--no-progress", "--out", str(tmp_path)]
    r = subprocess.run([*argv, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [(x["config"]["schedule"], x["same_as"], x["config"]["microbatches"], x["config"]["pp"]) for x in d["top"]] \
        == [("gpipe", ["1f1b"], 1, 2), ("no-pipeline", [], 1, 1), ("gpipe", ["1f1b"], 1, 4), ("no-pipeline", [], 1, 1),
            ("gpipe", ["1f1b"], 1, 2)]  # every row has m=1: one order at any pp; pp 1 runs no pipeline
    assert d["exported_schedule"] == "gpipe" and d["merged"] > 0
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert "\nexports: #1 is gpipe/1f1b: the same order on every rank at m=1, so the same simulation; gpipe, the " \
           "simplest, is exported\n" in r.stdout


def test_pp1_runs_no_pipeline_schedule():
    """At pp=1 one layout is one row, named no-pipeline: the accumulation loop (1F1B's order on one rank), whatever
    the schedules searched; its label reads back for --against, and a pipeline schedule there is outside the space."""
    space = _space(schedules=("gpipe", "zb-h1", "interleaved-1f1b"), chunks=(2,), global_batch=16,
                   microbatch_sizes=(1, 2))
    result = plan(space, top=5, workers=1)
    assert [(e.config.schedule, e.config.chunks, e.config.microbatches, e.schedule_label) for e in result.top] == \
        [("1f1b", 1, 1, "no-pipeline"), ("1f1b", 1, 2, "no-pipeline")]
    best = result.top[0]
    assert best.config.label() == "tp1 pp1 dp8 no-pipeline m1x2 ddp rc-none"
    assert best.to_dict()["config"]["schedule"] == "no-pipeline" and best.to_dict()["same_as"] == []
    assert format_plan(result).splitlines()[4].startswith(" 1   1   -   1    8 no-pipeline       1       1x2 ddp    none ")
    assert parse_layout(best.config.label(), space) == best.config
    gpipe = parse_layout("tp1 pp1 dp8 gpipe m2x1 ddp", space)
    assert in_space(gpipe, space) == ["schedule gpipe at pp 1, where the planner runs no-pipeline (each microbatch's "
                                      "forward and backward in turn)"]
    with pytest.raises(ConfigError, match=r"^plan: --against 'tp1 pp2 dp4 no-pipeline m4x1 ddp': no-pipeline is the "
                                          r"layout of pp 1 with v 1 \(got pp 2, v 1\); name a schedule for pp > 1$"):
        parse_layout("tp1 pp2 dp4 no-pipeline m4x1 ddp", space)
