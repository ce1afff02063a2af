"""An analytic GPT-style transformer: parameters, FLOPs and activation bytes per layer.

Per token of one layer with hidden size h, FFN size f, sequence length s
(Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters", sec. 5.1, generalised from f = 4h): a matmul of an (m x k) by a
(k x n) matrix costs 2mkn FLOPs, so

* QKV and output projections: 2 * 4h^2 = 8h^2; the MLP's two matmuls: 2 * 2hf = 4hf;
* attention scores QK^T and the weighted sum over V: 2 * 2sh = 4sh
  (causal masking is not subtracted, as in Megatron's formula);

forward = 8h^2 + 4hf + 4sh (= 24h^2 + 4sh when f = 4h). The backward costs
twice the forward: the input-gradient pass (I) repeats every matmul once for
dX and the attention matmuls once more (both operands need a gradient, no
weights): 8h^2 + 4hf + 8sh; the weight-gradient pass (W) repeats only the
weight matmuls: 8h^2 + 4hf. The LM head (last stage) adds 2hV per token to F,
I and W; the embedding lookup costs no FLOPs. Activation recomputation adds to
I the layer's forward (full) or the attention core's 4sh (selective):
:meth:`TransformerConfig.recompute_flops`.

Activation bytes per layer for one microbatch of b sequences, 16-bit
(Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", eq. 1 and Table 2): sbh(34 + 5as/h) without parallelism;
with t-way tensor, sequence parallelism and recomputation see
:meth:`TransformerConfig.layer_activation_bytes`. Of the 34 sbh, the inputs of
the four weight matmuls (QKV 2, out-proj 2, fc1 2, fc2 8: 14 sbh, with f = 4h)
are what the W pass still needs after I.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common import parse
from common.errors import ConfigError, check_positive_ints, find_name, quote
from schedules.partition import split_layers
from sim.costs.cluster import KeyCheck, check_table, key_choice, key_flag, key_positive_int, key_string
from sim.costs.moe import MLAConfig, MoEConfig
from sim.costs.recompute_modes import layer_every

__all__ = ["ATTENTION_KINDS", "MODEL_PRESETS", "TransformerConfig", "model_from_dict", "model_preset", "partition_layers"]


ATTENTION_KINDS = ("flash", "unfused")


@dataclass(frozen=True, slots=True, kw_only=True)
class TransformerConfig:
    """GPT shape: ``layers``, ``hidden`` (h), ``heads`` (a), ``ffn`` (f, default 4h), ``vocab`` (V), ``seq_len`` (s)."""

    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int = 51200
    seq_len: int = 1024
    ffn: int = 0  # 0: 4 * hidden
    # Llama-style variants (defaults give the GPT shape): grouped-query attention with ``kv_heads``
    # key/value heads, a gated (SwiGLU) MLP of three h x f matrices, no biases, RMSNorm, rotary
    # positions (no position table) and an LM head untied from the embedding.
    kv_heads: int = 0  # 0: heads (multi-head attention)
    head_dim: int = 0  # 0: hidden / heads; Qwen3's heads are wider than hidden / heads (32 x 128 on h 2048)
    gated_mlp: bool = False
    bias: bool = True
    tied_embeddings: bool = True
    learned_positions: bool = True
    dropout: bool = True  # dropout after attention and MLP (GPT); Llama trains without
    # "flash": a fused attention kernel (FlashAttention, cuDNN): no s x s tensor is stored or written to HBM,
    # the kernel's backward recomputes the scores; "unfused": the Megatron-LM kernels of 2021-22 (QK^T,
    # fused scale-mask-softmax, dropout, the product with V as separate operations).
    attention: str = "flash"
    # Mixture of experts (sim.costs.moe): every layer from ``moe.dense_layers`` on has routed experts in place of
    # its dense MLP (``ffn`` is then the dense layers' width); ``mla``: multi-head latent attention in place of
    # the Q, K, V and output projections (DeepSeek-V3).
    moe: MoEConfig | None = None
    mla: MLAConfig | None = None

    def __post_init__(self) -> None:
        owner = f"model {self.name!r}"
        check_positive_ints(owner, layers=self.layers, hidden=self.hidden, heads=self.heads,
                            vocab=self.vocab, seq_len=self.seq_len)
        for key, default in (("ffn", 4 * self.hidden), ("kv_heads", self.heads)):
            if type(getattr(self, key)) is int and getattr(self, key) == 0:  # 0 (not 0.0, not False): the default
                object.__setattr__(self, key, default)
        check_positive_ints(owner, ffn=self.ffn, kv_heads=self.kv_heads)
        if not (type(self.head_dim) is int and self.head_dim == 0):
            check_positive_ints(owner, head_dim=self.head_dim)
        elif self.hidden % self.heads:
            raise ConfigError(f"{owner}: hidden {self.hidden} must be divisible by heads {self.heads} (or give "
                              "head_dim)", field="hidden")
        else:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        parse.canonical_field(self, "attention", owner, ATTENTION_KINDS)
        for key in ("gated_mlp", "bias", "tied_embeddings", "learned_positions", "dropout"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{owner}: {key} must be true or false, got {quote(getattr(self, key))}", field=key)
        if not 1 <= self.kv_heads <= self.heads or self.heads % self.kv_heads:
            raise ConfigError(
                f"model {self.name!r}: kv_heads must divide heads {self.heads} (1..{self.heads}), got {self.kv_heads}"
            )
        if self.moe is not None:
            self.moe.check_layers(self.layers, owner)
        if (self.moe is not None or self.mla is not None) and (self.bias or not self.gated_mlp):
            raise ConfigError(f"{owner}: MoE layers and latent attention are modelled Llama-style: they need "
                              "bias false and gated_mlp true", field="bias")

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts: all from ``moe.dense_layers`` on (0 for a dense model)."""
        return 0 if self.moe is None else self.layers - self.moe.dense_layers

    def moe_in(self, start: int, count: int) -> int:
        """How many of layers ``start`` .. ``start + count - 1`` are MoE layers."""
        if self.moe is None:
            return 0
        return max(0, start + count - max(start, self.moe.dense_layers))

    @property
    def kv_hidden(self) -> int:
        """Width of the K and V projections: kv_heads x head_dim (h for multi-head attention)."""
        return self.kv_heads * self.head_dim

    @property
    def q_width(self) -> int:
        """Width of the queries and of the attention's output: heads x head_dim (h unless head_dim is given)."""
        return self.heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """The attention's weights: Q and O h^2 each, K and V h*h_kv each; latent attention's (MLAConfig.params)."""
        if self.mla is not None:
            return self.mla.params(self.hidden, self.heads)
        return 2 * self.hidden * self.q_width + 2 * self.hidden * self.kv_hidden

    @property
    def layer_matrix_params(self) -> int:
        """Weights of a dense layer's matmuls: the attention's and the MLP's 2hf (3hf gated)."""
        return self.attention_params + (3 if self.gated_mlp else 2) * self.hidden * self.ffn

    def moe_layer_params(self, ep: int = 1) -> float:
        """A MoE layer's weights on one of ``ep`` expert-parallel ranks: attention, two norms, E/ep routed
        experts, the shared experts and the router (sim.costs.moe.MoEConfig)."""
        assert self.moe is not None
        return (self.attention_params + 2 * self.hidden
                + self.moe.layer_mlp_params_per_rank(self.hidden, ep, self.gated_mlp))

    # --- parameters -------------------------------------------------------------------------------
    @property
    def layer_params(self) -> int:
        """GPT: attention 4h^2 + 4h (weights, biases), MLP 2hf + f + h, two layer norms 4h.

        Llama: the matrices only, plus two RMSNorm weights 2h.
        """
        h, f = self.hidden, self.ffn
        if not self.bias:
            return self.layer_matrix_params + 2 * h
        return self.layer_matrix_params + 2 * h + self.kv_hidden * 2 + f + h + 4 * h

    @property
    def embedding_params(self) -> int:
        """Token embedding Vh, learned positions sh if any, an untied LM head Vh if untied."""
        h = self.hidden
        return self.vocab * h * (1 if self.tied_embeddings else 2) + (self.seq_len * h if self.learned_positions else 0)

    @property
    def params(self) -> int:
        final_norm = 2 * self.hidden if self.bias else self.hidden
        moe = self.moe_layers * int(self.moe_layer_params()) if self.moe is not None else 0
        return (self.layers - self.moe_layers) * self.layer_params + moe + self.embedding_params + final_norm

    @property
    def active_params(self) -> int:
        """The weights one token passes through: a MoE layer's top_k routed and its shared experts (and router)."""
        if self.moe is None:
            return self.params
        m = self.moe
        idle = (m.experts - m.top_k) * m.expert_params(self.hidden, self.gated_mlp)
        return self.params - self.moe_layers * idle

    # --- FLOPs per token -----------------------------------------------------------------------------
    def layer_flops(self, kind: str, moe: bool = False) -> float:
        """FLOPs per token of one layer for pass ``kind``: 'F', 'I' or 'W' (see the module docstring); ``moe``: a
        MoE layer, whose MLP is its router and top_k + shared expert MLPs (MoEConfig.mlp_flops)."""
        if moe and self.moe is not None:
            weights = 2 * self.attention_params + self.moe.mlp_flops(self.hidden, self.gated_mlp)
        else:
            weights = 2 * self.layer_matrix_params  # 8h^2 + 4hf for the GPT shape
        core = self.core_flops()
        return {"F": weights + core, "I": weights + 2 * core, "W": weights}[kind]

    def core_flops(self) -> float:
        """The attention core's forward FLOPs per token over the whole sequence: QK^T and the product with V,
        4sh (latent attention: MLAConfig.core_flops)."""
        if self.mla is not None:
            return self.mla.core_flops(self.seq_len, self.heads)
        return 4.0 * self.seq_len * self.q_width

    def head_flops(self, kind: str) -> float:
        """LM head per token: one h x V matmul, again for dX (I) and for dW (W)."""
        return 2.0 * self.hidden * self.vocab

    def model_flops_per_token(self) -> float:
        """Forward + backward of the whole model per token: the 'model FLOPs' of MFU (no recompute)."""
        dense = (self.layers - self.moe_layers) * sum(self.layer_flops(k) for k in "FIW")
        moe = self.moe_layers * sum(self.layer_flops(k, True) for k in "FIW")
        return dense + moe + 3 * self.head_flops("F")

    def recompute_flops(self, mode: str, moe: bool = False) -> float:
        """FLOPs per token of one layer that recomputation adds to the backward (I) pass.

        full: the whole forward again; selective: the attention core's two matmuls, QK^T and the weighted
        sum over V, 4sh (Korthikanti et al. 2022, sec. 5); selective-op: the matmuls the policy does not save
        (:meth:`matmuls`); layer:N: the whole forward of one layer in N.
        """
        if mode == "full":
            return self.layer_flops("F", moe)
        if mode == "selective":
            return self.core_flops()
        if mode == "selective-op":
            return sum(flops for i, (_, flops, _, _) in enumerate(self.matmuls()) if i % 2)
        if n := layer_every(mode):
            return self.layer_flops("F", moe) / n
        return 0.0

    def matmuls(self) -> list[tuple[str, float, float, bool]]:
        """The layer's weight matmuls in forward order: (name, FLOPs per token, output bytes per token on one
        shard of a row-parallel one / all shards, row-parallel). A Llama layer runs q, k, v, out, gate, up,
        down as separate matmuls (torchtitan's model); a GPT layer a fused qkv, out, fc1, fc2 (Megatron-LM's)."""
        h, f, kv, q = self.hidden, self.ffn, self.kv_hidden, self.q_width
        if self.gated_mlp:
            return [("q", 2 * h * q, 2 * q, False), ("k", 2 * h * kv, 2 * kv, False), ("v", 2 * h * kv, 2 * kv, False),
                    ("out", 2 * q * h, 2 * h, True), ("gate", 2 * h * f, 2 * f, False), ("up", 2 * h * f, 2 * f, False),
                    ("down", 2 * f * h, 2 * h, True)]
        return [("qkv", 2 * h * (q + 2 * kv), 2 * (q + 2 * kv), False), ("out", 2 * q * h, 2 * h, True),
                ("fc1", 2 * h * f, 2 * f, False), ("fc2", 2 * f * h, 2 * h, True)]

    # --- activation bytes per microbatch of ``b`` sequences ------------------------------------------
    def activation_parts(self, moe: bool = False) -> tuple[float, float, float]:
        """Bytes per token one layer keeps without recomputation, 16-bit (Korthikanti et al. 2022, sec. 4.1,
        generalised): (replicated over the tensor-parallel group, split over it, the attention core (split)).

        Replicated: the two norms' inputs (2h each) and outputs (the QKV and fc1 inputs, 2h each) and, with
        dropout, the two 1-byte dropout masks: 10h (8h without dropout). Split: Q, K, V 2(h + 2h_kv), the
        attention output 2h, the MLP's fc1 output and fc2 input 2f each (4f; gated: the 2f-wide fc1 output
        and fc2's input, 6f, as a fused SwiGLU keeps them). Core: unfused, the softmax output 2as, its
        dropout mask as and output 2as (5as; 2as without dropout); flash, the fp32 log-sum-exp per head, 4a.
        The GPT shape gives sbh(10 + 24/t + 5as/(ht)), Korthikanti's Table 2.

        A MoE layer (``moe``) keeps in place of the MLP's 6f: per routed (token, expert) pair, top_k per token,
        its permuted input 2h and its expert's 6f_e; each shared expert's 6f_e; the router's fp32 scores 4E
        (uniform routing: the busiest rank's extra load is not counted). Latent attention (``mla``) keeps its
        Q, K and V (heads x (2(nope + rope) + v), 16-bit), the two latents and the rotary key, and the
        attention output (heads x v) in place of 2(h + 2h_kv) + 2h.
        """
        h, f, a, s = self.hidden, self.ffn, self.heads, self.seq_len
        replicated = (10 if self.dropout else 8) * h
        if self.mla is not None:
            ml = self.mla
            attention = 2 * (a * (2 * (ml.nope_dim + ml.rope_dim) + ml.v_dim) + ml.q_rank + ml.kv_rank + ml.rope_dim
                             + a * ml.v_dim)
        else:
            attention = 2 * (self.q_width + 2 * self.kv_hidden) + 2 * self.q_width
        if moe and self.moe is not None:
            m = self.moe
            mlp = m.top_k * (2 * h + 6 * m.expert_ffn) + 6 * m.shared_experts * m.expert_ffn + 4 * m.experts
        else:
            mlp = (6 if self.gated_mlp else 4) * f
        split = attention + mlp
        core = 4 * a if self.attention == "flash" else (5 if self.dropout else 2) * a * s
        return replicated, split, core

    def layer_activation_bytes(self, b: int, tp: int = 1, sp: bool = False, recompute: str = "none",
                               moe: bool = False) -> float:
        """Bytes one layer keeps for its backward on one of ``tp`` shards (:meth:`activation_parts`).

        none: replicated (/t with sequence parallelism) + split/t + core/t; selective: without the core;
        full (only the layer input kept): 2sbh, with SP 2sbh/t; selective-op: the layer input, the saved
        matmuls' outputs (:meth:`matmuls`, every other one; a row-parallel one's output is the full 2h
        unless SP reduce-scatters it) and the attention output with its core bytes; layer:N: one full layer
        in N, the others none (the average per layer).
        """
        tokens, h, t = self.seq_len * b, self.hidden, tp
        rep_div = t if sp else 1
        if n := layer_every(recompute):
            return (self.layer_activation_bytes(b, tp, sp, "full", moe)
                    + (n - 1) * self.layer_activation_bytes(b, tp, sp, "none", moe)) / n
        if recompute == "full":
            return 2 * tokens * h / rep_div
        replicated, split, core = self.activation_parts(moe)
        if recompute == "selective-op":
            saved = sum(out / (rep_div if row else t) for i, (_, _, out, row) in enumerate(self.matmuls()) if i % 2 == 0)
            return tokens * (2 * h / rep_div + saved + (2 * h + core) / t)
        if recompute == "selective":
            core = 0.0
        return tokens * (replicated / rep_div + (split + core) / t)

    def w_held_fraction(self, recompute: str = "none") -> float:
        """Fraction of a layer's activations the W pass still holds after I: the inputs of the weight matmuls
        (QKV, out-proj and fc1 2h each, fc2 2f: 14 sbh of sbh(34 + 5as/h) for the GPT shape).

        With full or selective-op recomputation W needs the recomputed inputs, so all is held until W. A MoE
        model's is its MoE layers': the attention's inputs, each routed pair's permuted input 2h and expert
        fc2 input 2f_e, each shared expert's 2f_e.
        """
        if recompute in ("full", "selective-op"):
            return 1.0
        moe = self.moe is not None
        replicated, split, core = self.activation_parts(moe)
        total = replicated + split + (0.0 if recompute == "selective" else core)
        if moe:
            m = self.moe
            held = (4 * self.hidden + 2 * self.q_width + m.top_k * (2 * self.hidden + 2 * m.expert_ffn)
                    + 2 * m.shared_experts * m.expert_ffn)
            return held / total
        return (4 * self.hidden + 2 * self.q_width + 2 * self.ffn) / total

    def head_activation_bytes(self, b: int) -> float:
        """The last stage's logits in fp32 for the loss: 4sbV."""
        return 4.0 * self.seq_len * b * self.vocab

    def boundary_bytes(self, b: int) -> float:
        """One activation (or its gradient) between stages: sbh in 16 bit."""
        return 2.0 * self.seq_len * b * self.hidden

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
               "ffn": self.ffn, "vocab": self.vocab, "seq_len": self.seq_len, "params": self.params,
               "attention": self.attention}
        if self.moe is not None:
            m = self.moe
            out.update(active_params=self.active_params, experts=m.experts, top_k=m.top_k, expert_ffn=m.expert_ffn,
                       shared_experts=m.shared_experts, dense_layers=m.dense_layers)
        return out


# GPT models of the zero-bubble paper (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Table 3):
# 1.5B (22 layers, 24 heads, h 2304), 6.2B (30, 32, 4096), 14.6B (46, 40, 5120), 28.3B (62, 48, 6144);
# sequence length 1024. Vocabulary 51200 (GPT-2's, padded as Megatron does). "gpt-tiny" is for tests.
# Their attention is kept unfused, as the figures pinned for them (tests, zb_table5) were computed.
_ZB = (("gpt-1.5b", 22, 2304, 24), ("gpt-6.2b", 30, 4096, 32), ("gpt-14.6b", 46, 5120, 40), ("gpt-28.3b", 62, 6144, 48))
# Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3): 8B has 32 layers, h 4096, FFN 14336,
# 32 heads, 8 KV heads; 70B has 80 layers, h 8192, FFN 28672, 64 heads, 8 KV heads; 405B 126 layers,
# h 16384, FFN 53248, 128 heads, 8 KV heads; vocabulary 128,256, SwiGLU, RoPE, untied output, no dropout,
# flash attention. Sequence 8192 (their pre-training length).
_LLAMA = (("llama-8b", 32, 4096, 32, 14336), ("llama-70b", 80, 8192, 64, 28672),
          ("llama3-405b", 126, 16384, 128, 53248))
# Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Table 3:
# 22B 48 layers h 6144 64 heads; GPT-3 175B 96, 12288, 96; MT-NLG 530B 105, 20480, 128;
# 1T 128, 25600, 160; sequence 2048, vocabulary 51200 (GPT-2's, padded); Megatron-LM's unfused attention.
_KORTHIKANTI = (("megatron-22b", 48, 6144, 64), ("gpt3-175b", 96, 12288, 96), ("mt-nlg-530b", 105, 20480, 128),
                ("megatron-1t", 128, 25600, 160))
# Megatron-LM README (NVIDIA/Megatron-LM, commit 937571c, images/model_table.png, July 2024): the H100
# weak-scaling GPT models; vocabulary 131,072, sequence 4096 (README text); FFN 4h, flash attention
# (Transformer Engine) and dropout (Megatron's default) are assumptions: the README does not say.
_MEGATRON_H100 = (("gpt-1.7b", 24, 2048, 16), ("gpt-7.1b", 30, 4096, 32), ("gpt-16b", 32, 6144, 48),
                  ("gpt-32b", 48, 7168, 56), ("gpt-70b", 84, 8192, 64), ("gpt-119b", 92, 10240, 80),
                  ("gpt-177b", 96, 12288, 96), ("gpt-314b", 96, 16384, 128), ("gpt-462b", 112, 18432, 144))
# Mixtral 8x7B: Jiang et al. 2024 ("Mixtral of Experts", arXiv 2401.04088), Table 1: dim 4096, 32 layers, head
# dimension 128, hidden_dim 14336, 32 heads, 8 KV heads, context 32768, vocabulary 32000, 8 experts, top-2
# ("47B total ... 13B active", sec. 1). Sequence here 4096 (a training length; the card gives the context).
# DeepSeek-V3: DeepSeek-AI 2024 ("DeepSeek-V3 Technical Report", arXiv 2412.19437), sec. 4.2: 61 layers, hidden
# 7168, 128 heads of 128, KV compression 512, query compression 1536, decoupled rotary 64; every FFN but the
# first three is MoE: 1 shared and 256 routed experts of width 2048, 8 routed per token; 671B total, 37B active;
# sequence 4096 in pre-training; the dense FFN width 18432 and vocabulary 129280 from its config.json
# (deepseek-ai/DeepSeek-V3 on Hugging Face). The multi-token-prediction module and node-limited routing are left
# out. moe-gpt-small: a small Llama-shaped MoE model for tests (4 layers, h 128, 8 experts of 256, top-2); the real
# runtime's --moe-experts GPT is GPT-shaped (biases, GELU, LayerNorm), which the simulator's MoE layers do not take.
# Qwen3-30B-A3B and Qwen3-235B-A22B: Yang et al. 2025 ("Qwen3 Technical Report", arXiv 2505.09388), Table 2 (layers,
# query/KV heads 32/4 and 64/4, 128 experts, 8 routed per token, no shared experts); hidden 2048 and 4096, expert width
# 768 and 1536 (dense width 6144 and 12288, unused: every layer is MoE), vocabulary 151936, untied embeddings: their Hugging Face config.json, as NVIDIA-NeMo/Megatron-Bridge
# copies it in tests/unit_tests/models/qwen/test_qwen3_moe_bridge.py; head_dim 128 (transformers' Qwen3MoeConfig
# default, the card's 30.5B/3.3B and 235B/22B totals). QK-norm (two RMSNorms of 128 per layer) is not counted.
_LLAMA_LIKE = dict(gated_mlp=True, bias=False, tied_embeddings=False, learned_positions=False, dropout=False)
_MOE = (
    TransformerConfig(name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                      seq_len=4096, moe=MoEConfig(experts=8, top_k=2, expert_ffn=14336), **_LLAMA_LIKE),
    TransformerConfig(name="deepseek-v3", layers=61, hidden=7168, heads=128, ffn=18432, vocab=129280, seq_len=4096,
                      moe=MoEConfig(experts=256, top_k=8, expert_ffn=2048, shared_experts=1, dense_layers=3),
                      mla=MLAConfig(q_rank=1536, kv_rank=512, rope_dim=64, nope_dim=128, v_dim=128), **_LLAMA_LIKE),
    *(TransformerConfig(name=name, layers=n, hidden=h, heads=a, kv_heads=4, head_dim=128, ffn=f, vocab=151936,
                        seq_len=4096, moe=MoEConfig(experts=128, top_k=8, expert_ffn=fe), **_LLAMA_LIKE)
      for name, n, h, a, f, fe in (("qwen3-30b-a3b", 48, 2048, 32, 6144, 768),
                                   ("qwen3-235b-a22b", 94, 4096, 64, 12288, 1536))),
    TransformerConfig(name="moe-gpt-small", layers=4, hidden=128, heads=4, vocab=1024, seq_len=128,
                      moe=MoEConfig(experts=8, top_k=2, expert_ffn=256), **_LLAMA_LIKE),
)
MODEL_PRESETS: dict[str, TransformerConfig] = {
    m.name: m
    for m in (
        TransformerConfig(name="gpt-tiny", layers=4, hidden=256, heads=4, vocab=1024, seq_len=128,
                          attention="unfused"),
        *(TransformerConfig(name=name, layers=n, hidden=h, heads=a, attention="unfused") for name, n, h, a in _ZB),
        *(TransformerConfig(name=name, layers=n, hidden=h, heads=a, kv_heads=8, ffn=f, vocab=128256, seq_len=8192,
                            gated_mlp=True, bias=False, tied_embeddings=False, learned_positions=False, dropout=False)
          for name, n, h, a, f in _LLAMA),
        *(TransformerConfig(name=name, layers=n, hidden=h, heads=a, seq_len=2048, attention="unfused")
          for name, n, h, a in _KORTHIKANTI),
        *(TransformerConfig(name=name, layers=n, hidden=h, heads=a, seq_len=4096, vocab=131072)
          for name, n, h, a in _MEGATRON_H100),
        *_MOE,
    )
}


def model_preset(name: str) -> TransformerConfig:
    found = find_name(name, MODEL_PRESETS)  # case-insensitive, as every name
    if found is None:
        raise ConfigError(f"unknown model {name!r}; valid presets: {', '.join(MODEL_PRESETS)} (or a [model] table)")
    return MODEL_PRESETS[found]


def _key_size(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """ffn and kv_heads: an integer >= 1, or 0 for the default (4 * hidden; heads)."""
    if not (type(value) is int and value == 0):
        key_positive_int(owner, key, value, error)


#: The [model.moe] table: a MoE model's experts (sim.costs.moe.MoEConfig; each value checked there).
MOE_TABLE = ("experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "capacity_factor", "skew", "histogram")


def _key_moe(owner: str, key: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
    """[model.moe]: a table of :data:`MOE_TABLE` keys, experts, top_k and expert_ffn among them."""
    if not isinstance(value, Mapping):
        raise error(f"{owner}: moe must be a table ([model.moe] with experts, top_k, expert_ffn), got {quote(value)}",
                    field="moe")
    unknown = sorted(map(str, set(value) - set(MOE_TABLE)))
    if unknown:
        raise error(f"{owner}: unknown [model.moe] key(s) {quote(unknown)}; valid: {', '.join(MOE_TABLE)}",
                    field=unknown[0])
    missing = [k for k in ("experts", "top_k", "expert_ffn") if k not in value]
    if missing:
        raise error(f"{owner}: [model.moe] needs {', '.join(missing)}", field=missing[0])


#: The [model] table: its keys and their kinds (``preset`` alone, or the shape).
MODEL_TABLE: dict[str, KeyCheck] = {
    "preset": key_string("a model preset such as 'gpt-6.2b'"), "name": key_string("the model's name"),
    **dict.fromkeys(("layers", "hidden", "heads", "vocab", "seq_len"), key_positive_int),
    "ffn": _key_size, "kv_heads": _key_size, "head_dim": _key_size, "moe": _key_moe,
    **dict.fromkeys(("gated_mlp", "bias", "tied_embeddings", "learned_positions", "dropout"), key_flag),
    "attention": key_choice(ATTENTION_KINDS),
}


def model_from_dict(data: Mapping[str, Any]) -> TransformerConfig:
    """A [model] table: a ``preset``, or the shape (layers, hidden, heads and optional keys)."""
    check_table("model", data, MODEL_TABLE)
    if "moe" in data:
        m = dict(data["moe"])
        if "histogram" in m and isinstance(m["histogram"], list):
            m["histogram"] = tuple(m["histogram"])
        data = {**data, "moe": MoEConfig(**m)}
    if "preset" in data:  # a preset, with any shape keys given beside it on top (e.g. seq_len)
        base = model_preset(data["preset"])
        extra = {k: v for k, v in data.items() if k != "preset"}
        return dataclasses.replace(base, **extra) if extra else base
    missing = {"layers", "hidden", "heads"} - set(data)
    if missing:
        raise ConfigError(f"config [model]: missing key(s) {sorted(missing)}; give layers, hidden and heads "
                          "or a preset", field=sorted(missing)[0])
    return TransformerConfig(**{"name": "custom", **data})


def partition_layers(layers: int, stages: int, explicit: Sequence[int] | None = None) -> tuple[int, ...]:
    """Layers per stage (:func:`schedules.partition.split_layers`); an explicit split may leave a stage empty.

    Two stages more than layers: one layer per stage, the first stage holding only the embedding and the last
    only the output layer, as Llama 3 405B was trained (Dubey et al. 2024, sec. 3.3.2: 126 layers on 16 ranks
    x 8 virtual stages, the first and the last stage one layer short).
    """
    if explicit is None and stages == layers + 2:
        return (0, *(1,) * layers, 0)
    return split_layers(layers, stages, explicit, min_per_stage=0, field="layers_per_stage")
