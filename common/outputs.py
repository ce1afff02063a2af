"""The one output-path policy: every file or folder schedlab writes is checked early and written whole.

Before any work (:func:`check_output_file`, :func:`check_output_dir`, :func:`check_distinct`):

* a name longer than the file system allows (``NAME_MAX`` bytes per name,
  ``PATH_MAX`` bytes in all) is refused, also the name of a sidecar;
* an existing target that is not a regular file (a directory, a character
  device such as ``/dev/null``, a fifo, a socket) is refused, never replaced;
* two outputs of one command that name one file (by path or as the same
  inode), and an output that names one of the command's inputs, are refused;
* the folder must be writable, or creatable under its nearest existing ancestor.

A command checks all its paths at once with :func:`check_paths`: every input and every output it will
write, derived sidecars (``OUT.json``, ``OUT.tokenizer.json``) and files inside its folders (the
``metrics.jsonl`` of a log folder) included, as :class:`Output` entries. Files a command appends to
(an event log, ``metrics.jsonl``) cannot be written atomically; they are checked like the others
(never an input, never another output, a regular file or none, writable) and :func:`open_append`
refuses again, on the file it opened, one that is an input.

Writing (:func:`atomic_write`, :func:`atomic_write_all`, :func:`replace_folder`):
each file goes to a short temporary name in its own folder, then ``os.replace``
puts it in place; a set of files is all written to temporaries first and only
then renamed; a folder is filled as a fresh temporary folder and swapped in, so
a failure leaves the previous contents as they were and no stale file remains.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from common.errors import OutputError, quote

__all__ = [
    "Output",
    "atomic_write",
    "atomic_write_all",
    "check_append_file",
    "check_distinct",
    "check_name_length",
    "check_output_dir",
    "check_output_file",
    "check_paths",
    "open_append",
    "replace_folder",
    "write_files_into",
]

Writer = Callable[[Path], object]

# A temporary name is '.' + 8 random characters + '.tmp' (13 bytes), whatever the target's length: a legal
# 254-byte name must not be refused because its temporary name would be longer.
_TMP_PREFIX, _TMP_SUFFIX = ".", ".tmp"


def _show(path: str | os.PathLike) -> str:
    return quote(str(path))


def _nearest_existing(p: Path) -> Path:
    probe = p
    while True:
        try:
            if probe.exists() or probe.parent == probe:
                return probe
        except OSError:  # a name too long to stat: its parent is checked
            pass
        probe = probe.parent


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder if folder.is_dir() else folder.parent, name)
    except (OSError, ValueError):
        return default


def check_name_length(path: str | os.PathLike, what: str) -> Path:
    """Each name of ``path`` within ``NAME_MAX`` bytes and the whole within ``PATH_MAX``, as the file system says."""
    p = Path(path)
    if "\0" in str(p):
        raise OutputError(f"{what} {_show(p)}: a file name cannot hold a NUL character")
    anchor = _nearest_existing(Path(os.path.abspath(p)))
    name_max = _limit(anchor, "PC_NAME_MAX", 255)
    path_max = _limit(anchor, "PC_PATH_MAX", 4096)
    for part in p.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise OutputError(f"{what} {_show(p)}: the name {quote(part)} is {size} bytes; the file system allows "
                              f"{name_max}: give a shorter name")
    size = len(os.fsencode(os.path.abspath(p)))
    if size >= path_max:
        raise OutputError(f"{what} {_show(p)}: the path is {size} bytes; the file system allows {path_max - 1}: "
                          "give a shorter path")
    return p


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a fifo"),
          (stat.S_ISSOCK, "a socket"))


def _stat(p: Path, what: str) -> os.stat_result | None:
    try:
        return os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise OutputError(f"{what} {_show(p)}: {exc.strerror or exc}") from None


def _refuse_special(p: Path, what: str, names: str = "") -> None:
    """An existing target that is not a regular file is never replaced by one."""
    st = _stat(p, what)
    if st is None or stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{what} {_show(p)} is a directory; give a file name" + (f" ending in {names}" * bool(names)))
    kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
    raise OutputError(f"{what} {_show(p)} is {kind}, not a regular file; it is never replaced: give a file name")


def _writable_folder(folder: Path, what: str, target: Path) -> None:
    """``folder`` exists as a writable directory, or can be made under its nearest existing ancestor."""
    probe = _nearest_existing(folder)
    if not probe.is_dir():
        raise OutputError(f"{what} {_show(target)}: {_show(probe)} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {_show(target)}: folder {_show(probe)} is not writable")
    try:  # catches what access() does not: a read-only or virtual file system (/proc, /sys), a full quota
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise OutputError(f"{what} {_show(target)}: cannot write in {_show(probe)} ({exc.strerror})") from None


def check_output_file(path: str | os.PathLike, what: str, suffixes: Sequence[str] = ()) -> Path:
    """Check an output file before any work: its length, its suffix, a regular file or none, its folder writable."""
    p = check_name_length(path, what)
    names = " or ".join(suffixes) if len(suffixes) == 2 else ", ".join(suffixes)
    if suffixes and p.suffix.lower() not in suffixes:
        raise OutputError(f"{what} {_show(p)}: use a name ending in {names}")
    _refuse_special(p, what, names)
    _writable_folder(p.parent if str(p.parent) else Path("."), what, p)
    return p


def check_append_file(path: str | os.PathLike, what: str) -> Path:
    """Check a file that is appended to (never replaced): its length, a regular file or none, writable."""
    p = check_name_length(path, what)
    _refuse_special(p, what)
    if p.exists() and not os.access(p, os.W_OK):
        raise OutputError(f"{what} {_show(p)} is not writable; make it writable or give another name")
    _writable_folder(p.parent if str(p.parent) else Path("."), what, p)
    return p


def check_output_dir(path: str | os.PathLike, what: str, *, replaced: Callable[[Path], bool] | None = None) -> Path:
    """Check an output folder before any work: its length, not a file, and writable or creatable.

    ``replaced``: the folder is replaced as a whole (:func:`replace_folder`); an existing one must be empty or
    pass ``replaced(folder)`` (it holds only what this output writes), else it is refused: nothing of the
    user's is ever removed.
    """
    p = check_name_length(path, what)
    st = _stat(p, what)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "a file")
        raise OutputError(f"{what} {_show(p)} is {kind}; give a folder")
    if replaced is not None and st is not None:
        try:
            foreign = any(p.iterdir()) and not replaced(p)
        except OSError as exc:
            raise OutputError(f"{what} {_show(p)} cannot be read ({exc.strerror or exc}); give a new or empty "
                              "folder") from None
        if foreign:
            raise OutputError(f"{what} {_show(p)} holds files this command does not write; it replaces the folder "
                              "as a whole: give a new or empty folder")
    _writable_folder(p, what, p)
    return p


def _identity(p: Path) -> tuple:
    try:
        st = os.stat(p)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(p))


def _inside(p: Path, folder: Path) -> bool:
    here, root = os.path.realpath(p), os.path.realpath(folder)
    return here == root or here.startswith(root.rstrip(os.sep) + os.sep)


PathMap = Mapping[str, "str | os.PathLike | None"]


def check_distinct(outputs: PathMap, inputs: PathMap | None = None, *, folders: PathMap | None = None,
                   appended: Collection[str] = ()) -> None:
    """No two outputs name one file, no output names an input, and no input lies in a replaced folder.

    Keys are what the message calls each path (a flag on the command line, a field in the library);
    None values are ignored. ``folders``: output folders replaced as a whole; ``appended``: the keys of
    ``outputs`` that are appended to, not replaced (their message says so).
    """
    inputs, folders = inputs or {}, folders or {}
    seen: dict[tuple, tuple[str, str | os.PathLike]] = {}
    for label, path in outputs.items():
        if path is None:
            continue
        key = _identity(Path(path))
        if key in seen:
            raise OutputError(f"{seen[key][0]} and {label} name the same file {_show(path)}; one would overwrite "
                              "the other: give each output its own name")
        seen[key] = (label, path)
    for label, path in inputs.items():
        if path is None:
            continue
        key = _identity(Path(path))
        if key in seen:
            out_label, out_path = seen[key]
            harm = "appending to it would change" if out_label in appended else "writing it would destroy"
            raise OutputError(f"{out_label} {_show(out_path)} is also an input ({label}); {harm} the input: give the "
                              "output another name")
        for out_label, folder in folders.items():
            if folder is not None and _inside(Path(path), Path(folder)):
                raise OutputError(f"the input {label} {_show(path)} lies in {out_label} {_show(folder)}, which is "
                                  "replaced as a whole: move the input out, or give another folder")


@dataclass(frozen=True, slots=True)
class Output:
    """One path a command writes, for :func:`check_paths`.

    ``kind``: ``file`` (written whole), ``append`` (appended to: an event log, ``metrics.jsonl``),
    ``folder`` (files are added to it) or ``replaced`` (replaced as a whole: ``replaced(folder)`` says whether an
    existing one holds only what the command writes). ``what`` names it in messages about the path itself.
    """

    path: str | os.PathLike
    what: str
    kind: str = "file"
    suffixes: tuple[str, ...] = ()
    replaced: Callable[[Path], bool] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("file", "append", "folder", "replaced"):
            raise ValueError(f"Output kind {self.kind!r}: file, append, folder or replaced")


def check_paths(outputs: Mapping[str, Output | None], inputs: PathMap | None = None) -> dict[str, Path]:
    """The one check of a command's paths, before anything runs or is written: each output on its own
    (:func:`check_output_file`, :func:`check_append_file`, :func:`check_output_dir`), then all together
    (:func:`check_distinct`): no two files are one, none is an input, no input lies in a replaced folder.

    Keys are what messages call each path (a flag, or ``the metrics file of --log-dir``); None entries, and
    inputs that are None, are ignored. Returns each output's checked path.
    """
    checked: dict[str, Path] = {}
    for label, out in outputs.items():
        if out is None:
            continue
        if out.kind == "file":
            checked[label] = check_output_file(out.path, out.what, out.suffixes)
        elif out.kind == "append":
            checked[label] = check_append_file(out.path, out.what)
        else:
            checked[label] = check_output_dir(out.path, out.what, replaced=out.replaced if out.kind == "replaced"
                                              else None)
    files = {k: p for k, p in checked.items() if outputs[k].kind in ("file", "append")}
    appended = {k for k, p in checked.items() if outputs[k].kind == "append"}
    check_distinct(files, inputs, folders={k: p for k, p in checked.items() if outputs[k].kind == "replaced"},
                   appended=appended)
    return checked


def open_append(path: str | os.PathLike, what: str, inputs: PathMap | None = None) -> IO[str]:
    """``path`` opened for appending text, refused (OutputError) if what was opened is not a regular file or is
    one of ``inputs`` (by inode: the check before the run could have been raced by a rename or a link)."""
    p = check_append_file(path, what)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        f = open(p, "a")
    except OSError as exc:
        raise OutputError(f"cannot write {what} {_show(p)}: {exc.strerror or exc}") from None
    st = os.fstat(f.fileno())
    mine = ("inode", st.st_dev, st.st_ino)
    for label, source in (inputs or {}).items():
        if source is not None and _identity(Path(source)) == mine:
            f.close()
            raise OutputError(f"{what} {_show(p)} is also an input ({label}); appending to it would change the "
                              "input: give the output another name")
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise OutputError(f"{what} {_show(p)} is not a regular file; it is never written: give a file name")
    return f


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temporary(p: Path, what: str) -> Path:
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=p.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {what} {_show(p)}: {exc.strerror or exc}") from None
    os.close(fd)
    return Path(name)


def atomic_write_all(items: Iterable[tuple[str | os.PathLike, Writer, str]]) -> list[Path]:
    """Write several files all or none: each ``write(tmp)`` fills a temporary file, then all are renamed.

    Every target is checked again (never a device, fifo or directory). A failure
    removes every temporary file and raises :class:`OutputError`; the files
    already there are left as they were. Each file gets the mode a plain ``open``
    would give (0666 less the umask).
    """
    todo = [(Path(path), write, what) for path, write, what in items]
    for p, _, what in todo:
        check_name_length(p, what)
        _refuse_special(p, what)
    temps: list[Path] = []
    try:
        for p, write, what in todo:
            tmp = _temporary(p, what)
            temps.append(tmp)
            try:
                write(tmp)
                os.chmod(tmp, 0o666 & ~_umask())
            except OSError as exc:
                raise OutputError(f"cannot write {what} {_show(p)}: {exc.strerror or exc}") from None
        for (p, _, what), tmp in zip(todo, temps, strict=True):
            _refuse_special(p, what)  # made one since the check: still never replaced
            try:
                os.replace(tmp, p)
            except OSError as exc:
                raise OutputError(f"cannot write {what} {_show(p)}: {exc.strerror or exc}") from None
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return [p for p, _, _ in todo]


def atomic_write(path: str | os.PathLike, write: Writer, what: str = "output file") -> Path:
    """Write ``path`` whole or not at all: ``write(tmp)`` fills a temporary file beside it, then it is renamed."""
    return atomic_write_all([(path, write, what)])[0]


def replace_folder(path: str | os.PathLike, fill: Callable[[Path], object], what: str) -> Path:
    """Fill a fresh temporary folder beside ``path`` with ``fill(tmp)``, then swap it in for ``path``.

    No file of a previous folder remains, and a failure (in ``fill`` or the swap)
    leaves the previous folder as it was. Check the folder with
    :func:`check_output_dir` (``replaced=``) first: whatever is in it is removed.
    """
    final = Path(path)
    check_name_length(final, what)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=final.parent))
    except OSError as exc:
        raise OutputError(f"cannot write {what} {_show(final)}: {exc.strerror or exc}") from None
    old: Path | None = None
    swapped = False
    try:
        fill(stage)
        os.chmod(stage, 0o777 & ~_umask())
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=final.parent))
            os.rename(final, old / "previous")
        try:
            os.rename(stage, final)
            swapped = True
        except OSError:
            if old is not None:
                os.rename(old / "previous", final)
            raise
    except OSError as exc:
        if exc.errno == errno.ENOTEMPTY:
            exc.strerror = f"{final} changed while it was written"
        raise OutputError(f"cannot write {what} {_show(final)}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if old is not None and (swapped or not (old / "previous").exists()):
            shutil.rmtree(old, ignore_errors=True)  # never the previous folder unless the new one is in place
    return final


def write_files_into(path: str | os.PathLike, fill: Callable[[Path], object], what: str) -> list[Path]:
    """Files added to a folder all or none: ``fill(tmp)`` writes them into a temporary folder inside ``path``,
    then each is renamed into ``path`` (other files there stay). Returns the files' paths in ``path``.

    A failure in ``fill`` leaves ``path`` as it was; every target is checked
    (never a directory, device or fifo) before the first is renamed.
    """
    final = Path(path)
    check_name_length(final, what)
    try:
        final.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=final))
    except OSError as exc:
        raise OutputError(f"cannot write {what} {_show(final)}: {exc.strerror or exc}") from None
    try:
        fill(stage)
        moves = [(item, final / item.relative_to(stage)) for item in sorted(stage.rglob("*")) if item.is_file()]
        for _, target in moves:
            check_name_length(target, what)
            _refuse_special(target, what)
        for item, target in moves:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(item, target)
    except OSError as exc:
        raise OutputError(f"cannot write {what} {_show(final)}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return [target for _, target in moves]
