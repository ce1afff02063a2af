"""What a hostile user types gets one line and exit 2, or a correct result: never a traceback, a hang,
a silent NaN or an ignored flag. Each class of bad input is a table here."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.cli import main as schedlab
from tests.test_profiled import PROFILE

ROOT = Path(__file__).resolve().parents[1]
SIM = ["--schedule", "1f1b", "--pp", "4", "--microbatches", "8"]


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    try:
        code = schedlab(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code: int, out: str, err: str, message: str) -> None:
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert message in err, err
    assert "Traceback" not in err


@pytest.fixture
def costs(tmp_path: Path) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(PROFILE))
    return str(path)


# -- no flag is silently ignored -------------------------------------------------------------------------------

IGNORED = [
    (["simulate", *SIM, "--tf", "2", "--costs", "{costs}"], "--tf has no effect with --costs"),
    (["simulate", *SIM, "--mw", "0.5", "--pair-overlap", "0.2", "--costs", "{costs}"],
     "--mw, --pair-overlap have no effect with --costs"),
    (["simulate", *SIM, "--dp", "2"], "--dp has no effect without physical units"),
    (["simulate", *SIM, "--dp-mode", "ddp", "--tp", "2"], "--tp, --dp-mode have no effect without physical units"),
    (["simulate", *SIM, "--collective", "ring"], "--collective has no effect without physical units"),
    (["simulate", *SIM, "--efficiency", "0.5"], "--efficiency has no effect without physical units"),
    (["simulate", "--schedule", "1f1b", "--pp", "8", "--microbatches", "8", "--model", "gpt-6.2b",
      "--cluster", "dgx-h100", "--tb", "3"], "--tb has no effect in physical units"),
    (["compare", "--dp", "2"], "--dp has no effect without physical units"),
    (["compare", "--microbatch-size", "4"], "--microbatch-size has no effect without physical units"),
    (["compare", "--tf", "2", "--costs", "{costs}"], "--tf has no effect with --costs"),
    (["compare", "--model", "gpt-6.2b", "--cluster", "dgx-h100", "--pp", "8", "--tw", "2"],
     "--tw has no effect in physical units"),
    (["report", "--tcomm", "1", "--costs", "{costs}"], "--tcomm has no effect with --costs"),
]


@pytest.mark.parametrize(("argv", "message"), IGNORED, ids=[" ".join(a[:1] + a[-2:]) for a, _ in IGNORED])
def test_a_flag_with_no_effect_is_an_error(capsys, tmp_path, costs, argv, message):
    argv = [a.replace("{costs}", costs) for a in argv]
    _one_line_error(*_run(capsys, [*argv, "--out", str(tmp_path / "o")] if argv[0] in ("compare", "report")
                          else argv), message)
    assert not (tmp_path / "o").exists()


# -- numbers stay finite, JSON stays strict ----------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "message"), [
    (["--schedule", "1f1b", "--pp", "4", "--microbatches", "8", "--tf", "1e308", "--tb", "1e308", "--json"],
     "the simulated step overflows to inf"),
    (["--schedule", "dualpipe-v", "--pp", "4", "--microbatches", "8", "--tf", "1e308", "--tb", "1e308", "--json"],
     "duration inf; need a finite time >= 0"),
    (["--schedule", "1f1b", "--pp", "4", "--microbatches", "10000000"],
     "would have about 280,000,000 tasks, above the limit of 4,000,000"),
    (["--schedule", "torch:GPipe", "--pp", "4", "--microbatches", "10000000"], "above the limit of 4,000,000"),
])
def test_non_finite_or_oversized_is_refused(capsys, argv, message):
    _one_line_error(*_run(capsys, ["simulate", *argv]), message)


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "deepseek-v3", "--cluster", "dgx-h100:4", "--pp", "4", "--dp", "8", "--ep", "3"],
     "ep 3 must divide dp x cp = 8 (expert parallelism folds over the data-parallel ranks, as Megatron-Core and "
     "torchtitan do); valid: 1, 2, 4, 8 (flag --ep)"),
    (["--model", "gpt-1.5b", "--cluster", "dgx-h100:1", "--pp", "4", "--dp", "2", "--ep", "2"],
     "ep 2 splits a MoE model's experts, and model 'gpt-1.5b' has none"),
    (["--model", "mixtral-8x7b", "--cluster", "dgx-h100:1", "--pp", "4", "--dp", "2", "--ep", "2",
      "--moe-dispatcher", "foo"], "unknown moe dispatcher 'foo'; valid: alltoall, deepep (flag --moe-dispatcher)"),
])
def test_bad_expert_parallel_layouts_are_one_line_errors(capsys, argv, message):
    _one_line_error(*_run(capsys, ["simulate", *argv, "--schedule", "1f1b", "--microbatches", "8"]), message)


def test_json_output_parses_strictly(capsys):
    code, out, _ = _run(capsys, ["simulate", *SIM, "--tf", "1e300", "--json"])
    assert code == 0
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


# -- outputs are checked before the work, written whole, with the umask's mode ---------------------------------

def _outputs(tmp: Path) -> list[tuple[list[str], str]]:
    (tmp / "adir.csv").mkdir()
    (tmp / "adir.png").mkdir()
    (tmp / "afile").write_text("x")
    return [
        (["simulate", *SIM, "--trace", str(tmp / "adir.csv")], "is a directory"),
        (["simulate", *SIM, "--plot", str(tmp / "adir.png")], "is a directory"),
        (["simulate", *SIM, "--export-csv", str(tmp / "adir.csv")], "is a directory"),
        (["simulate", *SIM, "--trace", str(tmp / "afile" / "t.csv")], "is a file, not a folder"),
        (["simulate", *SIM, "--plot", str(tmp / "afile" / "sub" / "t.png")], "is a file, not a folder"),
        (["compare", "--out", str(tmp / "afile")], "output folder"),
        (["report", "--out", str(tmp / "afile"), "--schedules", "gpipe"], "report folder"),
        (["perfetto", str(tmp / "afile"), str(tmp / "adir.csv")], "use a name ending in .json"),
    ]


def test_bad_output_paths_fail_before_any_work(capsys, tmp_path):
    for argv, message in _outputs(tmp_path):
        before = sorted(p.name for p in tmp_path.rglob("*"))
        _one_line_error(*_run(capsys, argv), message)
        assert sorted(p.name for p in tmp_path.rglob("*")) == before, argv


def test_outputs_follow_the_umask_and_leave_no_temp_files(capsys, tmp_path):
    old = os.umask(0o022)
    try:
        code, _, _ = _run(capsys, ["simulate", *SIM, "--export-csv", str(tmp_path / "s.csv"),
                                   "--trace", str(tmp_path / "t.csv"), "--plot", str(tmp_path / "t.png")])
    finally:
        os.umask(old)
    assert code == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"s.csv": 0o644, "t.csv": 0o644, "t.png": 0o644}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sink", ["closed pipe", "/dev/full"])
def test_a_closed_pipe_or_full_disk_ends_without_a_traceback(sink):
    cmd = [sys.executable, "-m", "sim", *SIM, "--json"]
    if sink == "closed pipe":
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.read(10)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=30) in (0, 1) and err == ""
    else:
        with open("/dev/full", "w") as full:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=full, stderr=subprocess.PIPE, text=True, timeout=30)
        assert proc.returncode == 2 and proc.stderr == "error: cannot write the output: No space left on device\n"


# -- names ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "result"), [("1F1B", "1f1b"), ("ZB-V", "zb-v"), ("Interleaved-1F1B", "interleaved-1f1b")])
def test_registered_names_are_case_insensitive(capsys, name, result):
    code, out, _ = _run(capsys, ["simulate", "--schedule", name, "--pp", "4", "--microbatches", "8", "--json"])
    assert code == 0 and json.loads(out)["schedule"] == result


@pytest.mark.parametrize(("argv", "message"), [
    (["simulate", "--schedule", "zbv", "--pp", "4", "--microbatches", "8"], "unknown schedule 'zbv' (did you mean 'zb-v'?)"),
    (["simulate", "--schedule", "1f1f", "--pp", "4", "--microbatches", "8"], "(did you mean '1f1b'?)"),
    (["simulate", "--schedule", "x" * 300, "--pp", "4", "--microbatches", "8"], "unknown schedule '" + "x" * 76 + "...;"),
    (["compare", "--schedules", ","], "no names in ','"),
    (["compare", "--schedules", "y" * 400], "unknown schedule 'yyy"),
])
def test_names_are_suggested_and_quoted_short(capsys, tmp_path, argv, message):
    code, out, err = _run(capsys, argv + (["--out", str(tmp_path)] if argv[0] == "compare" else []))
    _one_line_error(code, out, err, message)
    assert len(err) < 400


def test_compare_all_skips_and_lists_what_does_not_take_the_shape(capsys, tmp_path):
    code, out, _ = _run(capsys, ["compare", "--pp", "4", "--microbatches", "6", "--out", str(tmp_path), "--json"])
    d = json.loads(out)
    assert code == 0
    assert set(d["skipped"]) == {"interleaved-1f1b", "interleaved-zb", "dualpipe-v", "combined-1f1b"}
    assert "multiple of pp=4" in d["skipped"]["interleaved-1f1b"]
    assert "dualpipe-v needs microbatches >= 2*pp = 8" in d["skipped"]["dualpipe-v"]
    assert {r["schedule"] for r in d["schedules"]} == {"gpipe", "1f1b", "looped-bfs", "zb-h1", "zb-v", "zb-h2",
                                                       "zb-auto", "v-half", "v-min"}


def test_compare_takes_a_cost_file(capsys, tmp_path, costs):
    code, out, _ = _run(capsys, ["compare", "--pp", "2", "--microbatches", "4", "--schedules", "1f1b,zb-h1",
                                 "--costs", costs, "--out", str(tmp_path), "--json"])
    rows = {r["schedule"]: r for r in json.loads(out)["schedules"]}
    assert code == 0
    # The fixture's 1F1B at pp=2, m=4 (tests/test_profiled.py works it out by hand): 0.32228192 s.
    assert rows["1f1b"]["makespan"] == pytest.approx(0.32228192, rel=1e-12)


@pytest.mark.parametrize("value", ["-inf", "-1e-12", "-1", "-.5", "-NaN"])
def test_negative_and_non_finite_numbers_reach_the_value_check(capsys, value):
    """argparse alone would read -inf or -1e-12 as a flag ("expected one argument")."""
    _one_line_error(*_run(capsys, ["simulate", *SIM, "--tf", value]), "tf must be a finite time >= 0, got ")
