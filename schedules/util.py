"""Small helpers with no schedule knowledge: a paused collector, and output files checked early, written whole."""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from schedules.errors import OutputError, ScheduleError

__all__ = ["atomic_write", "check_output_dir", "check_output_file", "paused_gc", "read_text_file"]


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for an allocation-heavy pass.

    Building or simulating a graph allocates millions of small acyclic objects;
    each full collection would walk all of them. Reference counting still
    frees everything; the collector resumes after.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _writable_folder(folder: Path, what: str, target: Path) -> None:
    """``folder`` exists as a writable directory, or can be made under its nearest existing ancestor."""
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(f"{what} {str(target)!r}: {str(probe)!r} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {str(target)!r}: folder {str(probe)!r} is not writable")
    try:  # catches what access() does not: a read-only or virtual file system (/proc, /sys), a full quota
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise OutputError(f"{what} {str(target)!r}: cannot write in {str(probe)!r} ({exc.strerror})") from None


def check_output_file(path: str | os.PathLike, what: str, suffixes: Sequence[str] = ()) -> Path:
    """Check an output file before any work: its suffix, not a directory, its folder writable or creatable."""
    p = Path(path)
    names = " or ".join(suffixes) if len(suffixes) == 2 else ", ".join(suffixes)
    if suffixes and p.suffix.lower() not in suffixes:
        raise OutputError(f"{what} {str(p)!r}: use a name ending in {names}")
    if p.is_dir():
        raise OutputError(f"{what} {str(p)!r} is a directory; give a file name" + (f" ending in {names}" * bool(names)))
    _writable_folder(p.parent if str(p.parent) else Path("."), what, p)
    return p


def check_output_dir(path: str | os.PathLike, what: str) -> Path:
    """Check an output folder before any work: not a file, and writable or creatable."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} {str(p)!r} is a file; give a folder")
    _writable_folder(p, what, p)
    return p


def read_text_file(path: Path, where: str, what: str) -> str:
    """A text file's contents, UTF-8 with or without a byte-order mark; binary data raises one ScheduleError.

    ``where`` names the file in the message, ``what`` says what the file should be (e.g. "a trace is a CSV file").
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScheduleError(f"{where} cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ScheduleError(f"{where}, line {line}: not UTF-8 text (byte {raw[exc.start]:#04x}): binary data? "
                            f"{what}") from None
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise ScheduleError(f"{where}, line {line}: a NUL byte (binary data); {what}")
    return text


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object], what: str = "output file") -> Path:
    """Write ``path`` whole or not at all: ``write(tmp)`` fills a temporary file beside it, then it is renamed.

    The file gets the mode a plain ``open`` would give (0666 less the umask).
    A failure removes the temporary file and raises :class:`OutputError`.
    """
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {what} {str(p)!r}: {exc.strerror}") from None
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {what} {str(p)!r}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p
