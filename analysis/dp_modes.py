"""The validation grid's rows of the communication-efficient data-parallel modes (issues 24 and 26).

Beside the exact modes (ddp, sync, zero1, zero2, zero3), a grid row's mode may be:

* ``ps``: synchronous SGD through one parameter server (2 trainers + 1 server: 3 processes, so its runs
  are measured in a process group of their own). The simulator's ``ps`` graph pushes each bucket
  (REDUCE_SCATTER) when ready, the server updates the stage (an OPTIM on the collective stream: the
  profile's optimizer step, or from the run's own trace the server's traced update) and the bucket is
  pulled back (ALL_GATHER);
* ``decentralized``: each replica exchanges its parameters with its one ring neighbour (dp 2), timed
  as a p2p message of the bucket;
* ``local-sgd``: averages the parameters every K steps (the run's ``sync_every``; the grid's K is
  :data:`real.protocol.SYNC_EVERY`, 2). Its steps alternate, so the row
  is scored on the time per step amortized over K steps: predicted ``((K - 1) t_local + t_averaging) / K``
  (:func:`sim.comm_modes.amortized`, both steps simulated), measured the median over rounds of each
  round's mean step time (each round measures whole periods of K steps). The averaging step and the
  plain step are also reported apart (``measured_local`` / ``measured_averaging`` and the predictions);
* ``async-ps``: the asynchronous parameter server at staleness :data:`real.protocol.STALENESS` (1), measured
  in ps's 3-process group; scored on the time per update (dp / the sum of the trainers' rates, equal to a
  trainer's step time when both run alike), predicted by :mod:`analysis.async_grid` (:mod:`sim.async_ps`'s
  loop over the graph's step);
* ``MODE+CODEC`` (``ddp+int8``, ``ddp+fp16``): the mode with ``grad_compression`` CODEC. The profiled
  costs carry the codec as the simulator does (:mod:`sim.compression`): each gradient collective moves
  :func:`schedules.compression.buffer_bytes` of its bucket (its beta scaled by the bytes' ratio) and
  takes the codec's compress + decompress time, the profile's ``codecs`` nanoseconds per element, in its
  latency (alpha).

Nothing here runs anything; :mod:`analysis.calibration` builds the rows.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedules.util import percentile  # re-exported: the grid's spread, as real.measure's

if TYPE_CHECKING:
    from schedules import TaskGraph
    from sim.profiled import ProfiledCosts

__all__ = ["amortized_measured", "codec_costs", "codec_ns", "local_graph",
           "percentile", "predict_mode", "split_mode", "split_steps"]

_GRAD_OPS = ("all_reduce", "reduce_scatter")  # the gradient collectives a codec compresses
ELEM_BYTES = 4  # the runtime's gradients are float32 on CPU


def split_mode(mode: str) -> tuple[str, str]:
    """``ddp+int8`` -> (``ddp``, ``int8``); a mode without a codec -> (mode, ``none``)."""
    dp_mode, _, codec = mode.partition("+")
    return dp_mode, codec or "none"


def codec_ns(dp_profile: str | Path, codec: str) -> float:
    """Nanoseconds per gradient element of ``codec``'s compress + decompress in the profile (its ``codecs``);
    0.0 where the profile lacks it."""
    data = json.loads(Path(dp_profile).read_text())
    value = (data.get("codecs") or {}).get(codec)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else 0.0


def codec_costs(costs: ProfiledCosts, codec: str, ns_per_element: float, buckets: int, world: int = 2
                ) -> ProfiledCosts:
    """``costs`` with the gradient collectives compressed by ``codec`` (module doc): beta / ratio, alpha +
    codec time of a bucket of ``param_bytes / buckets`` bytes of float32 gradients."""
    from schedules.compression import buffer_bytes, parse_compression

    comp = parse_compression(codec)
    if comp.codec == "none":
        return costs
    elements = costs.stages[0].param_bytes / ELEM_BYTES / buckets
    n = max(round(elements), 1)
    ratio = buffer_bytes(comp, reduce=True, padded=n, world=world, elem_bytes=ELEM_BYTES) / (ELEM_BYTES * n)
    extra = ns_per_element * elements * 1e-9
    colls = tuple((op, alpha + extra, beta / ratio) if op in _GRAD_OPS else (op, alpha, beta)
                  for op, alpha, beta in costs.collectives)
    return replace(costs, collectives=colls)


def local_graph(graph: TaskGraph) -> TaskGraph:
    """A local-sgd graph's step that does not average (the same schedule, microbatches and buckets)."""
    from schedules import build, lower, validate
    from schedules.dp import add_data_parallel

    sched = graph.schedule
    plain = lower(build(sched.name, pp=1, microbatches=sched.num_microbatches))
    return validate(add_data_parallel(plain, "local-sgd", list(graph.plan.buckets), averaging=False))


def predict_mode(mode: str, graph: TaskGraph, costs: ProfiledCosts, dp_profile: str | Path | None,
                 sync_every: int = 1, *, measured_collectives: bool = False) -> dict[str, float]:
    """The step time the runtime would measure for ``mode``'s row: ``step`` (local-sgd: amortized over
    ``sync_every`` steps), and for local-sgd ``local`` and ``averaging`` apart. ``measured_collectives``: the
    costs' collective times were read from the mode's own traces, so they hold the codec already."""
    from sim.comm_modes import amortized

    dp_mode, codec = split_mode(mode)
    if codec != "none" and not measured_collectives:
        ns = codec_ns(dp_profile, codec) if dp_profile is not None else 0.0
        costs = codec_costs(costs, codec, ns, graph.plan.buckets[0])
    averaging = predict(graph, costs)
    if dp_mode != "local-sgd":
        return {"step": averaging}
    local = predict(local_graph(graph), costs)
    return {"step": amortized(local, averaging, sync_every), "local": local, "averaging": averaging}


def predict(graph: TaskGraph, costs: ProfiledCosts) -> float:
    """:func:`analysis.calibration.predict` (which imports this module): the simulated step, as measured."""
    from sim import simulate
    from sim.profiled import step_time

    return step_time(simulate(graph, costs, check=False), costs)


def amortized_measured(step_times: Sequence[Sequence[float]]) -> tuple[float, tuple[float, ...]]:
    """(the median over rounds of each round's mean step time, the round means)."""
    means = tuple(statistics.fmean(r) for r in step_times if r)
    return statistics.median(means), means


def split_steps(frames: Sequence[Any]) -> tuple[float | None, float | None]:
    """Median wall time of the traced local-sgd steps that ran no collective (plain) and of those that did
    (averaging), from the traces' rows and their ``step_times``."""
    from schedules.trace import trace_steps

    local, averaging = [], []
    for df in frames:
        walls = df.attrs.get("step_times", {})
        for step, part in trace_steps(df).items():
            if str(step) not in walls:
                continue
            ran = bool((part["stream"] == "collective").any())
            (averaging if ran else local).append(float(walls[str(step)]))
    return (statistics.median(local) if local else None, statistics.median(averaging) if averaging else None)
