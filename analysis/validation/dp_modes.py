"""The validation grid's rows of the communication-efficient data-parallel modes (servers, peers, codecs).

Beside the exact modes (ddp, sync, zero1, zero2, zero3), a grid row's mode may be:

* ``ps``: synchronous SGD through one parameter server (2 trainers + 1 server: 3 processes, so its runs
  are measured in a process group of their own). The simulator's ``ps`` graph pushes each bucket
  (REDUCE_SCATTER) when ready, the server updates the stage (an OPTIM on the collective stream: the
  profile's optimizer step, or from the run's own trace the server's traced update) and the bucket is
  pulled back (ALL_GATHER);
* ``decentralized``: each replica exchanges its parameters with its one ring neighbour (dp 2), timed
  as a p2p message of the bucket;
* ``local-sgd``: averages the parameters every K steps (the run's ``sync_every``; the grid's K is
  :data:`real.profile.protocol.SYNC_EVERY`, 2). Its steps alternate, so the row
  is scored on the time per step amortized over K steps: predicted ``((K - 1) t_local + t_averaging) / K``
  (:func:`sim.plan.comm_modes.amortized`, both steps simulated), measured the median over rounds of each
  round's mean step time (each round measures whole periods of K steps). The averaging step and the
  plain step are also reported apart (``measured_local`` / ``measured_averaging`` and the predictions);
* ``async-ps``: the asynchronous parameter server at staleness :data:`real.profile.protocol.STALENESS` (1), measured
  in ps's 3-process group; scored on the time per update (dp / the sum of the trainers' rates, equal to a
  trainer's step time when both run alike), predicted by :mod:`analysis.validation.async_grid` (:mod:`sim.costs.async_ps`'s
  loop over the graph's step);
* ``MODE+CODEC`` (``ddp+int8``, ``ddp+fp16``, ``ddp+bf16``): the mode with ``grad_compression`` CODEC. The
  profiled costs carry the codec as the simulator does (:mod:`sim.costs.compression`): each gradient collective
  moves :func:`schedules.dp.codecs.buffer_bytes` of its bucket (its beta scaled by the bytes' ratio) and
  takes the codec's compress + decompress time, the profile's ``codecs`` nanoseconds per element, in its
  latency (alpha);
* ``ddp+powersgd:R``: the runtime waits for each bucket's PowerSGD hook where the bucket is launched, on the
  trainer's thread, inside the backward pass that completes the bucket (a trace shows that pass stretched
  by every hook and the bucket's row ending with it: docs/compression.md). So the hooks are not on the
  collective: the gradient collectives take no time, and the step gets :func:`hook_time` more, on its
  last backward. Where the data-parallel profile has the hooks measured (its ``powersgd`` section,
  :mod:`real.profile.powersgd`), that is the hooks it measured (:func:`measured_hooks`): the hook calls of
  one backward, each bucket's launched from inside a real backward of the stage as a run launches it
  (``in_backward``, :mod:`real.profile.psgd_backward`: the compute between buckets, the replicas' drift and
  the future callbacks' hand-offs are in it); in a profile older than that, the sum of the buckets' hooks
  timed back to back on the data-parallel group (which sees neither drift nor a backward in progress).
  Otherwise (an older profile) it is built up: the codec's compute (the profile's ``codecs`` ns per element)
  and per bucket torch's three all-reduces (the whole tensors, then P, then Q), each waited for before the
  next: the profile's small all-reduce waited for alone (:func:`single_all_reduce`: its ``small`` fit over
  the sizes PowerSGD sends, else ``single``), alpha each and the bucket's factors and whole tensors over beta
  (:func:`schedules.dp.codecs.buffer_bytes` of the model's parameter shapes). On the CPU testbed that
  build-up falls far short of the measured hooks: an all-reduce issued from the hook's future callbacks and
  waited for there takes several times a plain one of its size (docs/compression.md).

Every mode whose replicas wait for each other each step also gets the skew between them
(:mod:`analysis.validation.dp_skew`): a fraction, measured in the calibration run, of the simulated step's busy time.

Nothing here runs anything; :mod:`analysis.validation.calibration` builds the rows.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schedules.util import percentile  # re-exported: the grid's spread, as real.measure's

if TYPE_CHECKING:
    from schedules import TaskGraph
    from sim.costs.profiled import ProfiledCosts
    from sim.engine import SimResult

__all__ = ["HOOK_COLLECTIVES", "amortized_measured", "codec_costs", "codec_ns", "hook_time", "local_graph",
           "measured_hooks", "percentile", "predict_mode", "simulate_mode", "single_all_reduce", "split_mode", "split_steps"]

log = logging.getLogger(__name__)

_GRAD_OPS = ("all_reduce", "reduce_scatter")  # the gradient collectives a codec compresses
ELEM_BYTES = 4  # the runtime's gradients are float32 on CPU
# torch's powerSGD_hook (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py, 2.13): an all-reduce of the
# tensors sent whole, then of P, then of Q, each started from the previous one's callback
HOOK_COLLECTIVES = 3


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
    from schedules.dp.codecs import buffer_bytes, parse_compression

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
    from schedules.dp.modes import add_data_parallel

    sched = graph.schedule
    plain = lower(build(sched.name, pp=1, microbatches=sched.num_microbatches))
    return validate(add_data_parallel(plain, "local-sgd", list(graph.plan.buckets), averaging=False))


def single_all_reduce(dp_profile: str | Path) -> tuple[float, float]:
    """(alpha, beta) of one small all-reduce waited for alone, from the data-parallel profile (its
    ``collectives.all_reduce.small``, fitted over the sizes PowerSGD sends; ``single``, fitted on MBs, where it
    has none; the burst fit where it has neither). beta None: infinite."""
    data = json.loads(Path(dp_profile).read_text())
    section = (data.get("collectives") or {}).get("all_reduce")
    if not isinstance(section, dict):
        raise ValueError(f"{dp_profile}: the profile has no all_reduce timing; profile a data-parallel pair (real.profile, dp 2)")
    fit = next((section[k] for k in ("small", "single") if isinstance(section.get(k), dict)), section)
    beta = fit.get("beta")
    return float(fit["alpha"]), math.inf if beta is None else float(beta)


def measured_hooks(dp_profile: str | Path, codec: str, buckets: int) -> float | None:
    """Seconds of a step's ``codec`` (``powersgd:R``) hooks as the profile measured them (its ``powersgd``
    section): the median over repetitions and ranks of a backward's hook calls launched from inside a real
    backward (``in_backward.hooks``, real.profile.psgd_backward); in a profile without it (older than that) the
    sum over the run's buckets of each bucket's median hook on the data-parallel group, timed back to back
    (``buckets[].wall``); None where the profile lacks both. A graph of another bucket count than the profile's
    gets the profiled mean per bucket times its ``buckets`` (logged)."""
    data = json.loads(Path(dp_profile).read_text())
    section = (data.get("powersgd") or {}).get(codec)
    if not isinstance(section, dict) or not section.get("buckets"):
        return None
    inside = section.get("in_backward")
    if isinstance(inside, dict):
        total, profiled = float(inside["hooks"]["median"]), int(inside["buckets"])
    else:
        walls = [float(b["wall"]["median"]) for b in section["buckets"]]
        total, profiled = sum(walls), len(walls)
    if profiled == buckets:
        return total
    log.warning("%s: the profile's %s hooks were measured on %d buckets, the graph has %d; charging their mean "
                "per bucket", dp_profile, codec, profiled, buckets)
    return total / profiled * buckets


def hook_time(ns_per_element: float, elements: float, buckets: int, payload_bytes: float, alpha: float,
              beta: float) -> float:
    """Seconds a step's PowerSGD hooks hold the trainer's thread (module doc): the codec's compute,
    ``ns_per_element`` x ``elements``, and per bucket :data:`HOOK_COLLECTIVES` all-reduces waited for in turn,
    ``alpha`` each, with the step's ``payload_bytes`` (factors and whole tensors) over ``beta``."""
    return ns_per_element * elements * 1e-9 + HOOK_COLLECTIVES * buckets * alpha + payload_bytes / beta


def _powersgd_hooks(codec: str, costs: ProfiledCosts, dp_profile: str | Path | None, buckets: int,
                    shapes: Sequence[tuple[int, ...]]) -> tuple[ProfiledCosts, float]:
    """(``costs`` with the gradient collectives taking no time, the seconds of the step's hooks: measured
    (:func:`measured_hooks`), else :func:`hook_time`)."""
    from schedules.dp.codecs import buffer_bytes, parse_compression

    if dp_profile is None or not shapes:
        raise ValueError(f"a {codec} row needs the data-parallel profile and the model's parameter shapes "
                         "(Calibration.of(..., dp_shapes=)); give both")
    measured = measured_hooks(dp_profile, codec, buckets)
    if measured is not None:
        return _no_grad_collectives(costs), measured
    elements = sum(math.prod(s) for s in shapes)
    payload = buffer_bytes(parse_compression(codec), reduce=True, padded=elements, world=2, shapes=shapes,
                           elem_bytes=ELEM_BYTES)
    hooks = hook_time(codec_ns(dp_profile, codec), elements, buckets, payload, *single_all_reduce(dp_profile))
    return _no_grad_collectives(costs), hooks


def _no_grad_collectives(costs: ProfiledCosts) -> ProfiledCosts:
    """``costs`` with the gradient collectives taking no time (PowerSGD's are in its hooks)."""
    colls = tuple((op, 0.0, math.inf) if op in _GRAD_OPS else (op, a, b) for op, a, b in costs.collectives)
    return replace(costs, collectives=colls)


def simulate_mode(mode: str, graph: TaskGraph, costs: ProfiledCosts, dp_profile: str | Path | None, *,
                  measured_collectives: bool = False, shapes: Sequence[tuple[int, ...]] = ()
                  ) -> tuple[SimResult, ProfiledCosts, float]:
    """``mode``'s graph simulated under ``costs`` with its codec (module doc): (the result, the costs it ran
    under, the seconds of PowerSGD's hooks to add to its last backward, 0 for the other codecs).
    ``measured_collectives``: the costs were read from the mode's own traces, which hold the codec already."""
    from sim import simulate

    codec = split_mode(mode)[1]
    hooks = 0.0
    if codec != "none" and not measured_collectives:
        if codec.startswith("powersgd"):
            costs, hooks = _powersgd_hooks(codec, costs, dp_profile, graph.plan.buckets[0], shapes)
        else:
            ns = codec_ns(dp_profile, codec) if dp_profile is not None else 0.0
            costs = codec_costs(costs, codec, ns, graph.plan.buckets[0])
    return simulate(graph, costs, check=False), costs, hooks


def predict_mode(mode: str, graph: TaskGraph, costs: ProfiledCosts, dp_profile: str | Path | None,
                 sync_every: int = 1, *, measured_collectives: bool = False, skew: float = 0.0,
                 shapes: Sequence[tuple[int, ...]] = ()) -> dict[str, float]:
    """The step time the runtime would measure for ``mode``'s row: ``step`` (local-sgd: amortized over
    ``sync_every`` steps), and for local-sgd ``local`` and ``averaging`` apart. ``measured_collectives``: the
    costs' collective times were read from the mode's own traces, so they hold the codec already. ``skew``: the
    replicas' skew as a fraction of the busy time (:mod:`analysis.validation.dp_skew`), added where the step waits for
    the slower replica. ``shapes``: the model's parameter shapes (powersgd's bytes)."""
    from analysis.validation.dp_skew import simulated_busy, waits_each_step
    from sim import simulate
    from sim.costs.profiled import step_time
    from sim.plan.comm_modes import amortized

    res, used, hooks = simulate_mode(mode, graph, costs, dp_profile, measured_collectives=measured_collectives,
                                     shapes=shapes)
    lag = skew * simulated_busy(res) if waits_each_step(mode) else 0.0
    averaging = step_time(res, used) + hooks + lag
    if split_mode(mode)[0] != "local-sgd":
        return {"step": averaging}
    plain = simulate(local_graph(graph), used, check=False)
    local = step_time(plain, used) + (skew * simulated_busy(plain) if waits_each_step(mode, False) else 0.0)
    return {"step": amortized(local, averaging, sync_every), "local": local, "averaging": averaging}


def predict(graph: TaskGraph, costs: ProfiledCosts) -> float:
    """:func:`analysis.validation.calibration.predict` (which imports this module): the simulated step, as measured."""
    from sim import simulate
    from sim.costs.profiled import step_time

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
