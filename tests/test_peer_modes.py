"""Decentralized SGD and local SGD for real: the built-in GPT on a token file, 2 gloo processes (dp 2).

One torchrun launch (tests/run_configs.py) runs, per mode, 4 steps
uninterrupted, 2 steps that checkpoint at step 2, and 4 steps resumed from it:

* each mode equals its own single-process definition (``_reference``: dp
  copies of the whole model in one process, each on its replica's share of
  the batch, averaged as the algorithm says) to 1e-5, losses and the first
  replica's parameters (decentralized with SGD, local-sgd K = 3 with AdamW);
* local-sgd with K = 1 and SGD (momentum 0.9) equals ddp to 1e-5, losses and
  parameters: averaging the parameters after every local step is averaging
  the gradients when the update is linear in the gradient (SGD, with or
  without momentum: the momentum buffers average too); AdamW's is not;
* a resumed run (decentralized ring; local-sgd K = 3 with AdamW, resumed at step 2,
  where a lost counter would average) is bit-identical to the uninterrupted one;
* the bytes each rank traced per step equal the prediction: the IR's tasks
  (``schedules.dp.modes``) for the mode, each a bucket of the runtime's, and their
  sum the closed form (decentralized: every parameter once per neighbour;
  local-sgd: once on an averaging step, none on the others).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from real import ModelConfig, RunConfig  # noqa: E402
from real.checkpoint import CheckpointConfig  # noqa: E402
from real.config import make_plan  # noqa: E402
from real.data.sources import microbatches  # noqa: E402
from real.data.tokens import prepare  # noqa: E402
from real.dp.sync import make_buckets  # noqa: E402
from real.model_api import data_for  # noqa: E402
from real.models import build_model, loss_fn, make_optimizer  # noqa: E402
from schedules import Kind  # noqa: E402
from schedules.dp.modes import add_data_parallel, random_peer, ring_neighbours  # noqa: E402

LAUNCH_TIMEOUT = 150  # seconds for the launch (8 runs of 2-4 steps on 2 processes)
SEQ = 8
MODEL = ModelConfig(kind="gpt", layers=2, dim=16, heads=2, vocab=256, seq=SEQ)
BUCKET_MB = 0.004  # a few buckets per stage
pytestmark = [pytest.mark.slow, pytest.mark.timeout(LAUNCH_TIMEOUT + 10)]


def _config(data: str, mode: str, steps: int, directory: Path | None = None, *, optimizer: str = "sgd",
            **sync) -> RunConfig:
    return RunConfig.of(schedule="1f1b", dp=2, microbatches=2, batch_size=8, steps=steps, model=MODEL,
                        token_file=data, optimizer=optimizer, lr=0.05, timeout_s=30, dp_mode=mode,
                        bucket_mb=BUCKET_MB, trace_steps=2, **sync,
                        checkpoint=None if directory is None else CheckpointConfig(directory=str(directory), every=2))


def _runs(tmp: Path) -> dict[str, RunConfig]:
    text = tmp / "text.txt"
    text.write_bytes(Path("README.md").read_bytes()[:4000])
    data = str(tmp / "corpus.u16")
    prepare([text], data)
    runs = {"ddp": _config(data, "ddp", 4), "local-sgd K=1": _config(data, "local-sgd", 4, sync_every=1)}
    for label, mode, kw in (("decentralized", "decentralized", {}),
                            ("local-sgd K=3", "local-sgd", {"sync_every": 3, "optimizer": "adamw"})):
        runs[f"{label} plain"] = _config(data, mode, 4, **kw)
        runs[f"{label} first"] = _config(data, mode, 2, tmp / label, **kw)
        runs[f"{label} resumed"] = _config(data, mode, 4, tmp / label, **kw)
    return runs


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[dict[str, RunConfig], dict]:
    from tests.conftest import launch_runs

    tmp = tmp_path_factory.mktemp("peermodes")
    runs = _runs(tmp)
    return runs, launch_runs(runs, 2, tmp, LAUNCH_TIMEOUT)


def _reference(cfg: RunConfig) -> tuple[list[float], dict[str, torch.Tensor]]:
    """(losses, replica 0's parameters) of the mode run in one process: dp whole models, each stepping on its
    replica's share of every batch; decentralized: before the step, each replica's parameters become the mean of
    its own and its neighbours' (all taken before the step); local-sgd: after steps 0, K, 2K, ..., the mean of
    every replica's."""
    dp, m, sync = cfg.layout.dp, cfg.layout.microbatches, cfg.sync
    models = [build_model(MODEL, cfg.data.seed) for _ in range(dp)]
    opts = [make_optimizer(cfg.optim.optimizer, model.parameters(), cfg.optim.lr) for model in models]
    data, losses = data_for(cfg, None), []
    for step in range(cfg.steps):
        before = [[p.detach().clone() for p in model.parameters()] for model in models]
        total = 0.0
        for d, (model, opt) in enumerate(zip(models, opts, strict=True)):
            opt.zero_grad(set_to_none=True)
            for x, y in microbatches(data.replica_batch(step, dp, d), 1, 0, m):
                loss = loss_fn(model(x), y) / m
                loss.backward()
                total += loss.item()
        with torch.no_grad():
            if sync.dp_mode == "decentralized":
                for d, model in enumerate(models):
                    peers = (ring_neighbours(d, dp) if sync.peer_selection == "ring"
                             else (random_peer(d, dp, cfg.data.seed, step),))
                    for i, p in enumerate(model.parameters()):
                        p.copy_((before[d][i] + sum(before[q][i] for q in peers)) / (1 + len(peers)))
            for opt in opts:
                opt.step()
            if sync.dp_mode == "local-sgd" and step % sync.sync_every == 0:
                for ps in zip(*(model.parameters() for model in models), strict=True):
                    mean = sum(p.detach().clone() for p in ps) / dp
                    for p in ps:
                        p.copy_(mean)
        losses.append(total / dp)
    return losses, {n: p.detach().clone() for n, p in models[0].named_parameters()}


@pytest.mark.parametrize("label", ["decentralized plain", "local-sgd K=3 plain"])
def test_a_peer_mode_equals_its_single_process_definition(launched, label):
    runs, got = launched
    ref_losses, ref_params = _reference(runs[label])
    assert max(abs(a - b) for a, b in zip(got[label]["losses"], ref_losses, strict=True)) <= 1e-5
    assert list(got[label]["params"]) == list(ref_params)
    for name, t in ref_params.items():
        diff = float((got[label]["params"][name] - t).abs().max())
        assert diff <= 1e-5, f"{label}: {name} differs from the definition by {diff:.3g}"


def test_local_sgd_averaging_every_step_with_sgd_equals_ddp(launched):
    _, got = launched
    ddp, local = got["ddp"], got["local-sgd K=1"]
    assert max(abs(a - b) for a, b in zip(local["losses"], ddp["losses"], strict=True)) <= 1e-5
    assert list(local["params"]) == list(ddp["params"])
    for name, t in ddp["params"].items():
        assert float((local["params"][name] - t).abs().max()) <= 1e-5, name


@pytest.mark.parametrize("label", ["decentralized", "local-sgd K=3"])
def test_a_peer_mode_resumes_bit_for_bit(launched, label):
    _, got = launched
    first, resumed, plain = (got[f"{label} {k}"] for k in ("first", "resumed", "plain"))
    assert first["start_step"] == 0 and resumed["start_step"] == 2
    assert resumed["losses"] == plain["losses"] and len(plain["losses"]) == 4
    for name, t in plain["params"].items():
        assert torch.equal(resumed["params"][name], t), f"{label}: {name} differs after resuming"
    assert plain["losses"] != got["ddp"]["losses"]  # the mode changes the mathematics


def _stage_bytes(cfg: RunConfig) -> list[list[int]]:
    """Per stage: the runtime's buckets (parameters in reverse, cut at bucket_mb), in bytes."""
    model = build_model(MODEL, cfg.data.seed)
    plan = make_plan(cfg, cfg.world_size)
    layers = list(model)
    out = []
    for rng in plan.layers:
        params = [p for i in rng for p in layers[i].parameters()]
        out.append([sum(p.numel() * 4 for p in b) for b in make_buckets(params, BUCKET_MB * 2**20)])
    return out


@pytest.mark.parametrize(("label", "mode", "averaging_steps"), [("decentralized plain", "decentralized", (2, 3)),
                                                                 ("local-sgd K=3 plain", "local-sgd", (3,))])
def test_bytes_sent_per_step_equal_the_prediction(launched, label, mode, averaging_steps):
    runs, got = launched
    cfg, trace = runs[label], got[label]["trace"]
    buckets = _stage_bytes(cfg)
    plan = make_plan(cfg, cfg.world_size)
    graph = add_data_parallel(plan.graph, mode, [len(b) for b in buckets], peers=1)
    kind = Kind.EXCHANGE if mode == "decentralized" else Kind.ALLREDUCE
    predicted = sorted((str(t.action), buckets[t.action.stage][t.action.bucket]) for t in graph.tasks
                       if t.action.kind is kind)
    assert sum(n for _, n in predicted) == sum(map(sum, buckets)) == 4 * sum(
        p.numel() for p in build_model(MODEL, 0).parameters())
    for step in (2, 3):
        for rank in (0, 1):
            rows = trace[(trace["step"] == step) & (trace["rank"] == rank) & (trace["stream"] == "collective")]
            measured = sorted(zip(rows["action"], rows["bytes"].astype(int), strict=True))
            assert measured == (predicted if step in averaging_steps else []), (label, step, rank)
