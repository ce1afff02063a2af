"""Exercise the NCCL/CUDA path of the real runtime wherever a GPU is present.

    python experiments/gpu_check.py                # needs CUDA; exit 1 if a check fails
    python experiments/gpu_check.py --device cpu   # the same checks on the CPU (a dry run of this script)

1. a pp=1 training run on one GPU through ``real.run`` (CUDA events time the
   tasks, ``torch.cuda.max_memory_allocated`` is reported): the loss must be
   finite and fall, the trace must hold every task;
2. the F / B / I / W profile of a middle stage at a few microbatch sizes,
   printed as a table (I + W should be close to B);
3. recomputation (``recompute full``: F under no_grad, R re-runs it with grad,
   the CUDA random state restored) against the same run without: the same
   losses, less activation memory;
4. with two or more GPUs: a pp=2 1F1B run under torchrun with NCCL (the
   point-to-point messages on CUDA streams) compared with plain training on
   the first GPU.
"""

from __future__ import annotations

import json
import sys

import torch

from analysis.cli.common import OneLineParser
from real import ModelConfig, RunConfig, reference_run, run
from real.launch import torchrun
from real.profile.machine import profile_stage

MODELS = {  # per device: big enough that a GPU is busy, small enough for a CPU dry run
    "cuda": ModelConfig(kind="gpt", layers=8, dim=512, heads=8, vocab=1024, seq=256),
    "cpu": ModelConfig(kind="gpt", layers=4, dim=64, heads=4, vocab=128, seq=32),
}


def _train_one(device: str) -> bool:
    backend = "nccl" if device == "cuda" else "gloo"
    cfg = RunConfig.of(schedule="1f1b", pp=1, microbatches=4, batch_size=32, steps=10, model=MODELS[device],
                    backend=backend)
    result = run(cfg)
    mem = result.memory[0]
    ok = all(x == x for x in result.losses) and result.losses[-1] < result.losses[0]
    ok &= sorted(result.trace["action"]) == sorted(f"0{k}{m}" for k in "FB" for m in range(4))
    print(f"pp=1 run on {device}: losses {result.losses[0]:.4f} -> {result.losses[-1]:.4f}, "
          f"median step {sorted(result.step_times)[5] * 1e3:.1f} ms, peak activations "
          f"{mem['peak_activation_bytes'] / 2**20:.1f} MiB, max allocated "
          f"{(mem['max_memory_allocated'] or 0) / 2**20:.1f} MiB  [{'ok' if ok else 'FAILED'}]")
    return ok


def _recompute(device: str) -> bool:
    backend = "nccl" if device == "cuda" else "gloo"
    runs = {mode: run(RunConfig.of(schedule="gpipe", pp=1, microbatches=4, batch_size=32, steps=3,
                                   model=MODELS[device], backend=backend, recompute=mode)) for mode in ("none", "full")}
    worst = max(abs(a - b) for a, b in zip(runs["none"].losses, runs["full"].losses, strict=True))
    peaks = {mode: r.memory[0]["peak_activations_mb"] for mode, r in runs.items()}
    ok = worst < 1e-5 and peaks["full"] < 1.1 < 3.9 < peaks["none"]
    print(f"recompute full on {device}: losses differ by {worst:.2e}, peak activations {peaks['none']:.2f} -> "
          f"{peaks['full']:.2f} M_B  [{'ok' if ok else 'FAILED'}]")
    return ok


def _profile(device: str) -> None:
    model = MODELS[device]
    print(f"\nF/B/I/W of one stage (layers 1..2: two decoder blocks, dim {model.dim}, seq {model.seq}), ms per microbatch")
    print(f"{'microbatch':>10} {'F':>9} {'B':>9} {'I':>9} {'W':>9} {'(I+W)/B':>8}")
    for mb in (1, 4, 16):
        p = profile_stage(model, range(1, 3), mb, torch.device(device))
        print(f"{mb:>10} {p.f * 1e3:>9.3f} {p.b * 1e3:>9.3f} {p.i * 1e3:>9.3f} {p.w * 1e3:>9.3f} "
              f"{(p.i + p.w) / p.b:>8.2f}")


def _two_gpus() -> bool:
    small = ["--layers", "4", "--dim", "64", "--heads", "4", "--vocab", "128", "--seq", "32"]
    args = ["-m", "real", "--schedule", "1f1b", "--pp", "2", "--microbatches", "4", "--steps", "4",
            "--batch-size", "16", *small, "--optimizer", "sgd", "--lr", "0.1", "--backend", "nccl", "--json"]
    proc = torchrun(2, args, timeout=300, capture=True)
    if proc.returncode != 0:
        print(f"pp=2 NCCL run FAILED:\n{proc.stderr[-4000:]}")
        return False
    got = json.loads(proc.stdout)
    cfg = RunConfig.of(schedule="1f1b", pp=2, microbatches=4, steps=4, batch_size=16, optimizer="sgd", lr=0.1,
                    model=ModelConfig(kind="gpt", layers=4, dim=64, heads=4, vocab=128, seq=32))
    ref, _ = reference_run(cfg)
    worst = max(abs(a - b) for a, b in zip(got["losses"], ref, strict=True))
    ok = worst < 1e-3  # GPU kernels (TF32, reduction order) differ from the CPU reference
    print(f"pp=2 1F1B on 2 GPUs (NCCL): losses {got['losses']}, max difference to CPU plain training {worst:.2e} "
          f"[{'ok' if ok else 'FAILED'}]")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python experiments/gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing to check (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    if a.device == "cuda":
        print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    ok = _train_one(a.device)
    ok &= _recompute(a.device)
    _profile(a.device)
    if a.device == "cuda" and torch.cuda.device_count() >= 2:
        ok &= _two_gpus()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
