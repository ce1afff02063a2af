"""Memory per device in bytes: model states by DP mode plus the simulated activation peak.

Model states of mixed-precision Adam for Psi parameters on one device
(Rajbhandari et al. 2020, "ZeRO", sec. 3.1): fp16 weights 2 Psi, fp16
gradients 2 Psi, fp32 master weights, momentum and variance 12 Psi; with N
data-parallel replicas:

* none, sync, ddp: 2 Psi + 2 Psi + 12 Psi = 16 Psi
* zero1 (optimizer states sharded): 2 Psi + 2 Psi + 12 Psi / N
* zero2 (and gradients): 2 Psi + (2 + 12) Psi / N
* zero3 / fsdp (and weights): 16 Psi / N, plus the gathered fp16 weights of
  the largest stage of the rank while it computes (2 Psi_stage)
* ps (optimizer on the servers): 2 Psi + 2 Psi on the worker; each of K
  servers holds 1/K of every stage's weights, gradients and optimizer state
  (:func:`server_memory`)

Psi is the rank's parameters per tensor shard (all its stages). Activations
are the engine's peak in bytes (program order, held from a pass's start, freed
at its end). Not counted: framework workspace, fragmentation, communication buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedules import TaskGraph
from sim.costs.uniform import UniformCosts
from sim.engine import simulate

__all__ = ["DeviceMemory", "ModelStates", "model_state_bytes", "model_states", "moe_state_bytes", "rank_memory", "server_memory"]


@dataclass(frozen=True, slots=True)
class ModelStates:
    """Bytes of one device's weights, gradients and optimizer state (and ZeRO-3's gathered weights)."""

    params: float
    grads: float
    optimizer: float
    gathered: float = 0.0  # zero3: one stage's whole weights while it computes, not part of the total

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


_SHARDED = {  # mode -> which of (weights, gradients, optimizer state) are split over the N replicas
    "none": (False, False, False), "sync": (False, False, False), "ddp": (False, False, False),
    "zero1": (False, False, True), "zero2": (False, True, True), "zero3": (True, True, True),
    "fsdp": (True, True, True),
    # each replica holds its own whole model; decentralized's exchange buffers (x_t and the neighbours') are
    # transient and not counted
    "decentralized": (False, False, False), "local-sgd": (False, False, False),
}


def model_states(psi: float, mode: str, dp: int, *, weight_bytes: float = 2, grad_bytes: float = 2,
                 optimizer_bytes: float = 12, stage_psi: float = 0.0) -> ModelStates:
    """Model states of ``psi`` parameters by category; bytes per parameter default to mixed-precision Adam.

    The runtime's fp32 training is ``weight_bytes=4, grad_bytes=4`` and ``optimizer_bytes`` 4 (SGD with
    momentum: one buffer) or 8 (AdamW: two moments; its step counters are not counted). ``stage_psi``: the
    largest stage of the rank, whose whole weights zero3 gathers. ps: the optimizer runs on the servers.
    """
    if mode in ("ps", "async-ps"):
        return ModelStates(weight_bytes * psi, grad_bytes * psi, 0.0)
    if mode not in _SHARDED:
        raise ValueError(f"unknown dp mode {mode!r}")
    w, g, o = (dp if split else 1 for split in _SHARDED[mode])
    gathered = weight_bytes * stage_psi if mode in ("zero3", "fsdp") else 0.0
    return ModelStates(weight_bytes * psi / w, grad_bytes * psi / g, optimizer_bytes * psi / o, gathered)


def rank_memory(graph: TaskGraph, stage_params: Sequence[int], rank: int, mode: str, dp: int, *,
                microbatch_bytes: float, weight_bytes: float = 4, grad_bytes: float = 4,
                optimizer_bytes: float = 8) -> dict[str, float]:
    """The simulator's bytes on pipeline rank ``rank``, by category, in the keys of the runtime's
    ``RunResult.memory``: model states of its stages (``stage_params[s]`` parameters each) under ``mode``, and
    the engine's activation peak (in M_B, uniform costs) times ``microbatch_bytes`` (one M_B of the rank).
    Bytes per parameter default to the runtime's fp32 training with AdamW."""
    stages = graph.schedule.stages_of(rank)
    states = model_states(sum(stage_params[s] for s in stages), mode if dp > 1 or mode in ("ps", "async-ps") else "none", dp,
                          weight_bytes=weight_bytes, grad_bytes=grad_bytes, optimizer_bytes=optimizer_bytes,
                          stage_psi=max(stage_params[s] for s in stages))
    peak = simulate(graph, UniformCosts()).ranks[rank].peak_activations
    return {"param_bytes": states.params, "grad_bytes": states.grads, "optimizer_bytes": states.optimizer,
            "gathered_param_bytes": states.gathered, "peak_activation_bytes": peak * microbatch_bytes}


def server_memory(stage_params: Sequence[int], servers: int, *, weight_bytes: float = 4, grad_bytes: float = 4,
                  optimizer_bytes: float = 8) -> dict[str, float]:
    """One of ``servers`` parameter servers (dp mode ps): 1/servers of every stage's weights, their gradients and
    optimizer state, in the keys of the runtime's ``RunResult.memory`` (no activations: servers run no passes)."""
    psi = sum(stage_params) / servers
    return {"param_bytes": weight_bytes * psi, "grad_bytes": grad_bytes * psi, "optimizer_bytes": optimizer_bytes * psi,
            "gathered_param_bytes": 0.0, "peak_activation_bytes": 0.0}


def model_state_bytes(psi: float, mode: str, dp: int, grad_bytes: float = 2) -> float:
    """Bytes of weights, gradients and optimizer states of ``psi`` parameters under ``mode`` (``grad_bytes`` 4:
    gradients accumulated in fp32, as with ``reduce_dtype`` fp32)."""
    return model_states(psi, mode, dp, grad_bytes=grad_bytes).total


def moe_state_bytes(psi: float, experts: float, mode: str, dp: int, expert_dp: int, grad_bytes: float = 2) -> float:
    """:func:`model_state_bytes` of ``psi`` parameters of which ``experts`` are a MoE model's routed experts: those
    sharded over their ``expert_dp`` replicas (dp x cp / ep), not over the ``dp`` the rest is."""
    if not experts:
        return model_state_bytes(psi, mode, dp, grad_bytes)
    return (model_state_bytes(psi - experts, mode, dp, grad_bytes)
            + model_state_bytes(experts, mode if expert_dp > 1 else "none", expert_dp, grad_bytes))


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One pipeline rank's device: what it holds against what it has."""

    rank: int
    device: str
    model_state_bytes: float
    activation_bytes: float
    gather_bytes: float  # zero3: the gathered weights of the stage being computed
    capacity_bytes: float

    @property
    def memory_bytes(self) -> float:
        return self.model_state_bytes + self.activation_bytes + self.gather_bytes

    @property
    def overflow(self) -> bool:
        return self.memory_bytes > self.capacity_bytes

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "device": self.device,
            "memory_bytes": self.memory_bytes,
            "model_state_bytes": self.model_state_bytes,
            "activation_bytes": self.activation_bytes,
            "gather_bytes": self.gather_bytes,
            "capacity_bytes": self.capacity_bytes,
            "overflow": self.overflow,
        }
