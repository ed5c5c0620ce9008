"""``rqsys restore SRC ROOT``: a backup checked whole, then put in place, durably.

Refused: a backup without a manifest or not matching it, one in an on-disk
format newer than this rqsys knows, and a ROOT that holds anything (unless
``--force``: then each top-level entry the backup has replaces ROOT's,
which goes only once the new one is in place; others, such as ``trash/``,
stay).  The backup is copied into ``ROOT/.restore.<pid>/``, a message
copied from ``run/`` into ``que/`` (it runs again: at least once, as after
a crash), synced with one ``syncfs``, then each top-level entry renamed
into ROOT, ``format.json`` last, as the backup has it: the next start
migrates an older one (``rqsys.store.formats``).  A restore cut short
leaves ``.restore.<pid>/``; run it again with ``--force``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rqsys.backup import files, manifest, walk
from rqsys.backup.manifest import TREE, BackupError
from rqsys.store import durable, formats
from rqsys.store.layout import STATES, TMP_DIR
from rqsys.store.view import QueueView

STAGING = ".restore"  # ROOT/.restore.<pid>/: the copy, before its renames into place
OLD = ".restore-old"  # ROOT/.restore-old.<pid>/: what --force replaced, until removed


@dataclass
class Report:
    """What a restore put back, as ``rqsys restore`` prints it."""

    root: Path
    messages: int = 0
    requeued: int = 0  # copied from run/ into que/

    def __str__(self) -> str:
        return (f"ok restored {self.messages} messages into {self.root} ({self.requeued} "
                "that were running are queued again)")


def restore(src: Path, root: Path, force: bool = False) -> Report:
    """Check the backup in ``src`` and put it in place in ``root``."""
    src, root = src.absolute(), root.absolute()
    data = manifest.read(src)
    manifest.check_format(src, data)
    if not force and not files.is_empty_dir(root):
        raise BackupError(f"restore: {root} is not empty: restore into a new or empty "
                          "directory, or give --force to replace what it holds")
    manifest.check_whole(src, data)
    report = Report(root, len(data["messages"]))
    report.requeued = sum(1 for row in data["messages"] if row[1] == "run")
    made = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    copier = files.Copier()
    if made:
        copier.keep(os.lstat(src / TREE), root)
    staging = root / f"{STAGING}.{os.getpid()}"
    durable.remove_tree(staging)  # a pid's earlier restore cut short
    _copy(copier, src / TREE, staging)
    durable.syncfs(staging)
    _put_in_place(staging, root)
    if made:
        durable.fsync_path(root.parent)
    return report


def _copy(copier: files.Copier, tree: Path, staging: Path) -> None:
    """The backup into ``staging``; each queue's run/ messages into its que/."""
    copier.tree(tree, staging, _run_dirs)
    for queue in walk.queues(tree):
        view = QueueView(tree / "queue" / queue)
        for msg_id in view.ids("run"):
            copier.tree(view.msg_dir("run", msg_id), staging / "queue" / queue / "que" / msg_id)
        for state in (*STATES, TMP_DIR):
            (staging / "queue" / queue / state).mkdir(exist_ok=True)
        copier.keep(os.lstat(view.state_dir("run")), staging / "queue" / queue / "run")


def _run_dirs(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) == 3 and parts[0] == "queue" and parts[2] == "run"


def _put_in_place(staging: Path, root: Path) -> None:
    """Rename each top-level entry of ``staging`` into ``root`` (format.json
    last), what it replaces set aside first; then sync and clean up."""
    old = root / f"{OLD}.{os.getpid()}"
    names = sorted(os.listdir(staging), key=lambda name: name == formats.FILE)
    for name in names:
        if os.path.lexists(root / name):
            old.mkdir(exist_ok=True)
            durable.rename(root / name, old / name)
        durable.rename(staging / name, root / name)
    durable.fsync_dirs([root, staging, *([old] if old.exists() else [])])
    durable.remove_tree(staging)
    durable.remove_tree(old)
    durable.fsync_path(root)
