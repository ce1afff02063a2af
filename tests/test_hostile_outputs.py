"""Hostile outputs and runaway searches, by class: each a table of cases with the exact outcome.

Files already on disk are never lost: an output never replaces a device, a fifo,
a directory or one of the command's inputs; two outputs never name one file; a
set of files (token file and sidecar, a comparison, a report folder) is written
whole or not at all. Names too long for the file system are refused before any
work. The planner ends on any batch, names the constraint that leaves nothing,
and survives a pool that cannot start.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
from pathlib import Path

import pytest

from analysis.cli import main as schedlab
from analysis.cli.data import main as data_main
from common.errors import ClusterError, ConfigError, OutputError, choice, find_name, quote
from common.outputs import atomic_write, atomic_write_all, check_distinct, check_output_dir, check_output_file

LONG = "n" * 256  # one byte over NAME_MAX on Linux file systems


def run(main, argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str) -> str:
    """The one line of a clean error, without its 'error: ' prefix."""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err[len("error: "):-1]


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "pipe.csv"
    os.mkfifo(path)
    return path


# ---------------------------------------------------------------- the policy, one table

def _targets(tmp_path: Path, fifo: Path) -> dict[str, Path]:
    (tmp_path / "d.csv").mkdir()
    return {"devnull": Path("/dev/null"), "fifo": fifo, "dir": tmp_path / "d.csv",
            "long name": tmp_path / (LONG + ".csv"), "long path": tmp_path / "/".join(["p" * 200] * 21) / "t.csv"}


@pytest.mark.parametrize(("target", "message"), [
    ("devnull", "trace file '/dev/null' is a character device, not a regular file; it is never replaced: give a "
                "file name"),
    ("fifo", "trace file '{tmp}/pipe.csv' is a fifo, not a regular file; it is never replaced: give a file name"),
    ("dir", "trace file '{tmp}/d.csv' is a directory; give a file name"),
    ("long name", "the name '" + "n" * 76 + "... is 260 bytes; the file system allows 255: give a shorter name"),
    ("long path", "bytes; the file system allows 4095: give a shorter path"),
])
def test_an_output_that_would_lose_or_fail_is_refused_before_any_work(tmp_path, fifo, target, message):
    path = _targets(tmp_path, fifo)[target]
    with pytest.raises(OutputError) as err:
        check_output_file(path, "trace file")
    text = str(err.value)
    assert "\n" not in text and text.endswith(message.replace("{tmp}", str(tmp_path))), text
    with pytest.raises(OutputError):  # the writer itself refuses too, whoever forgot to check
        atomic_write(path, lambda tmp: tmp.write_text("x"), "trace file")
    assert Path("/dev/null").is_char_device() and fifo.is_fifo()


def test_a_254_byte_name_is_written_through_a_short_temporary_name(tmp_path):
    path = tmp_path / ("a" * 250 + ".csv")
    seen = []
    atomic_write(check_output_file(path, "trace file", (".csv",)), lambda tmp: seen.append(tmp.name) or
                 tmp.write_text("x"), "trace file")
    assert path.read_text() == "x" and len(seen[0]) == len(".12345678.tmp")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize(("case", "message"), [
    ("same path", "--trace and --save-params name the same file '{tmp}/a.csv'; one would overwrite the other: give "
                  "each output its own name"),
    ("dot path", "--trace and --save-params name the same file '{tmp}/x/../a.csv'; one would overwrite the other: "
                 "give each output its own name"),
    ("hard link", "--trace and --save-params name the same file '{tmp}/hard.csv'; one would overwrite the other: "
                  "give each output its own name"),
    ("symlink", "--trace and --save-params name the same file '{tmp}/soft.csv'; one would overwrite the other: "
                "give each output its own name"),
    ("input", "--trace '{tmp}/a.csv' is also an input (--data); writing it would destroy the input: give the output "
              "another name"),
    ("in folder", "the input --data '{tmp}/rep/t.csv' lies in --out '{tmp}/rep', which is replaced as a whole: move "
                  "the input out, or give another folder"),
])
def test_outputs_that_name_one_file_or_an_input_are_refused(tmp_path, case, message):
    a = tmp_path / "a.csv"
    a.write_text("keep")
    (tmp_path / "x").mkdir()
    os.link(a, tmp_path / "hard.csv")
    (tmp_path / "soft.csv").symlink_to(a)
    second = {"same path": a, "dot path": tmp_path / "x/../a.csv", "hard link": tmp_path / "hard.csv",
              "symlink": tmp_path / "soft.csv"}
    with pytest.raises(OutputError) as err:
        if case in second:
            check_distinct({"--trace": a, "--save-params": second[case]})
        elif case == "input":
            check_distinct({"--trace": a}, {"--data": a})
        else:
            check_distinct({}, {"--data": tmp_path / "rep" / "t.csv"}, folders={"--out": tmp_path / "rep"})
    assert str(err.value) == message.replace("{tmp}", str(tmp_path))
    assert a.read_text() == "keep"
    check_distinct({"--trace": a, "--plot": tmp_path / "b.png"}, {"--data": tmp_path / "c.u16"})  # distinct: fine


def test_a_set_of_files_is_written_whole_or_not_at_all(tmp_path):
    a, b = tmp_path / "tok", tmp_path / "tok.json"
    a.write_text("old tokens")
    b.write_text("old sidecar")

    def fail(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OutputError, match=r"^cannot write sidecar '.*tok\.json': No space left on device$"):
        atomic_write_all([(a, lambda tmp: tmp.write_text("new"), "token file"), (b, fail, "sidecar")])
    assert (a.read_text(), b.read_text()) == ("old tokens", "old sidecar")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok", "tok.json"]  # no temporary left


def test_a_folder_replaced_whole_is_refused_when_it_holds_other_files(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    with pytest.raises(OutputError) as err:
        check_output_dir(folder, "report folder", replaced=lambda p: False)
    assert str(err.value) == (f"report folder '{folder}' holds files this command does not write; it replaces the "
                              "folder as a whole: give a new or empty folder")
    assert (folder / "thesis.tex").read_text() == "years of work"


# ---------------------------------------------------------------- every writer of the command line

def q(path: Path) -> str:
    """A path as messages quote it (cut to 80 characters)."""
    return quote(str(path))


def _cli_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    corpus = tmp / "corpus.txt"
    shape = ["--schedule", "1f1b", "--pp", "2", "--microbatches", "2"]
    return [
        ("prepare over its input", ["prepare", "--input", str(corpus), "--out", str(corpus)],
         f"token file '{corpus}' is also an input (input #1); writing it would destroy the input: give the output "
         "another name"),
        ("prepare's sidecar over an input", ["prepare", "--input", str(tmp / "a.json"), "--out", str(tmp / "a")],
         f"token file sidecar '{tmp}/a.json' is also an input (input #1); writing it would destroy the input: give "
         "the output another name"),
        ("prepare to /dev/null", ["prepare", "--input", str(corpus), "--out", "/dev/null"],
         "token file '/dev/null' is a character device, not a regular file; it is never replaced: give a file name"),
        ("prepare whose sidecar name is too long", ["prepare", "--input", str(corpus), "--out", str(tmp / ("t" * 252))],
         f"token file sidecar {q(tmp / ('t' * 252 + '.json'))}: the name '" + "t" * 76 + "... is 257 bytes; the file "
         "system allows 255: give a shorter name"),
        ("simulate: two outputs, one file", ["simulate", *shape, "--trace", str(tmp / "t.csv"), "--export-csv",
                                             str(tmp / "t.csv")],
         f"--trace and --export-csv name the same file '{tmp}/t.csv'; one would overwrite the other: give each output "
         "its own name"),
        ("simulate: trace to /dev/null", ["simulate", *shape, "--trace", "/dev/null"],
         "trace file '/dev/null': use a name ending in .csv or .parquet"),
        ("simulate: trace over the schedule file", ["simulate", "--schedule", f"csv:{tmp / 's.csv'}", "--trace",
                                                    str(tmp / "s.csv")],
         f"--trace '{tmp}/s.csv' is also an input (--schedule); writing it would destroy the input: give the output "
         "another name"),
        ("perfetto to a fifo", ["perfetto", str(tmp / "s.csv"), str(tmp / "fifo.json")],
         f"chrome trace file '{tmp}/fifo.json' is a fifo, not a regular file; it is never replaced: give a file name"),
        ("report over the user's folder", ["report", "--out", str(tmp / "home"), "--schedules", "gpipe"],
         f"report folder '{tmp}/home' holds files this command does not write; it replaces the folder as a whole: "
         "give a new or empty folder"),
        ("report's input in its folder", ["report", "--out", str(tmp / "rep"), "--schedules", "gpipe", "--real",
                                          str(tmp / "rep" / "traces" / "gpipe.csv")],
         f"the input --real #1 {q(tmp / 'rep' / 'traces' / 'gpipe.csv')} lies in --out {q(tmp / 'rep')}, which is "
         "replaced as a whole: move the input out, or give another folder"),
        ("compare into a name too long", ["compare", "--pp", "2", "--microbatches", "2", "--out", str(tmp / LONG)],
         f"output folder {q(tmp / LONG)}: the name '" + "n" * 76 + "... is 256 bytes; the file system allows 255: "
         "give a shorter name"),
    ]


def _cli_files(tmp: Path) -> None:
    (tmp / "corpus.txt").write_text("hello")
    (tmp / "a.json").write_text('{"mine": 1}')
    (tmp / "s.csv").write_text("0F0,0B0\n")
    os.mkfifo(tmp / "fifo.json")
    (tmp / "home").mkdir()
    (tmp / "home" / "notes.txt").write_text("mine")
    (tmp / "rep" / "traces").mkdir(parents=True)
    (tmp / "rep" / "traces" / "gpipe.csv").write_text("a trace")


@pytest.mark.parametrize("index", range(11))
def test_every_writer_refuses_in_one_line_and_loses_nothing(tmp_path, capsys, index):
    _cli_files(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    name, argv, message = _cli_cases(tmp_path)[index]
    main = data_main if argv[0] == "prepare" else schedlab
    code, out, err = run(main, argv, capsys)
    assert (code, out, one_error(err)) == (2, "", message), name
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_prepare_keeps_the_old_token_file_when_the_sidecar_cannot_be_written(tmp_path, capsys, monkeypatch):
    (tmp_path / "corpus.txt").write_text("hello")
    out = tmp_path / "tok"
    out.write_bytes(b"old")
    real_write = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.parent == tmp_path and self.name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    code, _, err = run(data_main, ["prepare", "--input", str(tmp_path / "corpus.txt"), "--out", str(out)], capsys)
    assert (code, one_error(err)) == (2, f"cannot write token file sidecar '{out}.json': No space left on device")
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "tok"]


def test_run_refuses_trace_and_save_params_naming_one_file(tmp_path, capsys):
    from analysis.cli.train import main as real_main

    path = str(tmp_path / "out.csv")
    code, _, err = run(real_main, ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "1",
                                   "--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8",
                                   "--trace", path, "--save-params", path], capsys)
    assert (code, one_error(err)) == (2, f"--trace and --save-params name the same file '{path}'; one would "
                                         "overwrite the other: give each output its own name")
    assert not (tmp_path / "out.csv").exists()


# ---------------------------------------------------------------- report and compare: whole or nothing

REPORT = ["--pp", "2", "--microbatches", "2", "--schedules", "gpipe,1f1b", "--no-progress"]


def test_a_second_report_leaves_no_stale_file_and_a_failed_one_leaves_the_first(tmp_path, capsys, monkeypatch):
    import analysis.report

    rep = tmp_path / "rep"
    assert run(schedlab, ["report", "--out", str(rep), *REPORT], capsys)[0] == 0
    first = {p.relative_to(rep): p.read_bytes() for p in rep.rglob("*") if p.is_file()}
    assert Path("traces/1f1b.csv") in first
    assert run(schedlab, ["report", "--out", str(rep), *REPORT[:4], "--schedules", "gpipe", "--no-progress"],
               capsys)[0] == 0
    assert sorted(str(p.relative_to(rep)) for p in rep.rglob("*.csv")) == ["traces/gpipe.csv"]
    assert "1f1b" not in (rep / "report.md").read_text()
    second = {p.relative_to(rep): p.read_bytes() for p in rep.rglob("*") if p.is_file()}

    def broken(out, sweep, validation=None, dp_modes=None):
        (out / "timelines.png").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(analysis.report, "_write_report", broken)
    code, _, err = run(schedlab, ["report", "--out", str(rep), *REPORT], capsys)
    assert (code, one_error(err)) == (2, f"cannot write report folder '{rep}': No space left on device")
    assert {p.relative_to(rep): p.read_bytes() for p in rep.rglob("*") if p.is_file()} == second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]


def test_a_failed_compare_leaves_no_figure(tmp_path, capsys, monkeypatch):
    import analysis.timeline

    out = tmp_path / "cmp"
    calls = []

    def broken(trace, path, **kwargs):
        calls.append(path)
        if len(calls) == 2:
            raise OutputError(f"cannot write figure file {str(path)!r}: No space left on device")
        Path(path).write_bytes(b"png")
        return Path(path)

    monkeypatch.setattr(analysis.timeline, "plot_timeline", broken)
    code, _, err = run(schedlab, ["compare", "--pp", "2", "--microbatches", "2", "--schedules", "gpipe,1f1b",
                                  "--out", str(out)], capsys)
    assert code == 2 and one_error(err).endswith("timeline-1f1b.png': No space left on device")
    assert list(out.iterdir()) == []


# ---------------------------------------------------------------- the planner ends, and says why when nothing is left

@pytest.mark.parametrize("n", [1, 2, 12, 36, 97, 360, 1024, 9973 * 9973, 2**40])
def test_divisors_in_order(n):
    from sim.plan.space import _divisors

    got = _divisors(n)
    if n < 10**5:
        assert got == [d for d in range(1, n + 1) if n % d == 0]
    else:
        assert all(n % d == 0 for d in got) and got == sorted(set(got)) and len(got) == {9973**2: 3, 2**40: 41}[n]


PLAN = ["plan", "--model", "gpt-tiny", "--cluster", "dgx-h100:1", "--no-progress", "--workers", "1"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--global-batch", "7", "--microbatch-sizes", "2"],
     "plan: no microbatch size of [2] divides the batch per replica ([7]) (flag --microbatch-sizes)"),
    (["--global-batch", "8", "--schedules", "interleaved-1f1b", "--chunks", "1"],
     None),  # no pp > 1 layout for interleaved-1f1b, but pp 1 runs no pipeline schedule: the pp 1 answer
    (["--global-batch", "8", "--schedules", "interleaved-1f1b", "--microbatch-sizes", "1", "--chunks", "2"],
     None),  # a valid space: the answer, exit 0
    (["--global-batch", "1099511627777"],
     "plan: global_batch 1,099,511,627,777 is beyond 1,099,511,627,776 (2^40) sequences; give a smaller batch "
     "(flag --global-batch)"),
    (["--global-batch", "1099511627776", "--top", "1"],
     "plan: no configuration fits in 85.5 GB per device: the smallest needs at least 1.759e+04 GB (model states and one "
     "microbatch); raise memory_limit, add nodes or give smaller microbatch sizes (flag --memory-limit)"),
    (["--global-batch", "8", "--dp-modes", "bogus"],
     "plan: unknown dp mode 'bogus'; valid: sync, ddp, zero1, zero2, fsdp, ps, zero3 (flag --dp-modes)"),
])
def test_plan_without_a_configuration_names_the_constraint(tmp_path, capsys, extra, message):
    code, out, err = run(schedlab, [*PLAN, "--out", str(tmp_path / "p"), *extra], capsys)
    if message is None:
        assert (code, err) == (0, "") and "wrote" in out
        return
    assert (code, out, one_error(err)) == (2, "", message)
    assert not (tmp_path / "p").exists() or list((tmp_path / "p").iterdir()) == []


def test_plan_lists_each_configuration_once_and_takes_names_in_any_case(tmp_path, capsys):
    import json

    argv = [*PLAN, "--global-batch", "8", "--top", "50", "--json", "--schedules", "1f1b,1F1B",
            "--microbatch-sizes", "1,1,2", "--dp-modes", "DDP,ddp"]
    argv[argv.index("gpt-tiny")] = "GPT-TINY"
    code, out, err = run(schedlab, [*argv, "--out", str(tmp_path / "a")], capsys)
    assert code == 0, err
    twice = json.loads(out)["top"]
    once = json.loads(run(schedlab, [*PLAN, "--global-batch", "8", "--top", "50", "--json", "--schedules", "1f1b",
                                     "--microbatch-sizes", "1,2", "--dp-modes", "ddp", "--out",
                                     str(tmp_path / "b")], capsys)[1])["top"]
    configs = [json.dumps(e["config"], sort_keys=True) for e in twice]
    assert len(configs) == len(set(configs)) and [e["config"] for e in twice] == [e["config"] for e in once]


@pytest.mark.parametrize(("value", "valid", "expect"), [
    ("DDP", ("ddp", "zero1"), "ddp"), ("Zero1", ("ddp", "zero1"), "zero1"), ("GPT-Tiny", ("gpt-tiny",), "gpt-tiny"),
    ("ddp ", ("ddp",), None), (3, ("ddp",), None), ("", ("ddp",), None),
])
def test_names_are_found_in_any_case_and_nothing_else(value, valid, expect):
    assert find_name(value, valid) == expect
    if expect is None:
        with pytest.raises(ConfigError, match=r"^plan: unknown dp mode .*; valid: "):
            choice("plan", "dp_mode", value, valid)


def test_presets_and_modes_in_any_case():
    from sim.costs.cluster import cluster_preset
    from sim.costs.parallel import ParallelConfig
    from sim.costs.transformer import model_preset

    assert model_preset("GPT-TINY") is model_preset("gpt-tiny")
    assert cluster_preset("DGX-H100:2").num_devices == 16
    p = ParallelConfig(pp=2, dp=2, dp_mode="ZeRO1", order="PP-INNER", collective="Ring")
    assert (p.dp_mode, p.order, p.collective) == ("zero1", "pp-inner", "ring")


@pytest.mark.parametrize(("text", "message"), [
    ("dgx-h100:100000000", "cluster 'dgx-h100:100000000' would hold 800,000,000 devices; at most 1,048,576 (2^20) are "
                           "supported: give fewer nodes"),
    ("dgx-h100:131073", "cluster 'dgx-h100:131073' would hold 1,048,584 devices; at most 1,048,576 (2^20) are "
                        "supported: give fewer nodes"),
    ("dgx-h100:1+ps2000000", "cluster 'dgx-h100:1+ps2000000' would hold 2,000,008 devices; at most 1,048,576 (2^20) "
                             "are supported: give fewer nodes"),
    ("dgx-h100:" + "9" * 30, "cluster 'dgx-h100:" + "9" * 30 + "': a count of 30 digits; at most 1,048,576 (2^20) "
                             "devices are supported: give fewer nodes"),
])
def test_a_cluster_too_large_is_refused_before_its_devices_are_built(text, message):
    from sim.costs.cluster import cluster_preset

    with pytest.raises(ClusterError) as err:
        cluster_preset(text)
    assert str(err.value) == message


@pytest.mark.parametrize(("devices", "message"), [
    (["/trainer/GPU:0-99999999999"], "cluster '/trainer/GPU:0-99999999999' would hold 100,000,000,000 devices; at "
                                     "most 1,048,576 (2^20) are supported: give fewer nodes"),
    ([f"node{n}/trainer/GPU:0-999999" for n in range(1000)], "cluster 'custom' would hold 2,000,000 devices; at most "
                                                             "1,048,576 (2^20) are supported: give fewer nodes"),
])
def test_placements_too_large_are_refused_before_they_are_built(devices, message):
    from sim.costs.cluster import cluster_from_dict

    with pytest.raises(ClusterError) as err:
        cluster_from_dict({"devices": devices})
    assert str(err.value) == message


def _space():
    from sim.costs.cluster import cluster_preset
    from sim.costs.transformer import model_preset
    from sim.plan.space import PlanSpace

    return PlanSpace(model=model_preset("gpt-tiny"), cluster=cluster_preset("dgx-h100:1"), global_batch=8,
                     schedules=("1f1b",), dp_modes=("ddp",), recompute=("none",))


@pytest.mark.parametrize("forks_allowed", [0, 1])
def test_a_pool_that_cannot_fork_falls_back_to_fewer_workers(monkeypatch, caplog, forks_allowed):
    """The fork failure of a process limit, simulated: the planner ends with the one-process answer, and no
    worker that did start is left behind."""
    from sim.plan.search import plan

    expect = [(e.config, e.step_time) for e in plan(_space(), top=3, workers=1).top]
    real_fork, count = os.fork, []

    def fork() -> int:
        count.append(1)
        if len(count) > forks_allowed:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real_fork()

    monkeypatch.setattr(os, "fork", fork)
    got = [(e.config, e.step_time) for e in plan(_space(), top=3, workers=4).top]
    assert got == expect
    assert [r.getMessage() for r in caplog.records if r.name == "sim.plan.search"][:2] == [
        "plan: 4 worker processes could not start ([Errno 11] Resource temporarily unavailable); trying 2",
        "plan: 2 worker processes could not start ([Errno 11] Resource temporarily unavailable); trying 1"]
    assert multiprocessing.active_children() == []


def _killed(*args: object) -> None:
    os._exit(9)  # a worker ended as the kernel's out-of-memory killer would end it


def test_a_worker_that_dies_mid_search_is_one_error(monkeypatch):
    import sim.plan.search

    monkeypatch.setattr(sim.plan.search, "_refine_job", _killed)
    with pytest.raises(ConfigError) as err:
        sim.plan.search.plan(_space(), top=3, workers=2)
    assert str(err.value) == ("plan: a worker process died during the search (killed for memory?); run again with "
                              "fewer workers than 2")
    assert multiprocessing.active_children() == []


# ---------------------------------------------------------------- real.profile: a bad microbatch is never replaced

@pytest.mark.parametrize(("extra", "expect"), [
    (["--microbatch-size", "0"], "profile: microbatch_size must be an integer >= 1, got 0"),
    (["--microbatch-size", "-3"], "profile: microbatch_size must be an integer >= 1, got -3"),
    (["--batch-size", "1", "--microbatches", "2"], "batch_size 1 does not split into microbatches x dp = 2 x 1 equal "
                                                   "microbatches of at least one sample; give a multiple of 2"),
    (["--batch-size", "6", "--microbatches", "4"], "batch_size 6 does not split into microbatches x dp = 4 x 1 equal "
                                                   "microbatches of at least one sample; give a multiple of 4"),
    (["--batch-size", "8"], "batch_size needs microbatches (microbatch = batch / (microbatches x dp))"),
    (["--batch-size", "8", "--microbatches", "0"], "profile: microbatches must be an integer >= 1, got 0"),
    (["--batch-size", "8", "--microbatches", "2", "--microbatch-size", "4"],
     "batch_size and microbatch_size both set the microbatch: give one of them"),
    (["--batch-size", "8", "--microbatches", "2"], 4),
    (["--batch-size", "12", "--microbatches", "2", "--dp", "2"], 3),
    ([], 4),
    (["--microbatch-size", "1"], 1),
])
def test_profile_microbatch_size(extra, expect):
    from analysis.cli.profile import _parser, config_from_args

    args = _parser().parse_args(["--out", "p.json", *extra])
    if isinstance(expect, int):
        assert config_from_args(args).microbatch_size == expect
        return
    with pytest.raises(ConfigError) as err:
        config_from_args(args)
    assert str(err.value) == expect


@pytest.mark.parametrize(("text", "expect"), [("all", True), ("ALL", True), (" All ", True), ("al", False),
                                              ("all,1f1b", False)])
def test_all_in_any_case(text, expect):
    from analysis.cli.common import is_all

    assert is_all(text) is expect


def _hardening_ids() -> list[str]:
    import tempfile

    from analysis.hostile_hardening import cases

    with tempfile.TemporaryDirectory() as tmp:
        return [f"{i} {c.group}: " + " ".join(a.replace(tmp + "/", "") for a in c.argv[2:])[:80]
                for i, c in enumerate(cases(Path(tmp))) if c.group in ("data loss", "runaway", "scripts")]


@pytest.fixture(scope="module")
def hardening(tmp_path_factory):
    from analysis.hostile_hardening import cases

    return cases(tmp_path_factory.mktemp("hardening"))


@pytest.mark.parametrize("case_id", _hardening_ids())
def test_data_loss_runaway_and_script_cases_have_their_exact_outcome(hardening, capsys, case_id):
    """The hardening table's data-loss, runaway and scripts classes (analysis.hostile_hardening), each in-process
    (``python experiments/hostile_inputs.py --only "data loss,runaway,scripts"`` runs them as subprocesses): its
    exact outcome and message, and every file it keeps as it was (a device stays a device)."""
    from conftest import run_case_in_process

    from analysis.hostile import _state, classify

    case = hardening[int(case_id.split()[0])]
    kept = {p: _state(p) for p in case.keep}
    code, out, err = run_case_in_process(case.argv, capsys)
    assert classify(case, code, out, err) == ("clean error" if case.expect == "error" else "ok"), (code, err[-600:])
    assert {p: _state(p) for p in case.keep} == kept
