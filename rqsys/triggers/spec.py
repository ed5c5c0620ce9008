"""Trigger files: ``<root>/triggers/<name>.json`` read and checked against ``trigger.json``.

A trigger file (or a symlink to one) names exactly one kind (``files``,
``webhook``, ``journal``) and the message each event makes (``msg``, with
its ``dest`` queue).  One bad file is refused alone, with the reason; the
others carry on.  Files are read when used (the web reads a webhook's at
each request, remembering the parsed file while its inode, size and mtime
stay the same), so a new or edited trigger needs no restart.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqsys import config
from rqsys.errors import ConfigError, NotFound
from rqsys.store import Layout

TRIGGERS_DIR = "triggers"  # beside timers/ (rqsys.store.Layout keeps no name for it)
KINDS = ("files", "webhook", "journal")
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}"
NAME_RE = re.compile(rf"^{NAME_PATTERN}$")
DEFAULTS = {"header": "X-Signature", "tolerance": 300, "max_body": 1 << 20,
            "unique_for": 604800}


@dataclass(frozen=True)
class Trigger:
    """One checked trigger file."""

    name: str
    kind: str
    settings: dict[str, Any]  # the kind's object (webhook: with DEFAULTS filled in)
    msg: dict[str, Any]
    params: dict[str, str] = field(default_factory=dict)

    @property
    def dest(self) -> str:
        return str(self.msg["dest"])


def triggers_dir(layout: Layout) -> Path:
    return layout.root / TRIGGERS_DIR


def trigger_name(filename: str) -> str | None:
    """``deploy.json`` -> ``deploy``; None for a name that is no trigger's."""
    if not filename.endswith(".json"):
        return None
    name = filename[: -len(".json")]
    return name if NAME_RE.match(name) else None


def names(layout: Layout) -> list[str]:
    """The names of the trigger files, sorted (hidden files, such as ``.state/``, left out)."""
    try:
        entries = os.listdir(triggers_dir(layout))
    except FileNotFoundError:
        return []
    return sorted(n for n in map(trigger_name, entries) if n is not None)


def path_of(layout: Layout, name: str) -> Path:
    if not NAME_RE.match(name):
        raise NotFound(f"no trigger named {name[:100]!r}")
    return triggers_dir(layout) / f"{name}.json"


def parse(name: str, data: Any, source: str) -> Trigger:
    """A trigger from a file's JSON; ConfigError names the file and the field."""
    if isinstance(data, dict):
        given = [k for k in KINDS if k in data]
        if len(given) != 1:
            raise ConfigError(f"{source}: {'/'.join(KINDS)}: give exactly one "
                              f"(given: {' and '.join(given) or 'none'})")
    checked = config.validate("trigger", data, source)
    kind = next(k for k in KINDS if k in checked)
    settings = dict(checked[kind])
    if kind == "webhook":
        settings = {**DEFAULTS, **settings}
    return Trigger(name, kind, settings, dict(checked["msg"]), dict(checked.get("params", {})))


def load(layout: Layout, name: str) -> Trigger:
    """Read and check ``triggers/<name>.json``; NotFound without one."""
    path = path_of(layout, name)
    if not os.path.lexists(path):
        raise NotFound(f"no trigger named {name}")
    if not path.is_file():
        raise ConfigError(f"{path}: {'broken link' if path.is_symlink() else 'not a file'}")
    return parse(name, config.load_json(path), str(path))


class Cache:
    """Parsed trigger files, each taken again once its file changes (inode,
    size, mtime: a replaced or edited file is read anew); shared by threads."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._known: dict[str, tuple[tuple[int, ...], Trigger]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Trigger:
        path = path_of(self.layout, name)
        try:
            st = path.stat()
        except FileNotFoundError:
            return load(self.layout, name)  # NotFound, or a broken link's ConfigError
        key = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)
        with self._lock:
            known = self._known.get(name)
        if known is not None and known[0] == key:
            return known[1]
        trigger = load(self.layout, name)
        with self._lock:
            self._known[name] = (key, trigger)
        return trigger
