"""Time to a target loss: measured loss curves times simulated step times, one row and one curve per mode.

A mode that communicates less per step may need more steps to reach a loss;
which one wins depends on the network. Here the steps come from a measured
loss curve (a real run of the mode, e.g. on this machine) and the seconds per
step from the simulator on the cluster of interest
(:func:`sim.plan.comm_modes.mode_step_time`):

    steps to L = the number of steps done when the loss is first <= L
    time to L  = steps to L x simulated seconds per step (amortized for local-sgd)

With ``smooth`` W > 1 the losses are first replaced by their trailing mean
over W steps (fewer at the start), so that one lucky batch does not count as
reaching L. A curve that never reaches L reports neither (None, "not reached"), never a
guess. Curve files: the ``metrics.jsonl`` that ``schedlab train --log-dir``
writes (one JSON object per line; the lines with a ``loss`` are used, by
their ``step``, counted from 0), or a CSV with the columns ``step`` and
``loss``. A mode is named ``MODE[:OPTION]``: ``ddp``, ``local-sgd:K``
(averaging every K steps), ``decentralized:ring`` or ``decentralized:random``.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import parse
from common.errors import find_name
from schedules import ConfigError
from schedules.dp.modes import DP_MODES, PEER_SELECTIONS

__all__ = ["LossCurve", "ModeSpec", "format_table", "parse_mode", "plot_loss_vs_time", "read_curve", "smoothed",
           "steps_to_loss", "time_to_loss_rows"]


@dataclass(frozen=True, slots=True)
class ModeSpec:
    """A data-parallel mode and its option: local-sgd's K, decentralized's peer selection."""

    mode: str
    sync_every: int = 1
    peer_selection: str = "ring"

    @property
    def label(self) -> str:
        if self.mode == "local-sgd":
            return f"local-sgd:{self.sync_every}"
        if self.mode == "decentralized":
            return f"decentralized:{self.peer_selection}"
        return self.mode

    def parallel_keys(self) -> dict[str, Any]:
        """The ParallelConfig fields that select this mode."""
        return {"dp_mode": self.mode, "sync_every": self.sync_every, "peer_selection": self.peer_selection}


def parse_mode(text: str) -> ModeSpec:
    """``ddp``, ``local-sgd:K``, ``decentralized:ring|random``; ConfigError naming the text otherwise."""
    mode, _, option = text.strip().partition(":")
    mode = find_name(mode, DP_MODES) or mode  # names without regard to case: DDP is ddp
    option = option.casefold() if mode == "decentralized" else option
    if mode not in DP_MODES or mode == "none":
        raise ConfigError(f"time to loss: mode {text!r} is not a data-parallel mode; valid: "
                          f"{', '.join(m for m in DP_MODES if m != 'none')} (local-sgd:K, decentralized:ring|random)",
                          field="curve")
    if mode == "local-sgd":
        every = parse.int_text(option)
        if every is None or not 1 <= every <= parse.MAX_INT:
            raise ConfigError(f"time to loss: {text!r} needs its averaging period, e.g. local-sgd:4 (K >= 1)",
                              field="curve")
        return ModeSpec(mode, sync_every=every)
    if mode == "decentralized":
        if option not in ("", *PEER_SELECTIONS):
            raise ConfigError(f"time to loss: {text!r}: peer selection {option!r} is not one of "
                              f"{', '.join(PEER_SELECTIONS)}", field="curve")
        return ModeSpec(mode, peer_selection=option or "ring")
    if option:
        raise ConfigError(f"time to loss: mode {mode} takes no option, got {text!r}", field="curve")
    return ModeSpec(mode)


@dataclass(frozen=True, slots=True)
class LossCurve:
    """One mode's measured losses: ``losses[i]`` after step ``steps[i]`` (0-based)."""

    spec: ModeSpec
    steps: tuple[int, ...]
    losses: tuple[float, ...]
    source: str = ""


def read_curve(path: str | Path) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """(steps, losses) of a metrics.jsonl or a step,loss CSV, in step order; ConfigError naming a bad file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"time to loss: curve file {str(path)!r} not found", field="curve")
    rows: dict[int, float] = {}
    where = f"time to loss: curve file {str(path)!r}"

    def put(n: int, step: Any, loss: Any) -> None:  # a later row of a step wins: a resumed run repeats steps
        at = f"{where} row {n}:"
        rows[parse.integer(step, f"{at} step", low=0, field="curve")] = parse.number(loss, f"{at} loss",
                                                                                      field="curve")

    runs: list[str] = []  # the runs of a metrics.jsonl (each line names its run)
    try:
        if path.suffix == ".csv":
            with path.open(newline="", encoding="utf-8") as f:
                for n, row in enumerate(csv.DictReader(f), 1):
                    put(n, row["step"], row["loss"])
        else:
            for n, line in enumerate(path.read_bytes().decode("utf-8").splitlines(), 1):
                if line.strip():
                    d = json.loads(line)
                    if "run" in d and d["run"] not in runs:
                        runs.append(d["run"])
                    if "loss" in d:
                        put(n, d["step"], d["loss"])
    except ConfigError:
        raise
    except (KeyError, ValueError, TypeError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:200]
        raise ConfigError(f"{where} is not a metrics.jsonl or a step,loss CSV ({type(exc).__name__}: {why})",
                          field="curve") from None
    if not rows:
        raise ConfigError(f"time to loss: curve file {str(path)!r} has no loss", field="curve")
    if len(runs) > 1:
        raise ConfigError(f"time to loss: curve file {str(path)!r} holds the lines of {len(runs)} runs "
                          f"({', '.join(map(str, runs[:3]))}{', ...' if len(runs) > 3 else ''}); give one run's "
                          "metrics (each run its own log folder)", field="curve")
    steps = tuple(sorted(rows))
    return steps, tuple(rows[s] for s in steps)


def steps_to_loss(steps: Sequence[int], losses: Sequence[float], target: float) -> int | None:
    """Steps done when the loss is first <= ``target`` (step s done: s + 1 steps); None if never."""
    for s, loss in zip(steps, losses, strict=True):
        if loss <= target:
            return s + 1
    return None


def smoothed(losses: Sequence[float], window: int) -> tuple[float, ...]:
    """Trailing mean over ``window`` losses (over the i + 1 so far for the first ones)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(f"time to loss: smooth {window!r} must be a whole number of steps >= 1 (1: raw losses)",
                          field="smooth")
    out, total = [], 0.0
    for i, loss in enumerate(losses):
        total += loss - (losses[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return tuple(out)


def time_to_loss_rows(curves: Sequence[LossCurve], step_times: dict[str, float], target: float,
                      smooth: int = 1) -> list[dict]:
    """Per curve: mode, steps to the target (losses smoothed over ``smooth`` steps), seconds per step, time to
    the target, final loss."""
    if not math.isfinite(target):
        raise ConfigError(f"time to loss: target loss {target} must be a finite number", field="time_to_loss")
    out = []
    for c in curves:
        n = steps_to_loss(c.steps, smoothed(c.losses, smooth), target)
        t = step_times[c.spec.label]
        out.append({"mode": c.spec.label, "steps_to_loss": n, "step_time_s": t,
                    "time_to_loss_s": None if n is None else n * t, "final_loss": c.losses[-1],
                    "steps_measured": c.steps[-1] + 1, "source": c.source})
    return out


def format_table(rows: Sequence[dict], target: float) -> str:
    header = f"{'mode':<22} {'steps to ' + format(target, 'g'):>14} {'step s':>10} {'time to loss s':>15} {'final loss':>10}"
    lines = [header, "-" * len(header)]
    for r in rows:
        steps = "not reached" if r["steps_to_loss"] is None else str(r["steps_to_loss"])
        ttl = "not reached" if r["time_to_loss_s"] is None else f"{r['time_to_loss_s']:.4g}"
        lines.append(f"{r['mode']:<22} {steps:>14} {r['step_time_s']:>10.4g} {ttl:>15} {r['final_loss']:>10.4f}")
    return "\n".join(lines)


def plot_loss_vs_time(curves: Sequence[LossCurve], step_times: dict[str, float], target: float, path: str | Path,
                      title: str = "", *, measured: str = "", simulated: str = "") -> Path:
    """Loss against simulated wall-clock time ((step + 1) x seconds per step), one curve per mode.

    The title says what is which: ``measured`` names the runs the losses come from ("a tiny GPT at dp 4"),
    ``simulated`` what the seconds per step were simulated for ("gpt-1.5b on 64 H100s"); ``title``, when
    given, goes above them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from analysis.figures import place_legend

    fig, ax = plt.subplots(figsize=(7, 4.6))
    for c in curves:
        t = step_times[c.spec.label]
        ax.plot([(s + 1) * t for s in c.steps], c.losses, label=f"{c.spec.label} ({t:.3g} s/step)")
    ax.axhline(target, color="grey", linestyle="--", linewidth=0.8, label=f"target {target:g}")
    ax.set_xlabel("time = steps x simulated seconds per step (s)")
    ax.set_ylabel("training loss, measured (nats/token)")
    what = (f"loss measured on {measured or 'the given runs'};\nseconds per step simulated for "
            f"{simulated or 'the cluster of interest'}")
    ax.set_title(f"{title}\n{what}" if title else what, fontsize=9, loc="left")
    fig.tight_layout()
    place_legend(ax, fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return Path(path)
