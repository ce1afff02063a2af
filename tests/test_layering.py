"""The packages import only downward: schedules <- sim <- analysis, real beside sim on schedules.

The command line (analysis/cli/) sits on top and may import any package; the
``__main__`` entry points (``python -m sim``, ``python -m real``) and a module's
``if __name__ == "__main__":`` block are command-line code too. Everything else
is library code and is checked here, import by import, from the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schedules", "sim", "real", "analysis")
# What each library package may import (itself included).
ALLOWED = {
    "schedules": {"schedules"},
    "sim": {"schedules", "sim"},
    "real": {"schedules", "real"},
    "analysis": {"schedules", "sim", "analysis"},
}


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, top-level package) of every import outside a __main__ guard, at any depth."""
    found = []
    stack: list[ast.AST] = [n for n in tree.body if not _is_main_guard(n)]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
        stack.extend(ast.iter_child_nodes(node))
    return found


def _library_modules() -> list[Path]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if path.name == "__main__.py" or rel.parts[:2] == ("analysis", "cli"):
                continue
            out.append(rel)
    return out


@pytest.mark.parametrize("rel", _library_modules(), ids=str)
def test_library_module_imports_only_downward(rel):
    pkg = rel.parts[0]
    tree = ast.parse((ROOT / rel).read_text(), str(rel))
    upward = [(line, mod) for line, mod in _imports(tree) if mod in PACKAGES and mod not in ALLOWED[pkg]]
    assert upward == [], f"{rel} imports {upward} (line, package); {pkg} may import only {sorted(ALLOWED[pkg])}"


def test_entry_points_are_shims_onto_the_cli():
    for rel in ("sim/__main__.py", "real/__main__.py", "analysis/__main__.py"):
        mods = {mod for _, mod in _imports(ast.parse((ROOT / rel).read_text()))}
        assert mods <= {"analysis", "sys"}, rel


def test_no_library_message_names_a_flag():
    """Library errors name fields; only analysis/cli/ turns them into flags."""
    offenders = []
    for rel in _library_modules():
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                text = ast.unparse(node.exc)
                if " --" in text or "'--" in text or '"--' in text or "(--" in text:
                    offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []
