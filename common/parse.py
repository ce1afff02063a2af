"""One parser for the numbers, names and sizes a user types: flags, specs inside flags, fields of files.

Every number or name schedlab reads from user text goes through these functions, so the rules are the
same everywhere:

* an integer is an optional sign and the ASCII digits 0-9. Python's ``int`` also takes ``'٣'`` (an
  Arabic-Indic three), ``'1_000'`` and ``' 3 '``, and ``str.isdigit`` passes ``'²'``, which ``int`` then
  refuses with a traceback; none of these is a number here;
* a real number is ASCII decimal notation (``1``, ``-0.5``, ``2.5e3``, ``.5``); :func:`number` takes only
  finite values within the bounds it is given, :func:`real_text` also the words ``inf`` and ``nan`` (for
  fields that check finiteness themselves and say so with their own message);
* every value is bounded, and the message names the bound: no integer beyond :data:`MAX_INT` (2^63 - 1,
  torch's int64) is ever taken as a count;
* names (modes, dtypes, codecs, schedules, presets) are compared without regard to case, and the
  registered spelling is returned (:func:`name`; ``FP32`` is ``fp32``);
* a size in bytes is a number, or a number with a unit (:data:`SIZE_UNITS`, case-insensitive):
  ``60GB`` is 60 x 10^9, ``56GiB`` 56 x 2^30 (:func:`size`).

Each function raises a :class:`common.errors.ConfigError` (or the error class given) of one line naming
the value, what it is (``what``) and what would be valid; ``field`` is the configuration field at fault,
so the command line can add its flag.

    >>> integer("8", "microbatches", low=1), number("2.5e-3", "lr", low=0, open_low=True)
    (8, 0.0025)
    >>> name("FP32", ("bf16", "fp32"), "reduce dtype"), size("56GiB", "mem_limit")
    ('fp32', 60129542144.0)
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from decimal import Decimal, InvalidOperation
from typing import Any

from common.errors import ConfigError, SchedlabError, choice, find_name, quote

__all__ = ["MAX_INT", "SIZE_FORMS", "SIZE_UNITS", "bounds", "canonical_field", "int_text", "integer", "name", "number",
           "real_text", "size"]

#: The largest integer any count may be (torch's int64, numpy's default integer).
MAX_INT = 2**63 - 1

_INT = re.compile(r"[-+]?[0-9]+")
_REAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_WORDS = re.compile(r"[-+]?(?:inf|infinity|nan)", re.IGNORECASE | re.ASCII)  # not the dotless i of "ınf"

#: Units of a size in bytes: decimal (10^3 steps, as vendors quote memory) and binary (2^10 steps, as drivers
#: report it).
SIZE_UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
              "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_UNITS = {k.lower(): v for k, v in SIZE_UNITS.items()}
_SIZE = re.compile(r"\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE | re.ASCII)
#: How a size may be written, as the messages say it.
SIZE_FORMS = ("a number of bytes (6e10) or a number with a unit: 60GB, 56GiB, 512MiB (units "
              + ", ".join(SIZE_UNITS) + ")")


def int_text(text: Any) -> int | None:
    """The integer ``text`` spells in ASCII digits (an optional sign first), else None. No bounds."""
    if isinstance(text, str) and _INT.fullmatch(text):
        return int(text)
    return None


def real_text(text: Any) -> float | None:
    """The number ``text`` spells in ASCII decimal notation, or ``inf``/``nan`` in words, else None. No bounds."""
    if isinstance(text, str) and (_REAL.fullmatch(text) or _WORDS.fullmatch(text)):
        return float(text)
    return None


def _show(value: float) -> str:
    """A bound as a message shows it: 1,048,576 (2^20) for a power of two past 1024, else with commas."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value > 1024 and value & (value - 1) == 0:
            return f"{value:,} (2^{value.bit_length() - 1})"
        if value == MAX_INT:
            return f"{value:,} (2^63 - 1)"
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    return f"{value:g}"


def bounds(kind: str, low: float | None = None, high: float | None = None, *, open_low: bool = False) -> str:
    """``an integer >= 1``, ``an integer from 257 to 1,048,576 (2^20)``, ``a finite number > 0``: what is valid."""
    if low is not None and high is not None:
        if open_low:
            return f"{kind} > {_show(low)} and <= {_show(high)}"
        return f"{kind} from {_show(low)} to {_show(high)}"
    if low is not None:
        return f"{kind} {'>' if open_low else '>='} {_show(low)}"
    if high is not None:
        return f"{kind} <= {_show(high)}"
    return kind


def _within(value: float, low: float | None, high: float | None, open_low: bool) -> bool:
    if low is not None and (value <= low if open_low else value < low):
        return False
    return high is None or value <= high


def integer(text: Any, what: str, *, low: int | None = None, high: int = MAX_INT, field: str | None = None,
            error: type[SchedlabError] = ConfigError) -> int:
    """The integer ``text`` writes (ASCII digits, see the module doc), within ``low`` .. ``high``.

    An int (not a bool) is taken as it is, so a field of a JSON or TOML file is checked by the same rule.
    """
    value = text if isinstance(text, int) and not isinstance(text, bool) else int_text(text)
    if value is None or not _within(value, low, high, False) or value < -MAX_INT - 1:
        shown = high if high != MAX_INT or (value is not None and value > high) else None  # the cap, when it bit
        raise error(f"{what} {quote(text)} is not {bounds('an integer', low, shown)}", field=field)
    return value


def number(text: Any, what: str, *, low: float | None = None, high: float | None = None, open_low: bool = False,
           field: str | None = None, error: type[SchedlabError] = ConfigError) -> float:
    """The finite number ``text`` writes (ASCII decimal notation), within ``low`` .. ``high`` (``open_low``: > low).

    An int or a float (not a bool) is taken as it is, so a field of a JSON or TOML file is checked by the same rule.
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        value: float | None = float(text)
    else:
        value = real_text(text)
    if value is None or not math.isfinite(value) or not _within(value, low, high, open_low):
        raise error(f"{what} {quote(text)} is not {bounds('a finite number', low, high, open_low=open_low)}",
                    field=field)
    return value


def name(text: Any, valid: Collection[str], what: str, *, field: str | None = None,
         error: type[SchedlabError] = ConfigError) -> str:
    """The member of ``valid`` that ``text`` names without regard to case (its registered spelling)."""
    found = find_name(text.strip() if isinstance(text, str) else text, valid)
    if found is None:
        raise error(f"unknown {what} {quote(text)}; valid: {', '.join(valid)}", field=field)
    return found


def canonical_field(obj: Any, field: str, owner: str, valid: Collection[str],
                    error: type[SchedlabError] = ConfigError) -> None:
    """A config dataclass's ``field`` (frozen or not) set to the member of ``valid`` it names without regard to case
    (``FP32`` becomes ``fp32``), in ``__post_init__``; else the one-line error of :func:`common.errors.choice`."""
    object.__setattr__(obj, field, choice(owner, field, getattr(obj, field), valid, error))


def size(value: Any, what: str = "mem_limit", *, field: str | None = None,
         error: type[SchedlabError] = ConfigError) -> float:
    """A size in bytes > 0 from ``value``: a number, or text such as ``"60GB"`` (60 x 10^9), ``"56GiB"``
    (56 x 2^30), ``"6e10"``; units are case-insensitive. Exact: the digits are scaled as decimals before the one
    rounding to float. ``field`` defaults to ``what``."""
    field = what if field is None else field
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise error(f"{what} must be a size in bytes, {SIZE_FORMS}; got {quote(value)}", field=field)
    if isinstance(value, str):
        found = _SIZE.fullmatch(value)
        scale = None if found is None else _UNITS.get(found.group(2).lower()) if found.group(2) else 1
        try:
            got = None if scale is None else float(Decimal(found.group(1)) * scale)
        except InvalidOperation:  # "1.2.3", "."
            got = None
        if got is None:
            raise error(f"{what} {quote(value)} is not a size in bytes; write {SIZE_FORMS}", field=field)
    else:
        got = float(value)
    if not 0 < got < math.inf:
        raise error(f"{what} must be a size in bytes > 0, {SIZE_FORMS}; got {quote(value)}", field=field)
    return got
