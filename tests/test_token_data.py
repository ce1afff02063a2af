"""Token files and the exactly-once sampler: prepare, windows, epochs, and a kill + resume + resize.

The multi-process test trains the gpt on a 48-window token file: 2 processes
(dp=2, global batch 8) checkpoint every 2 steps and rank 1 is SIGKILLed at step
3; torchrun restarts the group, which resumes at step 2 and saves at step 4;
then one process (``--dp auto``: dp=1, global batch 4) resumes from that
checkpoint for steps 4..7. The window ids each replica trained on (logged at
debug level) are collected from every attempt; taking each step from the
attempt that finished it, they are exactly epoch 0's order: every window once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from analysis.cli.data import main as data_main  # noqa: E402
from real import RunConfig  # noqa: E402
from real.data.sampler import EpochSampler  # noqa: E402
from real.data.tokens import TokenBatches, TokenFile, prepare  # noqa: E402
from real.launch import torchrun  # noqa: E402
from schedules import CheckpointError, ConfigError  # noqa: E402

SEQ = 8
LAUNCH_TIMEOUT = 45  # seconds per launch, kill and restart included, with room for a busy 2-core machine
MODEL = ["--layers", "2", "--dim", "16", "--heads", "2", "--vocab", "256", "--seq", str(SEQ)]
_WINDOWS = re.compile(r"step (\d+) replica (\d+) windows ([\d,]*)")


def _corpus(tmp_path, windows: int) -> str:
    """A byte-level token file of exactly ``windows`` windows, from the README's text."""
    text = tmp_path / "text.txt"
    text.write_bytes(open("README.md", "rb").read()[: windows * SEQ + 1])
    out = str(tmp_path / "corpus.u16")
    prepare([text], out)
    return out


def test_prepare_writes_bytes_as_uint16_tokens_and_a_sidecar(tmp_path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"hi\xff")
    b.write_text("yo")
    assert data_main(["prepare", "--input", str(a), str(b), "--out", str(tmp_path / "t.u16")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert np.fromfile(tmp_path / "t.u16", dtype=np.uint16).tolist() == [104, 105, 255, 10, 121, 111]
    meta = json.loads((tmp_path / "t.u16.json").read_text())
    assert (meta["dtype"], meta["vocab"], meta["tokens"]) == ("uint16", 256, 6)
    f = TokenFile(tmp_path / "t.u16", seq=2)
    assert f.num_windows == 2  # (6 - 1) // 2
    x, y = f.windows([1, 0])
    assert x.tolist() == [[255, 10], [104, 105]] and y.tolist() == [[10, 121], [105, 255]]


def test_a_uint32_file_is_read_through_its_sidecar(tmp_path):
    path = tmp_path / "t.u32"
    np.arange(70_000, 70_009, dtype=np.uint32).tofile(path)
    (tmp_path / "t.u32.json").write_text(json.dumps({"dtype": "uint32", "vocab": 80_000}))
    x, y = TokenFile(path, seq=4).windows([1])
    assert x.tolist() == [[70_004, 70_005, 70_006, 70_007]] and y.tolist() == [[70_005, 70_006, 70_007, 70_008]]


@pytest.mark.parametrize(("content", "seq", "message"), [
    (b"\x01\x00\x02", 2, "has 3 bytes, not a whole number of uint16 tokens"),
    (b"\x01\x00\x02\x00", 2, "has 2 tokens, fewer than one window of seq + 1 = 3"),
])
def test_bad_token_files_are_named(tmp_path, content, seq, message):
    path = tmp_path / "bad.u16"
    path.write_bytes(content)
    (tmp_path / "bad.u16.json").write_text('{"dtype": "uint16"}')
    with pytest.raises(ConfigError, match=re.escape(message)):
        TokenFile(path, seq)


def test_the_stream_takes_every_window_of_an_epoch_once_across_epochs():
    s = EpochSampler(10, seed=3)
    e0, e1 = s.order(0).tolist(), s.order(1).tolist()
    assert sorted(e0) == sorted(e1) == list(range(10)) and e0 != e1
    assert s.take(8, 4).tolist() == e0[8:] + e1[:2]  # a batch across the end of an epoch
    assert torch.cat([s.take(4 * k, 4) for k in range(5)]).tolist() == e0 + e1


def test_the_position_survives_a_change_of_global_batch(tmp_path):
    path = _corpus(tmp_path, 20)
    cfg = RunConfig.of(schedule="gpipe", batch_size=8, microbatches=2, token_file=path,
                       model=__import__("real").ModelConfig(vocab=256, seq=SEQ))
    first = TokenBatches.open(cfg)
    state = first.state(2)  # 16 windows consumed
    assert (state["consumed"], state["epoch"], state["offset"], state["windows"]) == (16, 0, 16, 20)
    smaller = TokenBatches(first.file, batch_size=4, seed=cfg.data.seed)
    smaller.restore(2, state)
    order = first.sampler
    assert smaller.ids(2).tolist() == order.order(0)[16:20].tolist()
    assert smaller.ids(3).tolist() == order.order(1)[:4].tolist()
    with pytest.raises(CheckpointError, match="of 20 windows with seed 0; this token file has 20 windows of seq 8, "
                                              "seed 1"):
        TokenBatches(first.file, 4, seed=1).restore(2, state)


def _windows_by_step(stderr: str) -> tuple[dict[tuple[int, int], list[int]], list[tuple[int, int]]]:
    """(step, replica) -> ids, the last logged (a restarted attempt replays the steps after the checkpoint);
    and every (step, replica) in the order logged."""
    last, seen = {}, []
    for m in _WINDOWS.finditer(stderr):
        key = (int(m[1]), int(m[2]))
        last[key] = [int(i) for i in m[3].split(",") if i]
        seen.append(key)
    return last, seen


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 45)  # two launches (kill and restart, then resume)
def test_every_window_is_used_exactly_once_across_a_kill_a_resume_and_a_resize(tmp_path):
    data, ckpt = _corpus(tmp_path, 48), str(tmp_path / "ckpt")
    common = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", *MODEL, "--data", data,
              "--checkpoint-dir", ckpt, "--checkpoint-every", "2", "--timeout", "30", "-vv", "--json"]
    try:
        first = torchrun(2, ["-m", "real", *common, "--dp", "2", "--batch-size", "8", "--steps", "4",
                             "--fail-at-step", "3", "--fail-rank", "1"], timeout=LAUNCH_TIMEOUT, capture=True,
                         launcher_args=["--max-restarts=1", "--monitor-interval=0.2"])
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun hung; stderr so far:\n{(exc.stderr or '')[-6000:]}")
    assert first.returncode == 0, first.stderr[-6000:]
    assert json.loads(first.stdout)["start_step"] == 2  # the restarted attempt resumed from step 2
    second = subprocess.run([sys.executable, "-m", "real", *common, "--dp", "auto", "--batch-size", "4",
                             "--steps", "8"], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    assert second.returncode == 0, second.stderr[-6000:]
    out = json.loads(second.stdout)
    assert (out["dp"], out["start_step"], out["resumed_from"].endswith("step_000004")) == (1, 4, True)

    ids1, seen1 = _windows_by_step(first.stderr)
    ids2, _ = _windows_by_step(second.stderr)
    assert sorted(ids1) == [(s, d) for s in range(4) for d in range(2)]
    assert all(seen1.count((s, d)) == 1 for s in (0, 1) for d in (0, 1))  # before the checkpoint: run once
    assert sorted(ids2) == [(s, 0) for s in range(4, 8)]
    used = [i for s in range(4) for d in range(2) for i in ids1[(s, d)]] + [i for s in range(4, 8) for i in ids2[(s, 0)]]
    assert sorted(used) == list(range(48)), "a window repeated or missing"
    assert used == EpochSampler(48, seed=0).order(0).tolist()
