"""Goodput of a Llama-3-scale job under failures, and the best checkpoint interval.

    python experiments/goodput.py [--out out/] [--trials 20] [--json] [--markdown docs/results/goodput.md]
                                  [--pause docs/results/live_pause.json] [--job-wide 0.05]

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

Live mode against checkpoint-restart by cluster size (1k to 100k GPUs, the same
per-GPU failure rate; :mod:`sim.faults.live`): each with Young's and Daly's interval
at the MTBF of the failures it must restart from. Live costs per failure: the
detection and the quorum measured by ``experiments/live_pause.py`` (``--pause``),
the state transfer scaled by bytes from that measurement to one GPU's state of
a Llama 3 405B replica (405e9 parameters x 14 bytes: bf16 weights, fp32 master
weights and two AdamW moments, over the 128 GPUs of TP 8 x PP 16; Dubey et al.
2024, table 4), the replacement as long as a restart; ``--job-wide`` of the
failures (our assumption) stop every replica. Writes out/goodput_scale.png.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from analysis.cli.common import OneLineParser, errors_to_exit, positive_int
from analysis.figures import place_legend
from analysis.results_page import check_page, table, write_page
from common.outputs import atomic_write, check_output_dir
from schedules import ConfigError
from sim.faults.failures import FailureModel, daly_interval, simulate_elastic, sweep_intervals, young_interval
from sim.faults.live import LiveCosts, checkpoint_interval, live_goodput, restart_goodput

GPUS = 16_384
JOB_MTBF = 54 * 24 * 3600 / 419  # seconds, Llama 3 (Dubey et al. 2024)
STEP = 10.0
HOURS = 24
CKPT, CKPT_BLOCKING, RESTART = 60.0, 5.0, 600.0
INTERVALS_MIN = [2, 4, 6, 8, 10, 12, 15, 20, 25, 30, 40, 60, 90, 120]
CLUSTERS = [1024, 2048, 4096, 8192, 16_384, 32_768, 65_536, 100_000]
REPLICA_GPUS = 128  # Llama 3 405B: TP 8 x PP 16 per data-parallel replica (Dubey et al. 2024, table 4)
STATE_BYTES_PER_GPU = 405e9 * 14 / REPLICA_GPUS  # bf16 weights + fp32 master + 2 fp32 AdamW moments


def main() -> None:
    ap = OneLineParser(prog="python experiments/goodput.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out")
    ap.add_argument("--trials", type=positive_int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/goodput.md)")
    ap.add_argument("--pause", default="docs/results/live_pause.json", metavar="FILE",
                    help="the live mode's measured costs (experiments/live_pause.py --json)")
    ap.add_argument("--job-wide", type=float, default=0.05, metavar="F",
                    help="share of failures that stop every replica, live mode (default 0.05, an assumption)")
    args = ap.parse_args()
    with errors_to_exit(ap):
        check_output_dir(args.out, "output folder")
        if args.markdown:
            check_page(args.markdown)
        if not 0 <= args.job_wide <= 1:
            raise ConfigError(f"--job-wide must be a share in [0, 1], got {args.job_wide}")
        measured = _measured(args.pause)
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
    summary["live"] = {"measured": measured, "job_wide": args.job_wide, "state_bytes_per_gpu": STATE_BYTES_PER_GPU,
                       "rows": _by_cluster_size(measured, args.job_wide)}
    png = _plot(summary, elastic["wait"][0], elastic["shrink"][0], Path(args.out))
    summary["plot"] = str(png)
    summary["plot_scale"] = str(_plot_scale(summary["live"], Path(args.out)))
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
    for row in summary["live"]["rows"]:
        print(f"{row['gpus']:>7} GPUs: restart {row['restart_young']:.3f}/{row['restart_daly']:.3f}, live "
              f"{row['live_young']:.3f}/{row['live_daly']:.3f} (Young/Daly)")
    print(f"wrote {png} and {summary['plot_scale']}")


def _measured(path: str) -> dict:
    """The live mode's measured costs; ConfigError naming the file if it is missing or incomplete."""
    keys = ("detection", "quorum", "heal_s", "heal_bytes", "transfer_s_per_byte")
    try:
        measured = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--pause {path!r} cannot be read ({exc}); write it with python experiments/live_pause.py "
                          "--json FILE") from None
    missing = [k for k in keys if not isinstance(measured.get(k), int | float)]
    if missing:
        raise ConfigError(f"--pause {path!r} lacks {', '.join(missing)}; write it with experiments/live_pause.py")
    return measured


def _by_cluster_size(measured: dict, job_wide: float) -> list[dict]:
    """Goodput of both modes at each cluster size, with Young's and Daly's intervals (closed form, sim.faults.live)."""
    costs = LiveCosts(detection=measured["detection"], quorum=measured["quorum"],
                      transfer_s_per_byte=measured["transfer_s_per_byte"], state_bytes=STATE_BYTES_PER_GPU,
                      replacement=RESTART, step_time=STEP, job_wide=job_wide)
    rows = []
    for gpus in CLUSTERS:
        mtbf, dp = JOB_MTBF * GPUS / gpus, gpus // REPLICA_GPUS
        row = {"gpus": gpus, "dp": dp, "job_mtbf_h": mtbf / 3600, "transfer_s": costs.transfer}
        for rule in ("young", "daly"):
            tau = checkpoint_interval(rule, CKPT, mtbf)
            row[f"restart_{rule}"] = restart_goodput(mtbf, CKPT, RESTART, tau)
            row[f"restart_{rule}_min"] = tau / 60
            row[f"live_{rule}"], live_tau = live_goodput(mtbf, dp, costs, checkpoint_cost=CKPT, restart=RESTART,
                                                         rule=rule)
            row[f"live_{rule}_min"] = live_tau / 60
        rows.append(row)
    return rows


def _page(summary: dict, markdown: str, png: Path) -> str:
    cells = [[f"{r['interval_min']:g}", f"{r['goodput_sync']:.3f}", f"{r['goodput_async']:.3f}"]
             for r in summary["sweep"]]
    figure = os.path.relpath(png.resolve(), Path(markdown).resolve().parent)
    bs, ba, el = summary["best_sync"], summary["best_async"], summary["elastic"]
    return f"""\
`sim/faults/failures.py` on a Llama-3-scale job: {GPUS:,} GPUs with the job MTBF of Llama 3's pre-training
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

{_live_section(summary["live"], os.path.relpath(Path(summary["plot_scale"]).resolve(), Path(markdown).resolve().parent))}"""


def _live_section(live: dict, figure: str) -> str:
    m = live["measured"]
    cells = [[f"{r['gpus']:,}", str(r["dp"]), f"{r['job_mtbf_h']:.2f}",
              f"{r['restart_young']:.3f} ({r['restart_young_min']:.0f})", f"{r['restart_daly']:.3f} ({r['restart_daly_min']:.0f})",
              f"{r['live_young']:.3f} ({r['live_young_min']:.0f})", f"{r['live_daly']:.3f} ({r['live_daly_min']:.0f})"]
             for r in live["rows"]]
    transfer = live["rows"][0]["transfer_s"]
    return f"""\
## Live fault tolerance against checkpoint-restart, by cluster size

`sim/faults/live.py` (closed form): the same per-GPU failure rate as above at 1,024 to 100,000 GPUs, replicas of
{REPLICA_GPUS} GPUs (Llama 3 405B's TP 8 x PP 16). Checkpoint-restart: Daly's expected goodput with a
{CKPT:g} s checkpoint and a {RESTART / 60:g} min restart. Live (`--elastic live`): per failure, the detection
({m['detection']:.3f} s) and the quorum ({m['quorum']:.3f} s) measured by `experiments/live_pause.py`
([elastic.md](elastic.md)), half a step redone, the replica's share carried by the others until its
replacement joins ({RESTART / 60:g} min, as a restart), and its join: a quorum and the transfer of one GPU's
state ({live['state_bytes_per_gpu'] / 1e9:.1f} GB) at the rate of torchft's HTTPTransport measured here
({m['bulk_bytes'] / m['bulk_s'] / 1e6:.0f} MB/s on loopback, one CPU: {transfer:.0f} s; a cluster's network
is faster, so this overstates the join); a share of
{live['job_wide']:g} of the failures (our assumption) stops every replica and is a checkpoint-restart, so
the live mode checkpoints at the MTBF of those alone. Goodput, and in brackets the checkpoint interval (min):

{table(["GPUs", "replicas", "job MTBF (h)", "restart, Young", "restart, Daly", "live, Young", "live, Daly"], cells)}

![goodput against cluster size, checkpoint-restart and live, Young's and Daly's intervals]({figure})
"""


def _plot_scale(live: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = [r["gpus"] for r in live["rows"]]
    for key, label, style in (("restart_young", "checkpoint-restart, Young", "o--"),
                              ("restart_daly", "checkpoint-restart, Daly", "o-"),
                              ("live_young", "live (torchft), Young", "s--"), ("live_daly", "live (torchft), Daly", "s-")):
        ax.plot(xs, [r[key] for r in live["rows"]], style, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("cluster size (GPUs), at Llama 3's failure rate per GPU")
    ax.set_ylabel("goodput (fraction of wall time)")
    ax.set_title(f"goodput, closed form (sim/faults/live.py), replicas of {REPLICA_GPUS} GPUs;\nlive: detection and "
                 f"quorum measured, {live['job_wide']:g} of failures job-wide (assumed)", fontsize=9, loc="left")
    fig.tight_layout()
    place_legend(ax, fontsize=8)
    try:
        return atomic_write(out / "goodput_scale.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png"), "figure")
    finally:
        plt.close(fig)


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
    ax.set_ylabel("goodput (fraction of wall time)")
    ax.set_title(f"simulated: {GPUS:,} GPUs at Llama 3's measured job MTBF ({summary['job_mtbf_h']:.2f} h)",
                 fontsize=10, loc="left")
    for res, label, color in ((wait, "wait for repair", "#3a78c9"), (shrink, "shrink and continue", "#e8a33d")):
        ts = [t / 3600 for t, _ in res.timeline]
        ns = [n / 128 for _, n in res.timeline]
        ax2.step(ts, ns, where="post", lw=0.8, color=color, label=f"{label} (goodput {res.goodput:.3f})")
        ax2.fill_between(ts, ns, step="post", alpha=0.25, color=color)
    ax2.set_xlabel("wall time (h)")
    ax2.set_ylabel("throughput (fraction of 128 replicas)")
    ax2.set_title("simulated elastic run: 128 replicas x 128 GPUs, 2 h repair (one seed)", fontsize=10, loc="left")
    fig.tight_layout()
    place_legend(ax, fontsize=8)
    place_legend(ax2, fontsize=8)
    try:
        return atomic_write(out / "goodput.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png"), "figure")
    finally:
        plt.close(fig)


if __name__ == "__main__":
    main()
