"""Activation-recomputation policies by name, as the training stacks define them.

* ``none``: every activation a layer's backward needs is kept.
* ``selective`` (Megatron-LM, Korthikanti et al. 2022, sec. 5): the attention
  core (QK^T, softmax, dropout, the product with V) is recomputed; with a fused
  (flash) attention kernel there is nothing of s x s size to drop.
* ``full`` (Megatron-LM ``--recompute-granularity full``; torchtitan ``mode = "full"``):
  only each layer's input is kept; the whole forward runs again in the backward.
* ``selective-op`` (torchtitan ``mode = "selective"``, ``selective_ac_option = "op"``,
  torchtitan/distributed/activation_checkpoint.py): every op's output is
  recomputed except the outputs of the attention kernel and of the matmuls, of
  which every second one is recomputed too (the policy counts the layer's mm calls
  and saves the odd ones: q, v, gate and down of a Llama layer; k, out, up are recomputed).
* ``layer:N`` (torchtitan ``selective_ac_option = "N"``): every N-th layer is
  checkpointed in full, the others keep everything; ``layer:1`` is ``full``.
"""

from __future__ import annotations

from common import parse
from common.errors import ConfigError, quote

__all__ = ["PLANNER_MODES", "check_recompute", "key_recompute", "layer_every"]

#: The modes the planner searches by default (the named policies of Megatron-LM).
PLANNER_MODES = ("none", "selective", "full")
_NAMED = ("none", "selective", "full", "selective-op")


def layer_every(mode: str) -> int:
    """N of ``layer:N``; 0 for the other modes."""
    return int(mode.split(":", 1)[1]) if mode.startswith("layer:") else 0


def check_recompute(owner: str, value: object, error: type[ConfigError] = ConfigError) -> str:
    """``value`` if it names a policy (module docstring), else a one-line error naming the valid ones."""
    if isinstance(value, str) and value in _NAMED:
        return value
    if isinstance(value, str) and value.startswith("layer:"):
        n = parse.int_text(value.split(":", 1)[1])
        if n is not None and 1 <= n <= parse.MAX_INT:
            return f"layer:{n}"
    raise error(f"{owner}: unknown recompute {quote(value)}; valid: {', '.join(_NAMED)}, layer:N (N >= 1: every "
                "N-th layer in full)", field="recompute")


def key_recompute(owner: str, key: str, value: object, error: type[ConfigError] = ConfigError) -> None:
    """The [run] table's check (sim.costs.cluster.KeyCheck's signature)."""
    check_recompute(owner, value, error)
