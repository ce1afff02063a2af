"""The real runtime's command line: under torchrun, through ``schedlab run``, and its bad-input errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

from analysis import plot_timeline, read_trace, summarize  # noqa: E402
from analysis.cli import main as schedlab  # noqa: E402
from analysis.cli.train import main as real_main  # noqa: E402
from real import ModelConfig, RunConfig, param_digest, reference_run  # noqa: E402
from real.launch import torchrun  # noqa: E402

SMALL = ["--layers", "4", "--dim", "16", "--heads", "2", "--vocab", "32", "--seq", "8"]
SMALL_MODEL = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8)


@pytest.mark.slow
@pytest.mark.timeout(120)  # torchrun launches: a hang guard, with room for a loaded CI machine
def test_schedlab_run_starts_torchrun_and_trains_1f1b(tmp_path):
    """schedlab run -> torchrun (2 gloo processes) -> python -m real: one JSON object, equal to plain training."""
    trace, params = tmp_path / "real.csv", tmp_path / "params.pt"
    args = ["--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--steps", "4", "--batch-size", "16", *SMALL,
            "--optimizer", "sgd", "--lr", "0.1", "--json", "--trace", str(trace), "--save-params", str(params)]
    cmd = [sys.executable, "-m", "analysis", "run", "--nproc-per-node", "2", *args]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}) as proc:
        try:
            out, err = proc.communicate(timeout=100)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"schedlab run hung; stderr so far:\n{proc.communicate()[1][-4000:]}")
    assert proc.returncode == 0, err[-6000:]
    result = json.loads(out)  # stdout is exactly one JSON object
    cfg = RunConfig.of(schedule="1f1b", pp=2, microbatches=4, steps=4, batch_size=16, model=SMALL_MODEL,
                    optimizer="sgd", lr=0.1)
    ref_losses, ref_params = reference_run(cfg)
    assert result["schedule"] == "1f1b" and result["world_size"] == 2 and result["trace"] == str(trace)
    assert len(result["step_times"]) == 4 and all(t > 0 for t in result["step_times"])
    assert max(abs(a - b) for a, b in zip(result["losses"], ref_losses, strict=True)) <= 1e-5
    assert result["losses"][-1] < result["losses"][0], "the loss must fall"
    assert [line.split()[1] for line in err.splitlines() if line.startswith("step ")] == ["0", "1", "2", "3"]
    saved = torch.load(params)
    assert list(saved) == list(ref_params)
    assert max(float((saved[k] - v).abs().max()) for k, v in ref_params.items()) <= 1e-5
    assert (result["param_norm"], result["param_sha256"]) == param_digest(saved.values())
    assert result["param_norm"] == pytest.approx(param_digest(ref_params.values())[0], rel=1e-6)
    df = read_trace(trace)
    assert df.attrs["source"] == "real" and df.attrs["params"] == {"pp": 2, "microbatches": 4, "chunks": 1}
    assert summarize(df)["makespan"] > 0
    assert plot_timeline(df, tmp_path / "real.png").stat().st_size > 0


WORLD_MISMATCH = "world size 2 (processes launched) does not equal pp x dp = 4 x 1 = 4; launch 4 processes"


@pytest.mark.slow
@pytest.mark.timeout(90)  # one torchrun launch
def test_bad_input_under_torchrun_fails_fast_with_the_error():
    """torchrun stops the other ranks as soon as one exits, so the first rank's line is what always shows."""
    start = time.monotonic()
    proc = torchrun(2, ["-m", "real", "--schedule", "1f1b", "--pp", "4", "--microbatches", "4"], timeout=75,
                    capture=True)
    assert proc.returncode != 0
    assert re.search(rf"error: \[rank [01]\] {re.escape(WORLD_MISMATCH)}", proc.stderr), proc.stderr[-3000:]
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_rejects_bad_input_on_its_own_before_communicating(monkeypatch, capsys, rank):
    """Each rank, as torchrun starts it (RANK, WORLD_SIZE), refuses with exit 2 and never joins a group."""
    for key, value in {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": rank}.items():
        monkeypatch.setenv(key, str(value))
    with pytest.raises(SystemExit) as exc:
        real_main(["--schedule", "1f1b", "--pp", "4", "--microbatches", "4"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: [rank {rank}] {WORLD_MISMATCH}")
    assert not dist.is_initialized()


@pytest.mark.parametrize(("argv", "message"), [
    (["--schedule", "gpipe", "--pp", "1", "--microbatches", "3"],
     "batch size 32 is not divisible by dp x microbatches = 1 x 3 = 3; use a multiple of 3, e.g. 30"),
    (["--schedule", "nope", "--pp", "1", "--microbatches", "2"], "unknown schedule 'nope'; valid: "),
    (["--schedule", "1f1b", "--pp", "2", "--microbatches", "4"],
     "world size 1 (processes launched) does not equal pp x dp = 2 x 1 = 2; launch 2 processes"),
    (["--schedule", "interleaved-1f1b", "--pp", "2", "--microbatches", "3", "--batch-size", "6"],
     "interleaved-1f1b needs microbatches to be a multiple of pp=2, got 3"),
    (["--schedule", "interleaved-1f1b", "--pp", "1", "--chunks", "8", "--microbatches", "2"],
     "8 stages but the model has 6 layers (input layer, blocks, head); use layers 6 or more, or fewer stages (flag --layers)"),
    (["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--split", "2,x"], "argument --split: invalid value '2,x'"),
    (["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--trace", "t.txt"], "use a name ending in .csv"),
    (["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--dim", "15"], "dim 15 is not divisible by heads 2"),
    (["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--recompute", "bubbles"],
     "recompute bubbles needs recompute_limit, the activation memory (M_B per rank) the moved R's may use, e.g. 2 "
     "(flag --recompute-limit)"),
    (["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--recompute-limit", "2"],
     "recompute_limit 2.0 applies to recompute bubbles only, not none; drop it or use recompute bubbles"),
    (["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "2", "--trace-step", "2"],
     "trace_step 2 is out of range for 2 steps; valid: -2..1 (negative counts from the end) (flag --trace-step)"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        real_main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not dist.is_initialized()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_nccl_without_cuda_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        real_main(["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--backend", "nccl"])
    assert exc.value.code == 2
    assert "backend nccl needs CUDA GPUs and none is available here; use backend gloo (flag --backend)" in capsys.readouterr().err


def test_schedlab_run_in_one_process_prints_losses_and_writes_the_trace(capsys, tmp_path):
    trace = tmp_path / "t.parquet"
    assert schedlab(["run", "--schedule", "zb-h1", "--pp", "1", "--microbatches", "2", "--steps", "3",
                     "--batch-size", "8", *SMALL, "--trace", str(trace)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out[:3]] == [["step", "0"], ["step", "1"], ["step", "2"]]
    assert out[-1] == f"wrote trace: {trace}"
    df = read_trace(trace)
    assert sorted(df["action"]) == sorted(["0F0", "0F1", "0I0", "0I1", "0W0", "0W1"])


def test_schedlab_run_recompute_full_trains_with_r_actions(capsys, tmp_path):
    """--recompute full: an R before every backward, the same losses as plain training, less activation memory."""
    trace = tmp_path / "t.csv"
    argv = ["run", "--schedule", "gpipe", "--pp", "1", "--microbatches", "4", "--steps", "2", "--batch-size", "8", *SMALL,
            "--json"]
    assert schedlab([*argv, "--recompute", "full", "--trace", str(trace)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert schedlab(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    cfg = RunConfig.of(schedule="gpipe", pp=1, microbatches=4, steps=2, batch_size=8, model=SMALL_MODEL)
    assert got["losses"] == pytest.approx(reference_run(cfg)[0], abs=1e-5)
    assert plain["memory"][0]["peak_activations_mb"] == 4.0 and got["memory"][0]["peak_activations_mb"] < 1.01
    df = read_trace(trace)
    assert list(df["action"]) == ["0F0", "0F1", "0F2", "0F3", "0R0", "0B0", "0R1", "0B1", "0R2", "0B2", "0R3", "0B3"]


# -- what --help advertises works for training: csv:FILE and torch:CLASS; outputs checked before training ----------


def test_a_csv_schedule_trains_with_pp_and_microbatches_from_the_file(capsys, tmp_path):
    """zb-h1 at pp=1 exported as torch's CSV, then trained from the file with neither --pp nor --microbatches."""
    from schedules import build, write_torch_csv

    path = write_torch_csv(build("zb-h1", pp=1, microbatches=4), tmp_path / "zbh1.csv")
    assert real_main(["--schedule", f"csv:{path}", "--steps", "2", "--batch-size", "16", *SMALL, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["pp"], got["microbatches"], got["schedule"]) == (1, 4, f"csv:{path}")
    cfg = RunConfig.of(schedule="zb-h1", pp=1, microbatches=4, steps=2, batch_size=16, model=SMALL_MODEL)
    assert got["losses"] == pytest.approx(reference_run(cfg)[0], abs=1e-5)


def test_a_torch_schedule_class_trains(capsys):
    assert real_main(["--schedule", "torch:GPipe", "--pp", "1", "--microbatches", "2", "--steps", "2", *SMALL,
                      "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == "torch:GPipe"


def test_bad_outputs_and_shapes_are_refused_before_training(capsys, tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    base = ["--schedule", "gpipe", "--pp", "1", "--microbatches", "2", "--steps", "2", *SMALL]
    for argv, message in [
        ([*base, "--save-params", str(tmp_path / "adir")], "parameter file"),
        ([*base, "--checkpoint-dir", str(tmp_path / "afile")], "is a file; give a directory"),
        ([*base, "--trace", str(tmp_path / "afile" / "t.csv")], "is a file, not a folder"),
        ([*base, "--plot", str(tmp_path / "adir")], "use a name ending in .png, .svg, .pdf"),
        (["--schedule", f"csv:{tmp_path / 'missing.csv'}", "--steps", "2"], "not found"),
        (["--schedule", "torch:GPipe", "--steps", "2"], "the following arguments are required: --pp, --microbatches"),
        (["--pp", "1", "--microbatches", "2"], "the following arguments are required: --schedule"),
    ]:
        with pytest.raises(SystemExit) as exc:
            real_main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and message in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]


@pytest.mark.slow
@pytest.mark.timeout(150)  # two launches
def test_torchrun_keeps_freed_memory_unless_told_otherwise(tmp_path):
    """The workers get KEEP_FREED_MEMORY as GLIBC_TUNABLES (freed tensors are reused, not faulted in again);
    a value the caller set is left alone."""
    from real.launch import KEEP_FREED_MEMORY

    script = tmp_path / "env.py"
    script.write_text("import os\nprint(os.environ.get('GLIBC_TUNABLES'), os.environ.get('OMP_NUM_THREADS'))\n")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "environ", env)
        default = torchrun(1, [str(script)], timeout=60, capture=True)
        own = torchrun(1, [str(script)], timeout=60, capture=True, env={"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert default.returncode == 0 and own.returncode == 0, default.stderr[-2000:] + own.stderr[-2000:]
    assert default.stdout.split() == [KEEP_FREED_MEMORY, os.environ.get("OMP_NUM_THREADS", "1")]
    assert own.stdout.split()[0] == "glibc.malloc.arena_max=2"
