"""The Megatron-LM launch script as bash runs it, and what Megatron-LM must make of it.

:func:`launch_script` runs an exported ``megatron.sh`` under bash with a
``torchrun`` of ours first on ``PATH`` that records its arguments and
environment instead of starting processes: what Megatron-LM's
``pretrain_gpt.py`` would be given, exactly. :func:`plan_settings` is what the
plan means in Megatron-LM's own terms (the fields of its parsed arguments,
``TransformerConfig`` and ``DistributedDataParallelConfig``);
:func:`megatron_settings` reads the same fields from Megatron-LM's objects
(experiments/check_megatron_launch.py runs Megatron-LM's parser on every
export and compares the two). :func:`check_flags` checks an argument list
against megatron-core's installed dataclasses and the recorded
:data:`analysis.plan.megatron.FLAG_SOURCES`, for where Megatron-LM's parser
itself is not installed (no package ships it).
"""

from __future__ import annotations

import dataclasses
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.plan.megatron import FLAG_SOURCES, FSDP_MODES, MEGATRON_COMMIT
from sim.costs.transformer import TransformerConfig
from sim.plan.space import PlanConfig

if TYPE_CHECKING:
    from analysis.plan.exports import PlanLayout

__all__ = ["CORE_FIELDS", "TORCHRUN_OPTIONS", "Launch", "check_flags", "launch_script", "megatron_settings",
           "plan_settings", "torchrun_env"]

#: The torchrun options the script passes, in its order (torch/distributed/run.py accepts each with - or _).
TORCHRUN_OPTIONS = ("--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port")

#: Flags that set a megatron-core dataclass field -> (module, class, field, the field's default). megatron-core
#: 0.16.1 (PyPI) defines each with that default, as main does; where the flag is absent the line relies on it
#: (``--data-parallel-sharding-strategy`` is always written with Megatron-FSDP, which alone reads it).
CORE_FIELDS: dict[str, tuple[str, str, str, Any]] = {
    "--tensor-model-parallel-size": ("megatron.core.model_parallel_config", "ModelParallelConfig",
                                     "tensor_model_parallel_size", 1),
    "--pipeline-model-parallel-size": ("megatron.core.model_parallel_config", "ModelParallelConfig",
                                       "pipeline_model_parallel_size", 1),
    "--sequence-parallel": ("megatron.core.model_parallel_config", "ModelParallelConfig", "sequence_parallel", False),
    "--bf16": ("megatron.core.model_parallel_config", "ModelParallelConfig", "bf16", False),
    "--num-layers": ("megatron.core.transformer.transformer_config", "TransformerConfig", "num_layers", 0),
    "--hidden-size": ("megatron.core.transformer.transformer_config", "TransformerConfig", "hidden_size", 0),
    "--num-attention-heads": ("megatron.core.transformer.transformer_config", "TransformerConfig",
                              "num_attention_heads", 0),
    "--num-query-groups": ("megatron.core.transformer.transformer_config", "TransformerConfig", "num_query_groups",
                           None),
    "--ffn-hidden-size": ("megatron.core.transformer.transformer_config", "TransformerConfig", "ffn_hidden_size", None),
    "--disable-bias-linear": ("megatron.core.transformer.transformer_config", "TransformerConfig", "add_bias_linear",
                              True),
    "--normalization": ("megatron.core.transformer.transformer_config", "TransformerConfig", "normalization",
                        "LayerNorm"),
    "--hidden-dropout": ("megatron.core.transformer.transformer_config", "TransformerConfig", "hidden_dropout", 0.1),
    "--attention-dropout": ("megatron.core.transformer.transformer_config", "TransformerConfig", "attention_dropout",
                            0.1),
    "--recompute-granularity": ("megatron.core.transformer.transformer_config", "TransformerConfig",
                                "recompute_granularity", None),
    "--recompute-method": ("megatron.core.transformer.transformer_config", "TransformerConfig", "recompute_method",
                           None),
    "--recompute-num-layers": ("megatron.core.transformer.transformer_config", "TransformerConfig",
                               "recompute_num_layers", None),
    # Written through arguments.py's own add_argument, read into the DDP config by name (training.py:2632).
    "--use-distributed-optimizer": ("megatron.core.distributed.distributed_data_parallel_config",
                                    "DistributedDataParallelConfig", "use_distributed_optimizer", False),
    "--overlap-grad-reduce": ("megatron.core.distributed.distributed_data_parallel_config",
                              "DistributedDataParallelConfig", "overlap_grad_reduce", False),
    "--overlap-param-gather": ("megatron.core.distributed.distributed_data_parallel_config",
                               "DistributedDataParallelConfig", "overlap_param_gather", False),
    "--use-megatron-fsdp": ("megatron.core.distributed.distributed_data_parallel_config",
                            "DistributedDataParallelConfig", "use_megatron_fsdp", False),
    "--data-parallel-sharding-strategy": ("megatron.core.distributed.distributed_data_parallel_config",
                                          "DistributedDataParallelConfig", "data_parallel_sharding_strategy",
                                          "no_shard"),
}


@dataclass(frozen=True)
class Launch:
    """What the script hands torchrun: its options, the training script, that script's arguments, the environment."""

    torchrun: dict[str, str]
    script: str
    argv: tuple[str, ...]
    env: dict[str, str]

    @property
    def world_size(self) -> int:
        return int(self.torchrun["--nnodes"]) * int(self.torchrun["--nproc-per-node"])


_STUB = '#!/bin/sh\nprintf "%s\\0" "$@" > "$SCHEDLAB_CAPTURE/argv"\nenv -0 > "$SCHEDLAB_CAPTURE/env"\n'


def launch_script(text: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> Launch:
    """Run the launch script ``text`` under bash, in environment ``env`` (plus PATH), with a recording torchrun.

    A script that exits non-zero, or never calls torchrun, raises ValueError with its one-line message."""
    with tempfile.TemporaryDirectory(prefix="megatron-launch-") as tmp:
        d = Path(tmp)
        (d / "bin").mkdir()
        (d / "bin" / "torchrun").write_text(_STUB)
        (d / "bin" / "torchrun").chmod(0o755)
        (d / "megatron.sh").write_text(text)
        base = {"PATH": f"{d / 'bin'}:/usr/bin:/bin", "SCHEDLAB_CAPTURE": str(d), **(env or {})}
        got = subprocess.run(["bash", str(d / "megatron.sh")], env=base, cwd=d, capture_output=True, text=True,
                             timeout=timeout)
        if got.returncode != 0:
            raise ValueError(f"the launch script exited {got.returncode}: {got.stderr.strip()}")
        if not (d / "argv").exists():
            raise ValueError("the launch script never called torchrun")
        words = (d / "argv").read_text().split("\0")[:-1]
        seen = dict(item.split("=", 1) for item in (d / "env").read_text().split("\0")[:-1])
    for k in ("SCHEDLAB_CAPTURE", "PWD", "OLDPWD", "SHLVL", "_"):
        seen.pop(k, None)
    options = dict(zip(words[:2 * len(TORCHRUN_OPTIONS):2], words[1:2 * len(TORCHRUN_OPTIONS):2], strict=True))
    if tuple(options) != TORCHRUN_OPTIONS:
        raise ValueError(f"torchrun options {list(options)}: the script passes {', '.join(TORCHRUN_OPTIONS)}")
    rest = words[2 * len(TORCHRUN_OPTIONS):]
    return Launch(options, rest[0], tuple(rest[1:]), seen)


def torchrun_env(launch: Launch, rank: int = 0) -> dict[str, str]:
    """The environment torchrun gives process ``rank`` (of node 0): the script's, plus its rank variables."""
    per = int(launch.torchrun["--nproc-per-node"])
    return {**launch.env, "WORLD_SIZE": str(launch.world_size), "RANK": str(rank), "LOCAL_RANK": str(rank % per),
            "LOCAL_WORLD_SIZE": str(per), "MASTER_ADDR": launch.torchrun["--master-addr"],
            "MASTER_PORT": launch.torchrun["--master-port"]}


def plan_settings(c: PlanConfig, model: TransformerConfig, global_batch: int, layout: PlanLayout,
                  reduce_dtype: str) -> dict[str, Any]:
    """What the plan means, as the fields Megatron-LM resolves the launch to (:func:`megatron_settings`)."""
    fsdp = c.dp > 1 and c.dp_mode in FSDP_MODES
    stages = None
    if c.pp > 1:
        stages = [[n, i == 0, i == layout.stages - 1] for i, n in enumerate(layout.layers)]
    multiple = 128 * c.tp  # --make-vocab-size-divisible-by 128 (DEFAULT_SOURCES "vocab-padding")
    recompute = {"none": [None, None, None], "selective": ["selective", None, None], "full": ["full", "uniform", 1]}
    strategy = {"zero2": "optim_grads", "zero3": "optim_grads_params", "fsdp": "optim_grads_params"}
    return {
        "tensor_model_parallel_size": c.tp, "pipeline_model_parallel_size": c.pp, "data_parallel_size": c.dp,
        "context_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": c.chunks if c.pp > 1 and c.chunks > 1 else None,
        "stages": stages,  # per stage in stage order: decoder layers, embedding, loss
        "micro_batch_size": c.microbatch_size, "global_batch_size": global_batch, "num_microbatches": c.microbatches,
        "sequence_parallel": bool(c.sp and c.tp > 1), "recompute": recompute[c.recompute],
        "params_dtype": "bfloat16",
        "num_layers": model.layers, "hidden_size": model.hidden, "ffn_hidden_size": model.ffn,
        "num_attention_heads": model.heads, "num_query_groups": model.kv_heads,
        "gated_linear_unit": model.gated_mlp, "add_bias_linear": model.bias,
        "normalization": "LayerNorm" if model.bias else "RMSNorm",
        "position_embedding_type": "learned_absolute" if model.learned_positions else "rope",
        "untie_embeddings_and_output_weights": not model.tied_embeddings, "seq_length": model.seq_len,
        "padded_vocab_size": -(-model.vocab // multiple) * multiple,
        "hidden_dropout": 0.1 if model.dropout else 0.0, "attention_dropout": 0.1 if model.dropout else 0.0,
        # Megatron-FSDP (version 1, the default) runs through the distributed optimizer (arguments.py:1135)
        "use_distributed_optimizer": c.dp > 1 and c.dp_mode in ("zero1", *FSDP_MODES), "use_megatron_fsdp": fsdp,
        "data_parallel_sharding_strategy": strategy[c.dp_mode] if fsdp else None,  # read by Megatron-FSDP only
        "overlap_grad_reduce": c.dp > 1 and c.dp_mode != "sync",
        "overlap_param_gather": c.dp > 1 and c.dp_mode in ("zero3", "fsdp"),
        # DDP reduces in fp32 or the parameters' bf16; Megatron-FSDP ignores it and takes its own two dtypes
        "grad_reduce_in_fp32": None if fsdp else reduce_dtype == "fp32",
        "megatron_fsdp_main_grads_dtype": "float32" if fsdp else None,
        "megatron_fsdp_grad_comm_dtype": {"bf16": "bfloat16", "fp32": "float32"}[reduce_dtype] if fsdp else None,
    }


def _dtype(value: Any) -> str | None:
    return None if value is None else str(value).removeprefix("torch.")


def megatron_settings(args: Any, config: Any, ddp: Any, num_microbatches: int, padded_vocab: int) -> dict[str, Any]:
    """The :func:`plan_settings` fields read from Megatron-LM's validated ``args``, its ``TransformerConfig``
    (``core_transformer_config_from_args``), its DDP config (``get_megatron_ddp_config``), the number of
    microbatches its calculator gives and its padded vocabulary (``calculate_padded_vocab_size``)."""
    stages = None
    if args.pipeline_model_parallel_size > 1:
        from megatron.core.transformer.enums import LayerType

        grid = config.pipeline_model_parallel_layout.layout  # [pp rank][virtual stage] -> layer types
        pp, vp = len(grid), len(grid[0])
        stages = [[cell.count(LayerType.decoder), LayerType.embedding in cell, LayerType.loss in cell]
                  for cell in (grid[s % pp][s // pp] for s in range(pp * vp))]
    fsdp = ddp.use_megatron_fsdp
    return {
        "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
        "data_parallel_size": args.data_parallel_size, "context_parallel_size": args.context_parallel_size,
        "virtual_pipeline_model_parallel_size": args.virtual_pipeline_model_parallel_size, "stages": stages,
        "micro_batch_size": args.micro_batch_size, "global_batch_size": args.global_batch_size,
        "num_microbatches": num_microbatches, "sequence_parallel": config.sequence_parallel,
        "recompute": [config.recompute_granularity, config.recompute_method, config.recompute_num_layers],
        "params_dtype": _dtype(config.params_dtype),
        "num_layers": config.num_layers, "hidden_size": config.hidden_size, "ffn_hidden_size": config.ffn_hidden_size,
        "num_attention_heads": config.num_attention_heads, "num_query_groups": config.num_query_groups,
        "gated_linear_unit": config.gated_linear_unit, "add_bias_linear": config.add_bias_linear,
        "normalization": config.normalization, "position_embedding_type": args.position_embedding_type,
        "untie_embeddings_and_output_weights": args.untie_embeddings_and_output_weights,
        "seq_length": args.seq_length, "padded_vocab_size": padded_vocab,
        "hidden_dropout": config.hidden_dropout, "attention_dropout": config.attention_dropout,
        "use_distributed_optimizer": ddp.use_distributed_optimizer, "use_megatron_fsdp": fsdp,
        "data_parallel_sharding_strategy": ddp.data_parallel_sharding_strategy if fsdp else None,
        "overlap_grad_reduce": ddp.overlap_grad_reduce, "overlap_param_gather": ddp.overlap_param_gather,
        "grad_reduce_in_fp32": None if fsdp else ddp.grad_reduce_in_fp32,
        "megatron_fsdp_main_grads_dtype": _dtype(ddp.megatron_fsdp_main_grads_dtype) if fsdp else None,
        "megatron_fsdp_grad_comm_dtype": _dtype(ddp.megatron_fsdp_grad_comm_dtype) if fsdp else None,
    }


def check_flags(argv: tuple[str, ...] | list[str]) -> list[str]:
    """One line per problem with ``argv``'s flags: a flag with no recorded source in Megatron-LM at
    :data:`MEGATRON_COMMIT`, or one generated from a megatron-core field the installed megatron-core lacks or
    gives another default. Empty: every flag is Megatron-LM's."""
    import importlib

    problems = []
    for word in argv:
        if not word.startswith("--"):
            continue
        if word not in FLAG_SOURCES:
            problems.append(f"{word}: not a Megatron-LM flag at {MEGATRON_COMMIT[:12]} (no row in FLAG_SOURCES)")
            continue
        if word not in CORE_FIELDS:
            continue
        module, cls, name, default = CORE_FIELDS[word]
        fields = {f.name: f for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
        if name not in fields:
            problems.append(f"{word}: megatron-core's {cls} has no field {name}")
        elif fields[name].default is not dataclasses.MISSING and fields[name].default != default:
            problems.append(f"{word}: megatron-core's {cls}.{name} defaults to {fields[name].default!r}, "
                            f"the export relies on {default!r}")
    return problems

