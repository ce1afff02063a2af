"""A planned configuration as other frameworks take it: torchtitan, Megatron-LM and torch's schedule CSV.

:func:`plan_layout` is what both exports are built from: the decoder layers of
each pipeline stage (the planner's split, :func:`sim.costs.transformer.partition_layers`:
embedding on stage 0, norm and head on the last stage, extra layers on the
first stages) and the rank that holds each stage (the schedule's own
``stage_to_rank``). :func:`write_exports` writes the three files:

* ``schedule.csv``: the pipeline order as torch's compute-only CSV (``_load_csv``);
* ``torchtitan_plan.py``: a torchtitan config module (:mod:`analysis.plan.torchtitan`);
* ``megatron.sh``: a Megatron-LM launch script (:mod:`analysis.plan.megatron`).

Each export names the version it was written for and says in a ``# note:``
comment what its target cannot express, with the nearest setting that runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from schedules import build
from schedules.interop.torch_csv import write_torch_csv
from schedules.ir import Schedule
from schedules.registry import lookup
from schedules.util import atomic_write
from sim.costs.transformer import TransformerConfig, partition_layers
from sim.plan.space import PlanConfig
from sim.plan.study import Study

__all__ = ["TORCH_SCHEDULE_CLASS", "PlanLayout", "plan_layout", "plan_schedule", "write_exports",
           "write_schedule_csv"]

#: Our schedule -> the torch.distributed.pipelining class (torch 2.13.0) whose order is the same family.
#: The exports run our own order from the CSV; the class name only says what the schedule is to a reader.
TORCH_SCHEDULE_CLASS = {
    "gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "looped-bfs": "LoopedBFS",
    "interleaved-zb": "InterleavedZeroBubble", "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV",
}


@dataclass(frozen=True)
class PlanLayout:
    """Decoder layers per stage (stage order) and the rank of each stage; ``placement`` names the pattern.

    ``placement``: ``"loop"`` (stage s on rank s mod pp), ``"v"`` (two stages per rank, rank r holds
    stages r and 2pp-1-r) or ``"other"``.
    """

    layers: tuple[int, ...]
    ranks: tuple[int, ...]
    placement: str

    @property
    def stages(self) -> int:
        return len(self.layers)


def _placement(ranks: tuple[int, ...], pp: int) -> str:
    n = len(ranks)
    if all(r == s % pp for s, r in enumerate(ranks)):
        return "loop"
    if n == 2 * pp and all(r == (s if s < pp else n - 1 - s) for s, r in enumerate(ranks)):
        return "v"
    return "other"


def plan_schedule(c: PlanConfig, study: Study | None = None) -> Schedule:
    """The configuration's pipeline schedule (adaptive schedules are built from ``study``'s costs)."""
    spec = lookup(c.schedule)
    if spec is not None and spec.adaptive and study is None:
        raise ValueError(f"schedule {c.schedule!r} is built from costs: give the study")
    options = study.schedule_options() if study is not None else None  # zb-auto plans with the model's pass times
    return build(c.schedule, None, options, pp=c.pp, microbatches=c.microbatches, chunks=c.chunks)


def plan_layout(c: PlanConfig, model: TransformerConfig, sched: Schedule) -> PlanLayout:
    """The stage split and placement both exports are checked against."""
    layers = partition_layers(model.layers, c.pp * c.chunks)
    ranks = tuple(sched.stage_to_rank)
    if len(ranks) != len(layers):
        raise ValueError(f"schedule {c.schedule!r} has {len(ranks)} stages, the plan {len(layers)}")
    return PlanLayout(layers, ranks, _placement(ranks, c.pp))


def write_schedule_csv(c: PlanConfig, study: Study | None, path: str | os.PathLike) -> Path:
    """The configuration's pipeline order as torch's compute-only CSV (``_load_csv``), one row per rank."""
    return write_torch_csv(plan_schedule(c, study), path)


def write_exports(c: PlanConfig, model: TransformerConfig, global_batch: int, study: Study | None,
                  out: str | os.PathLike, final: str | os.PathLike | None = None,
                  reduce_dtype: str = "bf16") -> dict[str, Path]:
    """``schedule.csv``, ``torchtitan_plan.py`` and ``megatron.sh`` for ``c`` in folder ``out``, with gradients
    reduced in ``reduce_dtype`` (the plan's ``--reduce-dtype``).

    ``final``: the folder the files will be moved to (when ``out`` is a staging folder), which the torchtitan
    module's schedule-CSV path names; default ``out``."""
    from analysis.plan.megatron import megatron_script
    from analysis.plan.torchtitan import torchtitan_config

    out = Path(out)
    sched = plan_schedule(c, study)
    layout = plan_layout(c, model, sched)
    csv = write_torch_csv(sched, out / "schedule.csv")
    titan = torchtitan_config(c, model, global_batch, layout, (Path(final) / csv.name if final else csv).resolve(),
                              reduce_dtype, sched, study)
    cluster = study.costs.cluster if study is not None else None
    megatron = megatron_script(c, model, global_batch, layout, reduce_dtype,
                               cluster.num_devices // cluster.num_nodes if cluster is not None else None)
    return {
        "schedule.csv": csv,
        "torchtitan": atomic_write(out / "torchtitan_plan.py", lambda tmp: tmp.write_text(titan), "torchtitan config"),
        "megatron": atomic_write(out / "megatron.sh", lambda tmp: tmp.write_text(megatron), "Megatron-LM launch script"),
    }
