"""The loss of decentralized and local SGD after N steps against exact ddp, at the same seed, measured.

    python experiments/comm_modes_loss.py --out out/comm-modes [--steps 300] [--markdown docs/results/comm-modes-loss.md]

Each mode trains the built-in GPT (2 blocks, dim 32, 2 heads, byte-level vocab of 256, sequences of 32) on a
token file made from this repository's README and docs (``real.data.tokens.prepare``), 4 gloo processes (dp 4,
1F1B on one pipeline rank), global batch 32, AdamW at lr 3e-3, seed 0: the same initial weights and the same
batches in every mode. Each run writes its losses with ``--log-dir OUT/LABEL`` (``metrics.jsonl``), the curves
``schedlab compare --time-to-loss`` and ``experiments/bandwidth_sweep.py`` read. The table: the loss at the
last step and the mean of the last 20 steps, each against ddp's. Losses, not times: the figures do not depend on
what else the machine runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit, fail
from analysis.results_page import check_page, table, write_page
from analysis.time_to_loss import parse_mode, read_curve
from common.outputs import check_output_dir
from real.data.tokens import prepare
from real.launch import torchrun

MODES = ("ddp", "local-sgd:4", "local-sgd:16", "decentralized:ring", "decentralized:random")
DP = 4
TAIL = 20  # steps averaged at the end
ARGV = ["--schedule", "1f1b", "--pp", "1", "--dp", str(DP), "--microbatches", "1", "--batch-size", "32",
        "--layers", "2", "--dim", "32", "--heads", "2", "--vocab", "256", "--seq", "32", "--optimizer", "adamw",
        "--lr", "3e-3", "--seed", "0", "--json"]


def corpus(out: Path) -> Path:
    root = Path(__file__).resolve().parents[1]
    out.mkdir(parents=True, exist_ok=True)
    text = out / "text.txt"
    text.write_text("\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]))
    tokens = out / "corpus.u16"
    for stale in (tokens, Path(f"{tokens}.json")):
        stale.unlink(missing_ok=True)
    prepare([text], tokens)
    return tokens


def mode_flags(label: str) -> list[str]:
    spec = parse_mode(label)
    flags = ["--dp-mode", spec.mode]
    if spec.mode == "local-sgd":
        flags += ["--sync-every", str(spec.sync_every)]
    if spec.mode == "decentralized":
        flags += ["--peer-selection", spec.peer_selection]
    return flags


def measure(label: str, tokens: Path, out: Path, steps: int) -> list[float]:
    log_dir = out / label.replace(":", "-")
    (log_dir / "metrics.jsonl").unlink(missing_ok=True)
    proc = torchrun(DP, ["-m", "real", *ARGV, "--steps", str(steps), "--data", str(tokens), *mode_flags(label),
                         "--log-dir", str(log_dir)], timeout=600, capture=True, env={"OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{label}: the run failed:\n{proc.stderr[-3000:]}")
    losses = json.loads(proc.stdout)["losses"]
    assert list(read_curve(log_dir / "metrics.jsonl")[1]) == losses
    return losses


def main() -> None:
    p = OneLineParser(prog="python experiments/comm_modes_loss.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="out/comm-modes", metavar="DIR", help="the token file and each mode's curve")
    p.add_argument("--steps", type=int, default=300, metavar="N", help="steps per run (default 300)")
    p.add_argument("--markdown", metavar="PAGE.md", help="also write the results page")
    args = p.parse_args()
    with errors_to_exit(p):
        out = check_output_dir(args.out, "--out")
        if args.markdown:
            check_page(args.markdown)
        if args.steps < TAIL:
            fail(f"--steps {args.steps} must be at least {TAIL} (the steps averaged at the end)")
    tokens = corpus(out)
    curves = {label: measure(label, tokens, out, args.steps) for label in MODES}
    ref = curves["ddp"]
    ref_tail = sum(ref[-TAIL:]) / TAIL
    rows = []
    for label, losses in curves.items():
        tail = sum(losses[-TAIL:]) / TAIL
        rows.append([label, f"{losses[-1]:.4f}", f"{losses[-1] - ref[-1]:+.4f}", f"{tail:.4f}",
                     f"{tail - ref_tail:+.4f}", f"{(tail - ref_tail) / ref_tail:+.2%}",
                     f"`{out / label.replace(':', '-') / 'metrics.jsonl'}`"])
    text = table(["mode", f"loss at step {args.steps - 1}", "vs ddp", f"mean of the last {TAIL}", "vs ddp",
                  "relative", "curve"], rows)
    print(text)
    if args.markdown:
        write_page(args.markdown, f"Loss after {args.steps} steps: decentralized and local SGD against ddp",
                   f"The built-in GPT (2 blocks, dim 32, vocab 256, seq 32) on a byte-level token file of this "
                   f"repository's README and docs, dp {DP} (4 gloo processes), global batch 32, AdamW lr 3e-3, "
                   f"seed 0 in every mode (same initial weights, same batches). *vs ddp*: the mode's loss minus "
                   f"ddp's; the mean over the last {TAIL} steps evens out the batch-to-batch noise. Each run's "
                   f"loss is the mean over the replicas of their own batch on their own parameters.\n\n{text}")


if __name__ == "__main__":
    main()
