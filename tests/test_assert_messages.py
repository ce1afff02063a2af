"""No check hides in an assertion's message: ``assert a, b and c`` tests a alone (b and c only build the text)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def checks_in_messages(source: str) -> list[int]:
    """Lines of the asserts whose message is a comparison or an ``and``/``or``: a check that never runs."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Assert) and isinstance(n.msg, ast.BoolOp | ast.Compare)]


def test_the_shape_is_found():
    src = ("assert code == 0, err and out == 4\n"
           "assert x, y == 1\n"
           "assert code == 0, err\n"
           "assert a and b, f'{a} {b}'\n")
    assert checks_in_messages(src) == [1, 2]


def test_no_test_checks_inside_an_assertion_message():
    found = [f"{p.name}:{line}" for p in sorted(TESTS.rglob("*.py")) for line in checks_in_messages(p.read_text())]
    assert found == []
