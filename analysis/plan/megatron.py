"""A planned configuration as a Megatron-LM launch script (``pretrain_gpt.py``), for Megatron-LM's main branch.

:func:`megatron_script` writes a bash script: the GPU count it needs, the
environment each mode needs (``CUDA_DEVICE_MAX_CONNECTIONS``), then
``torchrun ... pretrain_gpt.py`` with the plan's arguments on the last line.
Comments say what Megatron-LM cannot express (``# note:``), which of its
defaults the plan relies on (``# default:``) and which the line overrides
(``# override:``), each with the upstream file and line (:data:`DEFAULT_SOURCES`).

No package on the index ships Megatron-LM's argument parser (megatron-core
0.16.1's wheel has no ``megatron/training``), so every flag this module can
write is in :data:`FLAG_SOURCES` with the upstream file and line it was checked
against (NVIDIA/Megatron-LM at :data:`MEGATRON_COMMIT`). Many flags are
generated from dataclass fields by ``ArgumentGroupFactory``
(``megatron/training/argument_utils.py``: ``--`` + the field name with ``_``
as ``-``; a bool field that defaults to True becomes ``--no-``/``--disable-``);
for those the source is the field and the ``arguments.py`` line that builds
the group.

Checked constraints of ``validate_args`` (``megatron/training/arguments.py``)
the line respects: ``--use-torch-fsdp2`` is refused with pp > 1 (line 1035), so
ZeRO-2/3 go through Megatron-FSDP (``--use-megatron-fsdp``, which needs
``--ckpt-format fsdp_dtensor``, line 1169); one of
``--num-layers-per-virtual-pipeline-stage`` and ``--pipeline-model-parallel-layout``
at most (line 928), and the layout's stage count sets the virtual stages
(line 941), so the layout alone says the split, even or not.
"""

from __future__ import annotations

import math
import shlex
from typing import TYPE_CHECKING

from common.errors import ConfigError
from sim.costs.transformer import TransformerConfig
from sim.plan.space import PlanConfig

if TYPE_CHECKING:  # only a type here: analysis.plan.exports imports this module
    from analysis.plan.exports import PlanLayout

__all__ = ["DEFAULT_SOURCES", "DP_FLAGS", "FLAG_SOURCES", "FSDP_MODES", "MEGATRON_COMMIT", "REDUCE_FLAGS",
           "megatron_defaults", "megatron_dp_flags", "megatron_env", "megatron_layout", "megatron_notes", "megatron_script"]

#: The Megatron-LM commit (main, 2026-08-22) the flags were checked against.
MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"

_ARGS = "megatron/training/arguments.py"
_TC = "megatron/core/transformer/transformer_config.py"  # fields -> flags by the factory at arguments.py:2373
_MPC = "megatron/core/model_parallel_config.py"  # TransformerConfig's base class, same factory
_TRAIN = "megatron/training/config/training_config.py"
_COMMON = "megatron/training/config/common_config.py"

#: Every flag :func:`megatron_script` can write -> (file, line, what is there) at :data:`MEGATRON_COMMIT`.
FLAG_SOURCES: dict[str, tuple[str, int, str]] = {
    "--tensor-model-parallel-size": (_MPC, 55, "field tensor_model_parallel_size: int = 1"),
    "--pipeline-model-parallel-size": (_MPC, 83, "field pipeline_model_parallel_size: int = 1"),
    "--sequence-parallel": (_MPC, 94, "field sequence_parallel: bool = False (store_true)"),
    "--expert-model-parallel-size": (_MPC, 127, "field expert_model_parallel_size: int = 1"),
    "--num-experts": (_ARGS, 3518, "add_argument, type=int (num_moe_experts is excluded from the factory)"),
    "--moe-layer-freq": (_ARGS, 3520, "add_argument, type=moe_freq_type: an int or a list pattern such as ([0]*3+[1]*58)"),
    "--moe-router-topk": (_TC, 760, "field moe_router_topk: int = 2"),
    "--moe-ffn-hidden-size": (_TC, 740, "field moe_ffn_hidden_size: Optional[int] = None"),
    "--moe-shared-expert-intermediate-size": (_TC, 701, "field moe_shared_expert_intermediate_size: Optional[int]"),
    "--moe-grouped-gemm": (_TC, 850, "field moe_grouped_gemm: bool = False (store_true)"),
    "--moe-token-dispatcher-type": (_TC, 891, "field moe_token_dispatcher_type: 'allgather', 'alltoall' or 'flex'"),
    "--overlap-moe-expert-parallel-comm": (_MPC, 343, "field overlap_moe_expert_parallel_comm: bool = False "
                                                      "(store_true): combined 1F1B, the EP A2A overlap"),
    "--pipeline-model-parallel-layout": (_ARGS, 3103, "add_argument, type=str; E, t, L stages split by |"),
    "--micro-batch-size": (_TRAIN, 11, "TrainingConfig.micro_batch_size (factory at arguments.py:2863)"),
    "--global-batch-size": (_TRAIN, 15, "TrainingConfig.global_batch_size (factory at arguments.py:2863)"),
    "--seq-length": (_ARGS, 3305, "add_argument, type=int"),
    "--max-position-embeddings": (_ARGS, 2394, "add_argument, type=int"),
    "--num-layers": (_TC, 65, "field num_layers"),
    "--hidden-size": (_TC, 145, "field hidden_size"),
    "--num-attention-heads": (_TC, 148, "field num_attention_heads"),
    "--group-query-attention": (_ARGS, 2382, "add_argument, store_true"),
    "--num-query-groups": (_TC, 175, "field num_query_groups"),
    "--ffn-hidden-size": (_TC, 180, "field ffn_hidden_size"),
    "--disable-bias-linear": (_TC, 212, "field add_bias_linear, arg_names ['--disable-bias-linear']"),
    "--normalization": (_TC, 256, "field normalization: Literal['LayerNorm', 'RMSNorm']"),
    "--swiglu": (_ARGS, 2450, "add_argument, store_true"),
    "--position-embedding-type": (_ARGS, 2397, "add_argument, choices learned_absolute, rope, ..."),
    "--untie-embeddings-and-output-weights": (_ARGS, 2460, "add_argument, store_true"),
    "--recompute-granularity": (_TC, 532, "field recompute_granularity: Literal['full', 'selective']"),
    "--recompute-method": (_TC, 543, "field recompute_method: Literal['uniform', 'block']"),
    "--recompute-num-layers": (_TC, 551, "field recompute_num_layers"),
    "--use-distributed-optimizer": (_ARGS, 3156, "add_argument, store_true"),
    "--overlap-grad-reduce": (_ARGS, 3121, "add_argument, store_true, default False (DDP all-reduces after the "
                                           "backward)"),
    "--overlap-param-gather": (_ARGS, 3148, "add_argument, store_true; needs --overlap-grad-reduce and the "
                                            "distributed optimizer or Megatron-FSDP (line 1024)"),
    "--use-megatron-fsdp": (_COMMON, 92, "DistributedInitConfig.use_megatron_fsdp (factory at arguments.py:3092)"),
    "--data-parallel-sharding-strategy": (_ARGS, 3190, "add_argument, choices no_shard, optim, optim_grads, "
                                                       "optim_grads_params"),
    "--ckpt-format": (_TRAIN, 486, "CheckpointConfig.ckpt_format, fsdp_dtensor among the choices "
                                   "(factory at arguments.py:3008)"),
    "--tokenizer-type": (_TRAIN, 698, "TokenizerConfig.tokenizer_type, NullTokenizer among the choices "
                                      "(factory at arguments.py:3246)"),
    "--vocab-size": (_TRAIN, 679, "TokenizerConfig.vocab_size (factory at arguments.py:3246)"),
    "--mock-data": (_ARGS, 3302, "add_argument, store_true"),
    "--bf16": (_MPC, 180, "field bf16: bool = False (store_true): bf16 mixed precision"),
    "--grad-reduce-in-bf16": (_ARGS, 3053, "add_argument, store_true; with --bf16 it turns off the fp32 "
                                           "accumulation and reduction --bf16 sets by default (line 1213)"),
    "--accumulate-allreduce-grads-in-fp32": (_ARGS, 3069, "add_argument, store_true"),
    "--hidden-dropout": (_TC, 188, "field hidden_dropout: float = 0.1"),
    "--attention-dropout": (_TC, 191, "field attention_dropout: float = 0.1"),
    "--megatron-fsdp-main-grads-dtype": (_ARGS, 3691, "add_argument, default 'auto': the parameters' dtype"),
    "--megatron-fsdp-grad-comm-dtype": (_ARGS, 3695, "add_argument, default 'auto': the main gradients' dtype"),
    "--train-iters": (_TRAIN, 64, "TrainingConfig.train_iters: int | None = None (factory at arguments.py:2863)"),
    "--lr": (_ARGS, 2984, "add_argument, type=float, default=None"),
}

#: Megatron-LM behaviour the script's ``# default:``, ``# override:`` and environment lines rest on -> (file, line,
#: what is there) at :data:`MEGATRON_COMMIT`; experiments/check_megatron_flags.py checks each line holds ``text``.
DEFAULT_SOURCES: dict[str, tuple[str, int, str]] = {
    "dropout": (_TC, 188, "hidden_dropout: float = 0.1"),
    "vocab-padding": (_ARGS, 2441, "'--make-vocab-size-divisible-by', type=int, default=128"),
    "vocab-padding-multiple": ("megatron/training/vocab_utils.py", 58,
                               "multiple = make_vocab_size_divisible_by * tensor_model_parallel_size"),
    "data-parallel-size": (_ARGS, 448, "args.data_parallel_size = args.world_size // total_model_size"),
    "context-parallel-size": (_MPC, 100, "context_parallel_size: int = 1"),
    "microbatches": ("megatron/core/num_microbatches_calculator.py", 388,
                     "num_micro_batches = global_batch_size // micro_batch_times_data_parallel_size"),
    "fsdp-main-grads": ("megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py", 2322,
                        "return torch.bfloat16 if is_fp8 else group.dtype"),
    "fsdp-ddp-grads": ("megatron/training/training.py", 2647,
                       'kwargs["megatron_fsdp_main_grads_dtype"] = args.megatron_fsdp_main_grads_dtype'),
    "tp-connections": (_ARGS, 1477, "assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') == \"1\""),
    "fsdp-connections": (_ARGS, 1166, "assert os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != \"1\""),
    "bf16-reduce": (_ARGS, 1216, "args.accumulate_allreduce_grads_in_fp32 = True"),
}

#: The planner's gradient reduction dtype (``schedlab plan --reduce-dtype``) -> Megatron-LM's flag. With ``--bf16``
#: Megatron-LM accumulates and reduces gradients in fp32 unless ``--grad-reduce-in-bf16`` (arguments.py:1204-1217).
REDUCE_FLAGS = {"bf16": "--grad-reduce-in-bf16", "fp32": "--accumulate-allreduce-grads-in-fp32"}


def megatron_layout(layout: PlanLayout) -> str:
    """``--pipeline-model-parallel-layout``: stage i lists its decoder layers ``t*n``; E first, L last."""
    stages = []
    for i, n in enumerate(layout.layers):
        body = "t" if n == 1 else f"t*{n}" if n else ""
        stages.append(("E" if i == 0 else "") + body + ("L" if i == layout.stages - 1 else ""))
    return "|".join(stages)


def megatron_notes(c: PlanConfig, layout: PlanLayout) -> list[str]:
    """What Megatron-LM cannot express for ``c``, each with the setting the line uses instead."""
    if c.pp == 1 or c.schedule == "combined-1f1b":  # --overlap-moe-expert-parallel-comm runs it as planned
        return []
    if layout.placement != "loop":
        return [f"schedule {c.schedule} places stages {','.join(map(str, layout.ranks))} (a V); Megatron-LM places "
                "stage s on rank s mod pp and runs interleaved 1F1B on them: the nearest, with the same split"]
    exact = "interleaved-1f1b" if c.chunks > 1 else "1f1b"
    if c.schedule != exact:
        return [f"schedule {c.schedule} has no Megatron-LM flag (it runs 1F1B, or interleaved 1F1B with virtual "
                f"stages); this line runs {exact} with the same split, the nearest; the planned order is "
                "schedule.csv for torch.distributed.pipelining"]
    return []


def _model_flags(model: TransformerConfig) -> list[str]:
    flags = [f"--num-layers {model.layers}", f"--hidden-size {model.hidden}", f"--ffn-hidden-size {model.ffn}",
             f"--num-attention-heads {model.heads}"]
    if model.kv_heads != model.heads:
        flags += ["--group-query-attention", f"--num-query-groups {model.kv_heads}"]
    flags += [f"--seq-length {model.seq_len}", f"--max-position-embeddings {model.seq_len}",
              f"--position-embedding-type {'learned_absolute' if model.learned_positions else 'rope'}"]
    if model.gated_mlp:
        flags.append("--swiglu")
    if not model.bias:
        flags += ["--disable-bias-linear", "--normalization RMSNorm"]
    if not model.tied_embeddings:
        flags.append("--untie-embeddings-and-output-weights")
    if model.moe is not None:  # the experts' shape; the dispatcher as the simulator times it (alltoall)
        m = model.moe
        flags += [f"--num-experts {m.experts}", f"--moe-router-topk {m.top_k}", f"--moe-ffn-hidden-size {m.expert_ffn}",
                  "--moe-grouped-gemm", "--moe-token-dispatcher-type alltoall"]
        if m.shared_experts:
            flags.append(f"--moe-shared-expert-intermediate-size {m.shared_experts * m.expert_ffn}")
        if m.dense_layers:
            flags.append(f"--moe-layer-freq {shlex.quote(f'([0]*{m.dense_layers}+[1]*{model.moe_layers})')}")
    return flags


#: Data-parallel mode -> Megatron-LM's flags (``megatron/core/distributed/distributed_data_parallel_config.py``:
#: ``overlap_grad_reduce`` and ``overlap_param_gather`` default False, so plain DDP all-reduces after the backward).
#: zero1's parameter all-gather stays after the optimizer step, as in ``schedules.dp.modes`` (no ``--overlap-param-gather``,
#: which moves it into the next forward). Megatron-FSDP turns both overlaps on for optim_grads(_params) whatever the
#: flags (``megatron_fsdp.py``, ``MegatronFSDP.__init__``); the line says so. ``ps`` (parameter servers) and ``none``
#: with replicas (no gradient exchange) have no Megatron-LM setting: :func:`megatron_dp_flags` refuses them.
DP_FLAGS: dict[str, tuple[str, ...]] = {
    "sync": (),
    "ddp": ("--overlap-grad-reduce",),
    "zero1": ("--use-distributed-optimizer", "--overlap-grad-reduce"),
    "zero2": ("--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads", "--ckpt-format fsdp_dtensor",
              "--overlap-grad-reduce"),
    "zero3": ("--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
              "--ckpt-format fsdp_dtensor", "--overlap-grad-reduce", "--overlap-param-gather"),
}
DP_FLAGS["fsdp"] = DP_FLAGS["zero3"]
#: The modes that run on Megatron-FSDP (with replicas).
FSDP_MODES = ("zero2", "zero3", "fsdp")


def megatron_dp_flags(mode: str, dp: int) -> list[str]:
    """The flags of data-parallel ``mode`` at ``dp`` replicas; a mode Megatron-LM cannot run is a ConfigError."""
    if dp == 1:
        return []
    if mode not in DP_FLAGS:
        raise ConfigError(f"dp mode {mode!r} has no Megatron-LM setting (it runs {', '.join(DP_FLAGS)}); "
                          "plan with one of those", field="dp_modes")
    return list(DP_FLAGS[mode])


def megatron_env(c: PlanConfig) -> tuple[str | None, str]:
    """``CUDA_DEVICE_MAX_CONNECTIONS`` as ``c`` needs it -> (value, why); value None: unset, "" : no requirement.

    ``validate_args`` refuses Megatron-FSDP with the variable at 1 (:data:`DEFAULT_SOURCES` ``fsdp-connections``)
    and, on Hopper and older GPUs (the planner's devices), tensor parallelism without FSDP unless it is 1
    (``tp-connections``); with both, it warns and runs, so FSDP's rule wins."""
    if c.dp > 1 and c.dp_mode in FSDP_MODES:
        return None, f"Megatron-FSDP: validate_args refuses CUDA_DEVICE_MAX_CONNECTIONS=1 ({_where('fsdp-connections')})"
    if c.tp > 1:
        return "1", f"tensor parallelism: on Hopper and older GPUs validate_args requires it ({_where('tp-connections')})"
    return "", "no requirement (no tensor parallelism, no Megatron-FSDP)"


def _where(key: str) -> str:
    path, line, _ = DEFAULT_SOURCES[key]
    return f"{path.rsplit('/', 1)[-1]}:{line}"


def megatron_defaults(c: PlanConfig, model: TransformerConfig, global_batch: int,
                      reduce_dtype: str) -> list[tuple[str, str]]:
    """("default" | "override", what) for every Megatron-LM default the line relies on or overrides."""
    out = [("default", f"data-parallel size = WORLD_SIZE / (tp x pp x cp) with context parallelism 1 "
                       f"({_where('data-parallel-size')}, {_where('context-parallel-size')}): "
                       f"{c.tp * c.pp * c.dp} processes give dp {c.dp}"),
           ("default", f"microbatches = global batch / (micro batch x dp) ({_where('microbatches')}): "
                       f"{global_batch} / ({c.microbatch_size} x {c.dp}) = {c.microbatches}")]
    multiple = 128 * c.tp
    padded = -(-model.vocab // multiple) * multiple
    out.append(("default", f"--make-vocab-size-divisible-by 128 pads the vocabulary to a multiple of 128 x tp "
                           f"({_where('vocab-padding')}, {_where('vocab-padding-multiple')}): {padded} rows"
                + (", as planned" if padded == model.vocab else f"; the plan timed {model.vocab}")))
    if model.dropout:
        out.append(("default", f"hidden and attention dropout 0.1 ({_where('dropout')}); the plan has dropout, "
                               "its rate is not planned"))
    else:
        out.append(("override", f"--hidden-dropout 0 --attention-dropout 0: Megatron's default is 0.1 "
                                f"({_where('dropout')}), the model trains without dropout"))
    if c.dp > 1 and c.dp_mode in FSDP_MODES:
        out.append(("override", "--megatron-fsdp-main-grads-dtype fp32: Megatron-FSDP ignores "
                                "--accumulate-allreduce-grads-in-fp32 and by default accumulates gradients in the "
                                f"parameters' bf16 ({_where('fsdp-main-grads')}, {_where('fsdp-ddp-grads')})"))
        out.append(("override", f"--megatron-fsdp-grad-comm-dtype {reduce_dtype}: the plan reduces gradients in "
                                f"{reduce_dtype} (the default, auto, reduces in the main gradients' fp32)"))
    elif reduce_dtype == "bf16":
        out.append(("override", "--grad-reduce-in-bf16: with --bf16 Megatron accumulates and reduces gradients in "
                                f"fp32 ({_where('bf16-reduce')}); the plan reduces in bf16"))
    return out


def _check_combined(c: PlanConfig) -> None:
    """Megatron-core's own rules for ``--overlap-moe-expert-parallel-comm`` (TransformerConfig.__post_init__ at
    :data:`MEGATRON_COMMIT`, transformer_config.py:3002-3032): expert parallelism, and no full recomputation.
    (Its other rules hold for every line this module writes: bf16, the alltoall dispatcher, no MTP; and
    combined-1f1b itself has virtual stages whenever pp > 1.) One line before anything is written."""
    if c.schedule != "combined-1f1b":
        return
    if c.ep <= 1:
        raise ConfigError(f"schedule combined-1f1b is Megatron-LM's EP A2A overlap (overlap_moe_expert_parallel_comm), which needs "
                          f"expert parallelism (ep > 1), got ep {c.ep}; give ep 2 or more, or another schedule",
                          field="ep")
    if c.recompute == "full":
        raise ConfigError("schedule combined-1f1b is Megatron-LM's EP A2A overlap (overlap_moe_expert_parallel_comm), which refuses "
                          "full recomputation; use recompute none or selective", field="recompute")


def _gpus(c: PlanConfig, gpus_per_node: int | None) -> tuple[int, int]:
    """(nodes, GPUs per node) for the plan's world; a node's GPUs divide the world."""
    world = c.tp * c.pp * c.dp
    per = math.gcd(world, gpus_per_node or 8)
    return world // per, per


def megatron_script(c: PlanConfig, model: TransformerConfig, global_batch: int, layout: PlanLayout,
                    reduce_dtype: str = "bf16", gpus_per_node: int | None = None) -> str:
    """A bash script that launches ``c`` with Megatron-LM's ``pretrain_gpt.py``: bf16 mixed precision, as the
    planner times it, with gradients reduced in ``reduce_dtype`` (:data:`REDUCE_FLAGS`); the planned arguments
    are its last line. ``gpus_per_node``: the cluster's (default 8)."""
    if reduce_dtype not in REDUCE_FLAGS:
        raise ConfigError(f"reduce dtype {reduce_dtype!r}: give one of {', '.join(REDUCE_FLAGS)}", field="reduce_dtype")
    fsdp = c.dp > 1 and c.dp_mode in FSDP_MODES
    _check_combined(c)
    args = [f"--tensor-model-parallel-size {c.tp}", f"--pipeline-model-parallel-size {c.pp}"]
    if c.ep > 1:
        args.append(f"--expert-model-parallel-size {c.ep}")
    if c.pp > 1:
        args.append(f"--pipeline-model-parallel-layout {shlex.quote(megatron_layout(layout))}")
    args += [f"--micro-batch-size {c.microbatch_size}", f"--global-batch-size {global_batch}", *_model_flags(model)]
    if not model.dropout:
        args += ["--hidden-dropout 0", "--attention-dropout 0"]
    if c.sp and c.tp > 1:
        args.append("--sequence-parallel")
    if c.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif c.recompute == "selective":
        args.append("--recompute-granularity selective")
    args.append("--bf16")
    if c.schedule == "combined-1f1b":
        args.append("--overlap-moe-expert-parallel-comm")
    dp_flags = megatron_dp_flags(c.dp_mode, c.dp)
    if fsdp:
        dp_flags += ["--megatron-fsdp-main-grads-dtype fp32", f"--megatron-fsdp-grad-comm-dtype {reduce_dtype}"]
    else:
        args.append(REDUCE_FLAGS[reduce_dtype])
    args += [*dp_flags, "--tokenizer-type NullTokenizer", f"--vocab-size {model.vocab}", "--mock-data",
             '--train-iters "$TRAIN_ITERS"', '--lr "$LR"']
    world = c.tp * c.pp * c.dp
    nodes, per = _gpus(c, gpus_per_node)
    degrees = f"tp {c.tp} x pp {c.pp} x dp {c.dp}"
    value, why = megatron_env(c)
    env = ([f"export CUDA_DEVICE_MAX_CONNECTIONS=1  # {why}"] if value == "1" else
           [f"unset CUDA_DEVICE_MAX_CONNECTIONS  # {why}"] if value is None else
           [f"# CUDA_DEVICE_MAX_CONNECTIONS: {why}"])
    lines = [
        "#!/usr/bin/env bash",
        f"# Megatron-LM main ({MEGATRON_COMMIT[:12]}) launch of the schedlab plan {c.label()}",
        f"# Run it in a Megatron-LM checkout at that commit on {world} GPUs ({degrees}), on every node with "
        "NODE_RANK, MASTER_ADDR, MASTER_PORT set; replace --mock-data with --data-path PREFIX for real data",
        *[f"# note: {n}" for n in megatron_notes(c, layout)],
        *[f"# {kind}: {what}" for kind, what in megatron_defaults(c, model, global_batch, reduce_dtype)],
        "set -euo pipefail",
        f"NNODES=${{NNODES:-{nodes}}}",
        f"GPUS_PER_NODE=${{GPUS_PER_NODE:-{per}}}",
        f"if [ $((NNODES * GPUS_PER_NODE)) -ne {world} ]; then",
        f'    echo "error: NNODES x GPUS_PER_NODE is $((NNODES * GPUS_PER_NODE)); the plan runs on {world} GPUs '
        f'({degrees}): set them to make {world}" >&2',
        "    exit 2",
        "fi",
        "# Not planned (choose them for your run): the number of steps and the learning rate.",
        "TRAIN_ITERS=${TRAIN_ITERS:-100}",
        "LR=${LR:-0.0003}",
        *env,
        'torchrun --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "${NODE_RANK:-0}" '
        '--master-addr "${MASTER_ADDR:-localhost}" --master-port "${MASTER_PORT:-6000}" pretrain_gpt.py \\',
        " ".join(args),
    ]
    return "\n".join(lines) + "\n"
