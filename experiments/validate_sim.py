"""How close is the simulator to the real runtime? Profile once, simulate, run for real, compare.

    python experiments/validate_sim.py                   # table
    python experiments/validate_sim.py --json            # exactly one JSON object
    python experiments/validate_sim.py --schedules all --reps 2

On 2 CPU ranks with gloo (torchrun): ``python -m real.profile`` measures the
model's passes per stage (for every stage count the schedules need), the
messages and the per-step work once; then for each schedule the simulator
predicts the step time with :class:`sim.profiled.ProfiledCosts`
(:func:`sim.profiled.step_time`: programs, optimizer steps, loss
all-reduce), and ``python -m real`` trains it for ``warmup + steps`` steps,
``reps`` times (schedules interleaved, so drift of a shared machine hits all
alike). Measured = the median of the measured steps' times over all
repetitions, as the runtime reports them (``step_times``). error =
(predicted - measured) / measured. The traces of one step of each schedule
and the cost file stay in ``--out`` for ``schedlab report --real ... --costs``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from analysis.cli.train import add_model_args, model_argv, model_from_args
from real import ModelConfig

MODEL = ModelConfig(kind="gpt", layers=6, dim=128, heads=4, vocab=256, seq=64)  # the validation's default model

DEFAULT = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v")


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--schedules", default=",".join(DEFAULT), help="comma-separated, or 'all' (default: the five)")
    p.add_argument("--pp", type=int, default=2, help="pipeline ranks = processes (default 2)")
    p.add_argument("--microbatches", type=int, default=8, help="default 8")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (default 32: microbatch of 4)")
    add_model_args(p, MODEL)
    p.add_argument("--steps", type=int, default=8, help="measured steps per run (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured first steps per run (default 2)")
    p.add_argument("--reps", type=int, default=1, help="runs per schedule (default 1)")
    p.add_argument("--profile-reps", type=int, default=15, help="timed repetitions of the profile (default 15)")
    p.add_argument("--costs", metavar="PROFILE.json", help="use this cost file instead of profiling")
    p.add_argument("--out", default="out/validate", help="cost file and traces go here (default out/validate)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per torchrun (default 300)")
    p.add_argument("--quiet-wait", type=float, default=60.0, metavar="S",
                   help="before each torchrun wait up to S seconds for other processes to leave the cores idle "
                   "(default 60; 0: never wait)")
    p.add_argument("--max-foreign", type=float, default=0.1, metavar="CORES",
                   help="a run (or the profile) counts only if other processes used at most this many cores "
                   "meanwhile (default 0.1); else it is repeated, up to --attempts times, keeping the least disturbed")
    p.add_argument("--attempts", type=int, default=4, help="default 4")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    return p.parse_args(argv)


def _model_flags(a: argparse.Namespace) -> list[str]:
    return model_argv(model_from_args(a))


def _busy_fraction(window: float = 0.5) -> float:
    """Fraction of all cores busy over ``window`` seconds (from /proc/stat; 0 where it cannot be read)."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(window)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def _wait_quiet(max_wait: float, threshold: float = 0.15) -> float:
    """Wait (up to max_wait s) until other processes leave the cores idle; returns the seconds waited.

    A shared machine: someone else's tests on the same cores slow the real
    run (or the profile) 2-3x, and then no cost model can agree with it.
    """
    start = time.monotonic()
    while time.monotonic() - start < max_wait and _busy_fraction() > threshold:
        time.sleep(1.0)
    return time.monotonic() - start


def _cpu_seconds() -> tuple[float, float]:
    """(CPU seconds all processes have used, CPU seconds our finished children have used) so far."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        busy = 0.0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy, ru.ru_utime + ru.ru_stime


def _torchrun(nproc: int, target: list[str], timeout: float, quiet_wait: float = 0.0) -> tuple[str, float]:
    """(stdout, foreign): foreign = cores' worth of CPU that other processes used while it ran (0: alone)."""
    from real.launch import torchrun

    waited = _wait_quiet(quiet_wait) if quiet_wait > 0 else 0.0
    if waited > 1:
        print(f"waited {waited:.0f} s for idle cores", file=sys.stderr)
    busy0, own0 = _cpu_seconds()
    t0 = time.monotonic()
    done = torchrun(nproc, target, timeout=timeout, capture=True)
    busy1, own1 = _cpu_seconds()
    foreign = max(0.0, (busy1 - busy0) - (own1 - own0)) / max(time.monotonic() - t0, 1e-9)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or "").strip().splitlines()[-15:])
        raise SystemExit(f"error: {' '.join(target[:3])} failed (exit {done.returncode}):\n{tail}")
    return done.stdout, foreign


def _graphs(a: argparse.Namespace, chosen: list[str]) -> dict:
    from schedules import load_graph, validate

    return {s: validate(load_graph(s, pp=a.pp, microbatches=a.microbatches)) for s in chosen}


def _profile(a: argparse.Namespace, stage_counts: list[int], out: Path) -> Path:
    """Profile until no other process used more than --max-foreign cores meanwhile (at most --attempts times)."""
    path = out / "profile.json"
    best = None
    for attempt in range(a.attempts):
        tmp = out / f"profile-{attempt}.json"
        _, foreign = _torchrun(a.pp, ["-m", "real.profile", *_model_flags(a), "--batch-size", str(a.batch_size),
                                      "--microbatches", str(a.microbatches), "--stages",
                                      ",".join(map(str, stage_counts)), "--reps", str(a.profile_reps), "--out",
                                      str(tmp)], a.timeout, a.quiet_wait)
        print(f"profile attempt {attempt}: other processes used {foreign:.2f} cores", file=sys.stderr)
        if best is None or foreign < best[0]:
            best = (foreign, tmp)
        if foreign <= a.max_foreign:
            break
    data = json.loads(best[1].read_text())
    data["foreign_cores"] = best[0]
    path.write_text(json.dumps(data, indent=1))
    return path


def _clean_run(a: argparse.Namespace, schedule: str, trace: Path | None) -> tuple[list[float], float]:
    """A run during which other processes used at most --max-foreign cores (else the least disturbed of
    --attempts runs): (measured step times, foreign cores)."""
    best = None
    for _ in range(a.attempts):
        times, foreign = _run(a, schedule, trace)
        if best is None or foreign < best[1]:
            best = (times, foreign)
        if foreign <= a.max_foreign:
            break
        print(f"{schedule}: other processes used {foreign:.2f} cores meanwhile; run again", file=sys.stderr)
    return best


def _run(a: argparse.Namespace, schedule: str, trace: Path | None) -> tuple[list[float], float]:
    """The measured steps' times of one real run (rank 0's step_times after the warm-up), foreign cores."""
    flags = ["-m", "real", "--schedule", schedule, "--pp", str(a.pp), "--microbatches", str(a.microbatches),
             "--batch-size", str(a.batch_size), "--steps", str(a.warmup + a.steps), "--backend", "gloo",
             "--optimizer", "adamw", *_model_flags(a), "--json"]
    if trace is not None:
        flags += ["--trace", str(trace)]
    stdout, foreign = _torchrun(a.pp, flags, a.timeout, a.quiet_wait)
    result = json.loads(stdout.strip().splitlines()[-1])
    if trace is not None:
        trace.with_suffix(".json").write_text(json.dumps({**result, "foreign_cores": foreign}))
    return result["step_times"][a.warmup:], foreign


def validate_all(a: argparse.Namespace) -> dict:
    from analysis.validation import compare_pair, validation_summary
    from schedules import names
    from schedules.trace import read_trace
    from sim import simulate
    from sim.profiled import load_profile, step_time

    load_start = os.getloadavg()[0]
    chosen = list(names()) if a.schedules == "all" else [s for s in a.schedules.split(",") if s]
    graphs = _graphs(a, chosen)
    out = Path(a.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    counts = sorted({g.schedule.num_stages for g in graphs.values()})
    costs_path = Path(a.costs) if a.costs else _profile(a, counts, out)
    print(f"profiled: {costs_path}", file=sys.stderr)
    measured: dict[str, list[float]] = {s: [] for s in chosen}
    foreign: dict[str, list[float]] = {s: [] for s in chosen}
    for rep in range(a.reps):
        for s in chosen:
            trace = out / "traces" / f"{s}.csv" if rep == 0 else None
            times, f = _clean_run(a, s, trace)
            measured[s] += times
            foreign[s].append(f)
            print(f"rep {rep}: {s} median so far {statistics.median(measured[s]) * 1e3:.1f} ms "
                  f"(other processes: {f:.2f} cores)", file=sys.stderr)
    rows = []
    for s in chosen:
        costs = load_profile(costs_path, graphs[s].schedule.num_stages)
        sim = simulate(graphs[s], costs, check=False)
        row = compare_pair(sim.trace, read_trace(out / "traces" / f"{s}.csv"))
        row.update(schedule=s, predicted_step_time=step_time(sim, costs),
                   measured_step_time=statistics.median(measured[s]),
                   predicted_makespan=sim.makespan, measured_spread=[min(measured[s]), max(measured[s])])
        row["error"] = (row["predicted_step_time"] - row["measured_step_time"]) / row["measured_step_time"]
        rows.append(row)
    summary = validation_summary(rows)
    for r, full in zip(summary["schedules"], rows, strict=True):
        r.update(predicted_bubble=full["predicted_bubble"], measured_bubble=full["measured_bubble"],
                 measured_min_max=full["measured_spread"], foreign_cores=max(foreign[r["schedule"]]))
    summary["command"] = "python experiments/validate_sim.py " + " ".join(sys.argv[1:])
    summary["setup"] = {k: getattr(a, k) for k in ("pp", "microbatches", "batch_size", "layers", "dim", "seq",
                                                   "steps", "warmup", "reps")}
    summary["costs"] = str(costs_path)
    summary["load_average"] = {"start": load_start, "end": os.getloadavg()[0]}  # 1-minute, all processes
    return summary


def _table(summary: dict) -> str:
    lines = [f"{'schedule':<18} {'predicted ms':>12} {'measured ms':>12} {'error':>8} {'bubble sim':>10} "
             f"{'bubble real':>11}"]
    for r in summary["schedules"]:
        lines.append(f"{r['schedule']:<18} {r['predicted_step_time'] * 1e3:>12.1f} {r['measured_step_time'] * 1e3:>12.1f} "
                     f"{r['error']:>+8.1%} {r['predicted_bubble']:>10.1%} {r['measured_bubble']:>11.1%}")
    lines.append(f"mean |error| {summary['mean_abs_error']:.1%}   worst {summary['max_abs_error']:.1%}   "
                 f"Kendall tau {summary['kendall_tau']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    summary = validate_all(a)
    print(json.dumps(summary) if a.json else _table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
