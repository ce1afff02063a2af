"""Checkpoint integrity, in one process: a checkpoint is used only if every file verifies against COMPLETE.

* bytes changed in place (same size) -> its CRC-32 differs: skipped with a
  warning naming the file, the previous checkpoint is used;
* a .metadata DCP cannot read, a garbled or old-style COMPLETE -> skipped alike;
* every checkpoint corrupt -> training starts at step 0, as with an empty directory;
* each warning is logged once per process (rank), however often the directory is scanned;
* an asynchronous save records what a synchronous one records (the losses as of the save call).
"""

from __future__ import annotations

import json
import logging
import re
import zlib
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from analysis.cli.train import main as real_main  # noqa: E402
from real.checkpoint import MARKER, CheckpointConfig, Checkpointer, complete_checkpoints, latest_complete  # noqa: E402
from real.checkpoint import load as load_checkpoint  # noqa: E402
from real.checkpoint import state_dict as checkpoint_state  # noqa: E402
from schedules import CheckpointError  # noqa: E402
from tests.test_real_fault import SMALL, _params, save_steps  # noqa: E402

LOGGER = "real.checkpoint"


def _flip(path: Path, at: float = 0.5, n: int = 64) -> None:
    """Invert ``n`` bytes of the file at fraction ``at`` of its length: same size, other bytes."""
    data = bytearray(path.read_bytes())
    i = int(len(data) * at)
    data[i:i + n] = bytes(b ^ 0xFF for b in data[i:i + n])
    path.write_bytes(bytes(data))


def _record_crc(ckpt: Path, name: str) -> None:
    """Rewrite COMPLETE with the file's current CRC-32: a file that was garbled before the marker was written."""
    info = json.loads((ckpt / MARKER).read_text())
    info["files"][name]["crc32"] = f"{zlib.crc32((ckpt / name).read_bytes()):08x}"
    (ckpt / MARKER).write_text(json.dumps(info))


def _shard(ckpt: Path) -> str:
    return next(ckpt.glob("*.distcp")).name


def _sizes_only(ckpt: Path) -> None:
    """COMPLETE as schedlab wrote it before checksums: ``files`` maps each name to its size."""
    info = json.loads((ckpt / MARKER).read_text())
    info["files"] = {name: f["bytes"] for name, f in info["files"].items()}
    (ckpt / MARKER).write_text(json.dumps(info))


def _garble_metadata(ckpt: Path) -> None:
    _flip(ckpt / ".metadata", at=0.0)
    _record_crc(ckpt, ".metadata")


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


CORRUPTIONS = [  # (what is done to step 3, the reason the warning gives)
    pytest.param(lambda c: _flip(c / _shard(c)), r"file __0_0\.distcp has CRC-32 [0-9a-f]{8}, [0-9a-f]{8} was "
                 r"written: its bytes changed$", id="shard-bytes"),
    pytest.param(lambda c: _flip(c / ".metadata"), r"file \.metadata has CRC-32 [0-9a-f]{8}, [0-9a-f]{8} was "
                 r"written: its bytes changed$", id="metadata-bytes"),
    pytest.param(_garble_metadata, r"file \.metadata cannot be read \(UnpicklingError: [^\n]*\)$",
                 id="metadata-unreadable"),
    pytest.param(lambda c: _flip(c / MARKER, at=0.0, n=1), r"unreadable COMPLETE marker \(UnicodeDecodeError: ",
                 id="marker-garbled"),
    pytest.param(lambda c: (c / MARKER).write_text((c / MARKER).read_text()[:40]),
                 r"unreadable COMPLETE marker \(JSONDecodeError: ", id="marker-cut"),
    pytest.param(_sizes_only, r"its COMPLETE marker lists no checksum per file \(written by an older schedlab\?\); "
                 r"it cannot be verified$", id="marker-without-checksums"),
]


@pytest.mark.parametrize(("corrupt", "reason"), CORRUPTIONS)
def test_a_corrupt_checkpoint_is_skipped_once_with_a_warning_and_the_previous_one_loads(tmp_path, caplog, corrupt,
                                                                                      reason):
    named, _, saved = save_steps(tmp_path, 3, keep_last=3)
    caplog.clear()
    corrupt(tmp_path / "step_000003")
    restored = latest_complete(tmp_path)
    assert restored is not None and restored.step == 2 and restored.info["losses"] == [0.0, 0.0]
    (warning,) = _warnings(caplog)
    prefix = f"skipping checkpoint {tmp_path / 'step_000003'}: "
    assert warning.startswith(prefix) and "\n" not in warning and "weights_only" not in warning, warning
    assert re.match(reason, warning[len(prefix):]), warning
    fresh = [(n, torch.nn.Parameter(torch.zeros_like(p))) for n, p in named]
    opt = torch.optim.AdamW([p for _, p in fresh], lr=0.1)
    load_checkpoint(restored, fresh, [opt], 0)
    assert all(torch.equal(p, q) for (_, p), q in zip(fresh, saved[2], strict=True))
    assert [c.step for c in complete_checkpoints(tmp_path)] == [1, 2]
    assert latest_complete(tmp_path).step == 2
    assert len(_warnings(caplog)) == 1  # scanned three times, warned once


def test_only_the_newest_checkpoint_that_verifies_is_checksummed(tmp_path, caplog):
    """latest_complete stops at the first (newest) checkpoint that verifies: older corrupt ones are not read."""
    save_steps(tmp_path, 3, keep_last=3)
    _flip(tmp_path / "step_000001" / "__0_0.distcp")
    caplog.clear()
    assert latest_complete(tmp_path).step == 3 and _warnings(caplog) == []
    assert [c.step for c in complete_checkpoints(tmp_path)] == [2, 3] and len(_warnings(caplog)) == 1


def test_with_every_checkpoint_corrupt_training_starts_at_step_0(tmp_path, caplog, capsys):
    ckpt = tmp_path / "ckpt"
    args = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--batch-size", "8", *SMALL, "--steps", "4",
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--json"]
    assert real_main(args) == 0
    first = json.loads(capsys.readouterr().out)
    for step in (2, 4):
        _flip(ckpt / f"step_{step:06d}" / "__0_0.distcp")
    caplog.clear()
    assert real_main(args) == 0  # scans the directory twice (the flag checks, then run()) and saves twice
    again = json.loads(capsys.readouterr().out)
    assert again["start_step"] == 0 and again["resumed_from"] is None
    assert again["losses"] == first["losses"] and again["param_sha256"] == first["param_sha256"]
    shard_changed = r"file __0_0\.distcp has CRC-32 [0-9a-f]{8}, [0-9a-f]{8} was written: its bytes changed"
    expected = [  # newest first, each once
        re.escape(f"skipping checkpoint {ckpt / 'step_000004'}: ") + shard_changed,
        re.escape(f"skipping checkpoint {ckpt / 'step_000002'}: ") + shard_changed,
        re.escape(f"checkpoint directory {ckpt}: none of its 2 checkpoints verifies; training starts at step 0"),
    ]
    warnings = _warnings(caplog)
    assert len(warnings) == len(expected) and all(map(re.fullmatch, expected, warnings)), warnings
    assert [c.step for c in complete_checkpoints(ckpt)] == [2, 4]  # rewritten by the run from step 0


def test_a_checkpoint_garbled_before_its_marker_fails_to_load_in_one_line(tmp_path):
    """A shard that verifies but DCP cannot read (garbled before COMPLETE was written): one line, no torch advice."""
    named, _, _ = save_steps(tmp_path, 1, keep_last=1)
    ckpt = tmp_path / "step_000001"
    shard = _shard(ckpt)
    _flip(ckpt / shard, at=0.0)
    _record_crc(ckpt, shard)
    restored = latest_complete(tmp_path)
    assert restored is not None and restored.step == 1
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(restored, named, [], 0)
    message = str(info.value)
    assert message.startswith(f"checkpoint {ckpt} cannot be loaded (rank 0: UnpicklingError: ")
    assert message.endswith("; remove it to resume from the one before"), message
    assert "\n" not in message and "weights_only" not in message and info.value.field == "directory"


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_save_records_the_losses_as_of_the_call(tmp_path, async_save):
    """Training goes on (the losses grow) while an asynchronous save is in flight: COMPLETE holds N losses at step N."""
    named = _params()
    saver = Checkpointer(CheckpointConfig(directory=str(tmp_path), every=2, async_save=async_save), rank=0)
    losses = [3.5, 3.25]
    saver.save(2, checkpoint_state(named, [], 0), {"losses": losses})
    losses.append(3.0)  # step 2 runs while the save of step 2's start is in flight
    saver.wait()
    (restored,) = complete_checkpoints(tmp_path)
    assert restored.step == 2 and restored.info["losses"] == [3.5, 3.25]
    assert set(restored.info["files"]) == {".metadata", "__0_0.distcp"}
    assert all(set(f) == {"bytes", "crc32"} for f in restored.info["files"].values())
