"""The house's sizes (issue 12): every module under rqsys/ under 400 lines and
no function over 40 lines: a module or function past them does more than
one thing.  The one exception is named.  Classes have no cap of their own
(issue 31): one made a chain of subclasses out of the daemon's transitions."""

from __future__ import annotations

import ast

from conftest import REPO

ROOT = REPO / "rqsys"
MODULE, FUNCTION = 400, 40
# a table, not logic: the OpenAPI document's paths, one entry a route
LONG_FUNCTIONS = {"web/openapi.py:_queue_paths"}


def _sizes() -> list[tuple[str, str, int]]:
    """(kind, where, lines) of every module and function of rqsys."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        source = path.read_text()
        found.append(("module", name, len(source.splitlines())))
        for node in ast.walk(ast.parse(source)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1 \
                if isinstance(node, ast.stmt) else 0
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append(("function", f"{name}:{node.name}", lines))
    return found


def test_modules_and_functions_stay_small():
    limits = {"module": MODULE - 1, "function": FUNCTION}
    over = [f"{kind} {where}: {lines} lines" for kind, where, lines in _sizes()
            if lines > limits[kind] and where not in LONG_FUNCTIONS]
    assert over == []


def test_the_exceptions_are_still_needed():
    long = {where for kind, where, lines in _sizes() if kind == "function" and lines > FUNCTION}
    assert long == LONG_FUNCTIONS
