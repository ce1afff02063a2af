"""MoE layers (sim.costs.moe): shapes against the model cards, routing load, all-to-all bytes, two-stream overlap."""

import dataclasses

import pytest

from common.errors import ConfigError
from sim.costs.cluster import cluster_preset
from sim.costs.moe import (
    MoEConfig,
    Segment,
    all_to_all_bytes,
    expert_shares,
    max_load,
    threaded_pair_time,
    two_stream_time,
)
from sim.costs.transformer import MODEL_PRESETS
from sim.costs.transformer import model_preset as moe_preset

C, M = (lambda t: Segment(t)), (lambda t: Segment(t, comm=True))


def test_pair_whose_all_to_all_fits_under_the_others_compute_is_fully_hidden():
    # F: attention 10, dispatch 4, experts 10, combine 4; B: combine-grad 4, experts 10, dispatch-grad 4, attention 10.
    # By hand: B's 4 under F's first 10; F's dispatch under B's experts (10-20); B's 4 under F's experts (20-30);
    # F's combine under B's attention (30-40): the pair takes its compute, 40, against 56 run one after the other.
    f, b = [C(10), M(4), C(10), M(4)], [M(4), C(10), M(4), C(10)]
    assert two_stream_time([f]) == 28
    assert two_stream_time([f, b]) == 40


def test_pair_whose_all_to_all_is_twice_the_compute_is_not_hidden():
    # Each all-to-all 20 against compute 10: the comm stream is busy 0-20 (B's) and 20-40 (F's), so the pair
    # takes 40, the two all-to-alls, not its compute of 20; half the 40 of communication stays exposed.
    f, b = [C(10), M(20)], [M(20), C(10)]
    assert two_stream_time([f, b]) == 40
    assert two_stream_time([f, b]) - 20 == 20



def test_a_pair_in_two_threads_on_one_core():
    """The CPU runtime's pair (sim.costs.moe.threaded_pair_time), by hand: processor sharing of the core, each
    chain's all-to-all on a group of its own, compute slowed while one is in flight, and it slowed by compute."""
    assert threaded_pair_time([[C(4)]]) == 4 and threaded_pair_time([[C(4)], [C(4)]]) == 8  # the core shared
    # compute 4 beside an all-to-all of 2 with slowdown 2: 2 s at half speed (1 done), then 3 alone: 5
    assert threaded_pair_time([[C(4)], [M(2)]], slowdown=2.0) == 5
    # stall 2: the all-to-all of 2 takes 4 while the compute runs; the compute, unslowed, ends at 4 too
    assert threaded_pair_time([[C(4)], [M(2)]], stall=2.0) == 4
    # F: compute 1, all-to-all 2, compute 1; B: compute 3. Both compute at half speed until F's first piece ends
    # (t 2, B has 2 left); F's all-to-all (2) hides under B's last 2; then F's last 1: 5, against 7 in turn
    f, b = [C(1), M(2), C(1)], [C(3)]
    assert threaded_pair_time([f, b]) == 5 and sum(x.seconds for x in f + b) == 7
    # two all-to-alls at once, one group each: neither waits for the other
    assert threaded_pair_time([[M(2)], [M(2)]]) == 2 and two_stream_time([[M(2)], [M(2)]]) == 4


def test_threads_sharing_the_core_cost_the_measured_share():
    """share (real.profile.pair's factor): while both chains compute the core serves them share times slower;
    one chain alone, or compute beside communication, is not stretched by it."""
    assert threaded_pair_time([[C(4)], [C(4)]], share=1.25) == 10.0  # 8 x 1.25
    assert threaded_pair_time([[C(4)]], share=1.25) == 4 and threaded_pair_time([[C(4)], [M(2)]], share=2.0) == 4
    # F: compute 1, all-to-all 2, compute 1; B: compute 3, at share 1.5. Both compute at 1/3 each until F's first
    # piece ends (t 3, B has 2 left); F's all-to-all (2) runs under B alone, at full speed (t 5, B done); F's
    # last 1 alone: 6 (5 at share 1, 7 in turn)
    f, b = [C(1), M(2), C(1)], [C(3)]
    assert abs(threaded_pair_time([f, b], share=1.5) - 6.0) < 1e-12


def test_the_profiles_pair_factor_reaches_the_pairs(tmp_path):
    """The cost file's pair_threads.factor loads as ProfiledCosts.pair_share; absent, 1.0; bad, one line."""
    import json

    from schedules import build, lower
    from sim.costs.cost_file import PROFILE_SCHEMA, load_profile
    from sim.costs.profiled import CostFileError

    src = {"schema": PROFILE_SCHEMA, "partitions": [{"num_stages": 1, "stages": [
        {"stage": 0, "layers": [0, 2], "F": 0.01, "B": 0.02, "I": 0.011, "W": 0.012}]}]}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(src))
    assert load_profile(path).pair_share == 1.0
    path.write_text(json.dumps({**src, "pair_threads": {"factor": 1.25, "serial": [1.0], "paired": [1.25]}}))
    costs = load_profile(path)
    assert costs.pair_share == 1.25 and costs.describe()["pair_share"] == 1.25
    st = costs.stages[0]
    graph = lower(build("dualpipe-v", pp=1, microbatches=4))
    pair = next(t for t in graph.tasks if t.action.sub_actions)
    threaded = dataclasses.replace(costs, stages=(st, st), pair_threads=True)
    want = threaded_pair_time([st.segments(a.kind) for a in pair.action.sub_actions], share=1.25)
    assert threaded.duration(pair, graph) == want + costs.task_overhead
    path.write_text(json.dumps({**src, "pair_threads": {"factor": -1}}))
    with pytest.raises(CostFileError, match=r"pair_threads\.factor must be a finite factor > 0 .*got -1"):
        load_profile(path)


def test_profiled_pairs_in_threads_are_timed_by_their_segments():
    """ProfiledCosts.pair_threads: an OVERLAP_F_B of MoE stages is threaded_pair_time over each pass's segments
    (per MoE layer: compute, all-to-all, compute, all-to-all); off, the sum of its passes."""
    from schedules import Kind, build, lower
    from sim.costs.profiled import ProfiledCosts, StageCosts

    st = StageCosts(f=10.0, b=14.0, i=7.0, w=7.0, a2a_f=2.0, a2a_b=2.0, moe_layers=1)
    assert [(x.seconds, x.comm) for x in st.segments(Kind.F)] == [(4.0, False), (1.0, True), (4.0, False), (1.0, True)]
    assert [x.seconds for x in st.segments(Kind.W)] == [7.0]
    graph = lower(build("dualpipe-v", pp=1, microbatches=4))
    pair = next(t for t in graph.tasks if t.action.sub_actions)
    seq = ProfiledCosts(stages=(st, st))
    threaded = ProfiledCosts(stages=(st, st), pair_threads=True)
    assert seq.duration(pair, graph) == 24.0
    want = threaded_pair_time([st.segments(a.kind) for a in pair.action.sub_actions])
    assert threaded.duration(pair, graph) == want < 24.0


def test_presets_match_their_model_cards():
    mixtral, v3 = moe_preset("mixtral-8x7b"), moe_preset("DeepSeek-V3")
    # Mixtral: 46.7B total, 12.9B active (arXiv 2401.04088 rounds them to 47B and 13B).
    assert round(mixtral.params / 1e9, 1) == 46.7 and round(mixtral.active_params / 1e9, 1) == 12.9
    # DeepSeek-V3: 671B total, "37B activated" (arXiv 2412.19437, which rounds down: 37.55B here).
    assert round(v3.params / 1e9) == 671 and 37e9 <= v3.active_params < 38e9
    assert v3.moe_layers == 58 and set(MODEL_PRESETS) >= {"mixtral-8x7b", "deepseek-v3", "moe-gpt-small"}
    assert v3.moe_in(0, 4) == 1 and v3.moe_in(4, 4) == 4 and v3.moe_in(0, 3) == 0


def test_a_moe_layer_per_expert_parallel_rank():
    m = moe_preset("mixtral-8x7b")
    expert = 3 * 4096 * 14336
    assert m.moe_layer_params(8) == m.moe_layer_params() - 7 * expert
    assert m.moe_layer_params(4) == m.moe_layer_params() - 6 * expert


def test_routing_load():
    assert max_load(MoEConfig(experts=8, top_k=2, expert_ffn=1), 4) == pytest.approx(1.0)
    hist = MoEConfig(experts=4, top_k=1, expert_ffn=1, histogram=(3, 1, 1, 1))
    assert expert_shares(hist) == pytest.approx((0.5, 1 / 6, 1 / 6, 1 / 6))
    assert max_load(hist, 2) == pytest.approx(2 * (0.5 + 1 / 6))  # 4/3: rank 0 holds experts 0 and 1
    capped = MoEConfig(experts=4, top_k=1, expert_ffn=1, histogram=(3, 1, 1, 1), capacity_factor=1.0)
    assert max_load(capped, 2) == pytest.approx(2 * (0.25 + 1 / 6))  # expert 0 capped at 1/4, the rest dropped
    assert max_load(MoEConfig(experts=2, top_k=1, expert_ffn=1, skew=1.0), 2) == pytest.approx(4 / 3)  # (1, 1/2)


def test_all_to_all_bytes_and_time():
    moe = MoEConfig(experts=8, top_k=2, expert_ffn=1)
    assert all_to_all_bytes(moe, 4096, 4096, 8) == 4096 * 2 * 4096 * 2 * 7 / 8
    assert all_to_all_bytes(moe, 4096, 4096, 1) == 0.0


@pytest.mark.parametrize("kw, needle", [
    (dict(experts=8, top_k=9, expert_ffn=1), "top_k 9 must be at most experts 8"),
    (dict(experts=8, top_k=2, expert_ffn=1, capacity_factor=0.5), "capacity_factor must be 0 (dropless) or >= 1"),
    (dict(experts=2, top_k=1, expert_ffn=1, histogram=(1,)), "histogram must give 2 counts"),
    (dict(experts=0, top_k=1, expert_ffn=1), "experts must be an integer >= 1, got 0"),
])
def test_bad_moe_shapes(kw, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        MoEConfig(**kw)


def test_ep_must_divide_the_experts():
    with pytest.raises(ConfigError, match=r"ep 3 must divide the 8 experts; valid: 1, 2, 4, 8"):
        max_load(MoEConfig(experts=8, top_k=2, expert_ffn=1), 3)
    with pytest.raises(ConfigError, match="MoE layers and latent attention are modelled Llama-style"):
        dataclasses.replace(moe_preset("moe-gpt-small"), bias=True)


def test_ep_all_to_all_over_nvlink_and_the_nic():
    from sim.costs.moe import ep_all_to_all_time
    one, eight = cluster_preset("dgx-h100:1"), cluster_preset("dgx-h100:8")
    # ep 8 inside a node: all over NVLink
    assert ep_all_to_all_time(7e8, 8, 1, one) == pytest.approx(one.intra.alpha + 7e8 / one.intra.rate)
    # ep 64 over 8 nodes: 7 of 63 peers on the node (NVLink), 56 over the NIC, concurrently: the NIC's part sets it
    t = ep_all_to_all_time(63e7, 64, 1, eight)
    assert t == pytest.approx(eight.inter.alpha + max(7e7 / eight.intra.rate, 56e7 / eight.inter.rate))
    # tp 8 fills the node: every ep peer is on another node
    assert ep_all_to_all_time(63e7, 64, 8, cluster_preset("dgx-h100:64")) == pytest.approx(
        eight.inter.alpha + 63e7 / eight.inter.rate)


def test_a_stages_segments_in_the_order_it_runs_them():
    """TransformerCosts.segments: F runs per MoE layer attention, dispatch, experts, combine (the rest first); B the
    layers reversed, combine's gradient, experts, dispatch's gradient, attention (the rest last); W none."""
    from schedules import Kind
    c = _costs(ep=2, nodes=1)
    layers = c.stage_moe(3, 8)
    f, b, w = c.segments(Kind.F, 3, 8), c.segments(Kind.B, 3, 8), c.segments(Kind.W, 3, 8)
    assert [x.name for x in f] == ["rest", *["attention", "dispatch", "experts", "combine"] * layers]
    assert [x.name for x in b] == [*["combine-grad", "experts", "dispatch-grad", "attention"] * layers, "rest"]
    assert [x.comm for x in f[1:5]] == [False, True, False, True] and len(w) == 1 and not w[0].comm
    assert all(x.seconds == c.all_to_all_time() for x in (*f, *b) if x.comm)
    full = _costs(ep=2, nodes=1, recompute="full").segments(Kind.B, 3, 8)
    assert [x.name for x in full[:6]] == ["recompute-dispatch", "recompute-combine", "combine-grad", "experts",
                                          "dispatch-grad", "attention"]

# --- the MoE model in the analytic cost model (sim.costs.transformer_costs) --------------------------------------

def _costs(ep: int, nodes: int, pp: int = 4, **kw):
    from sim.costs.parallel import ParallelConfig
    from sim.costs.transformer_costs import TransformerCosts
    return TransformerCosts(model=moe_preset("deepseek-v3"), cluster=cluster_preset(f"dgx-h100:{nodes}"),
                            parallel=ParallelConfig(pp=pp, dp=nodes * 8 // pp, ep=ep), **kw)


def _pair(costs, n_st: int = 8, stages: tuple[int, int] = (3, 4)):
    from schedules import Action, Kind
    f, b = Action(Kind.F, stages[0], 0), Action(Kind.B, stages[1], 1)
    pair = Action(Kind.OVERLAP_F_B, None, None, sub_actions=(f, b))
    return (costs._compute(pair, n_st), costs.pass_time(Kind.F, stages[0], n_st),
            costs.pass_time(Kind.B, stages[1], n_st), costs)


def test_a_dualpipe_pair_in_the_cost_model_overlaps_by_its_streams():
    from schedules import Kind
    # ep 2 inside a node (pp 4 x dp 2 on one node): small all-to-alls, all hidden under the other pass's compute
    t, f, b, c = _pair(_costs(ep=2, nodes=1))
    a2a = c.all_to_all_time()
    layers = c.stage_moe(3, 8)
    comm = layers * a2a * (c.all_to_alls(Kind.F) + c.all_to_alls(Kind.B))
    assert a2a > 0 and layers == 8 and t == pytest.approx(f + b - comm)
    # the segments add up to the passes
    assert sum(s.seconds for s in c.segments(Kind.F, 3, 8)) == pytest.approx(f)
    assert sum(s.seconds for s in c.segments(Kind.B, 4, 8)) == pytest.approx(b)
    # ep 64 over 16 nodes (pp 2 x dp 64): the all-to-alls outlast the compute, so part of them stays exposed
    t, f, b, c = _pair(_costs(ep=64, nodes=16, pp=2), n_st=4, stages=(1, 2))
    comm = c.stage_moe(1, 4) * c.all_to_all_time() * 2 + c.stage_moe(2, 4) * c.all_to_all_time() * 2
    assert f + b - comm < t < f + b
    # an explicit pair_overlap overrides the mechanism, as before
    t, f, b, _ = _pair(_costs(ep=2, nodes=1, pair_overlap=0.5))
    assert t == pytest.approx(f + b - 0.5 * min(f, b))


def test_expert_parallel_params_states_and_collectives():
    c1, c8 = _costs(ep=1, nodes=4), _costs(ep=8, nodes=4)
    m = c1.model
    expert = 3 * 7168 * 2048
    layers = c1.stage_moe(1, 4)
    assert c1.stage_params(1, 4) - c8.stage_params(1, 4) == pytest.approx(layers * (256 - 32) * expert)
    assert c8.stage_expert_params(1, 4) == layers * 32 * expert and c8.expert_dp == 1
    assert c1.expert_bytes_scale(1, 4) == 1.0
    # dp 8 = ep 8: every replica holds its own experts, so only the dense part is reduced (scale = dense share)
    total = c8.stage_params(1, 4)
    assert c8.expert_bytes_scale(1, 4) == pytest.approx((total - layers * 32 * expert) / total)
    assert m.moe_layers == 58


def test_moe_bad_layouts():
    from sim.costs.parallel import ParallelConfig
    from sim.costs.transformer_costs import TransformerCosts
    with pytest.raises(ConfigError, match=r"ep 2 splits a MoE model's experts, and model 'gpt-1\.5b' has none"):
        TransformerCosts(model=moe_preset("gpt-1.5b"), cluster=cluster_preset("dgx-h100:1"),
                         parallel=ParallelConfig(pp=1, dp=2, ep=2))
    with pytest.raises(ConfigError, match="ep 3 must divide dp x cp = 2"):
        ParallelConfig(pp=1, dp=2, ep=3)
    with pytest.raises(ConfigError, match="ep 3 must divide the 8 experts"):
        TransformerCosts(model=moe_preset("mixtral-8x7b"), cluster=cluster_preset("dgx-h100:1"),
                         parallel=ParallelConfig(pp=1, dp=6, ep=3))
    with pytest.raises(ConfigError, match="selective-op is not modelled for MoE layers"):
        _costs(ep=2, nodes=1, recompute="selective-op")


def test_qwen3_moe_presets_match_their_cards():
    # Qwen3-30B-A3B: 30.5B total, 3.3B activated; Qwen3-235B-A22B: 235B, 22B (the model cards, arXiv 2505.09388)
    small, big = moe_preset("qwen3-30b-a3b"), moe_preset("qwen3-235b-a22b")
    assert round(small.params / 1e9, 1) == 30.5 and round(small.active_params / 1e9, 1) == 3.4  # card: 3.3 (rounded down)
    assert round(big.params / 1e9) == 235 and round(big.active_params / 1e9) == 22
    assert small.q_width == 4096 and small.kv_hidden == 512  # 32 x 128 queries on h 2048, 4 x 128 keys and values


def test_head_dim_defaults_to_hidden_over_heads():
    m = moe_preset("llama-8b")
    assert m.head_dim == 128 and m.q_width == m.hidden and m.kv_hidden == 1024
    with pytest.raises(ConfigError, match=r"hidden 100 must be divisible by heads 3 \(or give head_dim\)"):
        dataclasses.replace(m, hidden=100, heads=3, kv_heads=3, head_dim=0)
    wide = dataclasses.replace(m, hidden=100, heads=3, kv_heads=3, head_dim=64)
    assert wide.attention_params == 2 * 100 * 192 + 2 * 100 * 192


def test_deepep_dispatch_crosses_the_nic_once_per_remote_node():
    from sim.costs.moe import all_to_all_bytes, dispatch_time, ep_all_to_all_time, remote_nodes
    moe = MoEConfig(experts=128, top_k=8, expert_ffn=1)
    # 2 nodes of 64 experts each: a token misses the other node with probability C(64, 8) / C(128, 8)
    import math
    assert remote_nodes(moe, 2) == pytest.approx(1 - math.comb(64, 8) / math.comb(128, 8))
    assert remote_nodes(moe, 1) == 0.0
    two = cluster_preset("dgx-h100:2")
    tokens, h = 4096, 2048
    pairs = all_to_all_bytes(moe, tokens, h, 16)
    assert dispatch_time(moe, tokens, h, 16, 1, two) == pytest.approx(ep_all_to_all_time(pairs, 16, 1, two))
    nic = tokens * h * 2 * remote_nodes(moe, 2) / two.inter.rate
    nvlink = pairs * 7 / 8 / two.intra.rate
    assert dispatch_time(moe, tokens, h, 16, 1, two, "deepep") == pytest.approx(two.inter.alpha + max(nic, nvlink))
    assert dispatch_time(moe, tokens, h, 16, 1, two, "deepep") < dispatch_time(moe, tokens, h, 16, 1, two)
    # inside one node both dispatchers are the same all-to-all
    one = cluster_preset("dgx-h100:1")
    assert dispatch_time(moe, tokens, h, 8, 1, one, "deepep") == dispatch_time(moe, tokens, h, 8, 1, one)


def test_a_moe_model_from_a_toml_table():
    from sim.costs.transformer import model_from_dict
    shape = dict(layers=8, hidden=1024, heads=8, gated_mlp=True, bias=False, tied_embeddings=False,
                 learned_positions=False, dropout=False)
    m = model_from_dict({**shape, "moe": {"experts": 16, "top_k": 2, "expert_ffn": 1024, "dense_layers": 1,
                                          "histogram": [4, *[1] * 15]}})
    assert m.moe_layers == 7 and m.moe.routing == "histogram"
    assert max_load(m.moe, 4) == pytest.approx(4 * 7 / 19)  # experts 0-3 on rank 0: (4 + 1 + 1 + 1) / 19
    assert model_from_dict({"preset": "mixtral-8x7b", "moe": {"experts": 8, "top_k": 1, "expert_ffn": 14336}}
                           ).moe.top_k == 1
    with pytest.raises(ConfigError, match=r"unknown \[model.moe\] key\(s\) \['k'\]; valid: experts, top_k"):
        model_from_dict({**shape, "moe": {"experts": 16, "k": 2, "expert_ffn": 1024}})
    with pytest.raises(ConfigError, match=r"\[model.moe\] needs top_k"):
        model_from_dict({**shape, "moe": {"experts": 16, "expert_ffn": 1024}})
    with pytest.raises(ConfigError, match="top_k 17 must be at most experts 16"):
        model_from_dict({**shape, "moe": {"experts": 16, "top_k": 17, "expert_ffn": 1024}})


@pytest.mark.parametrize(("argv", "says"), [
    (["--schedules", "nope"], "--schedules: unknown nope"),
    (["--microbatches", "x"], "--microbatches: give comma-separated integers"),
    (["--calibrate-from", "dualpipe-v"], "--calibrate-from 'dualpipe-v': give a one-stage schedule"),
])
def test_validate_moe_refuses_bad_input_in_one_line(argv, says, capsys):
    """experiments/validate_moe.py: bad flags are one line and exit 2, before any profile or run."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "validate_moe", Path(__file__).resolve().parents[1] / "experiments" / "validate_moe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and says in err[0], err
