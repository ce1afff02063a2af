"""Data-parallel sync with expert parallelism: the dense parameters over every replica, the experts over theirs.

With ``ep`` N (:mod:`real.moe`) a stage's dense parameters are on all dp replicas and are averaged over them as
without experts (:class:`real.dp.sync.GradSync`, mode sync, ddp or zero1, the stage's data-parallel group; zero1
shards each part's optimizer state over its own group). An expert is
on dp / N replicas, one per ep group: its gradients are summed over that *expert data-parallel* group and divided
by dp, not by dp / N. Each ep group's gradient of an expert already sums what its N replicas' tokens contributed
(the combine all-to-all's backward brings them to the expert), each replica's loss being its own batch's; the
sum over the dp / N groups is then the sum over all dp replicas, and dividing by dp is the dense average.
Expert buckets are numbered after the stage's dense buckets in the trace (``{s}ALLREDUCE_b{k}``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist
from torch import nn

from real.dp.sync import GradSync

__all__ = ["ExpertDataSync"]


class ExpertDataSync:
    """Two :class:`GradSync`: ``dense`` over ``group`` (dp), ``experts`` over ``expert_group`` (dp / ep).

    ``parts`` is both, dense first: a zero1 checkpoint gathers and loads each over its own group (real.trainer).
    """

    codec = None  # no gradient codec with expert parallelism (real.config refuses one)

    def __init__(self, dense: dict[int, Sequence[nn.Parameter]], experts: dict[int, Sequence[nn.Parameter]], *,
                 group: dist.ProcessGroup, expert_group: dist.ProcessGroup, **kw) -> None:
        self.dense = GradSync(dense, group=group, **kw)
        first = {}
        for b in self.dense.buckets:
            first[b.stage] = max(first.get(b.stage, 0), b.index + 1)
        self.experts = GradSync(experts, group=expert_group, average_over=dist.get_world_size(group),
                                first_bucket=first, **kw)
        self.mode = self.dense.mode
        self.parts = (self.dense, self.experts)

    @property
    def step_bytes(self) -> int:
        return self.dense.step_bytes + self.experts.step_bytes

    def optimizer_params(self) -> dict[int, list]:
        out: dict[int, list] = {}
        for part in self.parts:
            for s, params in part.optimizer_params().items():
                out.setdefault(s, []).extend(params)
        return out

    def begin_step(self) -> None:
        for part in self.parts:
            part.begin_step()

    def poll(self) -> None:
        for part in self.parts:
            part.poll()

    def before_task(self, tid: int) -> None:
        """Parameters are whole in sync, ddp and zero1: nothing to gather."""

    def after_task(self, tid: int) -> None:
        """Nothing to free in sync, ddp and zero1."""

    def transient(self) -> dict[str, int]:
        return {}

    def gather_all(self) -> None:
        """Parameters are whole in sync, ddp and zero1 (zero1's after_step gathered them)."""

    def finish(self) -> None:
        for part in self.parts:
            part.finish()

    def after_step(self) -> None:
        for part in self.parts:
            part.after_step()

    @property
    def on_gather(self):
        return self.dense.on_gather

    @on_gather.setter
    def on_gather(self, fn) -> None:
        for part in self.parts:
            part.on_gather = fn
