"""The scandir library: scandir entries in, queue directories out (RQ's "scandir").

An entry ``scandir/<name>`` (a symlink to, or a directory) holding an
executable ``run`` becomes queue ``<name>``: its effective ``config.json``
is the defaults overlaid by the entry's own ``config.json``, ``script``
pointing at the real path of ``run``; its ``form.json`` is linked, and a
``.scandir`` marker records that rq-scan owns (and may trash) the queue.
Taking such a queue out of service is two steps with the daemon's stop in
between: :func:`mark_removed`, then :func:`trash` once it is stopped.

This module knows nothing of events or of who serves a queue; the watcher
that keeps queues in line with a changing scandir is :mod:`rqsys.scan.watcher`.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any

from rqsys import config
from rqsys.errors import ConfigError, RQError
from rqsys.observe.events import EventLog
from rqsys.store import DISABLED_MARK, QUEUE_NAME_RE, SCANDIR_MARK, Layout

QUEUE_FILES = frozenset({"run", "config.json", "form.json"})  # what an entry is made of
TIMERS_SUBDIR = ".timers"  # <scandir>/.timers holds timers shipped with the scripts


class Change(enum.Enum):
    """What installing an entry did to its queue."""

    NEW = "new"
    UPDATED = "updated"
    SAME = "same"


def is_entry_name(name: str) -> bool:
    """False for hidden names: editors' files, and .timers/."""
    return bool(name) and not name.startswith(".")


def entry_names(scandir: Path) -> list[str]:
    """The entries of ``scandir`` (none if it is not a directory)."""
    if not scandir.is_dir():
        return []
    return sorted(p.name for p in scandir.iterdir() if is_entry_name(p.name))


def entry_config(name: str, entry: Path) -> dict[str, Any]:
    """The effective config for scandir entry ``entry``; ConfigError says why not."""
    if not QUEUE_NAME_RE.match(name):
        raise ConfigError(f"{entry}: invalid queue name {name!r}")
    if not entry.exists():
        raise ConfigError(f"{entry}: broken link")
    if not entry.is_dir():
        raise ConfigError(f"{entry}: not a directory")
    run = entry / "run"
    if not run.is_file() or not os.access(run, os.X_OK):
        raise ConfigError(f"{run}: missing or not executable")
    own = entry / "config.json"
    overlay = config.load_json(own) if own.exists() else {}
    if not isinstance(overlay, dict):
        raise ConfigError(f"{own}: (top level): not a JSON object")
    return config.queue_config(name, os.path.realpath(run), overlay, str(own))


def install_queue(layout: Layout, name: str, entry: Path) -> dict[str, Any]:
    """Create or update queue ``name`` from its scandir entry."""
    cfg = entry_config(name, entry)
    layout.create_queue_dir(name, cfg)
    form = entry / "form.json"
    layout.link_form(name, form.resolve() if form.exists() else None)
    return cfg


def install_from_scandir(layout: Layout, name: str, entry: Path) -> dict[str, Any]:
    """install_queue, marking the queue as rq-scan's: removing the entry trashes it."""
    cfg = install_queue(layout, name, entry)
    layout.mark_queue(name, SCANDIR_MARK, f"{entry}\n")
    return cfg


def apply_entry(layout: Layout, name: str, entry: Path, changed: bool = False) -> Change:
    """Install ``entry`` as queue ``name``; whether that made or changed a queue.

    ``changed`` (an event touched the entry) counts as an update even when
    the installed config and form come out the same: the script may differ.
    """
    before = installed_state(layout, name)
    install_from_scandir(layout, name, entry)
    if before[0] is None:
        return Change.NEW
    if changed or installed_state(layout, name) != before:
        return Change.UPDATED
    return Change.SAME


def installed_from_scandir(layout: Layout, name: str) -> bool:
    """True for a queue rq-scan installed (and so may take out of service)."""
    return bool(QUEUE_NAME_RE.match(name)) and (layout.queue_dir(name) / SCANDIR_MARK).exists()


def scandir_queues(layout: Layout) -> list[str]:
    """The queues in service that rq-scan installed."""
    return [n for n in layout.queue_names() if installed_from_scandir(layout, n)]


def installed_state(layout: Layout, name: str) -> tuple[Any, str]:
    """(effective config, form link target) as installed now, to spot a change."""
    qdir = layout.queue_dir(name)
    try:
        cfg = config.load_json(qdir / "config.json")
    except ConfigError:
        cfg = None
    form = qdir / "form.json"
    return cfg, os.readlink(form) if form.is_symlink() else ""


def reconcile(layout: Layout, scandir: Path, log: EventLog | None = None) -> list[str]:
    """Install every valid entry of ``scandir``; returns the queue names."""
    names = []
    for name in entry_names(scandir):
        try:
            install_from_scandir(layout, name, scandir / name)
        except (RQError, OSError) as exc:
            if log is not None:
                log.event("daemon", f"scandir entry {name!r} skipped: {exc}")
            continue
        names.append(name)
    return names


def mark_removed(layout: Layout, name: str) -> None:
    """First step out of service: the queue is marked disabled (kept across restarts)."""
    if not (layout.queue_dir(name) / DISABLED_MARK).exists():
        layout.mark_queue(name, DISABLED_MARK, "scandir entry removed\n")


def removals_pending(layout: Layout) -> list[str]:
    """Queues marked disabled whose move to trash/ has not happened yet."""
    if not layout.queues.is_dir():
        return []
    return sorted(q.name for q in layout.queues.iterdir()
                  if QUEUE_NAME_RE.match(q.name) and (q / DISABLED_MARK).exists())


def trash(layout: Layout, name: str) -> Path:
    """Last step out of service, once its daemon is stopped: move it to trash/."""
    return layout.trash_queue(name)
