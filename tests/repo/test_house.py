"""The house's shape (issue 31): packages by feature, no import circle, and
each module's one job said in its first docstring line.

Imports are read from the source (ast), those inside functions included:
a circle kept apart only by a late import is still a circle.  Imports under
``if TYPE_CHECKING:`` are exempt (they never run)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import REPO

ROOT = REPO / "rqsys"
TOP_LEVEL_MAX = 16  # modules loose at the top of rqsys/, __init__ and __main__ counted
# packages whose __init__ is their public face (the store's 137 importers say
# ``from rqsys.store import Layout``; a pool queue's member is made there)
FACADES = {"store", "pool"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The rqsys modules ``name`` imports, anywhere in it but TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_blocks(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(_known(a.name, known) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else _known(node.module, known))
    found.discard("")
    found.discard(name)
    return found


def _known(dotted: str, known: set[str]) -> str:
    """The longest prefix of ``dotted`` that is an rqsys module ('' if none)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return ""


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    # a package's __init__ imports nothing: an import of a package names no module
    return {name: {d for d in imports(name, path, known) if mods[d].name != "__init__.py"}
            for name, path in mods.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_among_rqsys_modules():
    assert circles(graph()) == []


def test_the_web_imports_nothing_from_the_daemon():
    web = {name: deps for name, deps in graph().items() if name.startswith("rqsys.web")}
    assert {n: sorted(d for d in deps if d.startswith("rqsys.daemon"))
            for n, deps in web.items() if any(d.startswith("rqsys.daemon") for d in deps)} == {}


def test_few_modules_are_left_at_the_top():
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MAX, top


def test_every_package_init_says_its_rooms_and_imports_nothing():
    for init in ROOT.rglob("__init__.py"):
        if init.parent == ROOT or init.parent.name in FACADES | {"_native"}:
            continue
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), init
        assert not [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)], init


def test_every_module_says_its_job_in_its_first_docstring_line():
    silent = [name for name, path in modules().items()
              if not (ast.get_docstring(ast.parse(path.read_text())) or "").strip()]
    assert silent == []


def test_architecture_lists_every_module_once():
    text = (ROOT.parent / "ARCHITECTURE.md").read_text()
    table = text[text.index("## Every module"):]
    listed = re.findall(r"^\| `(rqsys[\w.]*)` \|", table, re.M)
    assert sorted(listed) == sorted(set(listed))  # once each
    assert sorted(set(listed)) == sorted(modules())
