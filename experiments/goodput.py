"""Goodput of a Llama-3-scale job under failures, and the best checkpoint interval.

    python experiments/goodput.py [--out out/] [--trials 20] [--json] [--markdown docs/results/goodput.md]

Facts: Llama 3 pre-training saw 419 unexpected interruptions in 54 days on
16,384 H100 GPUs (Dubey et al. 2024, "The Llama 3 Herd of Models", sec. 3.3.4),
so the job's MTBF is 54 x 24 h / 419 = 3.09 h, a per-GPU MTBF of about
50,700 h. Assumptions (ours, stated in the output): a 10 s step, a 60 s
synchronous checkpoint (or 5 s blocking with the rest asynchronous), and a
10 min restart (detection, rescheduling, loading); 24 h of training.

It sweeps the checkpoint interval, prints mean goodput per interval over
seeds, marks the best one beside Young's and Daly's formulas, and compares,
for the elastic case (128 replicas of 128 GPUs, 2 h repairs), waiting for the
repair with shrinking and continuing. Writes out/goodput.png.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit, positive_int
from analysis.results_page import check_page, table, write_page
from schedules.outputs import atomic_write, check_output_dir
from sim.failures import FailureModel, daly_interval, simulate_elastic, sweep_intervals, young_interval

GPUS = 16_384
JOB_MTBF = 54 * 24 * 3600 / 419  # seconds, Llama 3 (Dubey et al. 2024)
STEP = 10.0
HOURS = 24
CKPT, CKPT_BLOCKING, RESTART = 60.0, 5.0, 600.0
INTERVALS_MIN = [2, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 60, 90, 120]


def main() -> None:
    ap = OneLineParser(prog="python experiments/goodput.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out")
    ap.add_argument("--trials", type=positive_int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/goodput.md)")
    args = ap.parse_args()
    with errors_to_exit(ap):
        check_output_dir(args.out, "output folder")
        if args.markdown:
            check_page(args.markdown)
    failures = FailureModel(devices=GPUS, mtbf_device=JOB_MTBF * GPUS)
    steps = int(HOURS * 3600 / STEP)
    ks = [int(m * 60 / STEP) for m in INTERVALS_MIN]
    sync = sweep_intervals(steps, STEP, failures, intervals=ks, cost=CKPT, restart=RESTART, trials=args.trials)
    asyn = sweep_intervals(steps, STEP, failures, intervals=ks, cost=CKPT, restart=RESTART, blocking=CKPT_BLOCKING,
                           trials=args.trials)
    young, daly = young_interval(CKPT, JOB_MTBF), daly_interval(CKPT, JOB_MTBF)
    best_sync, best_async = max(sync, key=lambda r: r["goodput"]), max(asyn, key=lambda r: r["goodput"])
    elastic = {}
    for shrink in (False, True):
        runs = [simulate_elastic(dp=128, devices_per_replica=128, steps=steps, step_time=STEP,
                                 mtbf_device=JOB_MTBF * GPUS, repair_time=2 * 3600, restart=RESTART,
                                 checkpoint_every=int(daly / STEP), checkpoint_cost=CKPT, shrink=shrink, seed=s)
                for s in range(args.trials)]
        elastic["shrink" if shrink else "wait"] = runs
    summary = {
        "job_mtbf_h": JOB_MTBF / 3600,
        "assumptions": {"gpus": GPUS, "step_s": STEP, "hours": HOURS, "checkpoint_s": CKPT,
                        "checkpoint_blocking_s": CKPT_BLOCKING, "restart_s": RESTART, "trials": args.trials},
        "young_min": young / 60, "daly_min": daly / 60,
        "best_sync": {"interval_min": best_sync["interval_s"] / 60, "goodput": best_sync["goodput"]},
        "best_async": {"interval_min": best_async["interval_s"] / 60, "goodput": best_async["goodput"]},
        "sweep": [{"interval_min": s["interval_s"] / 60, "goodput_sync": s["goodput"], "goodput_async": a["goodput"]}
                  for s, a in zip(sync, asyn, strict=True)],
        "elastic": {k: sum(r.goodput for r in v) / len(v) for k, v in elastic.items()},
    }
    png = _plot(summary, elastic["wait"][0], elastic["shrink"][0], Path(args.out))
    summary["plot"] = str(png)
    if args.markdown:
        page = write_page(args.markdown, "Goodput under failures", _page(summary, args.markdown, png))
        print(f"wrote {page}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
        return
    print(f"Llama-3-scale job: {GPUS} GPUs, job MTBF {summary['job_mtbf_h']:.2f} h; step {STEP:g} s, "
          f"checkpoint {CKPT:g} s (async: {CKPT_BLOCKING:g} s blocking), restart {RESTART / 60:g} min, "
          f"{HOURS} h of training, {args.trials} seeds")
    print(f"{'interval (min)':>14} {'goodput sync':>13} {'goodput async':>14}")
    for row in summary["sweep"]:
        print(f"{row['interval_min']:>14g} {row['goodput_sync']:>13.3f} {row['goodput_async']:>14.3f}")
    print(f"Young {young / 60:.1f} min, Daly {daly / 60:.1f} min; best simulated: sync "
          f"{summary['best_sync']['interval_min']:g} min ({best_sync['goodput']:.3f}), async "
          f"{summary['best_async']['interval_min']:g} min ({best_async['goodput']:.3f})")
    print(f"elastic (128 replicas x 128 GPUs, 2 h repair): wait {summary['elastic']['wait']:.3f}, "
          f"shrink and continue {summary['elastic']['shrink']:.3f}")
    print(f"wrote {png}")


def _page(summary: dict, markdown: str, png: Path) -> str:
    cells = [[f"{r['interval_min']:g}", f"{r['goodput_sync']:.3f}", f"{r['goodput_async']:.3f}"]
             for r in summary["sweep"]]
    figure = os.path.relpath(png.resolve(), Path(markdown).resolve().parent)
    bs, ba, el = summary["best_sync"], summary["best_async"], summary["elastic"]
    return f"""\
`sim/failures.py` on a Llama-3-scale job: {GPUS:,} GPUs with the job MTBF of Llama 3's pre-training
(419 interruptions in 54 days: {summary['job_mtbf_h']:.2f} h; Dubey et al. 2024, sec. 3.3.4). Assumed: a
{STEP:g} s step, a {CKPT:g} s checkpoint ({CKPT_BLOCKING:g} s blocking when asynchronous), a
{RESTART / 60:g} min restart, {HOURS} h of training; mean goodput (useful time / wall time) over
{summary['assumptions']['trials']} seeds.

{table(["checkpoint interval (min)", "goodput, synchronous", "goodput, asynchronous"], cells)}

Best simulated interval: synchronous {bs['interval_min']:g} min (goodput {bs['goodput']:.3f}), asynchronous
{ba['interval_min']:g} min ({ba['goodput']:.3f}). Young's interval sqrt(2 C M): {summary['young_min']:.1f} min;
Daly's: {summary['daly_min']:.1f} min.

Elastic, 128 replicas of 128 GPUs with 2 h repairs (checkpoints at Daly's interval): waiting for the repair
keeps {el['wait']:.3f} of the time useful, shrinking dp and continuing {el['shrink']:.3f}.

![goodput against checkpoint interval; elastic shrink against wait]({figure})
"""


def _plot(summary: dict, wait, shrink, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    xs = [r["interval_min"] for r in summary["sweep"]]
    ax.plot(xs, [r["goodput_sync"] for r in summary["sweep"]], "o-", label=f"synchronous ({CKPT:g} s)")
    ax.plot(xs, [r["goodput_async"] for r in summary["sweep"]], "s-", label=f"asynchronous ({CKPT_BLOCKING:g} s blocking)")
    ax.axvline(summary["young_min"], color="#888888", ls="--", label=f"Young {summary['young_min']:.1f} min")
    ax.axvline(summary["daly_min"], color="#d1495b", ls=":", label=f"Daly {summary['daly_min']:.1f} min")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (min)")
    ax.set_ylabel("goodput (useful / wall time)")
    ax.set_title(f"{GPUS} GPUs, job MTBF {summary['job_mtbf_h']:.2f} h", fontsize=10, loc="left")
    ax.legend(fontsize=8)
    for res, label, color in ((wait, "wait for repair", "#3a78c9"), (shrink, "shrink and continue", "#e8a33d")):
        ts = [t / 3600 for t, _ in res.timeline]
        ns = [n / 128 for _, n in res.timeline]
        ax2.step(ts, ns, where="post", lw=0.8, color=color, label=f"{label} (goodput {res.goodput:.3f})")
        ax2.fill_between(ts, ns, step="post", alpha=0.25, color=color)
    ax2.set_xlabel("wall time (h)")
    ax2.set_ylabel("throughput (fraction of 128 replicas)")
    ax2.set_title("elastic: 128 replicas x 128 GPUs, 2 h repair (one seed)", fontsize=10, loc="left")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    try:
        return atomic_write(out / "goodput.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png"), "figure")
    finally:
        plt.close(fig)


if __name__ == "__main__":
    main()
