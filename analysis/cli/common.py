"""What every schedlab command shares: the parser, errors as one line, and the flag groups.

This package is the only code that names command-line flags. Library code
raises :class:`schedules.SchedlabError` naming a *field*; :func:`errors_to_exit`
prints it as one line with the flag that sets that field, and exits with 2.
"""

from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from common import parse
from common.errors import find_name, quote
from schedules import SchedlabError, names, schedule_spec
from schedules.registry import is_user_ref, lookup

__all__ = [
    "OneLineParser",
    "add_cost_args",
    "add_import_arg",
    "add_schedule_args",
    "canonical_schedule",
    "check_cost_flags",
    "errors_to_exit",
    "fail",
    "file_safe",
    "flag_of",
    "given",
    "guarded",
    "int_list",
    "is_all",
    "name_list",
    "nonnegative_float",
    "nonnegative_int",
    "positive_float",
    "positive_int",
    "positive_int_list",
    "print_json",
    "refuse",
    "schedule_list",
    "schedule_source",
    "uniform_costs",
]

# Fields whose flag is not "--" + the field with dashes.
FLAG_ALIASES: Mapping[str, str] = {
    "imports": "--import",
    "timeout_s": "--timeout",
    "async_save": "--async-checkpoint",
    "every": "--checkpoint-every",
    "directory": "--checkpoint-dir",
    "layers_per_stage": "--split",
    "seq_len": "--seq-len",
    "kind": "--model",
    "factory": "--model",
    "servers": "--placement",  # parameter servers (dp mode ps) are the placement's /pserver devices
    "token_file": "--data",
    "batches": "--model",
    "loss": "--model",
    "quorum_timeout_s": "--quorum-timeout",  # --elastic live
    "min_step_s": "--min-step-time",
}


# What argparse takes as a negative number rather than a flag: also -1e-12, -inf, -nan (its own rule
# knows only -1 and -1.5), so that `--tf -inf` reaches the value check instead of "expected one argument".
_NEGATIVE_NUMBER = re.compile(r"^-(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf(?:inity)?|nan)$",
                              re.IGNORECASE)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line with exit status 2, no usage dump."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_NUMBER
        # Every number a flag reads goes through common.parse: type=int and type=float take ASCII digits only
        # (int alone takes '٣' and '1_000'). The registry is shared with the argument groups and subparsers'
        # parents; argparse's own message still names the type ("invalid int value").
        for kind, read in _PLAIN.items():
            self.register("type", kind, read)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        """A flag's value; a name of its ``choices`` in their spelling, whatever its case (``--dtype FLOAT32``)."""
        value = super()._get_value(action, arg_string)
        if isinstance(value, str) and action.choices is not None and not isinstance(
                action, argparse._SubParsersAction):  # a subcommand's own arguments pass through here too
            names = [c for c in action.choices if isinstance(c, str)]
            value = find_name(value, names) or value
        return value

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (see --help)")

    def flags(self) -> set[str]:
        return {opt for action in self._actions for opt in action.option_strings}


def fail(message: str) -> NoReturn:
    # One write for the whole line: under PYTHONUNBUFFERED print() writes the text and the newline apart,
    # and the ranks of one torchrun share a stderr pipe, so their lines would interleave.
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def print_json(obj: Any) -> None:
    """Exactly one JSON object that a strict parser takes: a non-finite number is an error, never NaN/Infinity."""
    try:
        text = json.dumps(obj, allow_nan=False)
    except ValueError:
        fail("the result holds a non-finite number (inf or nan); nothing printed. Are the pass times too large?")
    print(text)


def _stdout_to_devnull() -> None:
    """Send what is left of stdout nowhere, so the interpreter's own flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def guarded(main: Callable[..., int]) -> Callable[..., int]:
    """A command's entry point: a closed pipe ends it quietly (exit 1), a full disk with one line (exit 2),
    Ctrl-C with one line (exit 130)."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> int:
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            _stdout_to_devnull()
            return 1
        except KeyboardInterrupt:  # Ctrl-C outside a run's own handling (real.stop): the shell's status, no traceback
            if os.environ.get("RANK", "0") == "0":  # one line for a launched group, not one per rank
                sys.stderr.write("interrupted\n")
            return 130
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:  # a path no check met first (an input): still one line
                sys.stderr.write(f"error: file name too long: {quote(exc.filename or '')}\n")
                return 2
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
                raise
            _stdout_to_devnull()
            sys.stderr.write(f"error: cannot write the output: {exc.strerror}\n")
            return 2

    return run


def flag_of(field: str | None, parser: OneLineParser | None) -> str | None:
    """The flag of ``parser`` that sets ``field``, if it has one."""
    if field is None or parser is None:
        return None
    flags = parser.flags()
    plain = "--" + field.replace("_", "-")
    for flag in (FLAG_ALIASES.get(field), plain, plain + "s"):  # --dp-modes sets the plan's dp_mode choices
        if flag in flags:
            return flag
    return None


@contextmanager
def errors_to_exit(parser: OneLineParser | None = None, prefix: str = "") -> Iterator[None]:
    """Turn a SchedlabError into one line on stderr and exit status 2, naming the flag of its field."""
    try:
        yield
    except SchedlabError as exc:
        fail(prefix + with_flag(str(exc), exc.field, parser))


def with_flag(message: str, field: str | None, parser: OneLineParser | None) -> str:
    """``message`` with the flag that sets its field added, unless it names the flag already."""
    flag = flag_of(field, parser)
    if flag is None or flag in message:
        return message
    return f"{message} (flag {flag})"


# -- value parsers (argparse types) -----------------------------------------------------------------------------


def _plain(kind: type, read: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type for any ``kind`` written in ASCII; argparse's own message names ``kind`` (invalid int value)."""
    def parse(text: str) -> Any:
        value = read(text)
        if value is None:
            raise ValueError(text)
        return value

    parse.__name__ = kind.__name__
    return parse


_PLAIN: Mapping[type, Callable[[str], Any]] = {int: _plain(int, parse.int_text), float: _plain(float, parse.real_text)}


def int_list(text: str) -> tuple[int, ...]:
    """``2,2,1,1`` -> (2, 2, 1, 1); an argparse type."""
    values = tuple(parse.int_text(x.strip()) for x in text.split(","))
    if any(v is None for v in values):
        raise argparse.ArgumentTypeError(f"invalid value {quote(text)}: give integers separated by commas, "
                                         "e.g. 2,4")
    return values


def _number(kind: type, low: float, closed: bool, what: str) -> Callable[[str], Any]:
    def read(text: str) -> Any:
        try:
            if kind is int:
                return parse.integer(text, "", low=low)
            return parse.number(text, "", low=low, open_low=not closed)
        except SchedlabError:
            raise argparse.ArgumentTypeError(f"invalid value {quote(text)}: give {what}") from None

    read.__name__ = what  # argparse names the type in its own messages
    return read


positive_int = _number(int, 1, True, "an integer >= 1")
nonnegative_int = _number(int, 0, True, "an integer >= 0")
positive_float = _number(float, 0, False, "a finite number > 0")
nonnegative_float = _number(float, 0, True, "a finite number >= 0")


def positive_int_list(text: str) -> tuple[int, ...]:
    """``4,8,16`` -> (4, 8, 16), each an integer >= 1; an argparse type."""
    values = int_list(text)
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"invalid value {quote(text)}: give integers >= 1 separated by commas, "
                                         "e.g. 4,8")
    return values


def schedule_list(text: str) -> list[str]:
    """``1f1b,zb-h1,my.py:lazy`` -> the schedule references, registered names in their own case; an argparse type.

    An unknown name is refused in one line; a user's ``file.py:NAME``, ``csv:`` and ``torch:`` are kept as given
    and resolved when they are built (a name another module registers is given as ``file.py:NAME``).
    """
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    if not chosen:
        raise argparse.ArgumentTypeError(f"no names in {quote(text)}: give comma-separated schedule names")
    bad = [s for s in chosen if lookup(s) is None and not is_user_ref(s) and not s.startswith(("csv:", "torch:"))]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown schedule {quote(bad[0])}; valid: {', '.join(names())}, or your "
                                         "own as FILE.py:NAME")
    return list(dict.fromkeys(canonical_schedule(s) for s in chosen))


def canonical_schedule(ref: str) -> str:
    """A registered name in its registered case; any other reference as given."""
    found = lookup(ref)
    return found.name if found is not None else ref


def file_safe(name: str) -> str:
    """``name`` as part of a file name: what is not a letter, digit, dot, dash or underscore becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "schedule"


def schedule_source(ref: str | None) -> str | None:
    """The file a schedule reference reads (csv:FILE, FILE.py:NAME), which no output may replace; else None."""
    if not ref:
        return None
    if ref.startswith("csv:"):
        return ref[4:]
    module = ref.rpartition(":")[0]
    return module if is_user_ref(ref) and module.endswith(".py") else None


def add_import_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import a module (pkg.module) or file (path/file.py) that registers schedules with "
                   "schedules.register, before the schedules are looked up (repeatable)")


def is_all(text: str) -> bool:
    """``all`` in any case (a list flag's word for every name)."""
    return text.strip().casefold() == "all"


def name_list(text: str, all_names: Sequence[str] | None = None) -> list[str]:
    """``a,b`` -> [a, b]; ``all`` -> ``all_names`` (default: every registered schedule, by family)."""
    if is_all(text):
        return list(all_names if all_names is not None else names(by_family=True))
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    if not chosen:
        fail(f"no names in {quote(text)}: give comma-separated names, or all")
    return chosen


# -- flag groups -------------------------------------------------------------------------------------------------


def add_schedule_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("--schedule", required=required, metavar="NAME",
                   help="a schedule name (" + ", ".join(names()) + "), your own FILE.py:NAME (a function registered "
                   "with schedules.register, or one that returns a Schedule from the PipelineParams), "
                   "torch:CLASS for torch.distributed.pipelining's "
                   "own order (e.g. torch:ZBVZeroBubble; needs torch), or csv:FILE for a torch CSV schedule "
                   "(one row per rank; its SEND/RECV, if any, are kept)")
    add_import_arg(p)
    p.add_argument("--pp", type=int, required=required, metavar="P", help="pipeline ranks (csv: from the file)")
    p.add_argument("--microbatches", type=int, required=required, metavar="M",
                   help="microbatches per step (csv: from the file)")
    p.add_argument("--chunks", type=int, default=None, metavar="V", help="stages per rank (multi-chunk schedules; default 2)")


def add_cost_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("uniform costs (time per microbatch through one rank's whole share)")
    g.add_argument("--tf", type=float, help="forward (default 1)")
    g.add_argument("--tb", type=float, help="input-gradient backward; B costs tb+tw (default 1)")
    g.add_argument("--tw", type=float, help="weight-gradient backward (default 1)")
    g.add_argument("--tcomm", type=float, help="delay of each cross-rank message (default 0)")
    g.add_argument("--mw", type=float, help="fraction of M_B that W still holds after I (default 1, the runtime's: "
                   "I frees nothing; 0: the zero-bubble paper's accounting)")
    g.add_argument("--pair-overlap", type=float, metavar="H",
                   help="fraction of the shorter pass hidden in an overlapped F+B pair (DualPipe); 0 = sum (default)")
    g.add_argument("--costs", metavar="PROFILE.json|TRACE.csv",
                   help="costs in seconds (replace the uniform costs): a cost file from python -m real.profile, or "
                   "a real run's trace (schedlab run --trace; calibrated from its measured steps)")
    g.add_argument("--costs-profile", metavar="PROFILE.json",
                   help="with a trace as --costs: the profile that supplies passes or stage counts the trace lacks "
                   "(each traced stage's time shared in the profile's proportions)")


UNIFORM_DEFAULTS: Mapping[str, float] = {"tf": 1.0, "tb": 1.0, "tw": 1.0, "tcomm": 0.0, "mw": 1.0, "pair_overlap": 0.0}


def given(args: argparse.Namespace, *fields: str) -> list[str]:
    """The flags among ``fields`` that the user gave (their value is not None)."""
    return ["--" + f.replace("_", "-") for f in fields if getattr(args, f, None) is not None]


def refuse(flags: list[str], why: str) -> None:
    """A flag that would have no effect is an error, never silently ignored."""
    if flags:
        fail(f"{', '.join(flags)} {'has' if len(flags) == 1 else 'have'} no effect {why}")


def uniform(args: argparse.Namespace, name: str) -> float:
    value = getattr(args, name)
    return UNIFORM_DEFAULTS[name] if value is None else value


def uniform_costs(args: argparse.Namespace) -> Any:
    from sim import UniformCosts

    return UniformCosts(**{k: uniform(args, k) for k in UNIFORM_DEFAULTS})


def check_cost_flags(args: argparse.Namespace) -> None:
    """--costs replaces the uniform pass times: giving both is an error; --costs-profile needs a trace."""
    if getattr(args, "costs_profile", None) and not str(getattr(args, "costs", "") or "").endswith((".csv", ".parquet")):
        fail("--costs-profile scales a real trace given as --costs; give --costs TRACE.csv")
    if getattr(args, "costs", None):
        refuse(given(args, "tf", "tb", "tw", "tcomm", "mw", "pair_overlap"),
               "with --costs (the cost file gives every time; leave them out)")


def schedule_options(args: argparse.Namespace) -> dict[str, Any]:
    """What an adaptive schedule (zb-auto) reads: the pass times, --mem-limit and --time-limit; nothing for the others."""
    options: dict[str, Any] = {}
    found = schedule_spec(args.schedule)
    if found is not None and found.adaptive:
        options = {k: uniform(args, k) for k in ("tf", "tb", "tw", "tcomm", "mw")}
    if getattr(args, "mem_limit", None) is not None:
        if found is None:
            fail(f"--mem-limit applies only to registered adaptive schedules, not to {args.schedule!r}")
        options["mem_limit"] = args.mem_limit
    if getattr(args, "time_limit", None) is not None:
        if found is None or not found.adaptive:
            fail(f"--time-limit applies only to registered adaptive schedules, not to {args.schedule!r}")
        options["time_limit"] = args.time_limit
    return options
