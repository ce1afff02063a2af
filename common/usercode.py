"""The boundary of the user's code: loading it, and its errors as one line naming the user's function, file and line.

A user brings code in two ways: a model (``--model FILE.py:factory``, :mod:`real.model_api`) and a schedule
(``--schedule FILE.py:NAME`` or ``--import MODULE``, :mod:`schedules.load`). :func:`load_object` loads
``file.py:NAME`` or ``pkg.module:NAME``; :func:`call` runs a user's function and turns whatever it raises
(``sys.exit`` included) into a :class:`UserCodeError`: one line with the exception and the innermost frame of the
user's own files, and the user's frames alone (never schedlab's) in :attr:`UserCodeError.frames`, which the
command line prints under ``-v``. No torch here: the checks of a model's outputs are :mod:`real.usercode`'s.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from common.errors import ConfigError

__all__ = ["UserCodeError", "call", "describe", "import_beside_command", "import_user", "is_file_or_module_ref",
           "load_object", "raised", "user_frames"]

# Files that are not the user's: the interpreter's, installed packages', and schedlab's own packages.
_OURS = tuple(str(Path(__file__).resolve().parents[1] / d) + "/" for d in ("common", "real", "sim", "schedules", "analysis"))
_SYSTEM = tuple({str(Path(p).resolve()) + "/" for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


class UserCodeError(ConfigError):
    """The user's code failed or returned what the runtime cannot use; ``frames``: the user's traceback frames."""

    def __init__(self, message: str, *, field: str | None = None, frames: Sequence[str] = ()) -> None:
        super().__init__(message, field=field)
        self.frames = list(frames)


def is_user_file(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    path = str(Path(filename).resolve())
    return not path.startswith(_OURS) and not path.startswith(_SYSTEM) and "site-packages" not in path


def user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback that are in the user's files, outermost first."""
    return [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename)]


def describe(fn: Callable[..., Any], name: str) -> str:
    """``name`` with where ``fn`` is defined: ``batches (my_model.py:14, make)``, or its qualified name if not the user's."""
    target = inspect.unwrap(getattr(fn, "forward", fn)) if not inspect.isroutine(fn) else fn
    try:
        file, line = inspect.getsourcefile(target), inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        file, line = None, None
    qual = getattr(target, "__qualname__", type(fn).__name__)
    if file is None or not is_user_file(file):
        return f"{name} ({getattr(target, '__module__', '?')}.{qual})"
    return f"{name} ({Path(file).name}:{line}, {qual})"


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"sys.exit({exc.code!r})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def raised(what: str, exc: BaseException, field: str) -> UserCodeError:
    """The UserCodeError of ``exc`` raised by ``what`` (the user's code)."""
    frames = user_frames(exc)
    at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    verb = "called" if isinstance(exc, SystemExit) else "raised"
    hint = "; a function of the model must return, not exit" if isinstance(exc, SystemExit) and field != "schedule" \
        else "; a schedule function must return, not exit" if isinstance(exc, SystemExit) else ""
    return UserCodeError(f"{what} {verb} {_first_line(exc)}{at}{hint}", field=field,
                         frames=traceback.format_list(frames))


def call(what: str, fn: Callable[..., Any], *args: Any, field: str = "model") -> Any:
    """``fn(*args)``; whatever it raises (``sys.exit`` too) as a UserCodeError naming ``what``."""
    try:
        return fn(*args)
    except UserCodeError:
        raise
    except (Exception, SystemExit) as exc:
        raise raised(what, exc, field) from exc


def load_object(spec: str, what: str, field: str) -> Any:
    """``path/to/file.py:NAME`` or ``pkg.module:NAME`` -> the object NAME of that file or module.

    The file is loaded by its path, the module as ``python -m`` finds it (:func:`import_beside_command`); an error
    while importing is one line naming the user's file and line (:func:`raised`). ``what`` names the reference in
    messages (``model 'm.py:net'``), ``field`` is the field at fault.
    """
    module = import_user(spec.rpartition(":")[0], what, field, spec=spec)
    attr = spec.rpartition(":")[2]
    found = getattr(module, attr, None)
    if found is None:
        raise ConfigError(f"{what}: {spec.rpartition(':')[0]} has no {attr!r}", field=field)
    return found


def is_file_or_module_ref(spec: str) -> bool:
    """``file.py:NAME`` or ``pkg.module:NAME`` (a colon, a non-empty module part and NAME)."""
    module, sep, attr = spec.rpartition(":")
    return bool(sep and module and attr) and (module.endswith(".py") or all(p.isidentifier() for p in module.split(".")))


def import_user(module_name: str, what: str, field: str, *, spec: str | None = None) -> ModuleType:
    """Import a user's ``path/file.py`` (by its path, once per process) or ``pkg.module``; errors as one line."""
    shown = spec if spec is not None else module_name
    if not module_name:
        raise ConfigError(f"{what}: give pkg.module:NAME or path/file.py:NAME, got {shown!r}", field=field)
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise ConfigError(f"{what}: no file {module_name}", field=field)
            key = f"schedlab_user_{path.stem}_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
            if key in sys.modules:  # once per process: a file named twice is one module
                return sys.modules[key]
            return _exec_module(importlib.util.spec_from_file_location(key, path), key)
        return import_beside_command(module_name)
    except ConfigError:
        raise
    except SystemExit as exc:  # the module's own code exits while it is imported
        raise raised(f"{what}: importing {module_name}", exc, field) from exc
    except Exception as exc:  # the user's module failed to import: one line with its error and where
        frames = user_frames(exc)
        at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
        raise UserCodeError(f"{what}: importing {module_name} failed ({_first_line(exc)}){at}", field=field,
                            frames=traceback.format_list(frames)) from exc


def import_beside_command(name: str) -> ModuleType:
    """Import ``name`` as ``python -m`` finds it: its top-level module in the working directory first, else on sys.path.

    importlib alone, sys.path untouched: the top-level module or package is loaded from the working directory by
    its path, and a package's submodules come from its own ``__path__``. Code split over several files next
    to the command is therefore a package (``pkg/__init__.py``) whose modules import each other as ``pkg.x`` or
    relatively; a lone module's ``import neighbour`` resolves on sys.path as usual.
    """
    top = name.partition(".")[0]
    if top not in sys.modules:
        found = importlib.machinery.PathFinder.find_spec(top, [str(Path.cwd())])
        if found is not None and found.origin is not None and found.loader is not None:  # not a namespace dir
            _exec_module(found, top)
    return importlib.import_module(name)


def _exec_module(spec: importlib.machinery.ModuleSpec, key: str) -> ModuleType:
    """Run the module of ``spec`` as ``sys.modules[key]``; a module that fails to import is not left there."""
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module
