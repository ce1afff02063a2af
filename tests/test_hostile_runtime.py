"""What a hostile user does to a run, and the exact outcome of each (see docs/guarantees.md).

* a checkpoint folder's files that schedlab did not write survive ``--keep-last``;
* one run per checkpoint directory: a live holder of its LOCK is refused, an ended one is taken over;
* COMPLETE records that lie (losses missing, of another type, too few; a step past ``--steps``) are skipped
  or refused, never trusted;
* flags that would do nothing are errors;
* the user's code (factory, batches, loss, blocks) fails with one line naming it;
* token files are checked when opened (range, sidecar), and a file truncated mid-run is one line;
* torchrun's own failure report is left out of ``schedlab run``'s stderr;
* the rounds worker's memory stays flat over configurations.

Signals and failures of real multi-process runs: test_signals.py.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from analysis.cli.train import main as real_main  # noqa: E402
from real import checkpoint as ckpt  # noqa: E402
from real.checkpoint import MARKER, CheckpointConfig, Checkpointer, complete_checkpoints  # noqa: E402
from real.data.tokens import TokenFile  # noqa: E402
from real.launch import _StderrFilter  # noqa: E402
from schedules import CheckpointError, ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
ONE = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--batch-size", "4", "--steps", "2"]


def _main(capsys, argv: list[str]) -> tuple[int, str]:
    """``python -m real ARGV`` in this process: (exit status, stderr)."""
    try:
        code = real_main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in root.rglob("*"))


def _save(saver: Checkpointer, step: int) -> None:
    state = {"w": torch.full((4,), float(step))}
    saver.save(step, state, {"losses": [0.5] * step})


# -- checkpoints: only what the runtime wrote is removed ---------------------------------------------------------


def test_keep_last_removes_only_what_a_save_wrote(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    saver = Checkpointer(CheckpointConfig(directory=str(root), every=1, keep_last=1), rank=0)
    _save(saver, 1)
    (root / "step_000001" / "mine.txt").write_text("my notes")
    (root / ".tmp-step_000002-mine").mkdir()
    (root / ".tmp-step_000002-mine" / "keep.txt").write_text("x")
    (root / ".tmp-notes").mkdir()
    (root / ".tmp-step_notes").mkdir()
    (root / ".tmp-step_000002-a7").mkdir()  # a save's own temporary (attempt 7), left by a killed run
    (root / ".tmp-step_000002-a7" / "__0_0.distcp").write_bytes(b"partial")
    _save(saver, 2)
    _save(saver, 3)
    assert _tree(root) == [
        ".tmp-notes/", ".tmp-step_000002-mine/", ".tmp-step_000002-mine/keep.txt", ".tmp-step_notes/",
        "step_000001/", "step_000001/mine.txt",
        "step_000003/", "step_000003/.metadata", "step_000003/COMPLETE", "step_000003/__0_0.distcp",
    ]
    assert [r.step for r in complete_checkpoints(root)] == [3]


def test_a_save_over_a_folder_with_user_files_keeps_them(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    (root / "step_000002").mkdir(parents=True)
    (root / "step_000002" / "mine.txt").write_text("mine")
    saver = Checkpointer(CheckpointConfig(directory=str(root), every=1, keep_last=3), rank=0)
    _save(saver, 2)
    assert _tree(root / "step_000002") == [".metadata", "COMPLETE", "__0_0.distcp", "mine.txt"]
    info = json.loads((root / "step_000002" / MARKER).read_text())
    assert sorted(info["files"]) == [".metadata", "__0_0.distcp"]
    assert [r.step for r in complete_checkpoints(root)] == [2]


# -- checkpoint records that lie ---------------------------------------------------------------------------------


def _lie(root: Path, **fields) -> None:
    path = root / "step_000002" / MARKER
    info = json.loads(path.read_text())
    for k, v in fields.items():
        if v is KeyError:
            info.pop(k)
        else:
            info[k] = v
    path.write_text(json.dumps(info))


@pytest.mark.parametrize(("losses", "why"), [
    (KeyError, "no losses"),
    (None, "losses null"),
    ("0.5,0.5", 'losses "0.5,0.5"'),
    ({"0": 0.5}, 'losses {"0": 0.5}'),
    ([0.5], "1 losses"),
    ([0.5, 0.5, 0.5], "3 losses"),
    ([0.5, "x"], "2 losses"),
    ([0.5, True], "2 losses"),
])
def test_a_record_whose_losses_lie_is_skipped(tmp_path: Path, caplog, losses, why) -> None:
    root = tmp_path / "ck"
    _save(Checkpointer(CheckpointConfig(directory=str(root), every=1, keep_last=3), rank=0), 2)
    _lie(root, losses=losses)
    ckpt._warned.clear()
    with caplog.at_level("WARNING", logger="real.checkpoint"):
        assert complete_checkpoints(root) == []
    assert [r.message for r in caplog.records if r.name == "real.checkpoint"] == [f"skipping checkpoint {root / 'step_000002'}: its COMPLETE marker holds {why}; "
                               "a checkpoint of step 2 holds a list of 2 numbers"]


def test_a_checkpoint_past_steps_is_refused(tmp_path: Path, capsys) -> None:
    root = tmp_path / "ck"
    code, err = _main(capsys, [*ONE, *SMALL, "--steps", "3", "--checkpoint-dir", str(root), "--checkpoint-every", "3"])
    assert code == 0, err
    code, err = _main(capsys, [*ONE, *SMALL, "--checkpoint-dir", str(root)])
    assert (code, err) == (2, f"error: checkpoint {root / 'step_000003'} is of step 3, past this run's 2 steps; give "
                              "steps 3 or more, or another checkpoint directory (flag --steps)\n")


# -- one run per checkpoint directory ----------------------------------------------------------------------------


def _start(pid: int) -> str | None:
    return ckpt._start_time(pid)


def test_a_live_holder_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    holder = {"host": socket.gethostname(), "pid": os.getppid(), "start": _start(os.getppid()), "since": "then"}
    (root / "LOCK").write_text(json.dumps(holder))
    msg = (f"checkpoint directory {str(root)!r} is in use by another run (PID {os.getppid()} on this host, since "
           "then); wait for it to end or give another checkpoint directory")
    with pytest.raises(CheckpointError, match=re.escape(msg) + "$"):
        ckpt.lock(root)
    with pytest.raises(CheckpointError, match=re.escape(msg) + "$"):
        ckpt.check_unlocked(root)
    other = {"host": "elsewhere", "pid": 7, "since": "then"}
    (root / "LOCK").write_text(json.dumps(other))
    with pytest.raises(CheckpointError, match=re.escape(
            f"checkpoint directory {str(root)!r} is locked by PID 7 on host 'elsewhere' (since then); if that run "
            f"has ended, remove {root / 'LOCK'}") + "$"):
        ckpt.lock(root)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("stale", ["dead", "reused", "garbage", "empty"])
def test_an_ended_holder_is_taken_over(tmp_path: Path, stale: str) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    me = socket.gethostname()
    text = {"dead": json.dumps({"host": me, "pid": _dead_pid()}),
            "reused": json.dumps({"host": me, "pid": os.getppid(), "start": "1"}),  # a PID alive, started another time
            "garbage": "{not json", "empty": ""}[stale]
    (root / "LOCK").write_text(text)
    path = ckpt.lock(root)
    record = json.loads(path.read_text())
    assert (record["host"], record["pid"], record["start"]) == (me, os.getpid(), _start(os.getpid()))
    assert sorted(p.name for p in root.iterdir()) == ["LOCK"]
    ckpt.unlock(path)
    assert list(root.iterdir()) == []


# -- flags that would do nothing ---------------------------------------------------------------------------------

FACTORY = "experiments/my_model.py:build"
USER = ["--model", FACTORY, "--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--batch-size", "8",
        "--steps", "1"]


@pytest.mark.parametrize(("argv", "line"), [
    ([*ONE, "--checkpoint-every", "2"],
     "--checkpoint-every has no effect without --checkpoint-dir (nothing would be saved; give --checkpoint-dir DIR)"),
    ([*ONE, "--keep-last", "1"],
     "--keep-last has no effect without --checkpoint-dir (nothing would be saved; give --checkpoint-dir DIR)"),
    ([*ONE, "--async-checkpoint"],
     "--async-checkpoint has no effect without --checkpoint-dir (nothing would be saved; give --checkpoint-dir DIR)"),
    ([*ONE, "--dp-mode", "zero1"], "--dp-mode has no effect at dp 1 (one replica: no gradients to synchronize)"),
    ([*ONE, "--dp", "1", "--bucket-mb", "5"],
     "--bucket-mb has no effect at dp 1 (one replica: no gradients to synchronize)"),
    ([*ONE, "--recv-ahead", "2"], "--recv-ahead has no effect at pp 1 (one pipeline rank: no messages between stages)"),
    ([*USER, "--heads", "4", "--seq", "16"],
     f"--heads, --seq have no effect with --model {FACTORY} (the factory builds the model; leave them out)"),
    ([*ONE, "--seed", str(2**64)], "data: seed must be an integer from 0 to 2**63 - 1 = 9223372036854775807 "
                                   f"(torch's seeds), got {2**64} (flag --seed)"),
    ([*ONE, "--seed", "-1"], "data: seed must be an integer from 0 to 2**63 - 1 = 9223372036854775807 "
                             "(torch's seeds), got -1 (flag --seed)"),
])
def test_flags_that_would_do_nothing(capsys, monkeypatch, argv, line) -> None:
    monkeypatch.chdir(ROOT)
    assert _main(capsys, argv) == (2, f"error: {line}\n")


def test_profile_refuses_a_factory(capsys, monkeypatch, tmp_path: Path) -> None:
    from analysis.cli.profile import main as profile_main

    monkeypatch.chdir(ROOT)
    try:
        code = profile_main(["--model", FACTORY, "--out", str(tmp_path / "p.json")])
    except SystemExit as exc:
        code = exc.code
    assert (code, capsys.readouterr().err) == (2, (
        f"error: python -m real.profile profiles the built-in models (gpt, mlp), not {FACTORY}; for your model's "
        "costs, train it with schedlab run --trace FILE.csv and give the trace as --costs (flag --model)\n"))


# -- the user's code ---------------------------------------------------------------------------------------------

MODELS = textwrap.dedent('''
    import sys

    import torch
    import torch.nn.functional as F
    from torch import nn

    from real import UserModel


    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x), x


    class Nothing(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            self.lin(x)


    class Boom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            raise ValueError("boom")


    def data(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(8, 8, generator=g), torch.randint(4, (8,), generator=g)


    def net():
        return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


    def stage_tuple():
        return UserModel(model=nn.Sequential(Pair(), nn.Linear(8, 4)), loss=F.cross_entropy, batches=data)


    def last_tuple():
        return UserModel(model=nn.Sequential(nn.Linear(8, 8), Pair()), loss=F.cross_entropy, batches=data)


    def last_none():
        return UserModel(model=nn.Sequential(nn.Linear(8, 8), Nothing()), loss=F.cross_entropy, batches=data)


    def block_raises():
        return UserModel(model=nn.Sequential(nn.Linear(8, 8), Boom()), loss=F.cross_entropy, batches=data)


    def zero_d():
        return UserModel(model=net(), loss=F.cross_entropy, batches=lambda step: (torch.tensor(1.0), torch.tensor(1)))


    def int_inputs():
        return UserModel(model=net(), loss=F.cross_entropy,
                         batches=lambda step: (torch.randint(3, (8, 8)), torch.randint(4, (8,))))


    def widths(step):
        x, y = data(step)
        return (x if step == 0 else torch.randn(8, 9)), y


    def width_changes():
        return UserModel(model=net(), loss=F.cross_entropy, batches=widths)


    def batches_raise():
        return UserModel(model=net(), loss=F.cross_entropy, batches=lambda step: {}['x'])


    def loss_vector():
        return UserModel(model=net(), loss=lambda out, y: F.cross_entropy(out, y, reduction="none"), batches=data)


    def loss_float():
        return UserModel(model=net(), loss=lambda out, y: float(F.cross_entropy(out, y)), batches=data)


    def loss_nograd():
        return UserModel(model=net(), loss=lambda out, y: F.cross_entropy(out, y).detach(), batches=data)


    def exits():
        sys.exit(0)


    def exits_text():
        sys.exit("bye")
''')


def _line_of(text: str, needle: str) -> int:
    """The line number of the first line of ``text`` (a file's contents) holding ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(("factory", "expected"), [
    ("stage_tuple", "model Sequential: block 0 (Pair) returns tuple; a block must return one tensor, the next "
                    "block's input (flag --model)"),
    ("last_tuple", "model Sequential: the last stage (blocks 0..1) returns tuple; every stage must return one tensor "
                   "(flag --model)"),
    ("last_none", "model Sequential: the last stage (blocks 0..1) returns NoneType; every stage must return one "
                  "tensor (flag --model)"),
    ("block_raises", "model Sequential: block 1 (Boom) on the data of batches(0) raised ValueError: boom at "
                     "models.py:@@raise ValueError@@ in forward (flag --model)"),
    ("zero_d", "batches (models.py:@@(torch.tensor(1.0)@@, zero_d.<locals>.<lambda>) returned a 0-d tensor at step 0; inputs "
               "and targets need a first dimension of batch_size = 8 rows (flag --model)"),
    ("int_inputs", "model Sequential: block 0 (Linear) on the data of batches(0) raised RuntimeError: mat1 and mat2 "
                   "must have the same dtype, but got Long and Float (flag --model)"),
    ("width_changes", "batches (models.py:@@def widths@@, widths) returned rows of inputs (9,) torch.float32, targets () "
                      "torch.int64 at step 1, where the first batch had (8,) torch.float32, () torch.int64; every "
                      "step's rows must have the same shape and dtype (flag --model)"),
    ("batches_raise", "batches (models.py:@@{}['x']@@, batches_raise.<locals>.<lambda>) at step 0 raised "
                      "KeyError: 'x' at models.py:@@{}['x']@@ in <lambda> (flag --model)"),
    ("loss_vector", "loss (models.py:@@reduction=@@, loss_vector.<locals>.<lambda>) returned a tensor of shape "
                    "(4,); it must return the mean loss, one element: reduce it (e.g. .mean()) (flag --model)"),
    ("loss_float", "loss (models.py:@@float(F.cross@@, loss_float.<locals>.<lambda>) returned float; it must return "
                   "the mean loss as a torch tensor of one element, computed from the output (not .item()) "
                   "(flag --model)"),
    ("loss_nograd", "loss (models.py:@@.detach(), batches@@, loss_nograd.<locals>.<lambda>) returned a tensor without "
                    "grad; compute it from the output with torch operations (no .detach(), .item() or "
                    "torch.tensor(...)) (flag --model)"),
    ("exits", "model '{spec}': the factory called sys.exit(0) at models.py:@@sys.exit(0)@@ in exits; a function of the "
              "model must return, not exit (flag --model)"),
    ("exits_text", "model '{spec}': the factory called sys.exit('bye') at models.py:@@sys.exit(\"bye\")@@ in "
                   "exits_text; a function of the model must return, not exit (flag --model)"),
])
def test_the_users_code_fails_with_one_line_naming_it(capsys, tmp_path: Path, factory: str, expected: str) -> None:
    (tmp_path / "models.py").write_text(MODELS)
    spec = f"{tmp_path / 'models.py'}:{factory}"

    expected = re.sub(r"@@(.+?)@@", lambda m: str(_line_of(MODELS, m[1])), expected).replace("{spec}", spec)
    argv = ["--model", spec, "--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--batch-size", "8",
            "--steps", "3"]
    assert _main(capsys, argv) == (2, f"error: {expected}\n")


def test_verbose_shows_only_the_users_frames(capsys, tmp_path: Path) -> None:
    (tmp_path / "models.py").write_text(MODELS)
    argv = ["--model", f"{tmp_path / 'models.py'}:block_raises", "--schedule", "gpipe", "--pp", "1",
            "--microbatches", "2", "--batch-size", "8", "--steps", "1", "-v"]
    code, err = _main(capsys, argv)
    lines = err.splitlines()
    assert code == 2
    assert lines[1:] == [
        "the traceback's frames in your code (most recent call last):",
        f'  File "{tmp_path / "models.py"}", line {_line_of(MODELS, "raise ValueError")}, in forward',
        '    raise ValueError("boom")',
    ]


# -- token files -------------------------------------------------------------------------------------------------


def _tokens(path: Path, values: list[int], sidecar: dict | None, dtype: str = "uint16") -> str:
    import numpy as np

    np.asarray(values, dtype=dtype).tofile(path)
    if sidecar is not None:
        Path(f"{path}.json").write_text(json.dumps(sidecar))
    return str(path)


RUN_GPT = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "1", "--batch-size", "2", "--steps", "1",
           "--layers", "1", "--dim", "8", "--heads", "2", "--seq", "4"]


@pytest.mark.parametrize(("values", "sidecar", "dtype", "flags", "expected"), [
    ([1, 2, 300, 4] * 5, {"dtype": "uint16", "vocab": 256}, "uint16", [],
     "token file '{f}' holds token 300 (at token 2), not below its sidecar's vocab 256: the sidecar's dtype (uint16) "
     "or vocab is wrong (flag --data)"),
    ([1, 2, 3, 4] * 5, {"dtype": "uint32", "vocab": 256}, "uint16", [],
     "token file '{f}' holds token 262147 (at token 1), not below its sidecar's vocab 256: the sidecar's dtype "
     "(uint32) or vocab is wrong (flag --data)"),
    ([1, 2, 3, 40] * 5, {"dtype": "uint16", "vocab": 16}, "uint16", [],
     "token file '{f}' holds token 40 (at token 3), not below its sidecar's vocab 16: the sidecar's dtype (uint16) "
     "or vocab is wrong (flag --data)"),
    ([1, 2, 3, 4] * 5, {"dtype": "uint16", "vocab": "256"}, "uint16", [],
     "token file sidecar '{f}.json': vocab must be a positive integer, at most 4,294,967,296 (2^32), got '256' "
     "(flag --data)"),
    ([1, 2, 3, 99] * 5, {"dtype": "uint16"}, "uint16", ["--vocab", "64"],
     "token file '{f}' holds token 99 (at token 3), not below the model's vocab 64: use a vocab of 100 or more "
     "(flag --vocab)"),
    ([1, 2, 3, 4] * 5, None, "uint32", [],
     "token file '{f}' has no sidecar '{f}.json' to say its dtype; the tokens of a file are never guessed: write "
     '{"dtype": "uint16", "vocab": N} there (or uint32), or make the file with python -m real.data prepare '
     "(flag --data)"),
])
def test_token_files_are_checked_when_opened(capsys, tmp_path: Path, values, sidecar, dtype, flags, expected) -> None:
    f = _tokens(tmp_path / "t.bin", values, sidecar, dtype)
    assert _main(capsys, [*RUN_GPT, "--data", f, *flags]) == (2, "error: " + expected.replace("{f}", f) + "\n")


def test_the_vocabulary_comes_from_the_sidecar(capsys, tmp_path: Path) -> None:
    f = _tokens(tmp_path / "t.bin", [1, 2, 3, 200] * 5, {"dtype": "uint16", "vocab": 256})
    code, err = _main(capsys, [*RUN_GPT, "--data", f, "--json"])  # token 200: past the default vocab 64
    assert (code, [line.split()[:2] for line in err.splitlines()]) == (0, [["step", "0"]])


def test_a_token_file_truncated_while_read_is_one_error(tmp_path: Path) -> None:
    f = _tokens(tmp_path / "t.bin", list(range(40)), {"dtype": "uint16"})
    tokens = TokenFile(f, seq=4)
    assert tokens.windows([8])[0].tolist() == [[32, 33, 34, 35]]
    os.truncate(f, 40)
    with pytest.raises(ConfigError, match=re.escape(
            f"token file {f!r} was 80 bytes when opened and is 40 now: it changed during the run; do not write a "
            "token file a run reads") + "$"):
        tokens.windows([8])


# -- torchrun's own failure report -------------------------------------------------------------------------------

TORCHRUN_FAILURE = """\
error: [rank 0] step 1: the loss is nan; training diverged (flag --lr)
E1201 15:51:08.711000 6122 /x/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 0
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/x/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: {trailing}
============================================================
real FAILED
------------------------------------------------------------
Failures:
[1]:
  exitcode  : 2 (pid: 6134)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 6133)
============================================================
Traceback (most recent call last):
  File "model.py", line 3, in forward
ZeroDivisionError: division by zero
""".replace("{trailing}", " ")  # torchrun writes a space after the exception's colon


def test_torchruns_report_is_left_out() -> None:
    out = io.StringIO()
    relay = _StderrFilter(out)
    for line in TORCHRUN_FAILURE.splitlines(keepends=True):
        relay.feed(line)
    relay.close()
    assert out.getvalue() == ("error: [rank 0] step 1: the loss is nan; training diverged (flag --lr)\n"
                              "Traceback (most recent call last):\n  File \"model.py\", line 3, in forward\n"
                              "ZeroDivisionError: division by zero\n")
    assert relay.root_exitcode == 2


# -- the rounds worker's memory ----------------------------------------------------------------------------------


def _live_tensors() -> int:
    import gc

    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_runs_in_one_process_retain_nothing() -> None:
    """What the rounds worker does: configurations one after another in one process. A zero-bubble schedule's
    split backward (retain_graph) once kept the metered step's whole graph alive per run (a reference cycle
    through the activation meter's saved-tensor hook): 268 tensors per zb-h1 run on pipeline rank 1 of 2."""
    from real import ModelConfig, RunConfig, run

    model = ModelConfig(kind="gpt", layers=2, dim=32, heads=2, vocab=64, seq=16)
    # pp 1: every stage on this rank; with two chunks the second stage's input needs a gradient, so its I and W
    # are split as on a last pipeline rank.
    configs = [RunConfig.of(schedule=s, pp=1, chunks=c, microbatches=m, batch_size=8, model=model, steps=2,
                            backend="gloo")
               for s, c, m in (("zb-v", 2, 4), ("1f1b", None, 4), ("interleaved-zb", 2, 4), ("gpipe", None, 2))]
    run(configs[0])
    before, rss = _live_tensors(), _rss_mb()
    after = []
    for config in configs * 3:
        run(config)
        after.append(_live_tensors() - before)
    assert after == [0] * 12
    assert _rss_mb() - rss < 20.0  # MiB: the leak grew by the graph of every run; allocator noise stays far below


TOKEN_MODEL = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn

    from real import UserModel


    def build():
        net = nn.Sequential(nn.Embedding(256, 8), nn.Linear(8, 256))
        return UserModel(model=net, loss=lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()),
                         batches=lambda step: (torch.zeros(4, 8, dtype=torch.long), torch.zeros(4, 8, dtype=torch.long)))
''')


def test_a_factorys_batches_with_a_token_file_says_which_trains(capsys, tmp_path: Path) -> None:
    (tmp_path / "tok.py").write_text(TOKEN_MODEL)
    data = _tokens(tmp_path / "t.bin", list(range(200)), {"dtype": "uint16", "vocab": 256})
    spec = f"{tmp_path / 'tok.py'}:build"
    code, err = _main(capsys, ["--model", spec, "--schedule", "gpipe", "--pp", "1", "--microbatches", "1",
                               "--batch-size", "4", "--steps", "1", "--data", data, "--json"])
    assert (code, err.splitlines()[0]) == (0, f"warning: --data {data} trains the model; the batches function of "
                                              f"{spec} is not used")
