"""zb-auto in physical units: a memory limit in bytes turned into the schedule's activation budget in M_B.

zb-auto (:mod:`schedules.library.zb_auto`) plans in M_B, one microbatch's activations of a rank's whole share
of layers, under one limit for every rank. On a real model and cluster a device holds more than activations,
and one M_B is a different number of bytes on each stage (the first stage's embedding, the last one's fp32
logits, uneven layer splits). So for a limit of L bytes per device:

* rank r holds S_r bytes that are not activations: its stage's weights, gradients and optimizer states under
  the layout's dp mode, and under zero3/fsdp the gathered weights of the stage while it computes
  (:func:`held_bytes`, the same figures as :meth:`sim.plan.study.StudyResult.devices`);
* one M_B of rank r is A_r bytes, :meth:`TransformerCosts.stage_activations` of its stage;
* the budget is min over r of (L - S_r) / A_r M_B: the tightest rank's, so every rank stays within L.

A rank whose S_r alone reaches L, or a budget under the one microbatch any schedule holds between its F and its
I (:data:`schedules.library.zb_auto.MIN_MEM_LIMIT`), is refused naming both numbers.

The pass times zb-auto plans with come from the same cost model: tf, tb (the I pass) and tw of a middle stage,
tcomm the slowest hop between neighbouring pipeline ranks (a boundary activation over that link), mw the share
of a layer's activations the W pass still holds (:meth:`TransformerConfig.w_held_fraction`), as the simulator
counts them.

    >>> from sim.plan.budget import parse_bytes
    >>> parse_bytes("60GB"), parse_bytes("56GiB"), parse_bytes("6e10")
    (60000000000.0, 60129542144.0, 60000000000.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from common import parse
from common.errors import ConfigError
from schedules import Kind, ZBAutoOptions
from schedules.library.zb_auto import MIN_MEM_LIMIT
from sim.costs.parallel import ParallelConfig
from sim.costs.transformer_costs import TransformerCosts
from sim.memory import moe_state_bytes

__all__ = ["SIZE_UNITS", "ActivationBudget", "activation_budget", "held_bytes", "parse_bytes", "zb_auto_options"]

SIZE_UNITS = parse.SIZE_UNITS


def parse_bytes(value: Any, field: str = "mem_limit") -> float:
    """A size in bytes from ``value``: a number, or text such as ``"60GB"``; :func:`common.parse.size`."""
    return parse.size(value, field)


def held_bytes(costs: TransformerCosts, stages: tuple[int, ...] | list[int], num_stages: int) -> tuple[float, float]:
    """(model states, gathered weights) in bytes on a rank holding ``stages``: weights, gradients (fp32 with
    ``reduce_dtype`` fp32) and optimizer states of its parameters under the layout's dp mode (:mod:`sim.memory`; a
    MoE model's routed experts sharded over their ``expert_dp`` replicas), and zero3/fsdp's gathered 16-bit
    weights at the peak (:func:`_gathered_bytes`)."""
    p = costs.parallel
    params = [costs.stage_params(st, num_stages) for st in stages]
    grad = 4 if getattr(costs, "reduce_dtype", "bf16") == "fp32" else 2  # an fp32 accumulator (its shard under zero2/3)
    experts = sum(costs.stage_expert_params(st, num_stages) for st in stages)
    return moe_state_bytes(sum(params), experts, p.dp_mode, p.dp, costs.expert_dp, grad), _gathered_bytes(params, p)


def _gathered_bytes(stage_params: list[float], p: ParallelConfig) -> float:
    """ZeRO-3's gathered 16-bit parameters at the peak: one stage's (the largest) while a pass runs; with
    ``fsdp_reshard_after_forward`` off a forward's stay gathered until its backward, so every stage of the rank."""
    if p.dp_mode not in ("zero3", "fsdp"):
        return 0.0
    return 2 * (max(stage_params) if p.fsdp_reshard_after_forward else sum(stage_params))


@dataclass(frozen=True, slots=True)
class ActivationBudget:
    """A memory limit per device as zb-auto's activation budget: per rank r (stage r) the bytes it holds that are
    not activations (``held``), one M_B in bytes (``microbatch_bytes``); ``mem_limit`` is the budget in M_B, the
    tightest rank's (``rank``)."""

    limit_bytes: float
    held: tuple[float, ...]
    microbatch_bytes: tuple[float, ...]
    mem_limit: float
    rank: int

    @property
    def activation_bytes(self) -> tuple[float, ...]:
        """Per rank, the activation bytes the budget allows: mem_limit M_B of that rank."""
        return tuple(self.mem_limit * a for a in self.microbatch_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"limit_bytes": self.limit_bytes, "mem_limit_mb": self.mem_limit, "rank": self.rank,
                "activation_budget_bytes": self.mem_limit * self.microbatch_bytes[self.rank],
                "held_bytes_per_rank": list(self.held), "microbatch_bytes_per_rank": list(self.microbatch_bytes),
                "activation_bytes_per_rank": list(self.activation_bytes)}

    def format(self) -> str:
        r = self.rank
        return (f"zb-auto memory limit {self.limit_bytes:,.0f} bytes ({self.limit_bytes / 1e9:.4g} GB) per device = "
                f"{self.mem_limit:.4g} M_B of "
                f"activations: rank {r}, the tightest, holds {self.held[r] / 1e9:.4g} GB of model states and "
                f"{self.mem_limit * self.microbatch_bytes[r] / 1e9:.4g} GB of activations at most "
                f"(1 M_B = {self.microbatch_bytes[r] / 1e9:.4g} GB there)")


def activation_budget(costs: TransformerCosts, limit_bytes: float) -> ActivationBudget:
    """``limit_bytes`` per device as zb-auto's budget in M_B for ``costs``'s model, cluster and layout (one stage
    per rank); refuses a limit that the model states alone reach, or that leaves less than one microbatch."""
    limit = parse_bytes(limit_bytes)
    pp = costs.parallel.pp
    held = tuple(sum(held_bytes(costs, (r,), pp)) for r in range(pp))
    act = tuple(costs.stage_activations(r, pp) for r in range(pp))
    worst = max(range(pp), key=lambda r: (held[r], -r))
    if held[worst] >= limit:
        raise ConfigError(f"mem_limit {limit / 1e9:.6g} GB ({limit:.6g} bytes) is not more than the "
                          f"{held[worst] / 1e9:.6g} GB ({held[worst]:.6g} bytes) rank {worst} holds before any "
                          f"activation (parameters, gradients and optimizer states, dp mode "
                          f"{costs.parallel.dp_mode}); raise the limit or shard the states (dp mode zero1/2/3)",
                          field="mem_limit")
    budgets = [((limit - held[r]) / act[r] if act[r] > 0 else math.inf, r) for r in range(pp)]
    mem_limit, rank = min(budgets)
    if mem_limit < MIN_MEM_LIMIT:
        raise ConfigError(f"mem_limit {limit / 1e9:.6g} GB leaves rank {rank} {(limit - held[rank]) / 1e9:.6g} GB "
                          f"for activations after its {held[rank] / 1e9:.6g} GB of model states, under the "
                          f"{act[rank] / 1e9:.6g} GB of the one microbatch any schedule holds between its F and I "
                          f"({mem_limit:.4g} M_B < {MIN_MEM_LIMIT:g}); raise the limit or use smaller microbatches",
                          field="mem_limit")
    if math.isinf(mem_limit):  # no stage holds activations: any order fits
        mem_limit = float(pp)
    return ActivationBudget(limit, held, act, mem_limit, rank)


def zb_auto_options(costs: TransformerCosts, mem_limit: float | str | None = None,
                    time_limit: float | None = None) -> tuple[ZBAutoOptions, ActivationBudget | None]:
    """What zb-auto plans with on ``costs``'s model, cluster and layout (the module docstring), and the budget
    that ``mem_limit`` (bytes per device, or text such as ``"60GB"``; None: zb-auto's default of pp M_B) gives.
    ``time_limit``: seconds of exact search (None: zb-auto's default)."""
    p = costs.parallel
    pp = p.pp
    n = min(pp - 1, max(1, pp // 2))  # a middle stage; the only one at pp=1
    times = {k: costs.pass_time(kind, n, pp) for k, kind in (("tf", Kind.F), ("tb", Kind.I), ("tw", Kind.W))}
    hop = costs.local.boundary_bytes(costs.microbatch_size) / p.tp
    tcomm = max((costs.cluster.link_between(p.device(r), p.device(r + 1)).time(hop) for r in range(pp - 1)),
                default=0.0)
    budget = None if mem_limit is None else activation_budget(costs, mem_limit)
    extra: dict[str, float] = {} if time_limit is None else {"time_limit": time_limit}
    options = ZBAutoOptions(**times, tcomm=tcomm, mw=costs.model.w_held_fraction(costs.recompute),
                            mem_limit=None if budget is None else budget.mem_limit, **extra)
    return options, budget
