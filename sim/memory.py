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
* ps (optimizer on the servers): 2 Psi + 2 Psi on the worker

Psi is the rank's parameters per tensor shard (all its stages). Activations
are the engine's peak in bytes (program order, held from a pass's start, freed
at its end). Not counted: framework workspace, fragmentation, communication buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceMemory", "model_state_bytes"]


def model_state_bytes(psi: float, mode: str, dp: int) -> float:
    """Bytes of weights, gradients and optimizer states of ``psi`` parameters under ``mode``."""
    if mode in ("none", "sync", "ddp"):
        return 16 * psi
    if mode == "zero1":
        return 4 * psi + 12 * psi / dp
    if mode == "zero2":
        return 2 * psi + 14 * psi / dp
    if mode in ("zero3", "fsdp"):
        return 16 * psi / dp
    if mode == "ps":
        return 4 * psi
    raise ValueError(f"unknown dp mode {mode!r}")


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
