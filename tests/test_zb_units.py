"""zb-auto in physical units: a memory limit in bytes as its activation budget, honoured by the simulated schedule."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import run_sim

from common.errors import ConfigError
from schedules import Kind, build
from schedules.library.zb_auto import makespan
from schedules.timing import evaluate
from sim.costs.cluster import cluster_preset
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer import TransformerConfig
from sim.costs.transformer_costs import TransformerCosts
from sim.plan.budget import activation_budget, parse_bytes, zb_auto_options
from sim.plan.study import Study, load_study, run_study

TINY = TransformerConfig(name="zb-tiny", layers=8, hidden=256, heads=4, vocab=1024, seq_len=128)
FORMS = ("a number of bytes (6e10) or a number with a unit: 60GB, 56GiB, 512MiB (units B, kB, MB, GB, TB, KiB, "
         "MiB, GiB, TiB)")


def _costs(pp: int = 4, mode: str = "none", dp: int = 1, **kw) -> TransformerCosts:
    return TransformerCosts(model=TINY, cluster=cluster_preset("dgx-h100:1"),
                            parallel=ParallelConfig(pp=pp, dp=dp, dp_mode=mode), **kw)


@pytest.mark.parametrize("text, size", [
    ("60GB", 60 * 10**9), ("56GiB", 56 * 2**30), ("6e10", 6e10), ("60 gb", 60e9), ("1.1GB", 1_100_000_000),
    ("512MiB", 512 * 2**20), ("1.5TB", 1.5e12), ("2TiB", 2 * 2**40), ("4096", 4096), ("3kB", 3000),
    ("1KiB", 1024), ("7B", 7), (" 80 GB ", 80e9), ("2.5e3MB", 2.5e9), (6e10, 6e10), (123, 123),
])
def test_sizes_in_bytes(text, size):
    """Decimal units are powers of 10, binary ones powers of 2, exactly (56GiB is not 56e9 x 1.0737...)."""
    assert parse_bytes(text) == float(size)


@pytest.mark.parametrize("text", ["60 G", "GB", "60GBs", "sixty", "", "1.2.3GB", ".", "nan", "inf", "60Gb/s", "-1GB"])
def test_bad_size_text_is_one_line_naming_it_and_the_forms(text):
    with pytest.raises(ConfigError) as e:
        parse_bytes(text)
    assert str(e.value) == f"mem_limit {text!r} is not a size in bytes; write {FORMS}"
    assert e.value.field == "mem_limit"


@pytest.mark.parametrize("value", [0, -5, "0GB", "1e400", float("nan"), True, None, [60]])
def test_sizes_that_are_not_positive_finite_numbers(value):
    with pytest.raises(ConfigError, match=r"^mem_limit must be a size in bytes(?: > 0)?, a number of bytes"):
        parse_bytes(value)


def _limit(costs: TransformerCosts, k: float) -> float:
    """The limit at which the tightest rank has exactly k M_B for activations."""
    pp = costs.parallel.pp
    return max(16 * costs.stage_params(r, pp) + k * costs.stage_activations(r, pp) for r in range(pp))


def test_budget_is_the_tightest_ranks_by_hand():
    """dp mode none: 16 bytes per parameter (2 weights, 2 gradients, 12 Adam) before any activation."""
    costs = _costs()
    b = activation_budget(costs, _limit(costs, 2.5))
    assert b.held == tuple(16 * costs.stage_params(r, 4) for r in range(4))
    assert b.microbatch_bytes == tuple(costs.stage_activations(r, 4) for r in range(4))
    assert b.mem_limit == pytest.approx(2.5, rel=1e-12)
    assert all((b.limit_bytes - h) / a >= b.mem_limit * (1 - 1e-12) for h, a in zip(b.held, b.microbatch_bytes, strict=True))
    # zero1 at dp=2 shards the optimizer states: 2 + 2 + 12/2 bytes per parameter
    sharded = activation_budget(_costs(mode="zero1", dp=2), b.limit_bytes)
    assert sharded.held == tuple(10 * costs.stage_params(r, 4) for r in range(4))
    assert sharded.mem_limit > b.mem_limit


def test_options_come_from_the_cost_model():
    costs = _costs()
    options, budget = zb_auto_options(costs, _limit(costs, 3), time_limit=0)
    assert (options.tf, options.tb, options.tw) == tuple(costs.pass_time(k, 2, 4) for k in (Kind.F, Kind.I, Kind.W))
    hop = costs.cluster.link_between(0, 1).time(2 * 128 * 256)  # a 16-bit activation over NVLink, one node
    assert options.tcomm == hop
    assert options.mw == TINY.w_held_fraction("none")
    assert options.time_limit == 0
    assert options.mem_limit == budget.mem_limit == pytest.approx(3, rel=1e-12)
    assert zb_auto_options(costs)[0].mem_limit is None and zb_auto_options(costs)[1] is None


KS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@pytest.fixture(scope="module")
def limited():
    costs = _costs()
    out = []
    for k in KS:
        study = Study(schedule="zb-auto", microbatches=8, costs=costs, mem_limit=_limit(costs, k), time_limit=0)
        out.append((study.activation_budget(), run_study(study)))
    return out


def test_the_limit_is_honoured_on_every_rank(limited):
    """The simulator's activation peak of the schedule built for a limit is within its budget on every rank, and
    states plus activations within the limit."""
    for budget, result in limited:
        for dev, allowed in zip(result.devices(), budget.activation_bytes, strict=True):
            assert dev.activation_bytes <= allowed * (1 + 1e-9)
            assert dev.memory_bytes <= budget.limit_bytes * (1 + 1e-9)
        assert result.sim.graph.schedule.params["mem_limit"] == budget.mem_limit


def test_a_tighter_limit_gives_no_more_memory_and_no_less_time(limited):
    """Memory, simulated: exactly monotone. Time: exactly monotone under the pass times zb-auto plans with (a middle
    stage's, the slowest hop); the simulator's step (first and last stages heavier, links shared) may differ by a
    hair: here 4 M_B's schedule is 2e-7 s faster than 6 M_B's, so the simulated step is checked to 1e-5."""
    peaks = [max(d.activation_bytes for d in r.devices()) for _, r in limited]
    planned = []
    for _, result in limited:
        o = result.study.schedule_options()
        planned.append(evaluate(result.sim.graph.schedule, o.tf, o.tb, o.tw, o.tcomm, o.mw).makespan)
    steps = [r.step_time for _, r in limited]
    assert peaks == sorted(peaks) and planned == sorted(planned, reverse=True)
    assert all(a >= b * (1 - 1e-5) for a, b in itertools.pairwise(steps))
    assert peaks[0] < peaks[-1] and steps[0] > 2 * steps[-1]  # the limit binds at 1 M_B, hardly at 6


def test_limit_below_the_model_states_is_refused_naming_both():
    costs = _costs()
    held = 16 * costs.stage_params(0, 4)
    with pytest.raises(ConfigError) as e:
        activation_budget(costs, 1000)
    assert str(e.value) == (f"mem_limit {1000 / 1e9:.6g} GB (1000 bytes) is not more than the {held / 1e9:.6g} GB "
                            f"({held:.6g} bytes) rank 0 holds before any activation (parameters, gradients and "
                            "optimizer states, dp mode none); raise the limit or shard the states (dp mode zero1/2/3)")
    assert e.value.field == "mem_limit"


def test_limit_under_one_microbatch_is_refused():
    costs = _costs()
    with pytest.raises(ConfigError, match=r"^mem_limit .* GB leaves rank \d .* GB for activations after its .* GB of "
                       r"model states, under the .* GB of the one microbatch any schedule holds between its F and I "
                       r"\(0\.5 M_B < 1\); raise the limit or use smaller microbatches$"):
        activation_budget(costs, _limit(costs, 0.5))


def test_a_limit_for_a_schedule_that_takes_none_is_refused():
    with pytest.raises(ConfigError, match=r"^study: mem_limit applies only to adaptive schedules \(zb-auto\), "
                       r"not to '1f1b'$"):
        Study(schedule="1f1b", microbatches=8, costs=_costs(), mem_limit="60GB")


def test_a_config_file_takes_the_limit(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\npreset = "gpt-6.2b"\n[cluster]\npreset = "dgx-h100:1"\n[parallel]\npp = 8\n'
                    '[run]\nschedule = "zb-auto"\nmicrobatches = 16\nmem_limit = "56GiB"\ntime_limit = 0\n')
    study = load_study(path)
    assert study.mem_limit == 56 * 2**30 and study.time_limit == 0
    path.write_text(path.read_text().replace('"56GiB"', '"56 G"'))
    with pytest.raises(ConfigError, match=r"^config \[run\]: mem_limit '56 G' is not a size in bytes; write a number"):
        load_study(path)


# ----------------------------------------------------------------------------------------------- the command line
UNITS = ("--schedule", "zb-auto", "--model", "gpt-6.2b", "--cluster", "dgx-h100:1", "--pp", "8",
         "--microbatches", "16", "--time-limit", "0")


def test_cli_takes_bytes_with_units_and_says_the_limit_used(capsys):
    code, out, _ = run_sim(capsys, *UNITS, "--mem-limit", "56GiB", "--json")
    assert code == 0
    d = json.loads(out)
    used = d["zb_auto_memory"]
    assert used["limit_bytes"] == 56 * 2**30 and used["rank"] == 0
    assert used["mem_limit_mb"] == pytest.approx((56 * 2**30 - d["devices"][0]["model_state_bytes"])
                                                 / used["microbatch_bytes_per_rank"][0], rel=1e-12)
    assert max(x["memory_bytes"] for x in d["devices"]) <= 56 * 2**30
    code, out, _ = run_sim(capsys, *UNITS, "--mem-limit", "60GB")
    assert code == 0
    assert "zb-auto memory limit 60,000,000,000 bytes (60 GB) per device = " in out


@pytest.mark.parametrize("argv, message", [
    (("--mem-limit", "60 G"), f"error: config [run]: mem_limit '60 G' is not a size in bytes; write {FORMS} (flag --mem-limit)"),
    (("--mem-limit", "4"), "error: mem_limit 4e-09 GB (4 bytes) is not more than the"),
    (("--time-limit", "-1"), "error: config [run]: time_limit must be a finite number of seconds >= 0, got -1.0 (flag "
                             "--time-limit)"),
])
def test_cli_refusals_are_one_line(capsys, argv, message):
    code, out, err = run_sim(capsys, *UNITS[:-2], *argv)
    assert code == 2 and not out
    assert err.startswith(message) and err.count("\n") == 1


def test_cli_refuses_a_limit_for_another_schedule_in_physical_units(capsys):
    code, _, err = run_sim(capsys, "--schedule", "1f1b", *UNITS[2:-2], "--mem-limit", "60GB")
    assert code == 2
    assert err == ("error: study: mem_limit applies only to adaptive schedules (zb-auto), not to '1f1b' "
                   "(flag --mem-limit)\n")


def test_unit_cost_path_is_unchanged(capsys):
    """With unit costs --mem-limit is M_B, as before: the same schedule as the library builds; bytes are refused."""
    code, out, _ = run_sim(capsys, "--schedule", "zb-auto", "--pp", "4", "--microbatches", "8", "--mem-limit", "2.5",
                           "--time-limit", "0", "--json")
    d = json.loads(out)
    s = build("zb-auto", pp=4, microbatches=8, mem_limit=2.5, time_limit=0)
    assert code == 0 and d["makespan"] == makespan(s, 1, 1, 1, 0)
    assert d["peak_activations"] <= 2.5 and "zb_auto_memory" not in d
    code, _, err = run_sim(capsys, "--schedule", "zb-auto", "--pp", "4", "--microbatches", "8", "--mem-limit", "60GB")
    assert code == 2
    assert err == ("error: --mem-limit '60GB': a size in bytes applies in physical units (--model/--cluster); with "
                   "unit costs the limit is activations per rank in M_B, a number such as 6\n")
