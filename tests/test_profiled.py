"""The profiled cost model: a cost file in, exactly its durations out; the --costs flag; a real tiny profile."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from schedules import CostFileError, Kind, build, load_graph, lower, validate
from schedules.dp.modes import add_data_parallel
from sim import simulate
from sim.costs.cost_file import load_profile
from sim.costs.param_copy import ParamCopy
from sim.costs.profiled import PROFILE_SCHEMA, ProfiledCosts, step_time
from tests.conftest import run_sim

ROOT = Path(__file__).resolve().parents[1]

# Two partitions; every number distinct so a mix-up of stage or kind shows.
STAGES2 = [
    {"stage": 0, "layers": [0, 3], "param_bytes": 1000, "F": {"median": 0.011}, "B": {"median": 0.021},
     "I": {"median": 0.013}, "W": {"median": 0.017}, "OPTIM": {"median": 0.005}},
    {"stage": 1, "layers": [3, 6], "param_bytes": 2000, "F": 0.031, "B": 0.041, "I": 0.033, "W": 0.037,
     "OPTIM": 0.007},
]
STAGES4 = [
    {"stage": s, "layers": [s, s + 1], "F": 0.001 * (s + 1), "B": 0.002 * (s + 1), "I": 0.0015 * (s + 1),
     "W": 0.0007 * (s + 1), "OPTIM": 0.0001 * (s + 1)}
    for s in range(4)
]
PROFILE = {
    "schema": PROFILE_SCHEMA, "activation_bytes": 4096, "task_overhead": {"median": 0.0002},
    "step_overhead": {"median": 0.003}, "p2p": {"alpha": 0.0001, "beta": 1e8},
    "partitions": [{"num_stages": 2, "stages": STAGES2}, {"num_stages": 4, "stages": STAGES4}],
}


@pytest.fixture
def profile_path(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    return path


def _median(v) -> float:
    return v["median"] if isinstance(v, dict) else v


# The fixture's 1F1B at pp=2 by hand: a pass costs its median + the 0.0002 task overhead, a message
# alpha + n / beta. Stage 1 is the slower one, so it runs its F and B back to back for every microbatch.
F0, B0 = 0.011 + 0.0002, 0.021 + 0.0002  # stage 0: 0.0112, 0.0212
F1, B1 = 0.031 + 0.0002, 0.041 + 0.0002  # stage 1: 0.0312, 0.0412
SEND = 0.0001 + 4096 / 1e8  # 0.00014096


def _1f1b_makespan(m: int) -> float:
    """0F0, its message, stage 1's m (F + B) back to back, the last gradient's message, 0B(m-1)."""
    return F0 + SEND + m * (F1 + B1) + SEND + B0


@pytest.mark.parametrize("schedule,stages", [("1f1b", STAGES2), ("zb-h1", STAGES2), ("interleaved-1f1b", STAGES4),
                                             ("zb-v", STAGES4)])
def test_durations_are_the_files(profile_path, schedule, stages):
    graph = validate(load_graph(schedule, pp=2, microbatches=4))
    costs = load_profile(profile_path, graph.schedule.num_stages)
    got = costs.durations(graph)
    for task, d in zip(graph.tasks, got, strict=True):
        a = task.action
        if a.kind in (Kind.F, Kind.B, Kind.I, Kind.W):
            assert d == pytest.approx(_median(stages[a.stage][a.kind.value]) + 0.0002, rel=1e-12, abs=0)
        elif a.kind in (Kind.SEND_F, Kind.SEND_B):
            assert d == pytest.approx(0.0001 + 4096 / 1e8, rel=1e-12)  # alpha + n / beta
            assert costs.bytes(task, graph) == 4096
        else:
            assert d == 0.0


def test_step_time_adds_slowest_ranks_optimizer_and_overhead(profile_path):
    graph = validate(load_graph("1f1b", pp=2, microbatches=4))
    costs = load_profile(profile_path, 2)
    result = simulate(graph, costs)
    # Rank 0 ends with 0B3 at the makespan, 0.0112 + 0.00014096 + 4 * 0.0724 + 0.00014096 + 0.0212 = 0.32228192;
    # rank 1 with 1B3, one message and 0B3 earlier: 0.32228192 - 0.00014096 - 0.0212 = 0.30094096.
    assert result.makespan == pytest.approx(_1f1b_makespan(4), rel=1e-12)
    assert [r.last_end for r in result.ranks] == pytest.approx([0.32228192, 0.30094096], rel=1e-12)
    ends = [r.last_end + (0.005, 0.007)[r.rank] for r in result.ranks]  # + each rank's OPTIM
    assert ends == pytest.approx([0.32728192, 0.30794096], rel=1e-12)
    # The slowest rank's end + the step overhead: 0.32728192 + 0.003.
    assert step_time(result, costs) == pytest.approx(0.33028192, rel=1e-12)


def test_uneven_stages_make_1f1b_slower_than_even(profile_path, tmp_path):
    """Stage 1 three times slower than stage 0: the pipeline runs at stage 1's pace."""
    costs = load_profile(profile_path, 2)
    result = simulate(validate(lower(build("1f1b", pp=2, microbatches=8))), costs)
    per_mb = _median(STAGES2[1]["F"]) + _median(STAGES2[1]["B"]) + 2 * 0.0002  # 0.031 + 0.041 + 0.0004 = 0.0724
    assert per_mb == pytest.approx(F1 + B1, rel=1e-12)
    # Stage 1's 8 microbatches back to back, plus the pipeline's fill and drain on stage 0 and two messages:
    # 0.0112 + 0.00014096 + 8 * 0.0724 + 0.00014096 + 0.0212 = 0.61188192.
    assert result.makespan == pytest.approx(_1f1b_makespan(8), rel=1e-12)
    assert result.makespan == pytest.approx(0.61188192, rel=1e-12)


def test_optim_and_overlap_durations(profile_path):
    costs = load_profile(profile_path, 4)
    graph = validate(load_graph("dualpipe-v", pp=2, microbatches=4))
    for task, d in zip(graph.tasks, costs.durations(graph), strict=True):
        if task.action.sub_actions is not None:
            parts = sum(_median(STAGES4[a.stage][a.kind.value]) for a in task.action.sub_actions)
            assert d == pytest.approx(parts + 0.0002, rel=1e-12)


def test_stage_count_mismatch_and_bad_files(profile_path, tmp_path):
    with pytest.raises(CostFileError, match="partitions of 2, 4 stages, not 3"):
        load_profile(profile_path, 3)
    costs = load_profile(profile_path, 2)
    with pytest.raises(CostFileError, match="profiles 2 stages but schedule 'zb-v' has 4"):
        costs.check(load_graph("zb-v", pp=2, microbatches=4))
    with pytest.raises(CostFileError, match="not found"):
        load_profile(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    for text, message in (("{", "not readable JSON"), ('{"schema": "x"}', "schema must be"),
                          (json.dumps({**PROFILE, "partitions": []}), "non-empty list"),
                          (json.dumps({**PROFILE, "partitions": [{"num_stages": 2, "stages": [{"F": 1}]}]}),
                           "must list that many stages"),
                          (json.dumps({**PROFILE, "partitions": [{"num_stages": 1, "stages": [{"stage": 0, "F": "x"}]}]}),
                           "F must be a number")):
        bad.write_text(text)
        with pytest.raises(CostFileError, match=message):
            load_profile(bad)
    with pytest.raises(CostFileError, match="p2p_beta must be a bandwidth"):
        ProfiledCosts(stages=costs.stages, p2p_beta=0.0)


def test_cli_costs(profile_path, capsys):
    code, out, err = run_sim(capsys, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs",
                             str(profile_path), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["costs"]["model"] == "profiled"
    # As test_step_time_adds_slowest_ranks_optimizer_and_overhead: makespan 0.32228192, rank 0's end + its
    # OPTIM 0.005 + the step overhead 0.003 = 0.33028192.
    assert d["makespan"] == pytest.approx(0.32228192, rel=1e-12)
    assert d["step_time"] == pytest.approx(0.33028192, rel=1e-12)
    code, out, err = run_sim(capsys, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs",
                             str(profile_path))
    assert code == 0 and "step time" in out


def test_null_bandwidth_is_size_independent(profile_path, tmp_path, capsys):
    """A fitted bandwidth of inf is stored as null (JSON has no inf): messages cost alpha, the JSON output stays
    strict, and the profiler's fit yields it when time does not grow with the size."""
    from real.profile.comm import _fit_alpha_beta, _json_bandwidth

    alpha, beta, warned = _fit_alpha_beta([1e3, 1e6], [2e-4, 1e-4], "p2p")
    assert (alpha, beta, _json_bandwidth(beta)) == (1e-4, math.inf, None)
    assert warned == ["p2p.beta: the time did not grow with the size (slope -1e-10 s/byte over 2 size(s), "
                      "1000-1000000 bytes, 0.0001-0.0002 s); bandwidth taken as infinite (null) and p2p.alpha as the "
                      "fastest time, 0.0001 s"]
    data = json.loads(profile_path.read_text())
    data["p2p"]["beta"] = None
    path = tmp_path / "null.json"
    path.write_text(json.dumps(data))
    costs = load_profile(path, 2)
    assert costs.p2p_beta == math.inf and costs.message_time(4096) == 0.0001
    code, out, err = run_sim(capsys, "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--costs",
                             str(path), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["costs"]["p2p_beta"] is None
    # As the fixture's 1F1B but each message is alpha = 0.0001 alone.
    send = 0.0001
    assert d["makespan"] == pytest.approx(F0 + send + 4 * (F1 + B1) + send + B0, rel=1e-12)
    del data["p2p"]["beta"]
    path.write_text(json.dumps(data))
    with pytest.raises(CostFileError, match=r"p2p\.beta is missing: give a bandwidth > 0 bytes/s, or null"):
        load_profile(path, 2)


@pytest.mark.parametrize("argv,message", [
    (["--pp", "3"], "profiles partitions of 2, 4 stages, not 3"),
    (["--costs-file", "missing"], "not found"),
    (["--costs-file", "malformed"], "not readable JSON"),
    (["--model", "gpt-1.3b"], "does not combine"),
])
def test_cli_costs_errors_one_line_exit_2(profile_path, tmp_path, capsys, argv, message):
    path = {"missing": tmp_path / "no.json", "malformed": tmp_path / "m.json"}
    (tmp_path / "m.json").write_text("[1,")
    args = {"--schedule": "1f1b", "--pp": "2", "--microbatches": "4", "--costs": str(profile_path)}
    if argv[0] == "--costs-file":
        args["--costs"] = str(path[argv[1]])
    elif argv[0] != "--model":
        args[argv[0]] = argv[1]
    flat = [x for kv in args.items() for x in kv] + (argv if argv[0] == "--model" else [])
    code, out, err = run_sim(capsys, *flat)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.timeout(120)  # a torchrun launch: a hang guard, with room for a loaded CI machine
def test_tiny_real_profile_loads_and_simulates(tmp_path):
    """Two gloo processes profile a tiny model; the file loads and predicts a finite positive step time."""
    from real.dp.compress import PROFILED
    from real.launch import torchrun

    out = tmp_path / "p.json"
    proc = torchrun(2, ["-m", "real.profile", "--layers", "2", "--dim", "16", "--seq", "8", "--stages", "2,4",
                        "--microbatch-size", "2", "--reps", "3", "--warmup", "1", "--out", str(out)],
                    timeout=100, capture=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["schema"] == PROFILE_SCHEMA and data["machine"]["world_size"] == 2
    # Bounds, not values: these are timings measured on this machine, different on every run.
    # beta is null when the fitted time did not grow with the size (noise on a loaded machine): it reads as inf.
    assert data["p2p"]["alpha"] >= 0 and (data["p2p"]["beta"] is None or data["p2p"]["beta"] > 0)
    assert list(data["codecs"]) == list(PROFILED) and all(math.isfinite(v) and v >= 0 for v in data["codecs"].values())
    for schedule in ("1f1b", "zb-v"):
        graph = validate(load_graph(schedule, pp=2, microbatches=4))
        costs = load_profile(out, graph.schedule.num_stages)
        t = step_time(simulate(graph, costs), costs)
        assert math.isfinite(t) and t > 0


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_data_parallel_profile_times_collectives_in_bursts(tmp_path):
    """--dp 2: every collective is fitted per member of a burst issued as the runtime issues its buckets, with the
    one-at-a-time timings kept; the passes are timed alone and with a bucket's all-reduce in flight
    (comm_slowdown); the file prices a bucketed ddp graph, its compute stretched by that factor."""
    from analysis.validation.dp_modes import measured_hooks
    from real.launch import torchrun
    from real.profile.comm import BURST
    from schedules.dp.codecs import powersgd_messages

    out = tmp_path / "p.json"
    proc = torchrun(2, ["-m", "real.profile", "--layers", "2", "--dim", "16", "--seq", "8", "--stages", "1", "--dp", "2",
                        "--pp", "1", "--microbatch-size", "2", "--reps", "3", "--warmup", "1", "--bucket-mb", "0.01",
                        "--out", str(out)], timeout=130, capture=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    colls, slow = data["collectives"], data["comm_slowdown"]
    assert slow["bucket_bytes"] == int(0.01 * 2**20) // 8 * 8 and slow["in_flight"] >= 2
    assert slow["factor"] == sum(slow["with_collective"][k]["median"] for k in "FBIW") / sum(
        slow["alone"][k]["median"] for k in "FBIW")
    assert all(slow[side][k]["n"] == 6 for side in ("alone", "with_collective") for k in "FBIW")  # 3 reps x 2 ranks
    assert set(colls) == {"all_reduce", "reduce_scatter", "all_gather"}
    for c in colls.values():
        assert c["burst"] == BURST and len(c["sizes"]) == len(c["single"]["sizes"]) == 2
        assert c["alpha"] >= 0 and c["single"]["alpha"] >= 0
    # zero2/zero3's reduce-scatter hook (real.profile.hook): timed on the run's own buckets (real.dp.sync.make_buckets
    # of the stage's parameters at --bucket-mb, each padded to a multiple of dp), per flat gradient byte
    hook = data["reduce_hook"]
    assert hook["bucket_bytes"] == _bucket_bytes(data["model"], 0.01, 2) and hook["cpu"]["n"] == 6
    assert hook["ns_per_byte"] == hook["cpu"]["median"] / sum(hook["bucket_bytes"]) * 1e9 > 0
    # PowerSGD's hooks (real.profile.powersgd) on the same buckets: per bucket torch's three messages, the hook's
    # compute (alone) and wall (on the dp group) over 3 reps x 2 ranks; the small all-reduce fit over those sizes
    assert list(data["powersgd"]) == ["powersgd:4"]
    for spec, psgd in data["powersgd"].items():
        assert psgd["bucket_bytes"] == hook["bucket_bytes"]
        assert [b["messages"] for b in psgd["buckets"]] == [
            [4 * n for n in powersgd_messages(s, int(spec[9:]))] for s in _bucket_shapes(data["model"], 0.01)]
        assert all(b[k]["n"] == 6 and b[k]["median"] >= 0 for b in psgd["buckets"] for k in ("compute", "wall"))
        assert psgd["wall"] == sum(b["wall"]["median"] for b in psgd["buckets"])
        # and launched from inside a real backward of the stage (real.profile.psgd_backward): what is charged
        inside = psgd["in_backward"]
        assert inside["buckets"] == len(psgd["buckets"]) and inside["hooks"]["n"] == inside["extra"]["n"] == 6
        assert inside["hooks"]["median"] > 0
        assert measured_hooks(out, spec, len(psgd["buckets"])) == inside["hooks"]["median"]
    # decentralized's and local-sgd's parameter copies (real.profile.param_copy): the runtime's PeerSync on the same
    # buckets, per parameter byte (no padding), 3 reps x 2 ranks each; loaded as sim.costs.param_copy.ParamCopy
    copy = data["param_copy"]
    assert sum(copy["bucket_bytes"]) == sum(4 * math.prod(s) for b in _bucket_shapes(data["model"], 0.01) for s in b)
    for key, clock in (("flatten", "wall"), ("average", "wall"), ("local_sgd", "cpu")):  # local-sgd's wall: all-reduce
        assert copy["cpu"][key]["n"] == 6 and set(copy["wall"]) == {"flatten", "average"}
        assert copy[f"{key}_ns_per_byte"] == copy[clock][key]["median"] / sum(copy["bucket_bytes"]) * 1e9 > 0
    assert load_profile(out, 1).param_copy == ParamCopy(copy["flatten_ns_per_byte"], copy["average_ns_per_byte"],
                                                        copy["local_sgd_ns_per_byte"])
    small = colls["all_reduce"]["small"]
    assert [r["bytes"] for r in small["sizes"]] == sorted({n for p in data["powersgd"].values()
                                                          for b in p["buckets"] for n in b["messages"] if n})
    assert small["alpha"] >= 0 and all(r["n"] == 6 for r in small["sizes"])
    graph = validate(add_data_parallel(lower(build("gpipe", pp=1, microbatches=2)), "ddp", [3]))
    costs = load_profile(out, 1)
    assert costs.comm_slowdown == slow["factor"] and costs.reduce_hook_ns_per_byte == hook["ns_per_byte"]
    # an overlapped pair's two parts in two threads against the two in turn (real.profile.pair), per stage
    pair = data["pair_threads"]
    assert len(pair["serial"]) == len(pair["paired"]) == 1 and pair["reps"] == 3
    assert pair["factor"] == sum(pair["paired"]) / sum(pair["serial"]) > 0 and costs.pair_share == pair["factor"]
    # ps's server update (real.profile.server): rank 0 alone (3 samples), the optimizer step on every rank (6)
    row = data["partitions"][0]["stages"][0]
    assert (row["SERVER_UPDATE"]["n"], row["OPTIM"]["n"]) == (3, 6)
    assert costs.stages[0].server_update == row["SERVER_UPDATE"]["median"] > 0
    t = step_time(simulate(graph, costs), costs)
    assert math.isfinite(t) and t > 0


def _bucket_shapes(model: dict, bucket_mb: float) -> list[list[tuple[int, ...]]]:
    """The parameter shapes of each of the runtime's buckets of the whole model (one stage)."""
    from real.config import ModelConfig
    from real.dp.sync import make_buckets
    from real.models import build_layers

    cfg = ModelConfig(**model)
    params = [p for layer in build_layers(cfg, 0, range(cfg.num_layers)) for p in layer.parameters()]
    return [[tuple(p.shape) for p in b] for b in make_buckets(params, bucket_mb * 2**20)]


def _bucket_bytes(model: dict, bucket_mb: float, dp: int) -> list[int]:
    """The runtime's buckets of the whole model (one stage) in flat bytes, padded to a multiple of ``dp``."""
    from real.config import ModelConfig
    from real.dp.sync import make_buckets
    from real.models import build_layers

    cfg = ModelConfig(**model)
    params = [p for layer in build_layers(cfg, 0, range(cfg.num_layers)) for p in layer.parameters()]
    return [-(-sum(p.numel() for p in b) // dp) * dp * 4 for b in make_buckets(params, bucket_mb * 2**20)]


@pytest.mark.slow
@pytest.mark.timeout(150)  # a subprocess: importing torch takes seconds on a loaded machine
def test_profile_bad_flag_one_line_exit_2():
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "real.profile", "--out", "x.json", "--stages", "2,x"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--stages: invalid value '2,x'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_report_predicts_real_traces_with_profiled_costs(profile_path, tmp_path, capsys):
    """schedlab report --costs: the real trace is set against the profiled prediction, in seconds."""
    from analysis.cli import main as schedlab
    from schedules.trace import write_trace

    graph = validate(load_graph("zb-h1", pp=2, microbatches=4))
    costs = load_profile(profile_path, 2)
    real = simulate(graph, costs).trace
    real[["start", "end"]] *= 1.25  # stands in for a measurement 25% slower than predicted
    real.attrs = {**real.attrs, "source": "real"}
    trace = write_trace(real, tmp_path / "zb-h1.csv")
    out = tmp_path / "rep"
    assert schedlab(["report", "--out", str(out), "--pp", "2", "--microbatches", "4", "--schedules", "1f1b,zb-h1",
                     "--no-progress", "--real", str(trace), "--costs", str(profile_path)]) == 0
    md = (out / "report.md").read_text()
    # the profile alone predicts the step; one traced step has no two halves, so its error is not judged
    assert f"Predicted from the profile `{profile_path}` alone" in md and "| zb-h1 | 4 | held out |" in md
    assert "**Noise verdict: noise undefined" in md and "| noise undefined |" in md and "no run traced two" in md
    assert (out / "sim-vs-real-zb-h1.png").is_file()
    with pytest.raises(SystemExit) as exc:
        schedlab(["report", "--out", str(tmp_path / "r2"), "--real", str(trace), "--costs", str(tmp_path / "no.json")])
    assert exc.value.code == 2 and "not found" in capsys.readouterr().err
    assert not (tmp_path / "r2").exists()
