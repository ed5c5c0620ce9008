"""A message's life in one place (issue 47): the ledger written only by the
transitions, and no feature tested for by hand on the message's path."""

from __future__ import annotations

import ast
import re

from conftest import REPO

from rqsys.daemon.ledger import WRITERS

ROOT = REPO / "rqsys"
# the transitions and their collaborators: the only callers of the ledger's writers
WRITING = {"daemon/ledger.py", "daemon/transitions.py", "daemon/retries.py",
           "daemon/removals.py", "daemon/queload.py"}
# the path every message takes: no feature is asked for by name there
PATH = ("daemon/loop.py", "daemon/intake.py", "daemon/transitions.py", "run/runner.py",
        "run/dups.py", "run/environment.py")
FEATURE_TEST = re.compile(r"\b(self\.pool|\.pool\b|tracing|\.traces\b)")


def _ledger_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each ``<...>ledger.<name>`` used, and each assignment to one."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
                isinstance(node.value, ast.Name) and node.value.id == "ledger"
                or isinstance(node.value, ast.Attribute) and node.value.attr == "ledger"):
            found.append((node.lineno, node.attr))
    return found


def test_only_the_transitions_write_the_ledger():
    writes = []
    for path in ROOT.rglob("*.py"):
        where = str(path.relative_to(ROOT))
        if where in WRITING:
            continue
        for line, name in _ledger_calls(ast.parse(path.read_text())):
            if name in WRITERS or name.startswith("_"):
                writes.append(f"{where}:{line}: ledger.{name}")
    assert writes == []


def test_the_ledgers_state_is_private():
    """Every field of the state is an underscore name; what others read is a
    property or a reading method (the que as ``QueView``, read only)."""
    from rqsys.daemon.ledger import Ledger

    tree = ast.parse((ROOT / "daemon/ledger.py").read_text())
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.name == "__init__" and n.lineno > _class_line(tree, "Ledger"))
    fields = {t.attr for n in ast.walk(init) if isinstance(n, ast.Assign | ast.AnnAssign)
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              for t in (t.elts if isinstance(t, ast.Tuple) else [t])
              if isinstance(t, ast.Attribute)}
    public = sorted(f for f in fields if not f.startswith("_"))
    # its collaborators, not its state: the store, the log, the moments, the unique index
    assert public == ["log", "moments", "store", "unique"]
    assert isinstance(Ledger.schedule, property) and isinstance(Ledger.running, property)


def _class_line(tree: ast.AST, name: str) -> int:
    return next(n.lineno for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                and n.name == name)


def test_no_feature_is_tested_for_on_a_messages_path():
    found = []
    for where in PATH:
        for number, line in enumerate((ROOT / where).read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if FEATURE_TEST.search(code) and not code.strip().startswith(('"', "'")):
                found.append(f"{where}:{number}: {line.strip()}")
    assert found == []
