"""Gradient compression: the loss after N steps of each codec against exact ddp, and its bytes per step.

    python experiments/compression_loss.py [--steps 30] [--markdown docs/results/compression.md]

Each codec trains the built-in GPT (4 layers, dim 64, 4 heads, seq 64, byte vocabulary) on a token file
(``real.data.tokens.prepare`` of docs/*.md) under torchrun: 2 gloo processes, dp 2, 1F1B with 2
microbatches, a global batch of 16, AdamW at lr 3e-3, buckets of 0.1 MiB, seed 0, so every run starts
from the same weights and sees the same batches. Per codec it reports the loss after the last step and
its distance to exact ddp's, the bytes of the last step's gradient collectives on rank 0, measured (the
trace's rows) and predicted (:func:`real.dp.compress_bytes.predicted_step_bytes`), their ratio to exact
ddp's, and the median step time on this machine (noisy on a shared machine: timings, not a claim).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

import torch

from analysis.cli.common import OneLineParser, errors_to_exit
from analysis.results_page import check_page, write_page
from common.errors import ConfigError
from real.data.tokens import prepare
from real.dp.compress_bytes import predicted_step_bytes
from real.launch import torchrun
from schedules.dp.codecs import parse_compression
from schedules.trace import read_trace

RUNS = (("ddp", "none"), ("ddp", "fp16"), ("ddp", "bf16"), ("ddp", "int8"), ("ddp", "powersgd:1"),
        ("ddp", "powersgd:4"), ("zero2", "int8"))
MODEL = ["--layers", "4", "--dim", "64", "--heads", "4", "--seq", "64", "--vocab", "256"]
BUCKET_MB = 0.1
MICROBATCHES = 2


def measure(mode: str, codec: str, steps: int, tokens: Path, tmp: Path) -> dict:
    """The run's JSON plus its parameters' shapes and rank 0's gradient bytes in the last step."""
    name = f"{mode}-{codec.replace(':', '')}"
    trace, params = tmp / f"{name}.csv", tmp / f"{name}.pt"
    argv = ["-m", "real", "--schedule", "1f1b", "--pp", "1", "--dp", "2", "--microbatches", str(MICROBATCHES),
            "--batch-size", "16", "--steps", str(steps), "--optimizer", "adamw", "--lr", "3e-3", *MODEL,
            "--data", str(tokens), "--dp-mode", mode, "--bucket-mb", str(BUCKET_MB), "--grad-compression", codec,
            "--trace", str(trace), "--save-params", str(params), "--json"]
    proc = torchrun(2, argv, timeout=600, capture=True, env={"OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{mode} {codec}: the run failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout)
    rows = read_trace(trace)
    rows = rows[(rows["rank"] == 0) & rows["kind"].isin(["ALLREDUCE", "REDUCE_SCATTER"])]
    out["sent"] = int(rows["bytes"].sum())
    out["shapes"] = [tuple(t.shape) for t in torch.load(params).values()]
    return out


def row(mode: str, codec: str, run: dict, exact: dict) -> str:
    def predicted(spec: str) -> int:
        return predicted_step_bytes(parse_compression(spec), {0: run["shapes"]}, mode=mode, bucket_mb=BUCKET_MB,
                                    world=2, reductions=MICROBATCHES)

    loss, ref = run["losses"][-1], exact["losses"][-1]
    comp = parse_compression(codec)
    return (f"| {mode} | {codec} | {'yes' if comp.exact else 'no'} | {loss:.5f} | {loss - ref:+.1e} | "
            f"{run['sent']} | {predicted(codec)} | {run['sent'] / predicted('none'):.3f} | "
            f"{statistics.median(run['step_times'][1:]) * 1e3:.1f} |")


def main() -> None:
    p = OneLineParser(prog="python experiments/compression_loss.py", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="training steps per codec (default 30)")
    p.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/compression.md)")
    args = p.parse_args()
    with errors_to_exit(p):
        if args.steps < 2:
            raise ConfigError(f"steps {args.steps} must be >= 2 (the first step's time is left out of the median)",
                              field="steps")
        if args.markdown:
            check_page(args.markdown)
    lines = ["| mode | codec | exact | loss | vs exact ddp | bytes/step measured | predicted | vs none | "
             "step ms (median) |", "|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tokens = Path(tmp) / "tokens.bin"
        prepare(sorted(Path(__file__).resolve().parents[1].joinpath("docs").glob("*.md")), tokens)
        runs = {(m, c): measure(m, c, args.steps, tokens, Path(tmp)) for m, c in RUNS}
    exact = runs[("ddp", "none")]
    lines += [row(m, c, run, exact) for (m, c), run in runs.items()]
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        write_page(args.markdown, f"Gradient compression: loss after {args.steps} steps and bytes per step",
                   f"Loss after step {args.steps} (mean over the global batch), its difference to exact ddp "
                   "at the same seed, and rank 0's bytes of the last step's gradient collectives (the n of the "
                   "collective formulas: measured from the tensors sent, predicted from the parameter shapes); "
                   "*vs none* is measured bytes over exact ddp's. Step times are this machine's, measured "
                   "while others worked on it.\n\n" + table)


if __name__ == "__main__":
    main()
