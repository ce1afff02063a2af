"""A planned configuration as a torchtitan 0.3 config module (``--module``/``--config``).

torchtitan dropped TOML configs in February 2026: 0.3.0 reads a Python module
with a function that returns a ``Trainer.Config`` (``torchtitan/config/manager.py``,
``ConfigManager._load_config``: ``--module`` is a short model name or any
importable module). The module written here starts from torchtitan's own
``llama3_8b`` recipe (optimizer, learning-rate schedule, data loader,
checkpointing) and replaces what the plan decides. Facts about torchtitan
0.3.0 it relies on (``torchtitan/distributed/pipeline_parallel.py``):

* ``module_fqns_per_model_part`` gives each stage's modules by name; with it the
  stage count and split are ours (``pipeline_parallel_layers_per_stage`` would
  count the embedding and the head as layers, and without either torchtitan
  builds 2 stages per rank);
* ``_get_pp_rank_to_stage_indices_mapping`` places stages by the name in
  ``pipeline_parallel_schedule``: rank r holds stages r and 2p-1-r for
  ``ZBVZeroBubble``/``DualPipeV``, stages r, r+p, ... for any other class;
* with ``pipeline_parallel_schedule_csv`` set, ``_build_pipeline_schedule``
  runs ``_PipelineScheduleRuntime`` on the CSV whatever the name: the name only
  places the stages, the CSV is the order that runs;
* ``training.local_batch_size`` is the batch per data-parallel rank of one
  accumulation step, cut into ``local_batch_size / pipeline_parallel_microbatch_size``
  microbatches.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import ConfigError
from sim.costs.transformer import TransformerConfig
from sim.plan.space import PlanConfig

if TYPE_CHECKING:  # only a type here: analysis.plan.exports imports this module
    from analysis.plan.exports import PlanLayout

__all__ = ["DP_SETTINGS", "TORCHTITAN_VERSION", "torchtitan_config", "torchtitan_notes"]

#: The torchtitan release the module is written for (the ``exports`` extra installs it).
TORCHTITAN_VERSION = "0.3.0"
#: Placement -> the schedule class whose name gives torchtitan's placement (the CSV gives the order).
_PLACEMENT_CLASS = {("loop", False): "PipelineScheduleSingle", ("loop", True): "PipelineScheduleMulti",
                    ("v", True): "ZBVZeroBubble"}


def _ffn(model: TransformerConfig) -> int:
    # torchtitan's llama3 MLP is gated (three h x f matrices); a 2-matrix MLP of width f has the
    # parameters and FLOPs of a gated one of width 2f/3.
    return model.ffn if model.gated_mlp else 2 * model.ffn // 3


def torchtitan_notes(c: PlanConfig, model: TransformerConfig, layout: PlanLayout, reduce_dtype: str = "bf16") -> list[str]:
    """What torchtitan cannot express for ``c`` (gradients reduced in ``reduce_dtype``), each with the setting the
    module uses instead."""
    notes = []
    if reduce_dtype != "fp32" and c.dp > 1:  # torchtitan 0.3.0: TrainingConfig.mixed_precision_reduce is float32 only
        notes.append(f"gradients reduced in {reduce_dtype}: torchtitan reduces them in float32 only "
                     "(TrainingConfig.mixed_precision_reduce), so its gradient collectives carry twice the bytes "
                     "the plan timed (plan with --reduce-dtype fp32 to time what torchtitan runs)")
    if not model.gated_mlp:
        notes.append(f"torchtitan's llama3 MLP is SwiGLU; the plan's 2-matrix MLP of {model.ffn} is written as a "
                     f"gated one of {_ffn(model)} (same parameters and FLOPs)")
    if model.bias:
        notes.append("torchtitan's llama3 model has no biases and RMSNorm; the plan's model has biases and LayerNorm")
    if model.learned_positions:
        notes.append("torchtitan's llama3 model has rotary positions; the plan's has a learned position table")
    if model.tied_embeddings and c.pp > 1:
        notes.append("torchtitan ties the embedding and the head only without pipeline parallelism; "
                     "the head is a separate matrix here")
    if c.tp > 1 and (model.heads % c.tp or model.kv_heads % c.tp):
        notes.append(f"torchtitan refuses tensor_parallel_degree {c.tp}: it must divide the {model.heads} heads and "
                     f"the {model.kv_heads} key/value heads")
    if c.dp > 1 and c.dp_mode not in DP_SETTINGS:
        raise ConfigError(f"dp mode {c.dp_mode!r} has no torchtitan setting (it runs {', '.join(DP_SETTINGS)}); "
                          "plan with one of those", field="dp_modes")
    if c.dp_mode == "sync" and c.dp > 1:
        notes.append("sync: torchtitan's replicated data parallelism (FSDP2 on the dp_replicate mesh) all-reduces "
                     "each block's gradients while the backward runs; no setting all-reduces after it: "
                     "data_parallel_replicate_degree (ddp) is the nearest")
    if c.dp_mode in ("zero1", "zero2") and c.dp > 1:
        notes.append(f"{c.dp_mode}: torchtitan has no ZeRO-1/2; FSDP2 that keeps the parameters gathered from the "
                     "forward through the backward (fsdp_reshard_after_forward never) is the nearest: it "
                     "reduce-scatters the gradients of every microbatch, as ZeRO-2 does")
    if c.recompute == "selective":
        notes.append("selective recomputation of the attention core: torchtitan's flex attention keeps only the "
                     "attention output and recomputes the scores in its own backward, so no activation "
                     "checkpointing runs what was simulated; torchtitan's SelectiveAC is per-op and recomputes "
                     "every second matmul, which is not the plan")
    if c.pp > 1 and layout.placement == "other":
        raise ValueError(f"schedule {c.schedule!r} places stages {layout.ranks}: torchtitan places them in loop "
                         "order or in a V; no torchtitan setting runs it")
    return notes


#: Data-parallel mode -> (replicated or sharded, FSDP's ``fsdp_reshard_after_forward``) in torchtitan 0.3.0's
#: ``ParallelismConfig`` (``torchtitan/config/configs.py``). The llama3 model is always wrapped by FSDP2 per block
#: (``models/llama3/parallelize.py`` calls ``apply_fsdp_to_decoder`` on the ``dp_replicate`` x ``fsdp`` mesh): a
#: replicate degree alone keeps whole parameters and all-reduces each block's gradients as the backward makes them
#: (ddp); a shard degree shards them (``fsdp_reshard_after_forward``: ``torchtitan/distributed/fsdp.py``).
#: sync and zero1/zero2 have no exact setting (notes say the nearest); ps and none with replicas have none at all.
DP_SETTINGS: dict[str, tuple[str, str | None]] = {
    "sync": ("replicate", None), "ddp": ("replicate", None),
    "zero1": ("shard", "never"), "zero2": ("shard", "never"),
    "zero3": ("shard", "always"), "fsdp": ("shard", "always"),
}


def _parallelism(c: PlanConfig, layout: PlanLayout, csv_path: str | os.PathLike | None) -> list[str]:
    how, reshard = DP_SETTINGS[c.dp_mode] if c.dp > 1 else ("replicate", None)
    shard = how == "shard"
    lines = [f"data_parallel_replicate_degree={1 if shard else c.dp}",
             f"data_parallel_shard_degree={c.dp if shard else 1}"]
    if shard:
        lines.append(f"fsdp_reshard_after_forward={reshard!r}")
    lines += [f"tensor_parallel_degree={c.tp}", f"enable_sequence_parallel={c.tp > 1 and c.sp}",
              f"pipeline_parallel_degree={c.pp}"]
    if c.pp > 1:
        if csv_path is None:
            raise ValueError("pp > 1: give the path of the schedule CSV")
        name = _PLACEMENT_CLASS[layout.placement, c.chunks > 1]
        lines += [f"pipeline_parallel_schedule={name!r}", f"pipeline_parallel_schedule_csv={str(csv_path)!r}",
                  f"pipeline_parallel_microbatch_size={c.microbatch_size}",
                  "module_fqns_per_model_part=stage_modules(STAGE_LAYERS)"]
    return lines


_MODULE = '''"""torchtitan {version} configuration of the schedlab plan {label}.

Run it with its folder on the Python path:

    PYTHONPATH={folder} torchrun --nproc-per-node={world} -m torchtitan.train \\
        --module torchtitan_plan --config schedlab_plan

The data loader and tokenizer are those of torchtitan's llama3_8b recipe
(--hf_assets_path, --dataloader.dataset override them); the tokenizer's
vocabulary must be the model's {vocab}.
"""
{notes}
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.models import llama3
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import config_registry
from torchtitan.protocols.model_spec import ModelSpec

#: Decoder layers of each pipeline stage, in stage order (the planned split).
STAGE_LAYERS = {stage_layers}
#: The rank that holds each stage in the plan (torchtitan places them by the schedule name).
STAGE_RANKS = {stage_ranks}


def stage_modules(layers):
    """Module names of each stage: the embedding on the first, the final norm and the head on the last."""
    parts, first = [], 0
    for n in layers:
        parts.append([f"layers.{{i}}" for i in range(first, first + n)])
        first += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts


def model_spec():
    """The plan's model: {layers} layers, hidden {dim}, {heads} heads ({kv_heads} key/value), MLP {ffn}, vocabulary {vocab}."""
    dim, heads, vocab = {dim}, {heads}, {vocab}
    model = llama3.Llama3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying={tied},
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)),
        layers=llama3._build_llama3_layers(
            n_layers={layers}, dim=dim, n_heads=heads, n_kv_heads={kv_heads}, hidden_dim={ffn},
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len={seq_len}, theta=500000),
            attn_backend="flex"))
    return ModelSpec(name="llama3", flavor="schedlab", model=model, parallelize_fn=llama3.parallelize_llama,
                     pipelining_fn=pipeline_llm, post_optimizer_build_fn=None,
                     state_dict_adapter=llama3.Llama3StateDictAdapter)


def schedlab_plan():
    config = config_registry.llama3_8b()
    config.model_spec = model_spec()
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec)))
    config.parallelism = ParallelismConfig(
        {parallelism})
    config.training = TrainingConfig(
        local_batch_size={local_batch}, global_batch_size={global_batch}, seq_len={seq_len},
        steps=config.training.steps, disable_cuda_graphs={no_graphs})
    config.activation_checkpoint = {ac}
    return config
'''


def torchtitan_config(c: PlanConfig, model: TransformerConfig, global_batch: int, layout: PlanLayout,
                      csv_path: str | os.PathLike | None, reduce_dtype: str = "bf16") -> str:
    """The text of ``torchtitan_plan.py`` for configuration ``c`` (``csv_path``: the schedule CSV, for pp > 1;
    ``reduce_dtype``: the plan's gradient reduction, noted where torchtitan cannot follow it)."""
    if global_batch % c.dp:
        raise ValueError(f"global batch {global_batch} does not split over dp {c.dp}")
    local = c.microbatches * c.microbatch_size if c.pp > 1 else c.microbatch_size
    notes = torchtitan_notes(c, model, layout, reduce_dtype)
    return _MODULE.format(
        version=TORCHTITAN_VERSION, label=c.label(), folder=Path(csv_path).parent if csv_path is not None else ".",
        world=c.tp * c.pp * c.dp, notes="".join(f"# note: {n}\n" for n in notes),
        stage_layers=repr(tuple(layout.layers)), stage_ranks=repr(tuple(layout.ranks)),
        layers=model.layers, dim=model.hidden, heads=model.heads, kv_heads=model.kv_heads, ffn=_ffn(model),
        vocab=model.vocab, seq_len=model.seq_len, tied=model.tied_embeddings and c.pp == 1,
        parallelism=",\n        ".join(_parallelism(c, layout, csv_path)),
        local_batch=local, global_batch=global_batch, no_graphs=c.pp > 1,  # torchtitan: no CUDA graphs with pp
        ac="FullAC.Config()" if c.recompute == "full" else "None")
