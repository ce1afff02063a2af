"""Every path through the one output policy: the cases of ``analysis.hostile_paths`` run in-process, and the
pieces under them (check_paths, open_append, the metrics' run id, the checkpoint lock and keep_last of one run).

Each case: the exact exit status, the exact one line on stderr, and every input byte-identical afterwards.
No case starts torchrun: every refusal comes before it.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from conftest import run_case_in_process as _run

from analysis.hostile import _state
from analysis.hostile_paths import GROUP, cases, live_lock
from common.errors import OutputError
from common.outputs import Output, check_paths, open_append
from real import checkpoint as ckpt

SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    return d, cases(d)


def _ids():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return [f"{i}: {' '.join(c.argv[3:5])} ... {c.argv[-1].rsplit('/', 1)[-1]}"
                for i, c in enumerate(cases(Path(tmp)))]


@pytest.mark.parametrize("index", range(len(_ids())), ids=_ids())
def test_each_case_has_its_exact_outcome_and_keeps_every_input(table, index, capsys, monkeypatch):
    d, all_cases = table
    case = all_cases[index]
    assert case.group == GROUP
    monkeypatch.chdir(d)
    kept = {p: _state(p) for p in case.keep}
    rc, _, err = _run(case.argv, capsys)
    if case.expect == "error":
        assert (rc, err) == (2, f"error: {case.message}\n")
    else:
        assert rc == 0, err
    assert {p: _state(p) for p in case.keep} == kept


def test_a_trained_tokenizer_is_written_with_the_token_file(tmp_path, capsys):
    from analysis.cli.data import main

    (tmp_path / "c.txt").write_text("hello world\n" * 40)
    assert main(["prepare", "--input", str(tmp_path / "c.txt"), "--out", str(tmp_path / "t"), "--train-tokenizer",
                 "bpe:260"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 't'}: ")
    meta = json.loads((tmp_path / "t.json").read_text())
    assert meta["tokenizer"]["kind"] == "bpe" and meta["tokenizer"]["path"] == str(tmp_path / "t.tokenizer.json")
    saved = json.loads((tmp_path / "t.tokenizer.json").read_text())
    assert len(saved["model"]["vocab"]) + len(saved["added_tokens"]) - 1 == meta["vocab"] == 260
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "t", "t.json", "t.tokenizer.json"]


# -- the policy itself -------------------------------------------------------------------------------------------


def test_check_paths_takes_appended_files_and_folders(tmp_path):
    (tmp_path / "in.txt").write_text("x")
    os.symlink(tmp_path / "in.txt", tmp_path / "soft.jsonl")
    with pytest.raises(OutputError) as exc:
        check_paths({"--events": Output(tmp_path / "soft.jsonl", "events file", "append")},
                    {"--data": tmp_path / "in.txt"})
    assert str(exc.value) == (f"--events '{tmp_path}/soft.jsonl' is also an input (--data); appending to it would "
                              "change the input: give the output another name")
    with pytest.raises(OutputError) as exc:
        check_paths({"--log-dir": Output(tmp_path / "in.txt", "log directory", "folder")})
    assert str(exc.value) == f"log directory '{tmp_path}/in.txt' is a file; give a folder"
    with pytest.raises(ValueError, match="Output kind 'copy'"):
        Output(tmp_path, "x", "copy")
    assert check_paths({"a": Output(tmp_path / "new.jsonl", "events file", "append"), "b": None}, {"c": None}) == {
        "a": tmp_path / "new.jsonl"}
    assert list(tmp_path.iterdir()) != [] and not (tmp_path / "new.jsonl").exists()  # checking writes nothing


def test_open_append_refuses_an_input_it_opened(tmp_path):
    (tmp_path / "in.u16").write_bytes(b"tokens")
    os.link(tmp_path / "in.u16", tmp_path / "events.jsonl")  # made after any earlier check: found on the file opened
    with pytest.raises(OutputError) as exc:
        open_append(tmp_path / "events.jsonl", "events file", {"token_file": tmp_path / "in.u16"})
    assert str(exc.value) == (f"events file '{tmp_path}/events.jsonl' is also an input (token_file); appending to "
                              "it would change the input: give the output another name")
    assert (tmp_path / "in.u16").read_bytes() == b"tokens"
    with open_append(tmp_path / "sub" / "e.jsonl", "events file", {"token_file": tmp_path / "in.u16"}) as f:
        f.write("a\n")
    assert (tmp_path / "sub" / "e.jsonl").read_text() == "a\n"


def test_a_read_only_metrics_file_is_one_line(tmp_path, capsys):
    from analysis.cli.train import main

    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "metrics.jsonl").write_text("")
    os.chmod(tmp_path / "tb" / "metrics.jsonl", 0o444)
    argv = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "1", "--batch-size", "2", *SMALL,
            "--log-dir", str(tmp_path / "tb"), "--json"]
    if os.geteuid() == 0:  # root writes a read-only file: the run appends to it
        assert main(argv) == 0
        assert [json.loads(x)["step"] for x in (tmp_path / "tb" / "metrics.jsonl").read_text().splitlines()] == [0, 0]
        return
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err == (f"error: metrics file '{tmp_path}/tb/metrics.jsonl' is not writable; make "
                                       "it writable or give another name\n")


# -- two runs, one metrics file: every line names its run --------------------------------------------------------


def test_two_runs_in_one_metrics_file_are_told_apart_and_a_curve_takes_one(tmp_path):
    pytest.importorskip("tensorboard")
    from analysis.time_to_loss import read_curve
    from real.metrics_log import JSONL_NAME, MetricsLog
    from schedules import ConfigError

    with MetricsLog(tmp_path, run="first") as m:
        m.log(0, {"loss": 2.0})
    with MetricsLog(tmp_path, run="second") as m:
        m.log(0, {"loss": 1.0})
    lines = [json.loads(x) for x in (tmp_path / JSONL_NAME).read_text().splitlines()]
    assert lines == [{"run": "first", "step": 0, "loss": 2.0}, {"run": "second", "step": 0, "loss": 1.0}]
    with pytest.raises(ConfigError) as exc:
        read_curve(tmp_path / JSONL_NAME)
    assert str(exc.value) == (f"time to loss: curve file '{tmp_path}/{JSONL_NAME}' holds the lines of 2 runs (first, "
                              "second); give one run's metrics (each run its own log folder)")


# -- one checkpoint directory, one run ----------------------------------------------------------------------------


def test_the_replicas_of_one_live_job_share_the_lock_and_others_are_refused(tmp_path):
    parent = os.getppid()
    live_lock(tmp_path, parent, run="live http://h:1")
    assert ckpt.lock(tmp_path, "live http://h:1") is None  # the same job: shared, nothing to unlock
    ckpt.check_unlocked(tmp_path, "live http://h:1")
    since = json.loads((tmp_path / "LOCK").read_text())["since"]
    message = (f"checkpoint directory '{tmp_path}' is in use by another run (PID {parent} on this host, since "
               f"{since}); wait for it to end or give another checkpoint directory")
    for run in ("live http://other:1", None):
        with pytest.raises(ckpt.CheckpointError) as exc:
            ckpt.lock(tmp_path, run)
        assert str(exc.value) == message
        with pytest.raises(ckpt.CheckpointError):
            ckpt.check_unlocked(tmp_path, run)
    # the holder gone: the next replica of the job takes it over, and holds it
    (tmp_path / "LOCK").write_text(json.dumps({"host": socket.gethostname(), "pid": 2**22 + 7, "run": "live x"}))
    held = ckpt.lock(tmp_path, "live http://h:1")
    assert held == tmp_path / "LOCK" and json.loads(held.read_text())["pid"] == os.getpid()
    assert ckpt.lock(tmp_path, "live http://h:1") == held  # taken again before a save: still this process's
    ckpt.unlock(held)
    assert not held.exists()


def test_keep_last_removes_only_its_own_runs_checkpoints(tmp_path):
    import torch

    def save(run: str, steps: range, keep: int) -> None:
        saver = ckpt.Checkpointer(ckpt.CheckpointConfig(directory=str(tmp_path), every=1, keep_last=keep), 0,
                                  run=run)
        for s in steps:
            saver.save(s, {"w": torch.full((2,), float(s))}, {"losses": [0.5] * s})

    save("other", range(1, 3), 5)
    save("mine", range(3, 7), 2)
    runs = {p.name: json.loads((p / "COMPLETE").read_text())["run"] for p in sorted(tmp_path.glob("step_*"))}
    assert runs == {"step_000001": "other", "step_000002": "other", "step_000005": "mine", "step_000006": "mine"}
    # a run that resumes continues the run it resumed: it prunes that run's checkpoints
    saver = ckpt.Checkpointer(ckpt.CheckpointConfig(directory=str(tmp_path), every=1, keep_last=1), 0, run="new")
    saver.resumed(ckpt.latest_complete(tmp_path))
    saver.save(7, {"w": torch.zeros(2)}, {"losses": [0.5] * 7})
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000001", "step_000002", "step_000007"]
