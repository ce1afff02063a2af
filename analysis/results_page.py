"""Results pages (``docs/results/*.md``): the machine, the UTC date and the exact command, then the tables.

A figure measured on one machine at one moment says so: each page a script
writes starts with where and when it ran and how to run it again.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["json_ready", "machine", "markdown_table", "results_page", "write_results_page"]


def machine() -> dict[str, Any]:
    """platform, processor, cores, python and torch versions of this machine."""
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "not installed"
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch_version}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def results_page(title: str, command: str, sections: Sequence[str], *, when: datetime.datetime | None = None,
                 host: dict[str, Any] | None = None) -> str:
    """The page's Markdown: title, the command (```sh, not run by the docs test: it measures this machine),
    the machine and the UTC date, then ``sections`` (Markdown blocks) in order."""
    when = when or datetime.datetime.now(datetime.UTC)
    m = host or machine()
    head = [f"# {title}", "", "```sh", "# not run: measures this machine for minutes (the lead runs it on a quiet one)",
            command, "```", "",
            f"Machine: {m['platform']}, {m['processor']}, {m['cores']} cores; Python {m['python']}, torch {m['torch']}. "
            f"Run {when.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC.", ""]
    return "\n".join(head + [x for sec in sections for x in (sec, "")])


def write_results_page(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (its folder made if needed)."""
    from schedules.util import atomic_write

    return atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text), "results page")


def json_ready(value: Any) -> Any:
    """``value`` with every NaN float as None: JSON has no NaN, and "undefined" is what a NaN here means."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value
