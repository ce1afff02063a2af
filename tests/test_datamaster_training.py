"""The data master as a run's data source (``--data-master``): leases of per-step shards, exactly once across a kill.

In one process the leased run equals the sampler's bit for bit (one replica
takes every shard in order). Under torchrun, two trainers (dp=2) lease shards
of 4 windows of a 48-window token file (one epoch in 6 steps), checkpointing every 2 steps; rank 1 is
SIGKILLed at step 3 holding its lease. torchrun restarts the group, whose new
master resumes from the checkpoint at step 2 and leases the shards from there
again: the dead trainer's among them. Taking each (step, replica) from the
attempt that finished it, the windows trained on are epoch 0's order, each once,
and the losses and parameters equal plain single-process training on the
sampler's batches.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig, run  # noqa: E402
from real.checkpoint import complete_checkpoints  # noqa: E402
from real.data.sampler import EpochSampler  # noqa: E402
from real.data.tokens import prepare  # noqa: E402
from real.launch import torchrun  # noqa: E402
from schedules import ConfigError  # noqa: E402

SEQ, WINDOWS, STEPS, BATCH = 8, 48, 6, 8  # the 6 steps take epoch 0 whole
LAUNCH_TIMEOUT = 150  # seconds, kill and restart included, with room for a busy 2-core machine
MODEL = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=256, seq=SEQ)
FLAGS = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--layers", "2", "--dim", "16", "--heads", "2",
         "--vocab", "256", "--seq", str(SEQ), "--batch-size", str(BATCH), "--steps", str(STEPS), "--timeout", "20"]
_LEASED = re.compile(r"\[rank (\d)\] DEBUG real\.data\.datamaster: step (\d+) replica (\d+) windows ([\d,]+) \(shard (\d+)\)")
_LEASES = re.compile(r"data master: \d+ shards of \d+ windows completed; leases (\[.*?\]);")


def _corpus(tmp_path) -> str:
    text = tmp_path / "text.txt"
    text.write_bytes(open("README.md", "rb").read()[: WINDOWS * SEQ + 1])
    out = str(tmp_path / "corpus.u16")
    prepare([text], out)
    return out


def _config(data: str, **kw) -> RunConfig:
    return RunConfig.of(schedule="gpipe", microbatches=2, batch_size=BATCH, steps=STEPS, model=MODEL,
                        token_file=data, **kw)


def test_a_data_master_needs_a_token_file():
    with pytest.raises(ConfigError, match="data_master hands out the windows of a token file") as err:
        RunConfig.of(schedule="gpipe", data_master=True)
    assert err.value.field == "data_master"


def test_one_process_leasing_every_shard_trains_as_the_sampler_does(tmp_path):
    data = _corpus(tmp_path)
    leased, plain = run(_config(data, data_master=True)), run(_config(data))
    assert leased.losses == plain.losses and leased.param_sha256 == plain.param_sha256


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
def test_a_trainer_killed_mid_lease_loses_it_to_the_restart_and_every_window_is_used_once(tmp_path):
    data, ckpt = _corpus(tmp_path), tmp_path / "ckpt"
    try:
        proc = torchrun(2, ["-m", "real", *FLAGS, "--dp", "2", "--data", data, "--data-master", "--json", "-vv",
                            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--keep-last", "3",
                            "--fail-at-step", "3", "--fail-rank", "1"], timeout=LAUNCH_TIMEOUT, capture=True,
                        env={"OMP_NUM_THREADS": "1"}, launcher_args=["--max-restarts=1", "--monitor-interval=0.2"])
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun hung; stderr so far:\n{(exc.stderr or '')[-6000:]}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    out = json.loads(proc.stdout)
    assert (out["restart_count"], out["start_step"]) == (1, 2)

    # The attempts split at the injected fault: rank 1 leased its shard of step 3, then died holding it.
    before, after = proc.stderr.split("injected fault (kill) at step 3", 1)
    died = [(int(m[5]), m[4]) for m in _LEASED.finditer(before) if m[1] == "1" and m[2] == "3"]
    assert len(died) == 1
    held, held_windows = died[0]
    leases = [ast.literal_eval(m[1]) for m in _LEASES.finditer(after)]
    assert len(leases) == 1, "rank 0 reports the restarted attempt's leases once"
    assert sorted(s for s, _ in leases[0]) == list(range(4, 12))  # steps 2..5, two shards each
    assert held in {s for s, _ in leases[0]}  # the dead trainer's lease, leased again
    restarted = {(int(m[2]), int(m[3])): (int(m[5]), m[4]) for m in _LEASED.finditer(after)}
    assert sorted(restarted) == [(s, d) for s in range(2, STEPS) for d in range(2)]
    assert held_windows in {w for _, w in restarted.values()}

    first = {(int(m[2]), int(m[3])): m[4] for m in _LEASED.finditer(before) if int(m[2]) < 2}
    used = [first[(s, d)] for s in range(2) for d in range(2)]
    used += [w for _, (_, w) in sorted(restarted.items())]
    by_step = [sorted(int(i) for w in used[2 * s : 2 * s + 2] for i in w.split(",")) for s in range(STEPS)]
    order = EpochSampler(WINDOWS, seed=0).order(0).tolist()
    assert by_step == [sorted(order[BATCH * s : BATCH * (s + 1)]) for s in range(STEPS)]  # the sampler's batches
    assert sorted(i for b in by_step for i in b) == list(range(WINDOWS))  # each window of the epoch once

    keys = ("source", "consumed", "epoch", "shard_windows", "epoch_shards_done")
    saved = {c.step: {k: c.info["data"][k] for k in keys} for c in complete_checkpoints(ckpt)}
    assert saved == {s: {"source": "data master", "consumed": BATCH * s, "epoch": s // STEPS, "shard_windows": 4,
                         "epoch_shards_done": 2 * s % 12} for s in (2, 4, 6)}

    reference = run(_config(data))  # one process, the sampler's batches
    assert out["losses"] == pytest.approx(reference.losses, abs=1e-5)
    assert out["param_norm"] == pytest.approx(reference.param_norm, rel=1e-5)
