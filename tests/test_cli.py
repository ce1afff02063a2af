"""The command line: exact JSON figures, readable table, files written, one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_sim

from analysis.cli import main as schedlab_main
from schedules import names
from schedules.trace import read_trace

ROOT = Path(__file__).resolve().parents[1]


def test_gpipe_json_bubble_ratio(capsys):
    code, out, _ = run_sim(capsys, "--schedule", "gpipe", "--pp", "4", "--microbatches", "8", "--json")
    assert code == 0
    d = json.loads(out)  # exactly one JSON object on stdout
    assert d["bubble_ratio"] == pytest.approx(3 / 11, abs=1e-9)
    assert (d["schedule"], d["pp"], d["microbatches"], d["chunks"], d["makespan"]) == ("gpipe", 4, 8, 1, 33.0)
    assert [r["rank"] for r in d["ranks"]] == [0, 1, 2, 3]
    assert [r["peak_activations"] for r in d["ranks"]] == [8.0] * 4
    assert [(r["busy"], r["first_start"], r["last_end"]) for r in d["ranks"]] == [
        (24.0, 0.0, 33.0), (24.0, 1.0, 31.0), (24.0, 2.0, 29.0), (24.0, 3.0, 27.0)
    ]


def test_interleaved_json(capsys):
    code, out, _ = run_sim(capsys, "--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "8", "--chunks", "2", "--json")
    d = json.loads(out)
    assert code == 0 and d["makespan"] == 28.5
    assert d["bubble_ratio"] == pytest.approx(4.5 / 28.5, abs=1e-9)
    assert [r["peak_activations"] for r in d["ranks"]] == [5.5, 4.5, 3.5, 2.5]


def test_costs_flags_reach_the_model(capsys):
    _, out, _ = run_sim(capsys, "--schedule", "1f1b", "--pp", "2", "--microbatches", "3",
                           "--tf", "2", "--tb", "3", "--tw", "1", "--tcomm", "0.5", "--json")
    d = json.loads(out)
    # mw 1 unless given: the runtime's memory (an I frees nothing until its W); input_fraction: a recomputed F's input
    assert d["costs"] == {"model": "uniform", "tf": 2.0, "tb": 3.0, "tw": 1.0, "tcomm": 0.5, "mw": 1.0, "pair_overlap": 0.0,
                          "input_fraction": 0.0}
    # p=2: F0 on rank 0 [0,2], message 0.5, rank 1 F0 [2.5,4.5] B0 [4.5,8.5], grad 0.5 -> rank 0 B0 [9,13] ...
    assert d["ranks"][1]["first_start"] == 2.5


def test_table_output(capsys):
    code, out, _ = run_sim(capsys, "--schedule", "1f1b", "--pp", "4", "--microbatches", "8")
    assert code == 0
    assert "schedule 1f1b: pp=4 microbatches=8 chunks=1" in out
    assert "bubble ratio 0.2727" in out
    lines = [ln.split() for ln in out.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    assert [(ln[0], ln[-1]) for ln in lines] == [("0", "4"), ("1", "3"), ("2", "2"), ("3", "1")]


def test_trace_and_plot_written(tmp_path, capsys):
    trace, plot = tmp_path / "t.csv", tmp_path / "sub" / "t.png"
    code, out, _ = run_sim(capsys, "--schedule", "1f1b", "--pp", "3", "--microbatches", "4",
                           "--trace", str(trace), "--plot", str(plot))
    assert code == 0
    df = read_trace(trace)
    assert df.attrs["source"] == "sim" and df.attrs["schedule"] == "1f1b"
    compute = df[df["stream"] == "compute"]
    assert len(compute) == 3 * 4 * 2 and compute["end"].max() == 18.0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote trace: {trace}" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--schedule", "nope", "--pp", "4", "--microbatches", "8"],
     "error: unknown schedule 'nope'; valid: " + ", ".join(names()) + ", or your own as FILE.py:NAME"),
    (["--schedule", "gpipe", "--pp", "0", "--microbatches", "8"], "error: pipeline: pp must be an integer >= 1, got 0 (flag --pp)"),
    (["--schedule", "gpipe", "--pp", "two", "--microbatches", "8"], "argument --pp: invalid int value: 'two'"),
    (["--schedule", "gpipe", "--pp", "4"], "the following arguments are required: --microbatches"),
    (["--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "6"],
     "interleaved-1f1b needs microbatches to be a multiple of pp=4, got 6; try 4 or 8"),
    (["--schedule", "interleaved-1f1b", "--pp", "4", "--microbatches", "8", "--chunks", "1"],
     "needs chunks (v) >= 2 stages per rank, got 1"),
    (["--schedule", "gpipe", "--pp", "4", "--microbatches", "8", "--chunks", "2"],
     "schedule 'gpipe' runs one stage per rank (chunks=1), got chunks=2"),
    (["--schedule", "gpipe", "--pp", "4", "--microbatches", "8", "--tb", "-1"], "error: tb must be a finite time >= 0, got -1.0 (flag --tb)"),
    (["--schedule", "gpipe", "--pp", "4", "--microbatches", "8", "--mw", "2"], "error: uniform costs: mw must be a fraction of M_B in [0, 1], got 2.0 (flag --mw)"),
    (["--schedule", "gpipe", "--pp", "4", "--microbatches", "8", "--plot", "x.gif"], "use a name ending in .png, .svg, .pdf"),
    (["--schedule", "gpipe", "--pp", "4", "--microbatches", "8", "--trace", "x.txt"], "use a name ending in .csv or .parquet"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_one_line_exit_2(capsys, tmp_path, argv, message):
    code, out, err = run_sim(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert message in err


def test_bad_input_writes_nothing(tmp_path, capsys):
    plot = tmp_path / "p.png"
    code, _, _ = run_sim(capsys, "--schedule", "nope", "--pp", "2", "--microbatches", "2", "--plot", str(plot),
                         "--trace", str(tmp_path / "t.csv"))
    assert code == 2 and list(tmp_path.iterdir()) == []


def test_list(capsys):
    code, out, _ = run_sim(capsys, "--list")
    assert code == 0
    assert [ln.split()[0] for ln in out.splitlines()] == names()
    assert {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zb-v", "interleaved-zb",
            "dualpipe-v", "zb-auto"} <= set(names())


def test_schedlab_compare_writes_table_and_pictures(tmp_path, capsys):
    code = schedlab_main(["compare", "--pp", "4", "--microbatches", "8", "--out", str(tmp_path), "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    rows = {r["schedule"]: r for r in d["schedules"]}
    assert [r["schedule"] for r in d["schedules"]] == names(by_family=True)
    assert rows["gpipe"]["bubble_ratio"] == pytest.approx(3 / 11)
    assert rows["interleaved-1f1b"]["bubble_ratio"] == pytest.approx(rows["interleaved-1f1b"]["bubble_closed_form"])
    assert rows["1f1b"]["peak_act_max"] == 4 and rows["gpipe"]["peak_act_max"] == 8
    assert rows["zb-h2"]["span_idle"] == 0.0 and rows["zb-h1"]["span_idle"] == 3.0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == sorted(["comparison.csv", "timelines.png", *(f"timeline-{n}.png" for n in names())])


def test_schedlab_unknown_command(capsys):
    with pytest.raises(SystemExit) as exc:
        schedlab_main(["frobnicate"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "error: schedlab: unknown command 'frobnicate'; valid: simulate, compare, run, report, perfetto, plan, list (see schedlab --help)\n"


@pytest.mark.slow
@pytest.mark.timeout(90)  # two subprocesses: a hang guard, with room for interpreter start-up on a loaded host
def test_python_dash_m_sim_subprocess():
    """The module entry point as a user runs it: one JSON object on stdout, nothing on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "sim", "--schedule", "gpipe", "--pp", "4", "--microbatches", "8", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=40,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["bubble_ratio"] == pytest.approx(3 / 11, abs=1e-9)
    bad = subprocess.run([sys.executable, "-m", "sim", "--schedule", "x", "--pp", "1", "--microbatches", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=40)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1
