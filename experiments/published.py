"""Reproduce Megatron-LM's published iteration times and activation memory (Korthikanti et al. 2022).

    python experiments/published.py            # the table
    python experiments/published.py --json     # exactly one JSON object
    python experiments/published.py --fit      # refit the A100 GEMM efficiency (prints the parameters)

Published figures (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198; checked against Calculon's transcription of them, calculon-ai/calculon llm/validation.py):

* Table 3, the configurations: 22B (TP 8, PP 1, 8 GPUs, global batch 4, microbatch 4); GPT-3 175B (TP 8,
  PP 8, 64 GPUs, batch 64, interleaved with 3 model chunks per GPU); MT-NLG 530B (TP 8, PP 35, 280 GPUs,
  batch 280, interleaved, 3 chunks: one layer each); 1T (TP 8, PP 64, 512 GPUs, batch 512, 2 layers per
  GPU, not interleaved: Figure 1's activation memory for it carries no interleaving factor). Microbatch 1
  except the 22B.
* Table 5, iteration time in seconds, full recomputation -> sequence parallelism + selective recomputation:
  22B 1.42 -> 1.10, 175B 18.13 -> 13.75, 530B 49.05 -> 37.83, 1T 94.42 -> 71.49.
* Figure 1, activation memory per GPU (GiB; the first pipeline stage) for the tensor-parallel baseline (no
  recomputation) and with sequence parallelism + selective recomputation: 22B 59.25 -> 9.5625, 175B 66.84375
  -> 12.3515625, 530B 114.0234375 -> 23.076171875, 1T 131.25 -> 26.5625.
* Figure 7, activation memory relative to the tensor-parallel baseline (%): sequence parallelism,
  selective recomputation, both, full recomputation: 22B 66.84, 49.42, 16.18, 7.64; 175B 62.04, 56.53,
  18.49, 8.71; 530B and 1T 58.31, 62.04, 20.27, 9.42.

Every row runs the same simulator with the same calibrated parameters (sim.gpu_model.CALIBRATED["A100"]).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.cli.common import OneLineParser
from analysis.progress import Progress
from sim import gpu_model
from sim.cluster import cluster_preset
from sim.engine import simulate
from sim.parallel import ParallelConfig
from sim.study import Study, StudyResult, build_graph, run_study
from sim.transformer import model_preset
from sim.transformer_costs import TransformerCosts

GIB = 2**30


@dataclass(frozen=True)
class Config:
    model: str
    pp: int
    microbatches: int
    microbatch_size: int
    chunks: int  # 1: plain 1F1B
    time_full: float  # Table 5, seconds
    time_seqsel: float
    fig1_none: float  # GiB
    fig1_seqsel: float
    fig7: tuple[float, float, float, float]  # % of baseline: seq, sel, seqsel, full


CONFIGS = (
    Config("megatron-22b", 1, 1, 4, 1, 1.42, 1.10, 59.25, 9.5625, (66.84, 49.42, 16.18, 7.64)),
    Config("gpt3-175b", 8, 64, 1, 3, 18.13, 13.75, 66.84375, 12.3515625, (62.04, 56.53, 18.49, 8.71)),
    Config("mt-nlg-530b", 35, 280, 1, 3, 49.05, 37.83, 114.0234375, 23.076171875, (58.31, 62.04, 20.27, 9.42)),
    Config("megatron-1t", 64, 512, 1, 1, 94.42, 71.49, 131.25, 26.5625, (58.31, 62.04, 20.27, 9.42)),
)
MODES = {"full": (False, "full"), "sp+selective": (True, "selective"), "none": (False, "none"),
         "sp": (True, "none"), "selective": (False, "selective")}


def study(c: Config, mode: str) -> Study:
    sp, recompute = MODES[mode]
    tp = 8
    nodes = c.pp * tp // 8
    costs = TransformerCosts(model=model_preset(c.model), cluster=cluster_preset(f"dgx-a100:{nodes}"),
                             parallel=ParallelConfig(pp=c.pp, tp=tp, sp=sp), microbatch_size=c.microbatch_size,
                             recompute=recompute)
    schedule = "interleaved-1f1b" if c.chunks > 1 else "1f1b"
    return Study(schedule=schedule, microbatches=c.microbatches, costs=costs,
                 chunks=c.chunks if c.chunks > 1 else None)


def command(c: Config, mode: str) -> str:
    sp, recompute = MODES[mode]
    sched = f"interleaved-1f1b --chunks {c.chunks}" if c.chunks > 1 else "1f1b"
    return (f"python -m sim --model {c.model} --cluster dgx-a100:{c.pp} --tp 8 --pp {c.pp} --dp 1 --schedule {sched} "
            f"--microbatches {c.microbatches} --microbatch-size {c.microbatch_size} --seq-len 2048 "
            f"--recompute {recompute}{' --sp' if sp else ''} --json")


def first_stage_activations(c: Config, mode: str) -> float:
    """The simulated activation peak of pipeline rank 0, bytes."""
    return run_study(study(c, mode)).sim.ranks[0].peak_activations


def time_rows() -> list[dict]:
    rows = []
    for c in CONFIGS:
        for mode, published in (("full", c.time_full), ("sp+selective", c.time_seqsel)):
            r = run_study(study(c, mode))
            rows.append({"model": c.model, "mode": mode, "predicted_s": r.step_time, "published_s": published,
                         "error": r.step_time / published - 1, "mfu": r.mfu, "hfu": r.hfu,
                         "bubble": r.sim.bubble_ratio, "command": command(c, mode)})
    return rows


def memory_rows() -> list[dict]:
    rows = []
    for c in CONFIGS:
        acts = {m: first_stage_activations(c, m) for m in ("none", "sp", "selective", "sp+selective", "full")}
        for mode, published in (("none", c.fig1_none), ("sp+selective", c.fig1_seqsel)):
            got = acts[mode] / GIB
            rows.append({"model": c.model, "figure": "1", "mode": mode, "predicted": got, "published": published,
                         "unit": "GiB", "error": got / published - 1})
        for mode, published in zip(("sp", "selective", "sp+selective", "full"), c.fig7, strict=True):
            got = 100 * acts[mode] / acts["none"]
            rows.append({"model": c.model, "figure": "7", "mode": mode, "predicted": got, "published": published,
                         "unit": "% of baseline", "error": got / published - 1})
    return rows


#: Loss evaluations of fit(): the 9 x 6 grid, then 4 refinements of 3 x 3 points.
FIT_EVALUATIONS = 9 * 6 + 4 * 9


def fit(modes: tuple[str, ...] = ("full",), progress: Progress | None = None) -> gpu_model.GemmEfficiency:
    """Least squares on the relative errors of the rows of ``modes``: a grid over (peak_fraction,
    log10 half_flops), then three refinements around the best point. The graphs are built once.
    ``progress`` advances once per evaluation (:data:`FIT_EVALUATIONS` in all)."""
    graphs = [(c, mode, build_graph(study(c, mode))) for c in CONFIGS for mode in modes]

    def loss(pf: float, lh: float) -> float:
        if progress is not None:
            progress.advance()
        gpu_model.CALIBRATED["A100"] = gpu_model.GemmEfficiency(peak_fraction=min(pf, 1.0), half_flops=10**lh)
        total = 0.0
        for c, mode, graph in graphs:
            published = c.time_full if mode == "full" else c.time_seqsel
            st = study(c, mode)
            total += (StudyResult(st, simulate(graph, st.costs, check=False)).step_time / published - 1) ** 2
        return total

    saved = gpu_model.CALIBRATED["A100"]
    try:
        _, pf, lh = min((loss(pf, lh), pf, lh) for pf in [0.60 + 0.05 * i for i in range(9)]
                        for lh in [9.0 + 0.5 * j for j in range(6)])
        for step_pf, step_lh in ((0.02, 0.2), (0.01, 0.1), (0.004, 0.04), (0.002, 0.02)):
            _, pf, lh = min((loss(pf + dp, lh + dl), pf + dp, lh + dl)
                            for dp in (-step_pf, 0, step_pf) for dl in (-step_lh, 0, step_lh))
        return gpu_model.GemmEfficiency(peak_fraction=round(pf, 3), half_flops=float(f"{10 ** lh:.2g}"))
    finally:
        gpu_model.CALIBRATED["A100"] = saved


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python experiments/published.py", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    ap.add_argument("--fit", action="store_true", help="refit the A100 GEMM efficiency on the full-recompute rows")
    ap.add_argument("--fit-all", action="store_true", help="(for comparison) refit on all eight rows")
    args = ap.parse_args(argv)
    if args.fit or args.fit_all:
        e = fit(("full", "sp+selective") if args.fit_all else ("full",), Progress(FIT_EVALUATIONS, "fit", every=2.0))
        print(f"peak_fraction={e.peak_fraction} half_flops={e.half_flops:.3g}")
        return 0
    times, memory = time_rows(), memory_rows()
    eff = gpu_model.CALIBRATED["A100"]
    mean_abs = sum(abs(r["error"]) for r in times) / len(times)
    summary = {"mean_abs_error": mean_abs, "max_abs_error": max(abs(r["error"]) for r in times),
               "max_abs_memory_error": max(abs(r["error"]) for r in memory),
               "calibration": {"device": "A100", "peak_fraction": eff.peak_fraction, "half_flops": eff.half_flops,
                               "source": eff.source}}
    if args.json:
        print(json.dumps({"iteration_times": times, "activation_memory": memory, **summary}))
        return 0
    print("Korthikanti et al. 2022, Table 5: iteration time on A100 (TP 8), predicted vs published")
    print(f"{'model':<13} {'mode':<13} {'predicted s':>11} {'published s':>11} {'error':>7} {'MFU':>6} {'HFU':>6}")
    for r in times:
        print(f"{r['model']:<13} {r['mode']:<13} {r['predicted_s']:>11.2f} {r['published_s']:>11.2f} "
              f"{r['error']:>+7.1%} {r['mfu']:>6.1%} {r['hfu']:>6.1%}")
    print(f"mean |error| {mean_abs:.1%}, max |error| {summary['max_abs_error']:.1%}")
    print("\nActivation memory per GPU (first pipeline stage): Figure 1 (GiB) and Figure 7 (% of the TP baseline)")
    print(f"{'model':<13} {'fig':>3} {'mode':<13} {'predicted':>10} {'published':>10} {'error':>7}")
    for r in memory:
        print(f"{r['model']:<13} {r['figure']:>3} {r['mode']:<13} {r['predicted']:>10.2f} {r['published']:>10.2f} "
              f"{r['error']:>+7.1%}")
    print(f"max |error| {summary['max_abs_memory_error']:.1%}")
    print(f"\nA100 GEMM efficiency e(F) = {eff.peak_fraction:g} x F / (F + {eff.half_flops:.3g} FLOPs): {eff.source}")
    return 0 if math.isfinite(mean_abs) else 1


if __name__ == "__main__":
    sys.exit(main())
