"""Measured results as Markdown pages (``docs/results/``), written by the experiment that measures them.

Each page starts with what a reader needs to judge a figure: the command that
wrote it, the UTC date, and the machine (platform, cores, load, Python, torch,
SimPy). The docs quote a measured figure by linking to its page, so re-running
the experiment with ``--markdown PATH`` updates what the docs show.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import shlex
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from schedules.util import atomic_write, check_output_file

__all__ = ["check_page", "command", "json_ready", "machine", "render_page", "table", "write_page"]

ROOT = Path(__file__).resolve().parents[1]


def check_page(path: str | os.PathLike) -> Path:
    """Check a page's path before any work (a ``.md`` name in a writable folder); raises OutputError."""
    return check_output_file(path, "--markdown", (".md",))


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> str:
    """One line: platform, processor, logical cores, 1-minute load average, Python, torch and SimPy versions.

    The load average says whether other work shared the machine while a timing was taken.
    """
    try:
        load = f"1-minute load average {os.getloadavg()[0]:.2f} when written"
    except OSError:  # not available on this platform
        load = "load average unknown"
    return (f"{platform.platform()}, {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores, "
            f"{load}, Python {platform.python_version()}, torch {_version('torch')}, simpy {_version('simpy')}")


def command(argv: Sequence[str] | None = None) -> str:
    """The command that ran, as a user types it from the repository root: ``python experiments/x.py ...``."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    try:
        script = script.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *argv[1:]])


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[bool] | None = None) -> str:
    """A Markdown table; ``right[i]`` right-aligns column i (default: every column but the first)."""
    right = [i > 0 for i in range(len(headers))] if right is None else list(right)
    if len(right) != len(headers) or any(len(r) != len(headers) for r in rows):
        raise ValueError(f"table: every row needs {len(headers)} cells, as the header has")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_page(title: str, body: str, *, argv: Sequence[str] | None = None, when: _dt.datetime | None = None,
                machine_line: str | None = None) -> str:
    """The page's text: title, then command, date and machine, then ``body``."""
    when = when or _dt.datetime.now(_dt.UTC)
    head = [
        f"# {title}",
        "",
        f"- Command: `{command(argv)}`",
        f"- Date: {when.astimezone(_dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine() if machine_line is None else machine_line}",
        "",
        "Written by the command above; run it again to refresh this page (edits by hand are overwritten).",
        "",
    ]
    return "\n".join(head) + "\n" + body.strip() + "\n"


def write_page(path: str | os.PathLike, title: str, body: str, *, argv: Sequence[str] | None = None) -> Path:
    """Write the page whole (a temporary file, then a rename) and return its path."""
    text = render_page(title, body, argv=argv)
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), "results page")


def json_ready(value: Any) -> Any:
    """``value`` with every NaN float as None: JSON has no NaN, and "undefined" is what a NaN here means."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value
