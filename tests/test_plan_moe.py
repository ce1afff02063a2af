"""The planner with a MoE model: ep searched, bounds below the simulated step, memory as simulated, the export."""

from __future__ import annotations

import shlex

import pytest

from analysis.plan.exports import plan_layout, plan_schedule
from analysis.plan.megatron import FLAG_SOURCES, megatron_script
from common.errors import ConfigError
from sim.costs.cluster import cluster_preset
from sim.costs.moe import MoEConfig
from sim.costs.transformer import TransformerConfig
from sim.plan.against import parse_layout
from sim.plan.space import PlanConfig, PlanSpace, enumerate_configs
from tests.test_plan import _check_bound_and_memory

# a small Llama-shaped MoE model: 6 layers (the first dense), 8 experts of width 512, top-2
MOE = TransformerConfig(name="moe-test", layers=6, hidden=512, heads=8, kv_heads=4, ffn=1024, vocab=4096, seq_len=512,
                        gated_mlp=True, bias=False, tied_embeddings=False, learned_positions=False, dropout=False,
                        moe=MoEConfig(experts=8, top_k=2, expert_ffn=512, dense_layers=1))


def _space(**kw) -> PlanSpace:
    return PlanSpace(**{**dict(model=MOE, cluster=cluster_preset("dgx-h100:1"), global_batch=16, chunks=(2,)), **kw})


def test_ep_is_searched_for_a_moe_model_only():
    eps = {(c.dp, c.ep) for c in enumerate_configs(_space())}
    assert {(8, 1), (8, 2), (8, 4), (8, 8), (4, 4), (2, 2), (1, 1)} <= eps
    assert all(c.dp % c.ep == 0 and 8 % c.ep == 0 for c in enumerate_configs(_space()))
    assert {c.ep for c in enumerate_configs(_space(ep=(2,)))} == {2}
    dense = TransformerConfig(name="dense", layers=4, hidden=256, heads=4)
    assert {c.ep for c in enumerate_configs(PlanSpace(model=dense, cluster=cluster_preset("dgx-h100:1"),
                                                     global_batch=8))} == {1}
    with pytest.raises(ConfigError, match="ep 2 splits a MoE model's experts, and model 'dense' has none"):
        PlanSpace(model=dense, cluster=cluster_preset("dgx-h100:1"), global_batch=8, ep=(2,))


def test_bounds_stay_below_the_step_and_memory_is_the_simulated():
    """With experts split over ep ranks the bounds leave the all-to-alls out (an overlapped pair may hide them
    all): still at most the simulated step, dualpipe-v's pairs included; the memory counts the experts' states
    sharded over dp / ep, as the simulation does."""
    space = _space(schedules=("1f1b", "dualpipe-v", "interleaved-1f1b"), dp_modes=("ddp", "zero1", "fsdp"),
                   recompute=("none",))
    configs = [c for c in enumerate_configs(space) if c.ep > 1][::5]
    assert len(configs) >= 10 and any(c.schedule == "dualpipe-v" for c in configs)
    _check_bound_and_memory(space, configs)


def test_a_layout_with_ep_and_its_megatron_line():
    space = _space()
    c = parse_layout("tp1 pp2 dp4 ep4 dualpipe-v v2 m4x1 zero1 rc-none", space)
    assert c == PlanConfig(1, 2, 4, "dualpipe-v", 2, 1, 4, "zero1", "none", False, 4)
    assert c.label() == "tp1 pp2 dp4 ep4 dualpipe-v v2 m4x1 zero1 rc-none"
    with pytest.raises(ConfigError, match="ep 3 must divide dp 4 and a MoE model's experts"):
        parse_layout("tp1 pp2 dp4 ep3 1f1b m4x1 zero1 rc-none", space)
    line = megatron_script(c, MOE, 16, plan_layout(c, MOE, plan_schedule(c))).splitlines()[-1]
    flags = [t for t in shlex.split(line) if t.startswith("--")]
    assert set(flags) <= set(FLAG_SOURCES)
    for flag in ("--expert-model-parallel-size 4", "--num-experts 8", "--moe-router-topk 2", "--moe-ffn-hidden-size 512",
                 "--moe-token-dispatcher-type alltoall", "--moe-layer-freq '([0]*1+[1]*5)'"):
        assert flag in line, flag
    # Megatron's moe_freq_type evaluates the list pattern (arguments.py:327): one 0 (dense), then a 1 per MoE layer
    tokens = shlex.split(line)
    pattern = tokens[tokens.index("--moe-layer-freq") + 1]
    assert eval(pattern, {"__builtins__": {}}) == [0, 1, 1, 1, 1, 1]


def test_torchtitan_export_builds_the_experts(tmp_path):
    """The module builds torchtitan's qwen3 MoE (its deepseek_v3 with latent attention) with the plan's experts and
    expert_parallel_degree; ep with a replicated dp mode has no torchtitan setting. (torchtitan builds and steps
    these exports on 4 gloo ranks: tests/test_torchtitan_launch.py.)"""
    pytest.importorskip("torchtitan", reason="the exports extra: pip install -e '.[exports]'")
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.common.moe import MoE

    from analysis.plan.exports import write_exports
    from analysis.plan.torchtitan import torchtitan_notes
    from tests.plan_questions import TINY_MLA
    from tests.test_exports import _titan_config

    c = PlanConfig(1, 2, 4, "1f1b", 1, 1, 4, "zero1", "none", False, 4)
    for model, name in ((MOE, "qwen3"), (TINY_MLA, "deepseek_v3")):
        cfg = _titan_config(write_exports(c, model, 16, None, tmp_path / name)["torchtitan"])
        assert cfg.model_spec.name == name
        assert cfg.parallelism.expert_parallel_degree == 4 and cfg.training.disable_cuda_graphs
        dims = ParallelDims.from_config(cfg.parallelism, 8)
        assert (dims.ep, dims.dp_shard * dims.cp * dims.tp // dims.ep) == (4, 1)  # efsdp: the plan's dp / ep
        layers = cfg.model_spec.model.layers
        moe = [layer.moe for layer in layers if getattr(layer, "moe", None) is not None]
        assert len(layers) == model.layers and len(moe) == model.moe_layers, name
        m = model.moe
        assert {(x.num_experts, x.router.top_k, x.routed_experts.inner_experts.hidden_dim) for x in moe} == \
            {(m.experts, m.top_k, m.expert_ffn)}, name
        assert all((x.shared_experts is not None) == (m.shared_experts > 0) for x in moe), name
        assert MoE.Config is type(moe[0]), name
    notes = torchtitan_notes(c, MOE, plan_layout(c, MOE, plan_schedule(c)))
    assert not any("does not run what was planned" in n for n in notes)
    ddp = c._replace(dp_mode="ddp")
    with pytest.raises(ConfigError, match="ep 4 with dp mode 'ddp' has no torchtitan setting"):
        torchtitan_notes(ddp, MOE, plan_layout(ddp, MOE, plan_schedule(ddp)))
