"""The parameter copies decentralized and local-sgd do on the training thread around their exchanges, as costs.

:mod:`real.dp.peer_sync` moves parameters, not gradients, and copies them on the trainer's thread:

* ``decentralized``, before the step's first pass (``PeerSync._launch``): each bucket's parameters x_t are
  concatenated into one flat buffer (``torch.cat``), the neighbours' receive buffers allocated and the
  isend/irecv posted. The simulator charges stage bytes x ``flatten`` to the rank's first compute task (the
  exchanges are posted during it: they still start with the step, a simplification of a few hundred microseconds);
* ``decentralized``, after the last backward (``PeerSync.finish``): once the exchanges are in, each bucket's mean of
  x_t and the neighbours' (a clone and an add per neighbour over the flat buffers) written into every parameter
  (``copy_``). Charged stage bytes x ``average`` to the stage's OPTIM, which waits for it in the runtime;
* ``local-sgd``, on an averaging step, per bucket (torch's ``average_parameters``, called by
  ``PeriodicModelAverager``): the bucket flattened into one buffer, divided by the world size, all-reduced,
  and the parameters pointed back at slices of it (``p.data = ...``: no copy back, only the flatten and the
  division are copies). The all-reduce itself is the ALLREDUCE's alpha + n / beta;
  bucket bytes x ``local_sgd`` (the CPU around it) is added to that ALLREDUCE, which runs them one bucket after
  another as the runtime does.

The three are nanoseconds per parameter byte, measured by :mod:`real.profile.param_copy` (the cost file's
``param_copy`` section: decentralized's two in wall time, local-sgd's in the trainer thread's CPU time, as the
step waits for them); a file without it (older profiles, ``--dp 1``) charges nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common.errors import CostFileError, quote
from schedules import Kind, Stream

if TYPE_CHECKING:
    from schedules import TaskGraph

__all__ = ["PARAM_COPY_FIELDS", "ParamCopy", "charge_param_copies", "param_copy_section"]

# the cost file's param_copy fields -> ParamCopy's
PARAM_COPY_FIELDS = {"flatten_ns_per_byte": "flatten", "average_ns_per_byte": "average",
                     "local_sgd_ns_per_byte": "local_sgd"}


def _ns(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise CostFileError(f"{name} must be a finite number of nanoseconds per parameter byte >= 0 (0: that copy "
                            f"is not charged), got {quote(value)}")
    return float(value)


@dataclass(frozen=True, slots=True)
class ParamCopy:
    """Nanoseconds per parameter byte of decentralized's flatten (+ posting) and averaging back, and of
    local-sgd's copies around each bucket's all-reduce (module doc); 0.0: not charged."""

    flatten: float = 0.0
    average: float = 0.0
    local_sgd: float = 0.0

    def __post_init__(self) -> None:
        for name in ("flatten", "average", "local_sgd"):
            _ns(getattr(self, name), f"profiled costs: param_copy.{name}")


def param_copy_section(section: Any, where: str) -> ParamCopy:
    """The file's ``param_copy`` section (absent or null: nothing charged)."""
    if section is None:
        return ParamCopy()
    if not isinstance(section, dict):
        raise CostFileError(f"{where}: param_copy must be an object of {', '.join(PARAM_COPY_FIELDS)} or null, "
                            f"got {quote(section)}")
    return ParamCopy(**{mine: _ns(section.get(key, 0.0), f"{where}: param_copy.{key}")
                        for key, mine in PARAM_COPY_FIELDS.items()})


def charge_param_copies(copy: ParamCopy, graph: TaskGraph, param_bytes: list[float], out: list[float]) -> None:
    """Add the copies to ``out`` (the tasks' durations) where the runtime does them (module doc);
    ``param_bytes[s]``: stage s's parameter bytes."""
    plan = getattr(graph, "plan", None)
    if plan is None or plan.mode not in ("decentralized", "local-sgd"):
        return
    if plan.mode == "local-sgd":
        for i, t in enumerate(graph.tasks):
            if t.action.kind is Kind.ALLREDUCE:
                out[i] += param_bytes[t.action.stage] / plan.buckets[t.action.stage] * copy.local_sgd * 1e-9
        return
    for prog in graph.programs:
        compute = [i for i in prog if graph.tasks[i].stream is Stream.COMPUTE]
        if not compute:
            continue
        stages = {graph.tasks[i].action.stage for i in compute if graph.tasks[i].action.kind is Kind.OPTIM}
        out[compute[0]] += sum(param_bytes[s] for s in stages) * copy.flatten * 1e-9
        for i in compute:
            if graph.tasks[i].action.kind is Kind.OPTIM:
                out[i] += param_bytes[graph.tasks[i].action.stage] * copy.average * 1e-9
