"""The simulator's default memory semantics are the runtime's: simulated peak activations per rank, in M_B,
equal the peaks the runtime measures, for every registered schedule at pp 2 and a user schedule.

One 2-process gloo launch (this file is its worker) runs every configuration for one step on a model whose
stages all save the same bytes per microbatch (four blocks Linear -> GELU, a loss that saves nothing), so one
microbatch through a chunk is exactly 1/v of a rank's M_B, as the simulator counts it. The runtime's
ActivationMeter counts every tensor autograd saves from its forward until the B or W that frees it: an I
(``autograd.grad`` with the graph retained) frees nothing, so the simulator's default is ``mw`` = 1. The user
schedule is 1F1B with the backward split into I and W, rank r's W of microbatch k deferred until after its
I of microbatch k + r + 1: with I freeing (``mw`` 0) the simulator said 2 and 1 M_B; the runtime holds 3 and 3.
A recomputed forward keeps its stage's input (one of the four tensors a two-block stage saves).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import schedules  # noqa: E402
from analysis.metrics import measured_peaks  # noqa: E402
from real import RunConfig, make_plan  # noqa: E402
from schedules import Action, Kind, PipelineParams  # noqa: E402
from sim import UniformCosts, simulate  # noqa: E402

LAUNCH_TIMEOUT = 120  # seconds for the whole launch (about 20 one-step runs), with room for a busy machine
BLOCKS, DIM, BATCH, MICROBATCHES = 4, 4, 8, 4
DELAYED_W = [3.0, 3.0]  # the user schedule's measured peaks; the old default (I frees) said [2.0, 1.0]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT + 30)]


def delayed_w(pp: int = 2, m: int = MICROBATCHES) -> schedules.Schedule:
    """1F1B with I and W split, rank r's W of microbatch k run after its I of microbatch k + r + 1 (or at the end)."""
    programs = []
    for r in range(pp):
        one_f_one_b = schedules.build("1f1b", pp=pp, microbatches=m).programs[r]
        prog: list[Action] = []
        waiting: list[int] = []
        for a in one_f_one_b:
            if a.kind is Kind.B:
                prog.append(Action(Kind.I, r, a.microbatch))
                waiting.append(a.microbatch)
                while waiting and waiting[0] + r + 1 <= a.microbatch:
                    prog.append(Action(Kind.W, r, waiting.pop(0)))
            else:
                prog.append(a)
        prog += [Action(Kind.W, r, k) for k in waiting]
        programs.append(prog)
    return schedules.make_schedule("delayed-w", PipelineParams(pp=pp, microbatches=m), programs)


def _config(schedule: str, **kw) -> RunConfig:
    return RunConfig.of(schedule=schedule, pp=2, microbatches=MICROBATCHES, batch_size=BATCH, steps=1,
                        optimizer="sgd", lr=0.1, timeout_s=60, **kw)


def _configs(user_csv: Path) -> dict[str, RunConfig]:
    runs = {}
    for name in schedules.names():
        multi = schedules.spec(name).takes_chunks  # combined-1f1b: v 2 at pp 2
        runs[name] = _config(name, **({"chunks": 2} if multi else {}))
    runs["user delayed-w"] = _config(f"csv:{user_csv}")
    for name in ("1f1b", "zb-h1", "interleaved-1f1b"):  # a recomputed forward keeps its input
        runs[f"{name} recompute full"] = _config(name, recompute="full", **({"chunks": 2} if "inter" in name else {}))
    runs["user delayed-w recompute full"] = _config(f"csv:{user_csv}", recompute="full")
    return runs


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[dict[str, RunConfig], dict]:
    from tests.conftest import launch_worker  # the torchrun workers run this file without the tests package

    tmp = tmp_path_factory.mktemp("mem")
    schedules.write_torch_csv(delayed_w(), tmp / "delayed_w.csv")
    runs = _configs(tmp / "delayed_w.csv")
    return runs, launch_worker(__file__, 2, {k: c.to_dict() for k, c in runs.items()}, tmp, LAUNCH_TIMEOUT)


def test_every_schedule_is_in_the_launch(measured):
    runs, got = measured
    assert set(schedules.names()) <= set(runs) and set(got) == set(runs)


def test_simulated_peaks_equal_the_measured_ones(measured):
    """Per rank, in M_B, exactly: halves and quarters of a microbatch are exact in binary."""
    runs, got = measured
    wrong = {}
    for label, cfg in runs.items():
        graph = make_plan(cfg, 2, num_layers=BLOCKS).graph
        # a recomputed forward keeps its stage's input: 1 of the 2 tensors each of the stage's blocks saves
        kept = 1 / (2 * BLOCKS // graph.schedule.num_stages) if cfg.layout.recompute == "full" else 0.0
        sim = [r.peak_activations for r in simulate(graph, UniformCosts(input_fraction=kept)).ranks]
        real = measured_peaks(got[label]["trace"])
        if sim != real:
            wrong[label] = (sim, real)
    assert wrong == {}


def test_the_delayed_w_schedule_holds_what_the_runtime_holds(measured):
    """The case that showed the old default wrong: I freeing said 2 and 1 M_B, the runtime holds 3 and 3."""
    runs, got = measured
    graph = make_plan(runs["user delayed-w"], 2, num_layers=BLOCKS).graph
    assert measured_peaks(got["user delayed-w"]["trace"]) == DELAYED_W
    assert [r.peak_activations for r in simulate(graph, UniformCosts()).ranks] == DELAYED_W
    assert [r.peak_activations for r in simulate(graph, UniformCosts(mw=0.0)).ranks] == [2.0, 1.0]


def _model():
    from torch import nn

    torch.manual_seed(0)
    # Linear saves its input, GELU its input (the Linear's output); no stage saves its own output, so a stage
    # boundary passed in memory (the V placements' middle stages) is counted once, by the stage that reads it.
    return nn.Sequential(*(nn.Sequential(nn.Linear(DIM, DIM), nn.GELU()) for _ in range(BLOCKS)))


def _worker(cfg_file: str, out_file: str) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    from real import Mesh, run
    from real.model_api import UserModel

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, DIM, generator=g)
    # the mean saves no tensor, so the last stage saves what every other stage does
    user = UserModel(model=_model(), loss=lambda out, _t: out.mean(), batches=lambda _step: (x, y))
    mesh, results = None, {}
    for label, d in json.loads(Path(cfg_file).read_text()).items():
        cfg = RunConfig.from_dict(d)
        mesh = mesh or Mesh.create(make_plan(cfg, 2, num_layers=BLOCKS), "gloo", cfg.runtime.timeout_s)
        r = run(cfg, mesh=mesh, user=user)
        if dist.get_rank() == 0:
            results[label] = {"trace": r.trace, "memory": r.memory}
    if dist.get_rank() == 0:
        torch.save(results, out_file)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _worker(*sys.argv[1:3])
