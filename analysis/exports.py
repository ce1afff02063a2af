"""A planned configuration as other frameworks take it: a torchtitan TOML fragment, a Megatron-LM argument line, the schedule CSV.

torchtitan keys are those of ``torchtitan/config/job_config.py`` (pytorch/torchtitan,
checked at commit 000204a4): ``[parallelism]`` data_parallel_replicate_degree,
data_parallel_shard_degree, fsdp_reshard_after_forward, tensor_parallel_degree,
pipeline_parallel_degree, pipeline_parallel_schedule (a name
``torch.distributed.pipelining.get_schedule_class`` knows),
pipeline_parallel_schedule_csv (then the schedule must be PipelineScheduleSingle,
PipelineScheduleMulti or _PipelineScheduleRuntime), pipeline_parallel_microbatch_size,
pipeline_parallel_layers_per_stage; ``[activation_checkpoint]`` mode
("none", "selective", "full") and selective_ac_option ("op": per-operation);
``[training]`` local_batch_size, global_batch_size, seq_len.

What does not map one to one is said in a comment in the output: torchtitan
has no ZeRO-1/2 (FSDP2 with ``fsdp_reshard_after_forward = "never"`` keeps the
parameters gathered from the forward through the backward, the nearest), and
its tensor parallelism always shards the norms over the sequence (sequence
parallelism); Megatron-LM runs 1F1B, or interleaved 1F1B with virtual stages,
and splits layers unevenly only through its first/last-stage layer counts.
"""

from __future__ import annotations

import os
from pathlib import Path

from schedules import build
from schedules.torch_csv import write_torch_csv
from sim.plan_space import PlanConfig
from sim.study import Study
from sim.transformer import TransformerConfig, partition_layers

__all__ = ["TORCH_SCHEDULE_CLASS", "megatron_args", "torchtitan_toml", "write_schedule_csv"]

#: Our schedule -> the name torch.distributed.pipelining.get_schedule_class takes (torch 2.13.0) for the same order.
TORCH_SCHEDULE_CLASS = {
    "gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "looped-bfs": "LoopedBFS",
    "interleaved-zb": "InterleavedZeroBubble", "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV",
}


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _layers_per_stage(model: TransformerConfig, c: PlanConfig) -> int | None:
    n = c.pp * c.chunks
    return model.layers // n if model.layers % n == 0 else None


def torchtitan_toml(c: PlanConfig, model: TransformerConfig, global_batch: int, csv_path: str | os.PathLike | None) -> str:
    """The ``[parallelism]``, ``[activation_checkpoint]`` and ``[training]`` tables for configuration ``c``.

    ``csv_path``: where the schedule CSV is (used when torch has no class for the schedule).
    """
    notes: list[str] = []
    replicate, shard, reshard = c.dp, 1, None
    if c.dp_mode in ("fsdp", "zero3"):
        replicate, shard = 1, c.dp
    elif c.dp_mode in ("zero1", "zero2"):
        replicate, shard, reshard = 1, c.dp, "never"
        notes.append(f"{c.dp_mode}: torchtitan has no ZeRO-1/2; FSDP2 that keeps the parameters gathered from the "
                     "forward through the backward (reshard_after_forward never) is the nearest")
    lines = ["[parallelism]", f"data_parallel_replicate_degree = {replicate}", f"data_parallel_shard_degree = {shard}"]
    if reshard is not None:
        lines.append(f"fsdp_reshard_after_forward = {_toml_str(reshard)}")
    lines += [f"tensor_parallel_degree = {c.tp}", f"pipeline_parallel_degree = {c.pp}"]
    if c.tp > 1 and not c.sp:
        notes.append("the plan has tensor parallelism without sequence parallelism; torchtitan's always shards the "
                     "norms over the sequence")
    torch_class = TORCH_SCHEDULE_CLASS.get(c.schedule)
    if torch_class is not None:
        lines.append(f"pipeline_parallel_schedule = {_toml_str(torch_class)}")
    else:
        if csv_path is None:
            raise ValueError(f"schedule {c.schedule!r} has no torch class: give the path of its CSV")
        lines += [f"pipeline_parallel_schedule = {_toml_str('PipelineScheduleMulti')}",
                  f"pipeline_parallel_schedule_csv = {_toml_str(str(csv_path))}"]
    lines.append(f"pipeline_parallel_microbatch_size = {c.microbatch_size}")
    per_stage = _layers_per_stage(model, c)
    if per_stage is not None:
        lines.append(f"pipeline_parallel_layers_per_stage = {per_stage}")
    else:
        split = partition_layers(model.layers, c.pp * c.chunks)
        notes.append(f"layers per stage {','.join(map(str, split))} (uneven): give pipeline_parallel_split_points")
    lines += ["", "[activation_checkpoint]", f"mode = {_toml_str(c.recompute)}"]
    if c.recompute == "selective":
        lines.append(f"selective_ac_option = {_toml_str('op')}")
    lines += ["", "[training]", f"local_batch_size = {global_batch // c.dp}", f"global_batch_size = {global_batch}",
              f"seq_len = {model.seq_len}"]
    head = [f"# schedlab plan: {c.label()}"] + [f"# note: {n}" for n in notes]
    return "\n".join(head + lines) + "\n"


def megatron_args(c: PlanConfig, model: TransformerConfig, global_batch: int) -> str:
    """One Megatron-LM argument line for ``c`` (flags as in megatron/training/arguments.py)."""
    args = [f"--tensor-model-parallel-size {c.tp}", f"--pipeline-model-parallel-size {c.pp}"]
    notes = []
    split = partition_layers(model.layers, c.pp * c.chunks)
    if c.chunks > 1:
        per = _layers_per_stage(model, c)
        if per is not None:
            args.append(f"--num-layers-per-virtual-pipeline-stage {per}")
        else:
            notes.append(f"uneven virtual stages {','.join(map(str, split))} have no Megatron flag")
    elif len(set(split)) > 1 and c.pp > 1:
        # Megatron splits evenly except for its first and last stage; ours puts the extra layers first.
        notes.append(f"layers per stage {','.join(map(str, split))}: Megatron needs --decoder-first-pipeline-num-layers "
                     "and --decoder-last-pipeline-num-layers so that the rest divides evenly")
    args += [f"--micro-batch-size {c.microbatch_size}", f"--global-batch-size {global_batch}",
             f"--seq-length {model.seq_len}", f"--num-layers {model.layers}"]
    if c.sp:
        args.append("--sequence-parallel")
    if c.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif c.recompute == "selective":
        args.append("--recompute-granularity selective")
    if c.dp_mode in ("zero1", "zero2"):
        args.append("--use-distributed-optimizer")
    elif c.dp_mode in ("fsdp", "zero3"):
        args.append("--use-torch-fsdp2")
    if c.schedule not in ("1f1b", "interleaved-1f1b") and c.pp > 1:
        notes.append(f"schedule {c.schedule} has no Megatron-LM flag (it runs 1F1B, or interleaved 1F1B with "
                     "virtual stages); use the schedule CSV with torch.distributed.pipelining")
    return "".join(f"# note: {n}\n" for n in notes) + " ".join(args) + "\n"


def write_schedule_csv(c: PlanConfig, study: Study, path: str | os.PathLike) -> Path:
    """The configuration's pipeline order as torch's compute-only CSV (``_load_csv``), one row per rank."""
    options = study.schedule_options()  # zb-auto plans with the model's pass times; None for the others
    sched = build(c.schedule, None, options, pp=c.pp, microbatches=c.microbatches, chunks=c.chunks)
    return write_torch_csv(sched, path)
