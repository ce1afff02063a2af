"""torchtitan's own pipelining_fn and parallelize_fn on the exports of every planning question, one step each.

Each winner of ``tests/plan_questions.py`` (plus fsdp on a V-shaped zb-v CSV) is shrunk to 4 ranks (dp 4 -> 2,
keeping pp, the schedule, chunks, tp and the dp mode), exported, and built and stepped by torchtitan's functions on
4 gloo ranks, all in one launch (this file is its own worker). Every parameter must have a gradient, and each rank's
data-parallel collectives of the step (counted by wrapping torch.distributed's functions) must be those the
simulator times for the plan as torchtitan runs it (:func:`analysis.plan.torchtitan.planned_collectives`), with one
UNSHARD and one RESHARD per stage.
The MoE questions (``tests.plan_questions.MOE_QUESTIONS``, ep 2) also count torchtitan's token dispatches and
combines against the simulator's (:func:`_moe_want`).

What the CPU needs, and only the test does: torchtitan's flex attention has no CPU backward, so its SDPA attention
runs instead (the math kernel, on each rank's own heads under tensor parallelism: DTensor has no CPU SDPA rule);
gloo has no PREMUL_SUM, so FSDP2 reduces with SUM (``set_force_sum_reduction_for_comms``); torchtitan picks
"cuda" as its device type. The second of two steps is counted (FSDP2's first step gathers more as it initialises).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

WORLD = 4
COLLECTIVES = {"all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter", "all_reduce": "all_reduce"}


def _shrunk(c):
    """``c`` on at most WORLD ranks: fewer replicas, everything else kept."""
    return c._replace(dp=max(1, WORLD // (c.tp * c.pp)))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchtitan_runs_every_planned_question(tmp_path):
    pytest.importorskip("torchtitan", reason="the exports extra: pip install -e '.[exports]'")
    import os
    import subprocess

    from analysis.plan.exports import plan_layout, plan_schedule, write_exports
    from analysis.plan.torchtitan import planned_collectives
    from real.launch import torchrun
    from sim.plan.space import PlanConfig
    from tests.plan_questions import MOE_QUESTIONS, QUESTIONS, TINY

    cases = {name: (_shrunk(q.winner()), q.model, q.reduce_dtype)
             for name, q in {**QUESTIONS, **MOE_QUESTIONS}.items()}
    cases["fsdp-zb-v"] = (PlanConfig(1, 2, 2, "zb-v", 2, 1, 4, "fsdp", "none", False), TINY, "fp32")
    plans, want = {}, {}
    for name, (c, model, reduce_dtype) in cases.items():
        assert c.tp * c.pp * c.dp == WORLD and c.dp > 1, (name, c)
        sched = plan_schedule(c)
        layout = plan_layout(c, model, sched)
        files = write_exports(c, model, c.microbatches * c.microbatch_size * c.dp, None, tmp_path / name,
                              reduce_dtype=reduce_dtype)
        plans[name] = str(files["torchtitan"])
        planned = planned_collectives(c, model, sched, layout)
        want[name] = [{**{k: planned[r][k] for k in COLLECTIVES.values()},
                       "stages": [s for s, x in enumerate(layout.ranks) if x == r] if c.pp > 1 else None,
                       "missing": [], **_moe_want(c, model, layout, r)} for r in range(c.pp)]
    (tmp_path / "plans.json").write_text(json.dumps(plans))
    start = time.monotonic()
    try:
        proc = torchrun(WORLD, [__file__, str(tmp_path / "plans.json"), str(tmp_path / "out.json")], timeout=240,
                        capture=True, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(  # the worker imports tests.*
                            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])})
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"launch hung; stderr:\n{(exc.stderr or '')[-4000:]}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    got = json.loads((tmp_path / "out.json").read_text())
    print(f"{len(plans)} plans on {WORLD} gloo ranks in {time.monotonic() - start:.1f} s")
    for name in plans:
        for rank, res in enumerate(got):
            mine = res[name]
            assert "error" not in mine, (name, rank, mine)
            assert {k: v for k, v in mine.items() if k != "pp_rank"} == want[name][mine["pp_rank"]], (name, rank)


def _moe_want(c, model, layout, pp_rank: int) -> dict:
    """A MoE plan's expert parallelism on pipeline rank ``pp_rank`` as the simulator times it: dispatch and combine
    once per MoE layer in every forward and every recomputation (TransformerCosts.all_to_alls: 2 in F and R), each
    dispatch carrying every (token, expert) pair of the microbatch (dropless: capacity factor 0); the ep and
    expert-dp (dp / ep) groups."""
    if model.moe is None:
        return {}
    firsts = [sum(layout.layers[:s]) for s in range(len(layout.layers))]
    moe = sum(model.moe_in(firsts[s], layout.layers[s]) for s, r in enumerate(layout.ranks) if r == pp_rank)
    passes = moe * c.microbatches * (2 if c.recompute == "full" else 1)
    return {"dispatch": passes, "combine": passes, "rows": [c.microbatch_size * model.seq_len * model.moe.top_k],
            "ep": c.ep, "efsdp": c.dp // c.ep}


# --------------------------------------------------------------------------------------------- the worker
def _counting_moe(counts: dict):
    """Count torchtitan's token exchanges (AllToAllTokenDispatcher: forward dispatch and combine) and the rows each
    dispatch sends, over all ranks of its ep group; returns the undo."""
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher as D

    originals = {name: getattr(D, name) for name in ("_dispatch_token_exchange", "_combine_token_exchange")}

    def dispatch(self, routed, pg, output_splits, input_splits):
        counts["dispatch"] += 1
        counts["rows"].add(int(sum(input_splits)))
        return originals["_dispatch_token_exchange"](self, routed, pg, output_splits, input_splits)

    def combine(self, *args, **kwargs):
        counts["combine"] += 1
        return originals["_combine_token_exchange"](self, *args, **kwargs)

    D._dispatch_token_exchange, D._combine_token_exchange = dispatch, combine

    def undo():
        for name, fn in originals.items():
            setattr(D, name, fn)
    return undo


def _counting(counts: dict[str, int], dp_ranks: list[int]):
    """Wrap torch.distributed's collectives that FSDP2 calls so that those of the data-parallel group count."""
    import torch.distributed as dist

    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def wrap(name, fn):
        def counted(*args, **kwargs):
            group = kwargs.get("group")
            if sorted(dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())) \
                    == dp_ranks:
                counts[COLLECTIVES[name]] += 1
            return fn(*args, **kwargs)
        return counted

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    return originals


def _local_attention(forward):
    """SDPA on this rank's heads: DTensor (tensor parallelism) has no CPU SDPA rule in torch 2.13.0."""
    from torch.distributed.tensor import DTensor

    def attention(q, k, v, **kwargs):
        if not isinstance(q, DTensor):
            return forward(q, k, v, **kwargs)
        out = forward(q.to_local(), k.to_local(), v.to_local(), **kwargs)
        return DTensor.from_local(out, q.device_mesh, q.placements, run_check=False)
    return attention


def _build(cfg):
    """The model parts (and the pipeline schedule) as torchtitan's trainer builds them, for a CPU."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torch.nn import functional
    from torch.nn.attention import SDPBackend
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.common.attention import ScaledDotProductAttention

    dims = ParallelDims.from_config(cfg.parallelism, dist.get_world_size())
    dims.build_mesh()
    dist_utils.set_spmd_backend(cfg.parallelism.spmd_backend)  # as torchtitan's Trainer.__init__ does after the mesh
    mc = cfg.model_spec.model
    mc.update_from_config(config=cfg)
    for layer in mc.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    with torch.device("meta"):
        model = mc.build()
    for sub in model.modules():
        if isinstance(sub, ScaledDotProductAttention):
            sub.sdpa_backends = [SDPBackend.MATH]
            sub.forward = _local_attention(sub.forward)

    def loss_fn(pred, labels, **kwargs):
        pred = pred.full_tensor() if isinstance(pred, DTensor) else pred
        return functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(), reduction="sum"), None

    spec = cfg.model_spec
    common = dict(parallel_dims=dims, training=cfg.training, parallelism=cfg.parallelism, compile_config=cfg.compile,
                  ac_config=cfg.activation_checkpoint, dump_folder=cfg.dump_folder)
    sched, first, last = None, True, True
    if dims.pp_enabled:
        sched, parts, first, last = spec.pipelining_fn(model, **common, device=torch.device("cpu"), model_config=mc,
                                                       parallelize_fn=spec.parallelize_fn, loss_fn=loss_fn)
    else:
        parts = [spec.parallelize_fn(model, **common)]
    for m in parts:
        for sub in m.modules():
            if isinstance(sub, FSDPModule):
                sub.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        m.to_empty(device="cpu")
        with torch.no_grad():
            m.init_weights(buffer_device=None)
        m.train()
    return dims, parts, sched, first, last, loss_fn


def _step(cfg, dims, parts, sched, first, last, loss_fn) -> None:
    """One training step's forward and backward, called as torchtitan's trainer calls them."""
    import torch

    seq, vocab = cfg.training.seq_len, cfg.model_spec.model.vocab_size
    gen = torch.Generator().manual_seed(1)
    if sched is not None:  # Trainer.pp_forward_backward_step
        mb = cfg.parallelism.pipeline_parallel_microbatch_size
        n = cfg.training.local_batch_size // mb
        tokens = [torch.randint(0, vocab, (mb, seq + 1), generator=gen) for _ in range(n)]
        sched.step(arg_mbs=[(t[:, :-1],) for t in tokens] if first else None,
                   kwarg_mbs=[{"positions": torch.arange(seq).expand(mb, seq)} for _ in range(n)],
                   target_mbs=[t[:, 1:] for t in tokens] if last else None, losses=[] if last else None,
                   loss_kwargs={}, return_outputs=False)
        return
    b = cfg.training.local_batch_size  # Trainer.train_step's accumulation loop, then forward_backward_step
    for _ in range(cfg.training.global_batch_size // (b * dims.dp_replicate * dims.dp_shard)):
        t = torch.randint(0, vocab, (b, seq + 1), generator=gen)
        loss_fn(parts[0](t[:, :-1], positions=torch.arange(seq).expand(b, seq)), t[:, 1:])[0].backward()


def _run(path: str) -> dict:
    import torch.distributed as dist

    from tests.test_exports import _titan_config

    cfg = _titan_config(Path(path))
    dims, parts, sched, first, last, loss_fn = _build(cfg)
    counts = dict.fromkeys(COLLECTIVES.values(), 0)
    moe = {"dispatch": 0, "combine": 0, "rows": set()}
    originals = _counting(counts, sorted(dist.get_process_group_ranks(dims.get_mesh("batch").get_group())))
    undo = _counting_moe(moe)
    try:
        for _ in range(2):
            counts.update(dict.fromkeys(counts, 0))
            moe.update(dispatch=0, combine=0, rows=set())
            for m in parts:
                for p in m.parameters():
                    p.grad = None
            _step(cfg, dims, parts, sched, first, last, loss_fn)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
        undo()
    if dims.ep_enabled:
        counts.update(moe, rows=sorted(moe["rows"]), ep=dims.get_mesh("ep").size(), efsdp=dims.get_mesh("efsdp").size())
    out = {**counts, "pp_rank": dims.get_mesh("pp").get_local_rank() if dims.pp_enabled else 0, "stages": None,
           "missing": [name for m in parts for name, p in m.named_parameters() if p.grad is None]}
    if sched is not None:
        actions = [a.computation_type.name for a in sched.pipeline_order_with_comms[sched.rank]]
        stages = [s.stage_index for s in sched._stages]
        assert actions.count("UNSHARD") == actions.count("RESHARD") == actions.count("REDUCE_GRAD") == len(stages), \
            actions
        out["stages"] = stages
    return out


def _worker(plans_file: str, out_file: str) -> None:
    import traceback

    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as titan_dims

    titan_dims.device_type = "cpu"  # torchtitan picks "cuda" on a build without accelerators
    dist.init_process_group("gloo")
    results = {}
    for name, path in json.loads(Path(plans_file).read_text()).items():
        try:
            results[name] = _run(path)
        except Exception as exc:  # reported per plan; every rank goes on to the next plan together
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            traceback.print_exc()
        dist.barrier()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, results)
    if dist.get_rank() == 0:
        Path(out_file).write_text(json.dumps(every))
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
