"""Fault tolerance of the real runtime: DCP checkpoints, torchrun restarts, elastic resize, dead-peer timeouts.

* kill and restart: rank 1 is SIGKILLed at step 3 (checkpoints every 2 steps);
  torchrun --max-restarts 1 restarts the group, which resumes from step 2 and
  ends with parameters bit-equal to an uninterrupted run; the losses cover
  every step once; a partial checkpoint directory (no COMPLETE marker) is
  skipped.
* the same with ``--async-checkpoint`` (killed at step 5: resumes from step 2
  or 4): every COMPLETE holds N losses at step N, the restart ends bit-equal.
* a diverging run (lr 1e6): both ranks stop at the same step with one error
  naming it (neither waits for the other).
* elastic: 4 steps with dp=2, then the same checkpoint directory resumed
  with one process (``--dp auto`` -> dp=1, same global batch) to step 6: the
  losses equal plain single-process training's to float tolerance.
* a hung peer: rank 1 stops answering; rank 0 exits within the timeout with
  an error naming rank 1.
* a hung launch: at the launcher's timeout every worker is stopped and its
  output so far is kept (what these tests rely on to fail, not hang).
* in-process: a truncated file or a missing marker makes a checkpoint
  partial, the previous complete one is used; only the last N are kept; a
  non-finite loss raises ConfigError naming the step (more checkpoint
  corruptions: test_checkpoint_integrity.py).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from analysis.cli.train import main as real_main  # noqa: E402
from real import ModelConfig, RunConfig, param_digest, reference_run, run  # noqa: E402
from real.checkpoint import MARKER, CheckpointConfig, Checkpointer, complete_checkpoints, latest_complete  # noqa: E402
from real.checkpoint import load as load_checkpoint  # noqa: E402
from real.checkpoint import state_dict as checkpoint_state  # noqa: E402
from real.launch import KILL_GRACE, torchrun  # noqa: E402
from real.trainer import Trainer  # noqa: E402
from schedules import ConfigError  # noqa: E402

SMALL = ["--layers", "4", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
MODEL = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8)
PP2 = ["--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--batch-size", "16", "--steps", "6", *SMALL,
       "--json", "--timeout", "30"]
LAUNCH_TIMEOUT = 90  # seconds per torchrun launch: a hang guard with room for a loaded machine (25 s failed at load 7)


def _torchrun(nproc: int, args: list[str], *, restarts: int = 0, timeout: float = LAUNCH_TIMEOUT,
              monitor: float = 0.2) -> subprocess.CompletedProcess:
    """``python -m real ARGS`` under torchrun; on timeout (process group killed) the test fails with stderr."""
    try:
        return torchrun(nproc, ["-m", "real", *args], timeout=timeout, capture=True, env={"OMP_NUM_THREADS": "1"},
                        launcher_args=[f"--max-restarts={restarts}", f"--monitor-interval={monitor}"])
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun hung; stderr so far:\n{(exc.stderr or '')[-6000:]}")


def _json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout)


def _steps_printed(stderr: str) -> list[int]:
    return [int(line.split()[1]) for line in stderr.splitlines() if line.startswith("step ")]


@pytest.fixture(scope="module")
def plain() -> dict:
    """PP2 run uninterrupted (one launch, shared by the kill tests)."""
    return _json(_torchrun(2, PP2))


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT * 2 + 5)  # its launch, and `plain`'s if it sets that up
def test_killed_rank_restarts_from_the_last_complete_checkpoint_bit_for_bit(tmp_path, plain):
    ckpt = tmp_path / "ckpt"
    decoy = ckpt / "step_000003"  # a save killed mid-write: files but no COMPLETE marker
    decoy.mkdir(parents=True)
    (decoy / "__0_0.distcp").write_bytes(b"partial")
    proc = _torchrun(2, [*PP2, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--keep-last", "2",
                         "--fail-at-step", "3", "--fail-rank", "1"], restarts=1)
    resumed = _json(proc)
    assert "injected fault (kill) at step 3" in proc.stderr
    assert resumed["restart_count"] == 1 and resumed["start_step"] == 2
    assert resumed["resumed_from"] == str(ckpt / "step_000002"), "the partial step_000003 must be skipped"
    assert resumed["param_sha256"] == plain["param_sha256"]
    assert resumed["losses"] == plain["losses"]  # 6 losses: steps 0-1 restored, 2-5 run once by the restart
    assert len(resumed["step_times"]) == 4
    assert _steps_printed(proc.stderr) == [0, 1, 2, 2, 3, 4, 5]  # step 2 ran twice, is counted once
    kept = complete_checkpoints(ckpt)
    assert [c.path.name for c in kept] == ["step_000004", "step_000006"]  # keep-last 2
    assert all(c.info["losses"] == plain["losses"][:c.step] for c in kept)  # N losses at step N
    warned = [line.split()[1] for line in proc.stderr.splitlines() if f"skipping checkpoint {decoy}: no COMPLETE" in line]
    assert sorted(warned) == ["0]", "0]", "1]", "1]"], proc.stderr[-6000:]  # once per rank and attempt


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT * 2 + 5)  # two launches, and `plain`'s if it sets that up
def test_killed_rank_restarts_from_an_async_checkpoint_bit_for_bit(tmp_path, plain):
    """As above with --async-checkpoint; killed at step 5, so the save of step 2 has finished (the save of
    step 4 waits for it) and the save of step 4 may or may not have: the restart resumes from step 2 or 4."""
    ckpt = tmp_path / "ckpt"
    proc = _torchrun(2, [*PP2, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2", "--keep-last", "2",
                         "--async-checkpoint", "--fail-at-step", "5", "--fail-rank", "1"], restarts=1)
    resumed = _json(proc)
    assert "injected fault (kill) at step 5" in proc.stderr
    start = resumed["start_step"]
    assert resumed["restart_count"] == 1 and start in (2, 4), start
    assert resumed["resumed_from"] == str(ckpt / f"step_{start:06d}")
    assert resumed["param_sha256"] == plain["param_sha256"]
    assert resumed["losses"] == plain["losses"] and len(resumed["losses"]) == 6
    assert len(resumed["step_times"]) == 6 - start
    assert _steps_printed(proc.stderr) == [0, 1, 2, 3, 4, *range(start, 6)]
    kept = complete_checkpoints(ckpt)
    assert [c.path.name for c in kept] == ["step_000004", "step_000006"]
    assert all(c.info["losses"] == plain["losses"][:c.step] for c in kept)  # N losses at step N, as a sync save


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 5)  # one launch
def test_a_diverging_run_stops_every_rank_at_the_same_step(tmp_path):
    """SGD at lr 1e6: the all-reduced loss turns non-finite on both ranks at once; each raises, none hangs."""
    # monitor 2 s: torchrun stops the group once a rank has exited; the other must have raised by then
    proc = _torchrun(2, [*PP2, "--optimizer", "sgd", "--lr", "1e6", "--checkpoint-dir", str(tmp_path),
                         "--checkpoint-every", "1", "--async-checkpoint"], monitor=2.0)
    assert proc.returncode != 0
    # Every rank raises the same error; rank 0 alone prints it ("error: [rank 0] step N: ..."), no traceback.
    errors = sorted(line for line in proc.stderr.splitlines() if line.startswith("error: [rank "))
    assert [e[:15] for e in errors] == ["error: [rank 0]"], proc.stderr[-6000:]
    step = int(errors[0].split("] step ")[1].split(":")[0])
    message = (f"step {step}: the loss is nan; training diverged with sgd at lr 1e+06: try a smaller lr "
               "(flag --lr)")
    assert all(e.endswith(message) for e in errors), errors  # at the same step
    assert "analysis/cli" not in proc.stderr and "real/train.py" not in proc.stderr
    assert all(s < step for s in _steps_printed(proc.stderr)) and "loss nan" not in proc.stderr
    assert [c.step for c in complete_checkpoints(tmp_path)][-1] == step  # the last save (async) was finished


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 5)  # one launch + one in-process run
def test_elastic_resume_with_fewer_replicas_keeps_the_global_batch_and_the_loss_curve(tmp_path, capsys):
    """dp=2 (2 processes) for 4 steps, then dp=1 (1 process, --dp auto) from the same checkpoints to step 6."""
    ckpt = str(tmp_path / "ckpt")
    common = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--batch-size", "16", *SMALL,
              "--optimizer", "sgd", "--lr", "0.1", "--checkpoint-dir", ckpt, "--checkpoint-every", "2", "--json"]
    first = _json(_torchrun(2, [*common, "--dp", "2", "--steps", "4"]))
    assert first["dp"] == 2 and len(first["losses"]) == 4
    assert real_main([*common, "--dp", "auto", "--steps", "6"]) == 0  # one process: world size 1 -> dp 1
    second = json.loads(capsys.readouterr().out)
    assert second["dp"] == 1 and second["start_step"] == 4 and len(second["step_times"]) == 2
    assert second["losses"][:4] == first["losses"]
    cfg = RunConfig.of(schedule="gpipe", microbatches=2, batch_size=16, steps=6, model=MODEL, optimizer="sgd", lr=0.1)
    ref_losses, ref_params = reference_run(cfg)
    assert max(abs(a - b) for a, b in zip(second["losses"], ref_losses, strict=True)) <= 1e-5
    assert second["param_norm"] == pytest.approx(param_digest(ref_params.values())[0], rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(LAUNCH_TIMEOUT + 10)  # one launch, the 5 s peer timeout included
def test_a_hung_peer_is_named_after_the_timeout():
    """Rank 1 stops answering at step 1 (torchrun cannot see it); rank 0 gives up after --timeout 5 s."""
    start = time.monotonic()
    proc = _torchrun(2, [*PP2, "--timeout", "5", "--fail-at-step", "1", "--fail-rank", "1", "--fail-mode", "hang"])
    assert proc.returncode != 0
    assert "error: [rank 0] rank 0: no 0RECV_B0 from rank 1 (pipeline rank 1): the peer died or hangs" in \
        proc.stderr, proc.stderr[-6000:]
    assert "PeerError" not in proc.stderr  # one line, not a traceback
    assert time.monotonic() - start < 60


HANG = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1], os.environ["RANK"]).write_text(str(os.getpid()))
sys.stderr.write(f"rank {os.environ['RANK']} started\\n")  # one write: the ranks share stderr
sys.stderr.flush()
time.sleep(300)
"""


def _gone(pid: int) -> bool:
    """No such process (or only a zombie left for its new parent to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.slow
@pytest.mark.timeout(30)  # the 8 s launch timeout, then torchrun stops its workers
def test_launch_timeout_stops_hung_workers_and_keeps_their_output(tmp_path):
    """The launcher's timeout (what _torchrun relies on): every worker is stopped, its stderr so far is kept."""
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        torchrun(2, [str(script), str(tmp_path)], timeout=8, capture=True, launcher_args=["--max-restarts=1"])
    assert time.monotonic() - start < 8 + KILL_GRACE + 2
    assert "rank 0 started" in info.value.stderr and "rank 1 started" in info.value.stderr, info.value.stderr
    pids = [int((tmp_path / str(rank)).read_text()) for rank in (0, 1)]
    deadline = time.monotonic() + 5
    while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(pid) for pid in pids), f"workers {pids} outlived the launch"


def _params() -> list[tuple[str, torch.nn.Parameter]]:
    torch.manual_seed(0)
    return [("0.weight", torch.nn.Parameter(torch.randn(4, 3))), ("1.bias", torch.nn.Parameter(torch.randn(5)))]


def save_steps(directory: Path, steps: int, keep_last: int) -> tuple[list, torch.optim.Optimizer, dict[int, list]]:
    """In one process: train ``_params()`` with AdamW and checkpoint after each of ``steps`` steps.

    (parameters, optimizer, {step: the parameters saved at that step}); ``losses`` of step k: k zeros.
    """
    named = _params()
    opt = torch.optim.AdamW([p for _, p in named], lr=0.1)
    saver = Checkpointer(CheckpointConfig(directory=str(directory), every=1, keep_last=keep_last), rank=0)
    saved = {}
    for step in range(1, steps + 1):
        sum(p.sum() for _, p in named).backward()
        opt.step()
        saved[step] = [p.detach().clone() for _, p in named]
        saver.save(step, checkpoint_state(named, [opt], 0), {"losses": [0.0] * step})
    return named, opt, saved


def test_partial_and_corrupt_checkpoints_are_skipped_and_only_the_last_n_kept(tmp_path):
    named, _, saved = save_steps(tmp_path, 4, keep_last=3)
    assert [c.step for c in complete_checkpoints(tmp_path)] == [2, 3, 4]  # keep-last 3
    data = next((tmp_path / "step_000004").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:-10])  # truncated
    (tmp_path / "step_000003" / MARKER).unlink()  # killed before the marker
    restored = latest_complete(tmp_path)
    assert restored is not None and restored.step == 2 and restored.info["losses"] == [0.0, 0.0]
    fresh = [(n, torch.nn.Parameter(torch.zeros_like(p))) for n, p in named]
    opt2 = torch.optim.AdamW([p for _, p in fresh], lr=0.1)
    load_checkpoint(restored, fresh, [opt2], 0)
    assert all(torch.equal(p, q) for (_, p), q in zip(fresh, saved[2], strict=True))
    assert set(opt2.state[fresh[0][1]]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(opt2.state[fresh[0][1]]["step"]) == 2.0


def test_async_checkpoint_is_a_snapshot_and_completes_on_wait(tmp_path):
    named = _params()
    saver = Checkpointer(CheckpointConfig(directory=str(tmp_path), every=1, async_save=True), rank=0)
    before = [p.detach().clone() for _, p in named]
    saver.save(1, checkpoint_state(named, [], 0), {"losses": [1.0]})
    with torch.no_grad():
        for _, p in named:
            p.add_(1.0)  # training goes on while the save is in flight
    saver.wait()
    restored = latest_complete(tmp_path)
    assert restored is not None and restored.step == 1
    fresh = [(n, torch.nn.Parameter(torch.zeros_like(p))) for n, p in named]
    load_checkpoint(restored, fresh, [], 0)
    assert all(torch.equal(p, q) for (_, p), q in zip(fresh, before, strict=True))


@pytest.mark.parametrize(("argv", "message"), [
    (["--checkpoint-dir", "x", "--keep-last", "0"], "keep_last must be an integer >= 1, got 0 (flag --keep-last)"),
    (["--fail-at-step", "9"], "fail_at_step 9 is out of range for 2 steps; valid: 0..1 (flag --fail-at-step)"),
    (["--fail-rank", "3"], "fail_rank 3 is not a rank of pp x dp = 1 processes; valid: 0..0 (flag --fail-rank)"),
    (["--dp", "x"], "invalid value 'x': give an integer or auto"),
])
def test_bad_fault_flags_are_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        real_main(["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "2", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_a_checkpoint_of_another_model_is_refused_before_training(tmp_path, capsys):
    args = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "2", "--batch-size", "8", *SMALL,
            "--checkpoint-dir", str(tmp_path), "--checkpoint-every", "2", "--json"]
    assert real_main(args) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        real_main([*args, "--dim", "32"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "was written with model" in err and "another checkpoint directory (flag --checkpoint-dir)" in err, err


def _tiny(**kw) -> RunConfig:
    return RunConfig.of(**{**dict(schedule="gpipe", microbatches=2, batch_size=8, steps=6, model=MODEL), **kw})


def _loss_at(step: int, value: float):
    """A patch of Trainer._step: the loss of ``step`` is ``value``."""
    original = Trainer._step

    def patched(self, s):
        loss = original(self, s)
        return torch.tensor(value) if s == step else loss
    return patched


@pytest.mark.parametrize(("config", "patch", "message"), [
    pytest.param(_tiny(), (3, float("nan")),
                 "step 3: the loss is nan; training diverged with adamw at lr 0.003: try a smaller lr", id="nan"),
    pytest.param(_tiny(), (1, float("inf")),
                 "step 1: the loss is inf; training diverged with adamw at lr 0.003: try a smaller lr", id="inf"),
    pytest.param(_tiny(optimizer="sgd", lr=1e6), None,
                 "step 2: the loss is nan; training diverged with sgd at lr 1e+06: try a smaller lr", id="sgd-lr-1e6"),
])
def test_a_non_finite_loss_stops_the_run_naming_the_step(monkeypatch, config, patch, message):
    if patch is not None:
        monkeypatch.setattr(Trainer, "_step", _loss_at(*patch))
    seen = []
    with pytest.raises(ConfigError) as info:
        run(config, on_step=lambda step, loss, _: seen.append((step, loss)))
    assert str(info.value) == message and info.value.field == "lr"
    failed = int(message.split()[1][:-1])
    assert [s for s, _ in seen] == list(range(failed)) and all(math.isfinite(x) for _, x in seen)


def test_a_non_finite_loss_is_never_checkpointed(tmp_path, monkeypatch):
    """Saves before the failing step are complete (async one included); none after it, none with a NaN."""
    monkeypatch.setattr(Trainer, "_step", _loss_at(3, float("nan")))
    config = _tiny(checkpoint=CheckpointConfig(directory=str(tmp_path), every=1, keep_last=9, async_save=True))
    with pytest.raises(ConfigError, match=r"^step 3: the loss is nan; "):
        run(config)
    kept = complete_checkpoints(tmp_path)
    assert [c.step for c in kept] == [1, 2, 3]
    assert all(len(c.info["losses"]) == c.step and all(map(math.isfinite, c.info["losses"])) for c in kept)
