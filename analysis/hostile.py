"""Hostile-input cases: one command each, run as a user runs it, and its outcome classified.

A :class:`Case` is a command line with what it must do (refuse with one line, or succeed) and the paths it
must leave as they were. :func:`run_case` runs it as a subprocess with a timeout and names the outcome:
``clean error`` (exit 2 and one line on stderr starting ``error:``), ``ok`` (exit 0; strict JSON with
``--json``), ``traceback``, ``hang``, ``unclean`` (any other failure), ``wrong`` (a clean result of the other
kind, or a refusal with another message than the exact one expected) or ``data lost`` (a kept path changed).
``experiments/hostile_inputs.py`` holds the cases.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from common.procs import die_with_parent

__all__ = ["OUTCOMES", "Case", "classify", "run_case"]

OUTCOMES = ("clean error", "ok", "wrong", "unclean", "traceback", "hang", "data lost")


@dataclass(frozen=True)
class Case:
    group: str
    argv: tuple[str, ...]
    expect: str  # "error" or "ok"
    stdout: str | None = None  # "full": /dev/full; "head": read 10 bytes, then close the pipe
    message: str | None = None  # the exact one line (after "error: ") a refusal must print, if given
    keep: tuple[str, ...] = ()  # paths that must be as they were afterwards (same kind; a file, same bytes)


def classify(case: Case, rc: int | None, out: str, err: str) -> str:
    if rc is None:
        return "hang"
    if "Traceback (most recent call last)" in err:
        return "traceback"
    clean_error = rc == 2 and err.count("\n") == 1 and err.startswith("error: ")
    ok = rc == 0 or (case.stdout == "head" and rc in (0, 1) and err == "")
    if ok and "--json" in case.argv and case.stdout is None:
        try:
            json.loads(out, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except ValueError:
            return "unclean"
    if clean_error:
        exact = case.message is None or err == f"error: {case.message}\n"
        return "clean error" if case.expect == "error" and exact else "wrong"
    if ok:
        return "ok" if case.expect == "ok" else "wrong"
    return "unclean"


def _state(path: str) -> tuple:
    """What a kept path is: its kind, and a regular file's bytes (a fifo or a device is never read)."""
    try:
        st = os.stat(path)
    except OSError:
        return ("gone",)
    return (stat.S_IFMT(st.st_mode), Path(path).read_bytes() if stat.S_ISREG(st.st_mode) else None)


def run_case(case: Case, cwd: Path, timeout: float) -> dict:
    kept = {p: _state(p) for p in case.keep}
    row = _run_command(case, cwd, timeout)
    if any(_state(p) != before for p, before in kept.items()):
        row["outcome"] = "data lost"
    return row


def _run_command(case: Case, cwd: Path, timeout: float) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    start = time.monotonic()
    rc: int | None
    try:
        if case.stdout == "head":
            proc = subprocess.Popen(case.argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    preexec_fn=die_with_parent)
            proc.stdout.read(10)
            proc.stdout.close()
            err = proc.stderr.read().decode(errors="replace")
            rc, out = proc.wait(timeout=timeout), ""
        elif case.stdout == "full":
            with open("/dev/full", "w") as full:
                p = subprocess.run(case.argv, cwd=cwd, env=env, stdout=full, stderr=subprocess.PIPE, text=True,
                                   timeout=timeout, preexec_fn=die_with_parent)
            rc, out, err = p.returncode, "", p.stderr
        else:
            p = subprocess.run(case.argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                               errors="replace", preexec_fn=die_with_parent)
            rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", ""
    return {"group": case.group, "argv": " ".join(a if len(a) < 60 else a[:57] + "..." for a in case.argv[1:]),
            "expect": case.expect, "outcome": classify(case, rc, out, err), "rc": rc,
            "stderr": err.strip().splitlines()[-1][:300] if err.strip() else "",
            "seconds": round(time.monotonic() - start, 2)}

