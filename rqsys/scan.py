"""The scandir: queues from symlinked script directories (RQ's "scandir").

An entry ``scandir/<name>`` (a symlink to, or a directory) holding an
executable ``run`` becomes queue ``<name>``: its effective ``config.json``
is the defaults overlaid by the entry's own ``config.json``, ``script``
pointing at the real path of ``run``; its ``form.json`` is linked, and a
``.scandir`` marker records that rq-scan owns (and may trash) the queue.
The watcher that keeps queues in line with the scandir is rqsys.scanloop.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rqsys import config
from rqsys.errors import BadRequest, ConfigError, RQError
from rqsys.store import QUEUE_NAME_RE, SCANDIR_MARK, Layout


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


def installed_from_scandir(layout: Layout, name: str) -> bool:
    """True for a queue rq-scan installed (and so may take out of service)."""
    return bool(QUEUE_NAME_RE.match(name)) and (layout.queue_dir(name) / SCANDIR_MARK).exists()


def installed_state(layout: Layout, name: str) -> tuple[Any, str]:
    """(effective config, form link target) as installed now, to spot a change."""
    qdir = layout.queue_dir(name)
    try:
        cfg = config.load_json(qdir / "config.json")
    except ConfigError:
        cfg = None
    form = qdir / "form.json"
    return cfg, os.readlink(form) if form.is_symlink() else ""


def reconcile(layout: Layout, scandir: Path, log: Any = None) -> list[str]:
    """Install every valid entry of ``scandir``; returns the queue names."""
    names = []
    for entry in sorted(scandir.iterdir()) if scandir.is_dir() else []:
        if entry.name.startswith("."):
            continue  # hidden: editors' files, and .timers/ (timers shipped with scripts)
        try:
            install_from_scandir(layout, entry.name, entry)
        except (RQError, BadRequest, OSError) as exc:
            if log is not None:
                log.event("daemon", f"scandir entry {entry.name!r} skipped: {exc}")
            continue
        names.append(entry.name)
    return names


def main(layout: Layout, scandir: Path) -> int:
    """``rqsys scan``: the long-running rq-scan watcher (see rqsys.scanloop)."""
    from rqsys import scanloop

    return scanloop.main(layout, scandir)
