"""Reading a cost file: the JSON ``python -m real.profile`` writes, checked and turned into :class:`ProfiledCosts`.

:func:`load_profile` picks the partition whose stage count is the schedule's and reads every section the
profiler writes (passes per stage, messages, collectives, overheads, the compute slowdown, the reduce-scatter
hook, parameter copies); a malformed file is one CostFileError naming the file and the field. What each field
costs a task is :mod:`sim.costs.profiled`'s.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from common.errors import CostFileError, quote
from schedules.formats import PROFILE_SCHEMA
from sim.costs.param_copy import param_copy_section
from sim.costs.profiled import ProfiledCosts, StageCosts, checked_hook_ns

__all__ = ["load_profile", "warn_once"]

log = logging.getLogger(__name__)


def _median(d: dict[str, Any], key: str, where: str, path: str = "") -> float:
    value = d.get(key)
    if isinstance(value, dict):
        value = value.get("median")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CostFileError(f"{where}: {path}{key} must be a number or {{\"median\": number}}, got {quote(value)}")
    return _number(value, where, path + key, what="a finite time >= 0 s")


def _number(value: Any, where: str, name: str, *, bandwidth: bool = False, what: str = "") -> float:
    """A finite number >= 0 (``bandwidth``: > 0 bytes/s, inf allowed: the profiler's "size does not matter")."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and (
        0 < value <= math.inf if bandwidth else 0 <= value < math.inf)
    if not ok:
        what = what or ("a bandwidth > 0 bytes/s" if bandwidth else "a finite number >= 0")
        raise CostFileError(f"{where}: {name} must be {what}, got {quote(value)}")
    return float(value)


def _alpha_beta(section: Any, where: str, name: str) -> tuple[float, float]:
    """A fitted ``{"alpha": s, "beta": bytes/s, ...}``."""
    if not isinstance(section, dict):
        raise CostFileError(f"{where}: {name} must be an object {{\"alpha\": s, \"beta\": bytes/s}}, got "
                            f"{quote(section)}")
    if "beta" not in section:
        raise CostFileError(f"{where}: {name}.beta is missing: give a bandwidth > 0 bytes/s, or null for "
                            "\"size does not matter\"")
    beta = section["beta"]  # null: the profiler's "size does not matter" (JSON has no inf)
    return (_number(section.get("alpha"), where, f"{name}.alpha"),
            math.inf if beta is None else _number(beta, where, f"{name}.beta", bandwidth=True))


def _partition(parts: list[dict[str, Any]], num_stages: int | None, where: str) -> tuple[int, list[int]]:
    """The chosen partition's index and, for stage 0, 1, ..., the index of its row (by each row's "stage" field)."""
    seen: dict[int, int] = {}
    for k, q in enumerate(parts):
        n = q.get("num_stages")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CostFileError(f"{where}: partitions[{k}].num_stages must be an integer >= 1, got {quote(n)}")
        if n in seen:
            raise CostFileError(f"{where}: partitions[{seen[n]}] and partitions[{k}] both profile {n} stages; "
                                "keep one of them")
        seen[n] = k
    if num_stages is None:
        c = 0
    elif num_stages in seen:
        c = seen[num_stages]
    else:
        raise CostFileError(
            f"{where} profiles partitions of {', '.join(map(str, seen))} stages, not {num_stages}; "
            f"profile that many stages with the profiler (real.profile, stages={num_stages})"
        )
    n, rows = parts[c]["num_stages"], parts[c].get("stages")
    if not isinstance(rows, list) or len(rows) != n:
        raise CostFileError(f"{where}: partition of {n} stages must list that many stages")
    at: dict[int, int] = {}
    for j, r in enumerate(rows):
        field = f"partitions[{c}].stages[{j}]"
        if not isinstance(r, dict):
            raise CostFileError(f"{where}: {field} must be an object of a stage's timings, got {quote(r)}")
        if "stage" not in r:
            raise CostFileError(f"{where}: {field} has no \"stage\" field; give each stage its index, 0..{n - 1}")
        s = r["stage"]
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < n:
            raise CostFileError(f"{where}: {field}.stage must be an integer in 0..{n - 1}, got {quote(s)}")
        if s in at:
            raise CostFileError(f"{where}: partitions[{c}].stages[{at[s]}] and [{j}] are both stage {s}; "
                                f"list each of 0..{n - 1} once")
        at[s] = j
    return c, [at[s] for s in range(n)]


def load_profile(path: str | Path, num_stages: int | None = None) -> ProfiledCosts:
    """The cost model of the partition with ``num_stages`` stages (None: the file's only or first partition).

    A partition's stages are taken in the order of their ``"stage"`` fields,
    not of the list. Raises CostFileError, one line naming the file and the
    field, for a missing or malformed file, a stage count the file does not
    have, two partitions of one stage count, or a stage index that is missing,
    not an integer, out of 0..n-1 or listed twice. A file without ``p2p`` loads;
    :meth:`ProfiledCosts.check` refuses it for a graph that sends messages.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise CostFileError(f"cost file {str(p)!r} not found; write one with the profiler (real.profile)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CostFileError(f"cost file {str(p)!r} is not readable JSON: {str(exc).splitlines()[0]}") from None
    where = f"cost file {str(p)!r}"
    if not isinstance(data, dict) or data.get("schema") != PROFILE_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise CostFileError(f"{where}: schema must be {PROFILE_SCHEMA!r}, got {got!r}")
    parts = data.get("partitions")
    if not isinstance(parts, list) or not parts or not all(isinstance(q, dict) for q in parts):
        raise CostFileError(f"{where}: 'partitions' must be a non-empty list of objects")
    c, order = _partition(parts, num_stages, where)
    stages = []
    for j in order:  # stage order, whatever the list order
        r, path = parts[c]["stages"][j], f"partitions[{c}].stages[{j}]."
        stages.append(StageCosts(
            f=_median(r, "F", where, path), b=_median(r, "B", where, path), i=_median(r, "I", where, path),
            w=_median(r, "W", where, path), optim=_median(r, "OPTIM", where, path) if "OPTIM" in r else 0.0,
            param_bytes=_number(r.get("param_bytes", 0.0), where, path + "param_bytes"),
            server_update=_median(r, "SERVER_UPDATE", where, path) if "SERVER_UPDATE" in r else 0.0))
    p2p = data.get("p2p")  # None (or absent): one process, no messages measured
    alpha, beta = _alpha_beta(p2p, where, "p2p") if p2p is not None else (0.0, math.inf)
    colls = data.get("collectives") or {}
    if not isinstance(colls, dict):
        raise CostFileError(f"{where}: collectives must be an object of op -> {{alpha, beta}} or null, "
                            f"got {quote(colls)}")
    warned = data.get("warnings", [])
    if not isinstance(warned, list) or not all(isinstance(w, str) for w in warned):
        raise CostFileError(f"{where}: warnings must be a list of strings (the profiler's guesses), got {quote(warned)}")
    for w in warned:
        warn_once(f"{where}: {w}")
    return ProfiledCosts(
        stages=tuple(stages),
        activation_bytes=_number(data.get("activation_bytes", 0.0), where, "activation_bytes"),
        p2p_alpha=alpha,
        p2p_beta=beta,
        task_overhead=_median(data, "task_overhead", where) if "task_overhead" in data else 0.0,
        step_overhead=_median(data, "step_overhead", where) if "step_overhead" in data else 0.0,
        collectives=tuple((op, *_alpha_beta(v, where, f"collectives.{op}")) for op, v in colls.items()),
        source=str(p),
        p2p_measured=p2p is not None,
        send_cpu=_median(p2p, "send_cpu", where, "p2p.") if isinstance(p2p, dict) and "send_cpu" in p2p else 0.0,
        warnings=tuple(warned),
        comm_slowdown=_comm_slowdown(data.get("comm_slowdown"), where),
        pair_share=_factor(data.get("pair_threads"), where, "pair_threads",
                           "two threads' compute does not cost more than the two in turn"),
        reduce_hook_ns_per_byte=_reduce_hook(data.get("reduce_hook"), where),
        param_copy=param_copy_section(data.get("param_copy"), where),
    )


def _reduce_hook(section: Any, where: str) -> float:
    """The file's ``reduce_hook.ns_per_byte`` (absent or null: 0.0, not charged; profiled with dp 1)."""
    if section is None:
        return 0.0
    value = section.get("ns_per_byte") if isinstance(section, dict) else section
    return checked_hook_ns(value, f"{where}: reduce_hook.ns_per_byte")


def _comm_slowdown(section: Any, where: str) -> float:
    """The file's ``comm_slowdown.factor`` (absent or null: 1.0, nothing stretched)."""
    return _factor(section, where, "comm_slowdown", "communication does not slow compute")


def _factor(section: Any, where: str, name: str, one: str) -> float:
    """The file's ``<name>.factor`` (absent or null: 1.0, ``one``)."""
    if section is None:
        return 1.0
    factor = section.get("factor") if isinstance(section, dict) else None
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor < math.inf:
        raise CostFileError(f"{where}: {name}.factor must be a finite factor > 0 (1.0: {one}), "
                            f"got {quote(factor if isinstance(section, dict) else section)}")
    return float(factor)


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Log a guess once per process (a calibration builds the same costs many times)."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)
