"""Memory per rank of every runtime data-parallel mode, measured against the simulator's figure.

    python experiments/dp_memory.py [--markdown docs/results/dp-memory.md] [--json out/dp-runs.json]

Each mode runs once under torchrun (2 gloo processes: dp 2, 1F1B, 2 microbatches; ``none``: pp 2;
``ps``: 2 trainers and 1 parameter server, 3 processes),
a GPT of 4 layers, dim 16, AdamW, 4 steps. Per rank and category (parameters, gradients, optimizer
state, zero3's gathered parameters, activation peak) it prints the bytes the run held
(``RunResult.memory``) beside ``sim.memory.rank_memory``'s, and the worst relative error. Memory,
not time: the figures do not depend on what else the machine runs.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from analysis.cli.common import OneLineParser, errors_to_exit
from analysis.results_page import check_page, write_page
from common.outputs import atomic_write, check_output_file
from real import ModelConfig, RunConfig, make_plan
from real.launch import torchrun
from sim.memory import rank_memory, server_memory

MODEL = ModelConfig(kind="gpt", layers=4, dim=16, heads=2, vocab=32, seq=8)
MODES = ("none", "sync", "ddp", "zero1", "zero2", "zero3", "ps")
PS_PLACEMENT = "/pserver/CPU:0,/trainer/CPU:0-1"  # ps: 2 trainers (dp 2) and one server
KEYS = ("param_bytes", "grad_bytes", "optimizer_bytes", "gathered_param_bytes", "peak_activation_bytes")
ARGV = ["--schedule", "1f1b", "--microbatches", "2", "--batch-size", "16", "--steps", "4", "--optimizer", "adamw",
        "--lr", "0.01", "--layers", "4", "--dim", "16", "--heads", "2", "--vocab", "32",
        "--seq", "8", "--json"]


def config(mode: str) -> RunConfig:
    layout = {"pp": 2} if mode == "none" else {"dp": 2, "dp_mode": mode, "bucket_mb": 0.002}
    if mode == "ps":
        layout["servers"] = 1
    return RunConfig.of(schedule="1f1b", microbatches=2, batch_size=16, steps=4, model=MODEL, optimizer="adamw",
                        lr=0.01, **layout)


def measure(mode: str, tmp: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the run's JSON, its final parameters)."""
    params = tmp / f"{mode}.pt"
    flags = ["--pp", "2"] if mode == "none" else ["--pp", "1", "--dp", "2", "--dp-mode", mode, "--bucket-mb", "0.002"]
    if mode == "ps":
        flags = ["--pp", "1", "--placement", PS_PLACEMENT, "--bucket-mb", "0.002"]
    proc = torchrun(config(mode).world_size, ["-m", "real", *ARGV, *flags, "--save-params", str(params)], timeout=120, capture=True,
                    env={"OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: the run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout), torch.load(params)


def rows(mode: str, result: dict, params: dict[str, torch.Tensor]) -> list[str]:
    cfg = config(mode)
    plan = make_plan(cfg, cfg.world_size)
    sizes = [sum(t.numel() for n, t in params.items() if int(n.split(".", 1)[0]) in plan.layers[s])
             for s in range(plan.num_stages)]
    out = []
    for mem in result["memory"]:
        if mem.get("server") is not None:  # a parameter server: 1/servers of every stage's model states
            want = server_memory(sizes, cfg.sync.servers)
        else:
            want = rank_memory(plan.graph, sizes, mem["pp_rank"], cfg.sync.dp_mode, cfg.layout.dp,
                               microbatch_bytes=mem["activation_bytes_per_microbatch"])
        cells = [f"{mem.get(k, 0)} / {want[k]:.0f}" for k in KEYS]
        worst = max(abs(mem.get(k, 0) - want[k]) / want[k] for k in KEYS if want[k])
        who = f"{mem['rank']} (server)" if mem.get("server") is not None else mem["rank"]
        out.append(f"| {mode} | {who} | " + " | ".join(cells) + f" | {worst:.2%} |")
    return out


def main() -> None:
    p = OneLineParser(prog="python experiments/dp_memory.py", description=__doc__.splitlines()[0])
    p.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/dp-memory.md)")
    p.add_argument("--json", metavar="FILE.json", help="also write every run's JSON as {\"runs\": [...]} (what "
                   "'schedlab compare --dp-modes ... --measured' reads)")
    args = p.parse_args()
    with errors_to_exit(p):
        if args.markdown:
            check_page(args.markdown)
        if args.json:
            check_output_file(args.json, "runs file", (".json",))
    runs = []
    lines = ["| mode | rank | parameters | gradients | optimizer | gathered (zero3) | activation peak | worst |",
             "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            result, params = measure(mode, Path(tmp))
            runs.append(result)
            lines += rows(mode, result, params)
    table = "\n".join(lines)
    print(table)
    if args.json:
        atomic_write(Path(args.json), lambda tmp: tmp.write_text(json.dumps({"runs": runs}, indent=1) + "\n"),
                     "runs file")
    if args.markdown:
        write_page(args.markdown, "Data-parallel memory per rank: measured / simulated (bytes)",
                   "Each cell is measured / simulated bytes on one rank (pp 2, dp 2; ps: 2 trainers and 1 server); *worst* is the largest relative "
                   "difference in the row.\n\n" + table)


if __name__ == "__main__":
    main()
