"""schedlab's errors for bad input, and the field checks that raise them.

Every error is one line that names the offending value and what would be
valid. Library code names *fields* (``microbatches``, ``bucket_mb``), never
command-line flags: an error raised for a field carries it in ``.field``, and
the command line (:mod:`analysis.cli`) adds the flag that sets that field.

    SchedlabError            the common base: catch this to catch them all
    ├── ScheduleError        a schedule, its parameters, a program, a schedule file, a trace
    ├── ConfigError          a configuration field: model, run, parallel layout, profile
    │   └── ClusterError     a cluster preset, placement or hardware figure
    ├── CostFileError        a cost file written by real.profile
    ├── CheckpointError      a checkpoint directory or its contents
    └── OutputError          an output path that cannot be written
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

__all__ = [
    "CheckpointError",
    "ClusterError",
    "ConfigError",
    "CostFileError",
    "OutputError",
    "SchedlabError",
    "ScheduleError",
    "check_choice",
    "check_fraction",
    "check_multiple_of_pp",
    "check_positive",
    "check_positive_ints",
    "choice",
    "quote",
]

MAX_QUOTE = 80  # characters of a bad value quoted in a message


class SchedlabError(ValueError):
    """Bad input anywhere in schedlab. ``field``: the configuration field at fault, if one is."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ScheduleError(SchedlabError):
    """An unknown schedule, impossible pipeline parameters, an invalid program or schedule file."""


class ConfigError(SchedlabError):
    """A configuration field with a value that is not valid (model, run, parallel layout, profile)."""


class ClusterError(ConfigError):
    """An unknown cluster preset, a bad placement, or ranks that do not fit the cluster."""


class CostFileError(SchedlabError):
    """A cost file (``schedlab.profile/1``) that is missing, malformed or does not fit the schedule."""


class CheckpointError(SchedlabError):
    """A checkpoint directory that cannot be used, or a checkpoint that does not match the run."""


class OutputError(SchedlabError):
    """An output path that cannot be written: a directory, a missing or read-only folder, a full disk."""


def quote(value: Any) -> str:
    """``repr(value)``, cut to :data:`MAX_QUOTE` characters."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


def check_positive_ints(owner: str, error: type[SchedlabError] = ConfigError, **values: Any) -> None:
    """Each value an integer >= 1 (not a bool); the error names ``owner`` and the field."""
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise error(f"{owner}: {name} must be an integer >= 1, got {quote(value)}", field=name)


def check_positive(owner: str, name: str, value: Any, unit: str = "", error: type[SchedlabError] = ConfigError) -> None:
    """A finite number > 0 (catches NaN, inf and non-numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise error(f"{owner}: {name} must be a finite number > 0{unit}, got {quote(value)}", field=name)


def check_fraction(owner: str, name: str, value: Any, what: str = "a fraction", *, open_low: bool = False,
                   error: type[SchedlabError] = ConfigError) -> None:
    """A number in [0, 1] (``open_low``: in (0, 1])."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and (
        0 < value <= 1 if open_low else 0 <= value <= 1)
    if not ok:
        interval = "(0, 1]" if open_low else "[0, 1]"
        raise error(f"{owner}: {name} must be {what} in {interval}, got {quote(value)}", field=name)


def check_choice(owner: str, name: str, value: Any, valid: Collection[str],
                 error: type[SchedlabError] = ConfigError) -> None:
    """``value`` one of ``valid``."""
    if value not in valid:
        raise error(f"{owner}: unknown {name.replace('_', ' ')} {quote(value)}; valid: {', '.join(valid)}", field=name)


def find_name(value: Any, valid: Collection[str]) -> str | None:
    """The member of ``valid`` that ``value`` names, compared without regard to case (``DDP`` is ``ddp``), or None.

    Every name a user types (a mode, a preset, an algorithm) is looked up through this one helper.
    """
    if not isinstance(value, str):
        return None
    folded = value.casefold()
    return next((member for member in valid if member.casefold() == folded), None)


def choice(owner: str, name: str, value: Any, valid: Collection[str],
           error: type[SchedlabError] = ConfigError) -> str:
    """The member of ``valid`` that ``value`` names (:func:`find_name`); else one line listing the valid names."""
    found = find_name(value, valid)
    if found is not None:
        return found
    raise error(f"{owner}: unknown {name.replace('_', ' ')} {quote(value)}; valid: {', '.join(valid)}", field=name)


def check_multiple_of_pp(name: str, pp: int, microbatches: int) -> None:
    """Schedules that run microbatches in rounds of p: m must be a multiple of p."""
    if microbatches % pp:
        lower, upper = (microbatches // pp) * pp, (microbatches // pp + 1) * pp
        suggestion = f"{lower} or {upper}" if lower else f"{upper}"
        raise ScheduleError(
            f"{name} needs microbatches to be a multiple of pp={pp}, got {microbatches}; try {suggestion}"
        )
