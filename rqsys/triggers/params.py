"""An event's params: a tiny JSON path subset (``$.a.b[0]``) over the body, or ``header:NAME``.

A path is ``$`` followed by ``.key`` (letters, digits, ``_`` and ``-``) and
``[N]`` steps, nothing else (no wildcards, filters or quotes).  A string is
taken as it is, any other value as compact JSON; a path that leads nowhere
(or a body that is not JSON) leaves its param out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from rqsys.errors import ConfigError

STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[([0-9]+)\]")
HEADER = "header:"
MISSING = object()


def steps(path: str) -> list[str | int]:
    """``$.a.b[0]`` -> ``["a", "b", 0]``; ConfigError for anything else."""
    if not path.startswith("$"):
        raise ConfigError(f"{path[:100]!r}: a JSON path starts with $")
    out: list[str | int] = []
    at = 1
    while at < len(path):
        found = STEP.match(path, at)
        if found is None:
            raise ConfigError(f"{path[:100]!r}: only .key and [N] steps are understood")
        out.append(found.group(1) if found.group(1) is not None else int(found.group(2)))
        at = found.end()
    return out


def lookup(doc: Any, path: str) -> Any:
    """The value at ``path`` in ``doc``, else MISSING."""
    for step in steps(path):
        in_list = isinstance(step, int) and isinstance(doc, list) and step < len(doc)
        if not (in_list or (isinstance(step, str) and isinstance(doc, dict) and step in doc)):
            return MISSING
        doc = doc[step]
    return doc


def text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def parse_body(body: bytes) -> Any:
    """The body as JSON, else MISSING."""
    try:
        return json.loads(body)
    except ValueError:  # UnicodeDecodeError is one
        return MISSING


def gather(wanted: dict[str, str], body: bytes,
           header: Callable[[str], str | None]) -> dict[str, str]:
    """``{"param1": "$.repository.full_name", "param2": "header:X-GitHub-Event"}`` ->
    their values in this event (the body parsed once, only if a path asks)."""
    doc: Any = None
    out: dict[str, str] = {}
    for param, source in sorted(wanted.items()):
        if source.startswith(HEADER):
            value: Any = header(source[len(HEADER):])
            value = MISSING if value is None else value
        else:
            doc = parse_body(body) if doc is None else doc
            value = MISSING if doc is MISSING else lookup(doc, source)
        if value is not MISSING:
            out[param] = text(value)
    return out
