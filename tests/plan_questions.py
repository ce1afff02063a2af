"""Planning questions whose winners the exports are checked on (tests/test_exports*.py).

Each question is a search space on one DGX H100 node (8 devices), global batch 16, microbatch size 1, for a
small Llama-shaped model (so a real torchtitan step of a shrunk copy runs on gloo), with what its winner must be.
Together they cover every schedule family the planner ranks, fsdp with tp, zero2 with v > 1, fp32 reductions,
pp 1 with accumulation, tied embeddings and an uneven split.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.costs.cluster import cluster_preset
from sim.costs.moe import MLAConfig, MoEConfig
from sim.costs.transformer import TransformerConfig
from sim.plan.search import plan
from sim.plan.space import PlanConfig, PlanSpace

# 7 layers: 4 stages of interleaved 1F1B on pp=2 split unevenly (2, 2, 2, 1).
TINY = TransformerConfig(name="tiny-llama", layers=7, hidden=64, heads=4, vocab=256, seq_len=32, ffn=128, kv_heads=2,
                         gated_mlp=True, bias=False, tied_embeddings=False, learned_positions=False)
# 8 layers with the input embedding tied to the output head (GPT-2 style).
TIED = TransformerConfig(name="tiny-tied", layers=8, hidden=64, heads=4, vocab=256, seq_len=32, ffn=128, kv_heads=2,
                         gated_mlp=True, bias=False, tied_embeddings=True, learned_positions=False)
# Mixtures of experts (tests/test_torchtitan_launch.py): 4 layers, the first dense, 4 experts of 64, top-2 and one
# shared expert; with grouped-query attention (torchtitan's qwen3) and with latent attention (its deepseek_v3).
_TINY_MOE = dict(layers=4, hidden=64, heads=4, vocab=256, seq_len=32, ffn=128, gated_mlp=True, bias=False,
                 tied_embeddings=False, learned_positions=False,
                 moe=MoEConfig(experts=4, top_k=2, expert_ffn=64, shared_experts=1, dense_layers=1))
TINY_MOE = TransformerConfig(name="tiny-moe", kv_heads=2, **_TINY_MOE)
TINY_MLA = TransformerConfig(name="tiny-mla", mla=MLAConfig(q_rank=32, kv_rank=16, rope_dim=8, nope_dim=16, v_dim=16),
                             **_TINY_MOE)

CLUSTER = "dgx-h100:1"
GLOBAL_BATCH = 16


class Question:
    def __init__(self, model: TransformerConfig, expect: Callable[[PlanConfig], bool], reduce_dtype: str = "bf16",
                 **choices: Any) -> None:
        self.model, self.expect, self.reduce_dtype, self.choices = model, expect, reduce_dtype, choices

    def space(self) -> PlanSpace:
        return PlanSpace(model=self.model, cluster=cluster_preset(CLUSTER), global_batch=GLOBAL_BATCH,
                         microbatch_sizes=(1,), reduce_dtype=self.reduce_dtype, **self.choices)

    def winner(self) -> PlanConfig:
        c = plan(self.space(), top=1, workers=1).top[0].config
        assert self.expect(c), c
        return c


QUESTIONS: dict[str, Question] = {
    "1f1b": Question(TINY, lambda c: c.schedule == "1f1b" and c.pp == 2 and c.dp_mode == "ddp",
                     schedules=("1f1b",), pp=(2,), tp=(1,), dp_modes=("ddp",), recompute=("none",)),
    "gpipe": Question(TINY, lambda c: c.schedule == "gpipe" and c.pp == 2,
                      schedules=("gpipe",), pp=(2,), tp=(1,), dp_modes=("ddp",), recompute=("none",)),
    "interleaved-uneven": Question(TINY, lambda c: c.schedule == "interleaved-1f1b" and c.chunks == 2,
                                   schedules=("interleaved-1f1b",), pp=(2,), tp=(1,), chunks=(2,), dp_modes=("ddp",)),
    "zb-v": Question(TINY, lambda c: c.schedule == "zb-v" and c.recompute == "selective",
                     schedules=("zb-v",), pp=(2,), tp=(1,), dp_modes=("ddp",), recompute=("selective",)),
    "v-half": Question(TIED, lambda c: c.schedule == "v-half" and c.pp == 2,
                       schedules=("v-half",), pp=(2,), tp=(1,), dp_modes=("ddp",), recompute=("none",)),
    "dualpipe-v": Question(TIED, lambda c: c.schedule == "dualpipe-v" and c.pp == 2,
                           schedules=("dualpipe-v",), pp=(2,), tp=(1,), dp_modes=("ddp",), recompute=("none",)),
    "interleaved-zb": Question(TIED, lambda c: c.schedule == "interleaved-zb" and c.chunks == 2,
                               schedules=("interleaved-zb",), pp=(2,), tp=(1,), chunks=(2,), dp_modes=("ddp",),
                               recompute=("none",)),
    "fsdp-tp-recompute": Question(TINY, lambda c: c.dp_mode == "fsdp" and c.tp == 2 and c.sp and c.recompute == "full",
                                  schedules=("1f1b",), pp=(1,), tp=(2,), dp_modes=("fsdp",), recompute=("full",),
                                  sp=(True,)),
    "zero1": Question(TINY, lambda c: c.dp_mode == "zero1" and c.pp == 2,
                      schedules=("1f1b", "zb-h1"), pp=(2,), tp=(1,), dp_modes=("zero1",), recompute=("none",)),
    "zero2-v2": Question(TINY, lambda c: c.dp_mode == "zero2" and c.chunks == 2,
                         schedules=("interleaved-1f1b",), pp=(2,), tp=(1,), chunks=(2,), dp_modes=("zero2",),
                         recompute=("none",)),
    "fp32-reduce": Question(TINY, lambda c: c.dp_mode == "ddp" and c.pp == 2, reduce_dtype="fp32",
                            schedules=("1f1b",), pp=(2,), tp=(1,), dp_modes=("ddp",), recompute=("none",)),
    "pp1-accumulation": Question(TINY, lambda c: c.pp == 1 and c.dp == 4 and c.microbatches == 4,
                                 schedules=("1f1b",), pp=(1,), tp=(2,), dp_modes=("ddp",), recompute=("none",)),
}

#: MoE questions at ep 2 (on one node a tiny model's experts fit whole: left to choose, the planner keeps ep 1).
MOE_QUESTIONS: dict[str, Question] = {
    "moe-fsdp": Question(TINY_MOE, lambda c: c.ep > 1 and c.pp == 1, schedules=("1f1b",), pp=(1,), tp=(1,), ep=(2,),
                         dp_modes=("fsdp",), recompute=("none",)),
    "mla-zero1-pp2": Question(TINY_MLA, lambda c: c.ep > 1 and c.pp == 2, schedules=("1f1b",), pp=(2,), tp=(1,), ep=(2,),
                              dp_modes=("zero1",), recompute=("full",)),
    "moe-dualpipe-v": Question(TINY_MOE, lambda c: c.ep > 1 and c.schedule == "dualpipe-v",
                               schedules=("dualpipe-v",), pp=(2,), tp=(1,), ep=(2,), dp_modes=("zero1",),
                               recompute=("none",)),
}
