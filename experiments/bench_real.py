"""Step time of our executor against torch.distributed.pipelining's own schedules, and our DP against DDP.

    python experiments/bench_real.py                 # table
    python experiments/bench_real.py --json          # exactly one JSON object
    python experiments/bench_real.py --reps 5 --steps 8 --schedules gpipe,1f1b
    python experiments/bench_real.py --reps 5 --markdown docs/results/bench_real.md   # also the results page

Two gloo processes on this machine (torchrun). For each schedule the same
GPT model (same stage modules, same data, same optimizer, same per-step loss
all-reduce) is trained by our executor (``real.run``) and by torch's class
for that schedule (ScheduleGPipe, Schedule1F1B, ...); for data parallelism,
our hook-driven ``ddp`` mode against ``DistributedDataParallel`` (no_sync
for all but the last microbatch) on the whole model. A repetition is one
fresh run of ``warmup + steps`` steps; its figure is the median step time of
the measured steps on rank 0; the table shows the median over repetitions,
ours and torch's alternating. ratio = ours / torch (below 1: ours is faster).
"same order": torch's multi-stage classes run their published per-rank
order (``pipeline_order``); yes where its compute actions equal our
schedule's programs action for action. The single-stage classes (GPipe,
1F1B) run a hand-written loop instead: "-".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from analysis.cli.common import OneLineParser, nonnegative_int, positive_int
from analysis.cli.train import add_model_args, model_from_args
from real import ModelConfig
from real.launch import die_with_launcher

MODEL = ModelConfig(kind="gpt", layers=6, dim=128, heads=4, vocab=256, seq=64)  # the benchmark's default model

PAIRS = {  # our schedule -> torch's class for it
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zb-v": "ScheduleZBVZeroBubble",
}


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog="python experiments/bench_real.py", description=__doc__.splitlines()[0])
    p.add_argument("--schedules", default=",".join(PAIRS), help="comma-separated (default: all pairs)")
    p.add_argument("--reps", type=positive_int, default=3, help="repetitions per implementation (default 3)")
    p.add_argument("--steps", type=positive_int, default=6, help="measured steps per repetition (default 6)")
    p.add_argument("--warmup", type=nonnegative_int, default=2, help="unmeasured first steps (default 2)")
    p.add_argument("--microbatches", type=positive_int, default=8, help="default 8")
    p.add_argument("--batch-size", type=positive_int, default=32, help="global batch (default 32)")
    add_model_args(p, MODEL)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--markdown", metavar="PAGE.md", help="also write the results page (docs/results/bench_real.md)")
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    unknown = [s for s in a.schedules.split(",") if s not in PAIRS]
    if unknown or not a.schedules:
        p.error(f"argument --schedules: {a.schedules!r}: give comma-separated names of {', '.join(PAIRS)}")
    return a


def _config(a: argparse.Namespace, schedule: str, pp: int, dp: int):
    from real import RunConfig

    model = model_from_args(a)
    return RunConfig.of(schedule=schedule, pp=pp, dp=dp, microbatches=a.microbatches, batch_size=a.batch_size,
                     steps=a.warmup + a.steps, model=model, optimizer="adamw", lr=1e-3, backend="gloo")


def _loss_allreduce(loss, dp: int) -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([0.0 if loss is None else float(loss)], dtype=torch.float64)
    dist.all_reduce(value)
    return float(value[0]) / dp


def _timed_steps(cfg, step_fn) -> list[float]:
    """Step times on this rank, each ending after the loss all-reduce (as real.run measures them)."""
    import torch.distributed as dist

    dist.barrier()
    times, prev = [], time.perf_counter()
    for step in range(cfg.steps):
        _loss_allreduce(step_fn(step), cfg.layout.dp)
        now = time.perf_counter()
        times.append(now - prev)
        prev = now
    return times


def _ours(cfg, mesh) -> list[float]:
    from real import run

    return run(cfg, mesh=mesh).step_times


def _torch_pipeline(cfg, torch_class: str, orders: dict | None = None) -> list[float]:
    import torch
    import torch.distributed as dist
    from torch.distributed import pipelining

    from real import make_plan
    from real.data.sources import make_batch
    from real.executor import Stage
    from real.models import build_layers, loss_fn, make_optimizer

    plan = make_plan(cfg, dist.get_world_size())
    rank, last = dist.get_rank(), plan.num_stages - 1
    mods = [Stage(s, plan.layers[s].start, build_layers(cfg.data.model, cfg.data.seed, plan.layers[s]), is_last=s == last)
            for s in plan.stages_of(rank)]
    stages = [pipelining.PipelineStage(m, m.index, plan.num_stages, torch.device("cpu")) for m in mods]
    cls = getattr(pipelining, torch_class)
    single = torch_class in ("ScheduleGPipe", "Schedule1F1B")
    sched = cls(stages[0] if single else stages, cfg.layout.microbatches, loss_fn=loss_fn)
    if orders is not None and not single:  # the multi-stage classes execute their published order
        compute = ("F", "I", "W", "B", "OVERLAP_F_B")
        theirs = [[str(a) for a in sched.pipeline_order[r] if a is not None and a.computation_type.value in compute]
                  for r in range(dist.get_world_size())]
        orders[cfg.schedule] = theirs == [[str(a) for a in prog] for prog in plan.graph.schedule.programs]
    opt = make_optimizer(cfg.optim.optimizer, [p for m in mods for p in m.parameters()], cfg.optim.lr)
    holds_first, holds_last = 0 in plan.stages_of(rank), last in plan.stages_of(rank)

    def step(k: int):
        x, y = make_batch(cfg.data.model, cfg.data.seed, k, cfg.data.batch_size)
        opt.zero_grad(set_to_none=True)
        losses: list = []
        args = (x,) if holds_first else ()
        sched.step(*args, target=y if holds_last else None, losses=losses, return_outputs=False)
        opt.step()
        return sum(float(v) for v in losses) / cfg.layout.microbatches if holds_last else None

    return _timed_steps(cfg, step)


def _torch_ddp(cfg) -> list[float]:
    import contextlib

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from real.data.sources import make_batch, microbatches
    from real.models import build_model, loss_fn, make_optimizer

    model = DistributedDataParallel(build_model(cfg.data.model, cfg.data.seed))
    opt = make_optimizer(cfg.optim.optimizer, model.parameters(), cfg.optim.lr)
    rank = dist.get_rank()

    def step(k: int):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        mbs = microbatches(make_batch(cfg.data.model, cfg.data.seed, k, cfg.data.batch_size), cfg.layout.dp, rank, cfg.layout.microbatches)
        for j, (x, y) in enumerate(mbs):
            ctx = model.no_sync() if j < len(mbs) - 1 else contextlib.nullcontext()
            with ctx:
                loss = loss_fn(model(x), y) / cfg.layout.microbatches
                loss.backward()
            total += loss.item()
        opt.step()
        return total

    return _timed_steps(cfg, step)


def _median_of_reps(a: argparse.Namespace, fn) -> float:
    return statistics.median(fn()[a.warmup:])


def _worker(a: argparse.Namespace) -> None:
    import torch.distributed as dist

    from real import Mesh, make_plan

    dist.init_process_group("gloo")
    world = dist.get_world_size()
    pipe_mesh = Mesh.create(make_plan(_config(a, "gpipe", world, 1), world), "gloo", 300)
    results = {"pipeline": [], "data_parallel": None}
    orders: dict[str, bool] = {}
    for name in [s for s in a.schedules.split(",") if s]:
        cfg = _config(a, name, world, 1)
        ours, theirs = [], []
        for _ in range(a.reps):
            ours.append(_median_of_reps(a, lambda cfg=cfg: _ours(cfg, pipe_mesh)))
            theirs.append(_median_of_reps(a, lambda cfg=cfg, name=name: _torch_pipeline(cfg, PAIRS[name], orders)))
        results["pipeline"].append({**_row(name, PAIRS[name], ours, theirs), "same_order": orders.get(name)})
    cfg = _config(a, "1f1b", 1, world)  # at pp=1, 1F1B is F,B per microbatch: DDP's accumulation loop
    dp_mesh = Mesh.create(make_plan(cfg, world), "gloo", 300)
    ours, theirs = [], []
    for _ in range(a.reps):
        ours.append(_median_of_reps(a, lambda: _ours(cfg, dp_mesh)))
        theirs.append(_median_of_reps(a, lambda: _torch_ddp(cfg)))
    results["data_parallel"] = _row("1f1b pp=1 dp=2 ddp", "DistributedDataParallel", ours, theirs)
    if dist.get_rank() == 0:
        Path(a.worker).write_text(json.dumps(results))
    dist.destroy_process_group()


def _row(schedule: str, torch_name: str, ours: list[float], theirs: list[float]) -> dict:
    o, t = statistics.median(ours), statistics.median(theirs)
    return {"schedule": schedule, "torch_class": torch_name, "ours": o, "torch": t, "ratio": o / t,
            "ours_reps": ours, "torch_reps": theirs}


def _table(results: dict, a: argparse.Namespace) -> str:
    lines = [f"2 gloo processes, GPT {a.layers} blocks dim {a.dim} seq {a.seq}, batch {a.batch_size}, "
             f"{a.microbatches} microbatches; median of {a.reps} reps x {a.steps} steps",
             f"{'schedule':<22}{'torch class':<32}{'ours (s)':>10}{'torch (s)':>11}{'ratio':>8}  same order"]
    for r in [*results["pipeline"], results["data_parallel"]]:
        same = {True: "yes", False: "NO", None: "-"}[r.get("same_order")]
        lines.append(f"{r['schedule']:<22}{r['torch_class']:<32}{r['ours']:>10.4f}{r['torch']:>11.4f}{r['ratio']:>8.3f}"
                     f"  {same}")
    return "\n".join(lines)


def _page(results: dict, a: argparse.Namespace) -> str:
    from analysis.results_page import table

    def ms(reps: list[float]) -> str:
        return f"{1000 * min(reps):.1f}-{1000 * max(reps):.1f}"

    cells = [[r["schedule"], r["torch_class"], {True: "yes", False: "NO", None: "-"}[r.get("same_order")],
              f"{1000 * r['ours']:.1f}", ms(r["ours_reps"]), f"{1000 * r['torch']:.1f}", ms(r["torch_reps"]),
              f"{r['ratio']:.2f}"] for r in [*results["pipeline"], results["data_parallel"]]]
    return f"""\
Two gloo processes (torchrun) on this machine, OMP_NUM_THREADS=1. The same GPT ({a.layers} blocks, dim {a.dim},
{a.heads} heads, seq {a.seq}, vocab {a.vocab}), the same stage modules, data, AdamW and per-step loss all-reduce,
global batch {a.batch_size} in {a.microbatches} microbatches, trained by our executor (`real.run`) and by torch's
class for the schedule; data parallelism: our hook-driven `ddp` mode (1F1B at pp=1: F and B per microbatch)
against `DistributedDataParallel` with `no_sync` on all but the last microbatch. A repetition's figure is the
median of {a.steps} measured steps (after {a.warmup} warm-up steps) on rank 0; the table gives the median of
{a.reps} repetitions, ours and torch's alternating, and their range. "same order": torch's multi-stage class runs
exactly our schedule's per-rank order (checked action for action; "-": a single-stage class with its own loop).
ratio = ours / torch (below 1: ours is faster). Step times on a shared machine move by 10-20% between runs:
compare figures from one run.

{table(["schedule", "torch class", "same order", "ours (ms/step)", "ours, range", "torch (ms/step)",
        "torch, range", "ratio"], cells, right=[False, False, False, True, True, True, True, True])}
"""


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.worker:
        die_with_launcher()
        _worker(a)
        return 0
    unknown = [s for s in a.schedules.split(",") if s and s not in PAIRS]
    if unknown:
        print(f"error: no torch counterpart for {unknown}; valid: {', '.join(PAIRS)}", file=sys.stderr)
        return 2
    if a.markdown:
        from analysis.cli.common import errors_to_exit
        from analysis.results_page import check_page

        with errors_to_exit():
            check_page(a.markdown)
    from real.launch import torchrun

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        rest = [x for x in (argv if argv is not None else sys.argv[1:]) if x != "--json"]
        proc = torchrun(2, [__file__, *rest, "--worker", str(out)], capture=True)
        if proc.returncode != 0:
            print(proc.stderr[-6000:], file=sys.stderr)
            return proc.returncode
        results = json.loads(out.read_text())
    if a.markdown:
        from analysis.results_page import write_page

        page = write_page(a.markdown, "Our executor against torch.distributed.pipelining and DDP", _page(results, a),
                          argv=[__file__, *(argv if argv is not None else sys.argv[1:])])
        print(f"wrote {page}", file=sys.stderr)
    print(json.dumps(results) if a.json else _table(results, a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
