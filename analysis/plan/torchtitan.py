"""A planned configuration as a torchtitan 0.3 config module (``--module``/``--config``).

torchtitan dropped TOML configs in February 2026: 0.3.0 reads a Python module
with a function that returns a ``Trainer.Config`` (``torchtitan/config/manager.py``,
``ConfigManager._load_config``: ``--module`` is a short model name or any
importable module). The module written here starts from torchtitan's own
``llama3_8b`` recipe (optimizer, learning-rate schedule, data loader,
checkpointing) and replaces what the plan decides: the model is torchtitan's
llama3, or for a mixture of experts its qwen3 (deepseek_v3 with latent
attention) with ``expert_parallel_degree``. Facts about torchtitan
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
  microbatches;
* the default ``spmd_backend`` (``spmd_types``) makes ``fully_shard`` require every
  parameter to be a DTensor on the whole mesh, which torchtitan 0.3.0's llama3 does
  not give it with torch 2.13.0 (``ValueError: When dp_mesh_dims is provided, all
  parameters must be DTensors ...``); ``partial_dtensor`` (DTensors for tensor
  parallelism only) builds;
* torch's CSV runtime (``_PipelineScheduleRuntime._prepare_schedule_with_comms``,
  torch 2.13.0) turns FSDP's gradient reduction off for every backward and adds one
  ``REDUCE_GRAD`` per stage after its last backward, and one ``UNSHARD``/``RESHARD``
  pair per stage (more when a rank holds over 3 stages: ``_add_unshard_reshard``
  keeps 3 unsharded). So at pp > 1 every sharded mode runs as zero1
  (:func:`torchtitan_dp_mode`).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import ConfigError
from sim.costs.transformer import TransformerConfig
from sim.plan.space import PlanConfig

if TYPE_CHECKING:  # only types here: analysis.plan.exports imports this module
    from analysis.plan.exports import PlanLayout
    from schedules.ir import Schedule
    from sim.plan.study import Study

__all__ = ["DP_SETTINGS", "TORCHTITAN_VERSION", "fsdp_units", "planned_collectives", "retimed", "torchtitan_config",
           "torchtitan_dp_mode", "torchtitan_notes"]

#: The torchtitan release the module is written for (the ``exports`` extra installs it).
TORCHTITAN_VERSION = "0.3.0"
#: Placement -> the schedule class whose name gives torchtitan's placement (the CSV gives the order).
_PLACEMENT_CLASS = {("loop", False): "PipelineScheduleSingle", ("loop", True): "PipelineScheduleMulti",
                    ("v", True): "ZBVZeroBubble"}


def _ffn(model: TransformerConfig) -> int:
    # torchtitan's llama3 MLP is gated (three h x f matrices); a 2-matrix MLP of width f has the
    # parameters and FLOPs of a gated one of width 2f/3.
    return model.ffn if model.gated_mlp else 2 * model.ffn // 3


#: The data-parallel modes FSDP2 shards (a shard degree); the others replicate.
_SHARDED = ("zero1", "zero2", "zero3", "fsdp")
#: Stages of a rank torch 2.13's CSV runtime keeps unsharded at once (``_add_unshard_reshard``, max_active_stages).
_ACTIVE_STAGES = 3
#: Without pipelining, what the module turns off for every accumulation microbatch but the last (FSDP2's gradient
#: reduction, its resharding after the backward), so that each mode gathers and reduces as the simulator times it:
#: ddp all-reduces once a step, zero1 gathers and reduce-scatters once, zero2 gathers once and reduce-scatters every
#: microbatch, zero3 gathers before every pass and reduce-scatters every microbatch (FSDP2's defaults).
_SKIP_NAMES = {"sync": "gradient reduction (set_requires_gradient_sync)",
               "reshard": "resharding after the backward (set_reshard_after_backward)"}
_ACCUMULATION_SKIPS = {"sync": ("sync",), "ddp": ("sync",), "zero1": ("sync", "reshard"), "zero2": ("reshard",),
                       "zero3": (), "fsdp": ()}


def torchtitan_dp_mode(c: PlanConfig) -> str:
    """The simulator's data-parallel mode torchtitan runs ``c`` as, with the settings the module writes.

    sync runs as ddp (FSDP2 reduces while the backward runs). At pp > 1 torch's CSV runtime reduces each stage's
    gradients once a step, after its last backward, and holds them unsharded until then: zero2, zero3 and fsdp run as
    zero1 (the module keeps the parameters gathered through the step, ``fsdp_reshard_after_forward`` never)."""
    if c.dp == 1:
        return c.dp_mode
    if c.dp_mode == "sync":
        return "ddp"
    if c.pp > 1 and c.dp_mode in _SHARDED:
        return "zero1"
    return c.dp_mode


def fsdp_units(model: TransformerConfig, layout: PlanLayout, pp: int) -> tuple[int, ...]:
    """FSDP2 units of each stage as torchtitan wraps them (``apply_fsdp_to_decoder``): one per decoder layer, the
    embedding on the first stage, the final norm with the head on the last (one unit with the embedding when tied,
    which torchtitan does only without pipelining). Each unit gathers and reduces its parameters in one collective."""
    units = list(layout.layers)
    units[0] += 1
    if not (model.tied_embeddings and pp == 1):
        units[-1] += 1
    return tuple(units)


def planned_collectives(c: PlanConfig, model: TransformerConfig, sched: Schedule, layout: PlanLayout
                        ) -> list[dict[str, int]]:
    """Per pipeline rank, the data-parallel collectives of one step as the simulator times ``c`` run by torchtitan:
    :func:`schedules.dp.modes.add_data_parallel` in :func:`torchtitan_dp_mode`, with torchtitan's FSDP units as the
    buckets. Keys: ``all_gather``, ``reduce_scatter``, ``all_reduce`` (tasks), ``gathers`` (all-gathers of a whole
    stage: what torch's runtime does with one UNSHARD)."""
    from schedules.dp.modes import add_data_parallel
    from schedules.ir import Kind
    from schedules.validate import validate

    units = fsdp_units(model, layout, c.pp)
    mode = torchtitan_dp_mode(c) if c.dp > 1 else "none"
    graph = add_data_parallel(validate(sched), mode, units)
    out = []
    for prog in graph.programs:
        kinds = [graph.tasks[i].action for i in prog]
        count = {"all_gather": sum(a.kind is Kind.ALL_GATHER for a in kinds),
                 "reduce_scatter": sum(a.kind is Kind.REDUCE_SCATTER for a in kinds),
                 "all_reduce": sum(a.kind is Kind.ALLREDUCE for a in kinds)}
        count["gathers"] = sum(a.kind is Kind.ALL_GATHER for a in kinds if a.bucket == 0)
        out.append(count)
    return out


def _unshards(sched: Schedule) -> list[int]:
    """UNSHARD actions per rank that torch 2.13's CSV runtime adds to the schedule (``_add_unshard_reshard``)."""
    from torch.distributed.pipelining.schedules import _Action

    from schedules.interop.torch_csv import torch_csv_text

    rows = [[_Action.from_str(x) for x in line.split(",") if x] for line in torch_csv_text(sched).splitlines()]
    return [unshard_count(row) for row in rows]


def unshard_count(actions: list, max_active_stages: int = _ACTIVE_STAGES) -> int:
    """The UNSHARDs torch 2.13's ``_add_unshard_reshard(actions, max_active_stages)`` adds, by its own rule.

    The same walk as torch's: before each action, the next ``max_active_stages`` distinct stages from it on
    (both of an OVERLAP_F_B's stages) are gathered if not held, and held stages not among them are released.
    torch finds them in a copy of the rest of the list at every action (quadratic: 9.8 s for the 32 ranks of
    interleaved-zb at pp 32, m 1024, v 4); without OVERLAP_F_B this finds them in one backward pass (0.5 s there).
    Equal to torch's count on every built-in schedule: tests/test_exports.py."""
    acts = [a for a in actions if a is not None]  # torch skips None both as an action and in the look-ahead
    if any(a.computation_type.name == "OVERLAP_F_B" and a.sub_actions is not None for a in acts):
        nexts = [_next_stages(acts, i, max_active_stages) for i in range(len(acts))]
    else:  # the first k distinct stages from i: stage i, then those from i + 1 less stage i (one pass, backwards)
        nexts, after = [()] * len(acts), ()
        for i in range(len(acts) - 1, -1, -1):
            s = acts[i].stage_index
            after = nexts[i] = ((s, *(x for x in after if x != s)))[:max_active_stages]
    unshards = 0
    active: set[int] = set()
    for nxt in nexts:
        active.intersection_update(nxt)
        unshards += sum(stage not in active for stage in nxt)
        active.update(nxt)
    return unshards


def _next_stages(acts: list, i: int, k: int) -> tuple[int, ...]:
    """torch's ``next_stage_indices(k, acts[i:])``: distinct stages in order, an OVERLAP_F_B's both at once."""
    seen: list[int] = []
    for a in itertools.islice(acts, i, None):
        if a.computation_type.name == "OVERLAP_F_B" and a.sub_actions is not None:
            for x in a.sub_actions:
                if x.stage_index not in seen:
                    seen.append(x.stage_index)
            if len(seen) >= k:
                break
        elif a.stage_index not in seen:
            seen.append(a.stage_index)
            if len(seen) == k:
                break
    return tuple(seen)


def retimed(study: Study, mode: str) -> tuple[float, float]:
    """(step seconds, peak bytes of a device) of ``study`` simulated in data-parallel mode ``mode``."""
    import dataclasses

    from sim.plan.study import run_study

    costs = study.costs
    res = run_study(dataclasses.replace(study, costs=dataclasses.replace(
        costs, parallel=dataclasses.replace(costs.parallel, dp_mode=mode))))
    return res.step_time, max(d.memory_bytes for d in res.devices())


def torchtitan_notes(c: PlanConfig, model: TransformerConfig, layout: PlanLayout, reduce_dtype: str = "bf16",
                     sched: Schedule | None = None, study: Study | None = None) -> list[str]:
    """What torchtitan cannot express for ``c`` (gradients reduced in ``reduce_dtype``), each with the setting the
    module uses instead; with ``sched`` the UNSHARDs torch's runtime adds, with ``study`` a mode torchtitan runs
    otherwise than planned re-timed by the simulator."""
    notes = []
    if c.ep > 1 and (c.dp_mode not in _SHARDED or c.dp == 1):
        raise ConfigError(f"ep {c.ep} with dp mode {c.dp_mode!r} has no torchtitan setting: its expert parallelism "
                          "borrows the ranks of FSDP's shard dimension (ParallelismConfig.expert_parallel_degree: "
                          f"data_parallel_shard_degree x cp x tp = efsdp x ep); plan ep {c.ep} with one of "
                          f"{', '.join(_SHARDED)}, or ep 1", field="dp_modes")
    if model.moe is not None:
        notes += _moe_notes(c, model)
    if c.pp == 1 and c.schedule == "combined-1f1b":
        notes.append("combined-1f1b at pp 1: torchtitan runs no pipeline schedule without pipeline parallelism; its "
                     "gradient accumulation runs each microbatch's forward and backward in turn, not the overlapped "
                     "(F i+1; B i) pairs the plan timed (Megatron-LM's --overlap-moe-expert-parallel-comm runs them)")
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
    runs = torchtitan_dp_mode(c)
    if c.dp > 1 and c.pp > 1 and c.dp_mode in _SHARDED:
        how = ("as planned" if runs == c.dp_mode else
               f"so {c.dp_mode} runs as zero1 (whole gradients and parameters through the step)")
        notes.append(f"{c.dp_mode}: torch's CSV runtime reduce-scatters each stage's gradients once a step, after its "
                     "last backward (REDUCE_GRAD), and holds them unsharded in float32 until then; the parameters "
                     f"are gathered once a step (UNSHARD, fsdp_reshard_after_forward never): {how}")
        if runs != c.dp_mode and study is not None:
            t, peak = retimed(study, runs)
            t0, peak0 = retimed(study, c.dp_mode)
            notes.append(f"{c.dp_mode} re-timed as torchtitan runs it (zero1): {t:.4g} s a step, {peak / 1e9:.4g} GB "
                         f"peak; the plan's {c.dp_mode}: {t0:.4g} s, {peak0 / 1e9:.4g} GB")
        if c.dp_mode in ("zero3", "fsdp"):
            notes.append(f"{c.dp_mode}: fsdp_reshard_after_forward always is not written: with a CSV that splits "
                         "the backward (I, W) the last stage gets no gradients (checked with torch 2.13.0), and it "
                         "would gather again before every pass while the gradients stay unsharded")
        if sched is not None and c.chunks > _ACTIVE_STAGES:
            unshards = _unshards(sched)
            notes.append(f"{c.chunks} stages per rank: torch's runtime keeps {_ACTIVE_STAGES} unsharded and gathers "
                         f"the others again, {max(unshards)} UNSHARDs a step on a rank where the plan times "
                         f"{c.chunks}")
    if c.dp > 1 and c.pp == 1 and c.microbatches > 1 and _ACCUMULATION_SKIPS[c.dp_mode]:
        notes.append(f"{c.microbatches} accumulation steps: torchtitan would reduce every microbatch's gradients "
                     f"({c.dp_mode} planned otherwise); the module's parallelize_fn turns FSDP2's "
                     f"{' and '.join(_SKIP_NAMES[x] for x in _ACCUMULATION_SKIPS[c.dp_mode])} off for all but the "
                     "last")
    if c.recompute == "selective":
        notes.append("selective recomputation of the attention core: torchtitan's flex attention keeps only the "
                     "attention output and recomputes the scores in its own backward, so no activation "
                     "checkpointing runs what was simulated; torchtitan's SelectiveAC is per-op and recomputes "
                     "every second matmul, which is not the plan")
    if c.pp > 1 and layout.placement == "other":
        raise ValueError(f"schedule {c.schedule!r} places stages {layout.ranks}: torchtitan places them in loop "
                         "order or in a V; no torchtitan setting runs it")
    return notes



def _moe_notes(c: PlanConfig, model: TransformerConfig) -> list[str]:
    """How torchtitan's MoE model differs from the plan's (the model is torchtitan's qwen3, or deepseek_v3 with MLA)."""
    m, notes = model.moe, []
    if model.mla is None:
        notes.append("torchtitan's qwen3 layers normalise queries and keys (two RMSNorms of the head dimension per "
                     "layer) and route by softmax; the plan counts no such norms")
    else:
        notes.append("torchtitan's deepseek_v3 routes by sigmoid without node-limited groups, as the plan times it; "
                     "its multi-token prediction is left out, as in the plan")
    if m.capacity_factor:
        notes.append(f"capacity factor {m.capacity_factor:g}: torchtitan's standard dispatcher is dropless; the plan "
                     "caps each expert's load")
    if c.tp > 1:
        notes.append(f"tp {c.tp} with ep {c.ep}: torchtitan's expert parallelism borrows the tp ranks "
                     "(efsdp = dp_shard x tp / ep) and keeps each expert whole; the plan shards each expert over tp")
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
    if shard and c.pp > 1:  # torch's CSV runtime: see torchtitan_notes (never always with the CSV)
        reshard = "never"
    lines = ["spmd_backend='partial_dtensor'",  # spmd_types fails in fully_shard with torch 2.13.0 (module docstring)
             f"data_parallel_replicate_degree={1 if shard else c.dp}",
             f"data_parallel_shard_degree={c.dp if shard else 1}"]
    if shard:
        lines.append(f"fsdp_reshard_after_forward={reshard!r}")
    lines += [f"tensor_parallel_degree={c.tp}", f"enable_sequence_parallel={c.tp > 1 and c.sp}",
              f"pipeline_parallel_degree={c.pp}"]
    if c.ep > 1:
        lines.append(f"expert_parallel_degree={c.ep}")
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
import functools

import torch
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.models import llama3
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import config_registry
{model_imports}from torchtitan.protocols.model_spec import ModelSpec

#: Decoder layers of each pipeline stage, in stage order (the planned split).
STAGE_LAYERS = {stage_layers}
#: The rank that holds each stage in the plan (torchtitan places them by the schedule name).
STAGE_RANKS = {stage_ranks}
#: Without pipelining: accumulation steps, and what FSDP2 skips on all of them but the last ("sync": the gradient
#: reduction, "reshard": resharding after the backward), so that the mode gathers and reduces as planned.
ACCUMULATION = {accumulation}
SKIP_UNTIL_LAST = {skips}


def parallelize_fn(model, **kwargs):
    """torchtitan's {parallelize_name}; without pipelining, FSDP2 reduces (and reshards) only on the last
    accumulation microbatch where the plan does (torchtitan would do both on every microbatch)."""
    model = {parallelize}(model, **kwargs)
    if ACCUMULATION > 1 and SKIP_UNTIL_LAST and not kwargs["parallel_dims"].pp_enabled:
        seen = [0]

        def before_forward(module, args):
            if module.training and torch.is_grad_enabled():
                seen[0] += 1
                last = seen[0] % ACCUMULATION == 0
                if "sync" in SKIP_UNTIL_LAST:
                    module.set_requires_gradient_sync(last)
                if "reshard" in SKIP_UNTIL_LAST:
                    module.set_reshard_after_backward(last)

        model.register_forward_pre_hook(before_forward)
    return model


def pipelining_fn(model, **kwargs):
    """torchtitan's pipeline_llm, whose schedule takes the trainer's call, step(arg_mbs=..., kwarg_mbs=...):
    torch 2.13.0's step takes a whole batch and splits it (given lists, it fails)."""
    schedule, parts, has_first, has_last = pipeline_llm(model, **kwargs)
    schedule.step = functools.partial(_step_microbatches, schedule)
    return schedule, parts, has_first, has_last


def _step_microbatches(schedule, *, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None,
                       return_outputs=True, loss_kwargs=None):
    for stage in schedule._stages:  # what torch 2.13.0's step does before it runs the microbatches
        stage.has_backward = schedule._has_backward
        stage.clear_runtime_states()
    schedule._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs)


def stage_modules(layers):
    """Module names of each stage: the embedding on the first, the final norm and the head on the last."""
    parts, first = [], 0
    for n in layers:
        parts.append([f"layers.{{i}}" for i in range(first, first + n)])
        first += n
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return parts


{model_spec}def schedlab_plan():
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


_DENSE_SPEC = '''def model_spec():
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
    return ModelSpec(name="llama3", flavor="schedlab", model=model, parallelize_fn=parallelize_fn,
                     pipelining_fn=pipelining_fn, post_optimizer_build_fn=None,
                     state_dict_adapter=llama3.Llama3StateDictAdapter)
'''

#: The MoE model as torchtitan's qwen3 (grouped-query attention, every layer of the MoE part routed, the dense first
#: layers from its dense builder, shared experts as the MoE's ``shared_experts`` feed-forward) or, with latent
#: attention, its deepseek_v3 (MLA, dense first layers and shared experts in its own builder).
_QWEN3_SPEC = '''def model_spec():
    """The plan's model: {layers} layers ({dense} dense, MLP {ffn}), hidden {dim}, {heads} heads ({kv_heads} key/value, head
    {head_dim}), {experts} experts of {expert_ffn}, top-{top_k}, {shared} shared, vocabulary {vocab}: torchtitan's qwen3."""
    dim, heads, kv_heads, head_dim, vocab = {dim}, {heads}, {kv_heads}, {head_dim}, {vocab}
    common = dict(dim=dim, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim, attn_backend="flex",
                  rope=CosSinRoPE.Config(dim=head_dim, max_seq_len={seq_len}, theta=1000000.0))
{dense_layers}    routed = qwen3._build_qwen3_moe_layers(n_layers={moe_layers}, moe_hidden_dim={expert_ffn}, num_experts={experts},
                                           top_k={top_k}, moe_comm_backend={comm_backend!r}, **common)
{shared_experts}    model = qwen3.Qwen3Model.Config(
        dim=dim, vocab_size=vocab, enable_weight_tying={tied}, norm=qwen3._qwen3_norm(dim),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=qwen3._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=qwen3._LINEAR_INIT),
        layers={layer_list})
    return ModelSpec(name="qwen3", flavor="schedlab", model=model, parallelize_fn=parallelize_fn,
                     pipelining_fn=pipelining_fn, post_optimizer_build_fn=register_moe_load_balancing_hook,
                     state_dict_adapter=qwen3.Qwen3StateDictAdapter)
'''
_DSV3_SPEC = '''def model_spec():
    """The plan's model: {layers} layers ({dense} dense, MLP {ffn}), hidden {dim}, {heads} heads of latent attention
    (query rank {q_rank}, key/value rank {kv_rank}), {experts} experts of {expert_ffn}, top-{top_k}, {shared} shared,
    vocabulary {vocab}: torchtitan's deepseek_v3."""
    dim, vocab = {dim}, {vocab}
    layers = deepseek_v3._build_dsv3_layers(
        n_layers={layers}, n_dense_layers={dense}, dim=dim, n_heads={heads}, q_lora_rank={q_rank},
        kv_lora_rank={kv_rank}, qk_nope_head_dim={nope_dim}, qk_rope_head_dim={rope_dim}, v_head_dim={v_dim},
        mscale=1.0, dense_hidden_dim={ffn}, moe_hidden_dim={expert_ffn}, num_experts={experts},
        num_shared_experts={shared}, router_top_k={top_k}, router_score_func="sigmoid", router_route_norm=True,
        attn_backend="flex", moe_comm_backend={comm_backend!r}, non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim={rope_dim}, max_seq_len={seq_len}, theta=10000.0))
    model = deepseek_v3.DeepSeekV3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim,
                                        param_init=deepseek_v3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=deepseek_v3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=deepseek_v3._output_linear_init(dim)),
        layers=layers)
    return ModelSpec(name="deepseek_v3", flavor="schedlab", model=model, parallelize_fn=parallelize_fn,
                     pipelining_fn=pipelining_fn, post_optimizer_build_fn=register_moe_load_balancing_hook,
                     state_dict_adapter=deepseek_v3.DeepSeekV3StateDictAdapter)
'''
#: The simulator's MoE dispatcher -> torchtitan 0.3.0's ``moe_comm_backend`` (``models/common/config_utils.py``,
#: ``make_token_dispatcher_config``: 'standard' is AllToAllTokenDispatcher, 'deepep' DeepEP's kernels).
COMM_BACKENDS = {"alltoall": "standard", "deepep": "deepep"}


def _model_spec(model: TransformerConfig, tied: bool, dispatcher: str) -> tuple[str, str, str]:
    """(imports, the ``model_spec`` function, torchtitan's parallelize function) of the module for ``model``."""
    shape = dict(layers=model.layers, dim=model.hidden, heads=model.heads, kv_heads=model.kv_heads, ffn=_ffn(model),
                 vocab=model.vocab, seq_len=model.seq_len, tied=tied)
    m = model.moe
    if m is None:
        return "", _DENSE_SPEC.format(**shape), "llama3.parallelize_llama"
    shape.update(dense=m.dense_layers, moe_layers=model.layers - m.dense_layers, experts=m.experts, top_k=m.top_k,
                 expert_ffn=m.expert_ffn, shared=m.shared_experts,
                 comm_backend=COMM_BACKENDS[dispatcher])
    if model.mla is not None:
        a = model.mla
        spec = _DSV3_SPEC.format(**shape, q_rank=a.q_rank, kv_rank=a.kv_rank, nope_dim=a.nope_dim,
                                 rope_dim=a.rope_dim, v_dim=a.v_dim)
        return ("from torchtitan.components.optimizer import register_moe_load_balancing_hook\n"
                "from torchtitan.models import deepseek_v3\n"), spec, "deepseek_v3.parallelize_deepseekv3"
    dense = (f"    dense = qwen3._build_qwen3_layers(n_layers={m.dense_layers}, hidden_dim={_ffn(model)}, **common)\n"
             if m.dense_layers else "")
    shared = (f"    for layer in routed:  # {m.shared_experts} shared expert(s) of {m.expert_ffn}, as one MLP\n"
              f"        layer.moe.shared_experts = make_ffn_config(dim=dim, hidden_dim={m.expert_ffn * m.shared_experts}, "
              "w1_param_init=qwen3._LINEAR_INIT,\n"
              "                                                   w2w3_param_init=qwen3._LINEAR_INIT)\n"
              if m.shared_experts else "")
    spec = _QWEN3_SPEC.format(**shape, head_dim=model.head_dim, dense_layers=dense, shared_experts=shared,
                              layer_list="dense + routed" if m.dense_layers else "routed")
    return ("from torchtitan.components.optimizer import register_moe_load_balancing_hook\n"
            "from torchtitan.models import qwen3\n"
            "from torchtitan.models.common import CosSinRoPE\n"
            "from torchtitan.models.common.config_utils import make_ffn_config\n"), spec, "qwen3.parallelize_qwen3"


def torchtitan_config(c: PlanConfig, model: TransformerConfig, global_batch: int, layout: PlanLayout,
                      csv_path: str | os.PathLike | None, reduce_dtype: str = "bf16", sched: Schedule | None = None,
                      study: Study | None = None) -> str:
    """The text of ``torchtitan_plan.py`` for configuration ``c`` (``csv_path``: the schedule CSV, for pp > 1;
    ``reduce_dtype``: the plan's gradient reduction, noted where torchtitan cannot follow it; ``sched`` and
    ``study``: for the notes, :func:`torchtitan_notes`)."""
    if global_batch % c.dp:
        raise ValueError(f"global batch {global_batch} does not split over dp {c.dp}")
    local = c.microbatches * c.microbatch_size if c.pp > 1 else c.microbatch_size
    notes = torchtitan_notes(c, model, layout, reduce_dtype, sched, study)
    accumulation = global_batch // (local * c.dp) if c.pp == 1 else 1
    dispatcher = study.costs.moe_dispatcher if study is not None else "alltoall"
    imports, spec, parallelize = _model_spec(model, model.tied_embeddings and c.pp == 1, dispatcher)
    return _MODULE.format(
        version=TORCHTITAN_VERSION, label=c.label(), folder=Path(csv_path).parent if csv_path is not None else ".",
        world=c.tp * c.pp * c.dp, notes="".join(f"# note: {n}\n" for n in notes),
        accumulation=accumulation, skips=repr(_ACCUMULATION_SKIPS.get(c.dp_mode, ()) if c.dp > 1 and c.pp == 1 else ()),
        stage_layers=repr(tuple(layout.layers)), stage_ranks=repr(tuple(layout.ranks)),
        model_imports=imports, model_spec=spec + "\n\n", parallelize=parallelize, vocab=model.vocab,
        seq_len=model.seq_len, parallelize_name=parallelize.split(".")[1],
        parallelism=",\n        ".join(_parallelism(c, layout, csv_path)),
        local_batch=local, global_batch=global_batch,
        # torchtitan (trainer.py, Trainer.Config): no CUDA graphs with pp, nor with ep's dispatchers that sync the CPU
        no_graphs=c.pp > 1 or c.ep > 1,
        ac="FullAC.Config()" if c.recompute == "full" else "None")
