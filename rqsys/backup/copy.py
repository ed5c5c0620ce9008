"""``rqsys backup DEST``: a live root copied, each message once, in a state it had.

The messages are found by ``walk`` (states in the order messages move,
under a watch that names every message moving meanwhile), then copied one
by one: a message whose directory moves while it is copied is looked for
again and copied again from its new state, so each copy is of one state
the message was in.  Found twice, a message is copied once, from its later
sighting.  The root's other files (``format.json``, ``config/``, the
scandir's links as links, timers and their records, queue configs and
admin states, statistics, batches, the audit trail) are copied as they
are; left out are ``trash/``, the sockets, each queue's search index
(rebuilt at its daemon's start) and its ``que.snapshot`` (a clean stop's,
of que/ as it was then).  Everything is synced with one ``syncfs`` of
DEST, then the manifest is written, durably, last.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from rqsys.backup import files, manifest, walk
from rqsys.backup.manifest import TREE, BackupError, Row
from rqsys.backup.walk import Key, Place
from rqsys.observe import audit
from rqsys.store import durable, formats
from rqsys.store.layout import QUE_SNAPSHOT, SHARDED_STATES, STATES, TMP_DIR, Layout
from rqsys.store.view import QueueView, listdir

LEFT_OUT = ("trash", "sock", formats.LOCK, manifest.NAME)  # at the root's top
QUEUE_LEFT_OUT = (*STATES, TMP_DIR, QUE_SNAPSHOT)  # in queue/<q>/ (the states: by the walk)
INDEX = "search.sqlite"  # a queue's search index (and its -wal, -shm): rebuilt at start
COPIES = 20  # times a message moving while it is copied is copied again


@dataclass
class Report:
    """What a backup holds, as ``rqsys backup`` prints it."""

    dest: Path
    messages: int = 0
    running: int = 0  # copied from run/: a restore queues them again
    moved: int = 0  # seen moving during the walk, looked for again
    gone: int = 0  # seen, then in no state (deleted or pruned meanwhile)
    seconds: float = 0.0

    def __str__(self) -> str:
        return (f"ok backup {self.dest}: {self.messages} messages ({self.running} running, "
                f"restored to que/), {self.moved} seen moving, {self.gone} deleted meanwhile, "
                f"{self.seconds:.1f}s")


def backup(layout: Layout, dest: Path) -> Report:
    """Copy the root of ``layout`` into ``dest`` (new, or an empty directory)."""
    root, dest = layout.root, dest.absolute()
    fmt = _source_format(root)
    _check_dest(root, dest)
    began = time.time()
    report = Report(dest)
    (dest / TREE).mkdir(parents=True, exist_ok=True)
    found, report.moved = walk.find_all(root)
    copier = files.Copier()
    copier.tree(root, dest / TREE, _left_out)
    rows = [row for key, place in sorted(found.items())
            if (row := _message(copier, root, dest / TREE, key, place, report))]
    _make_states(copier, root, dest / TREE)
    durable.syncfs(dest)
    manifest.write(dest, began, time.time(), fmt, root, rows)
    durable.fsync_path(dest.parent)
    report.seconds = time.time() - began
    return report


def _source_format(root: Path) -> int:
    """The root's format (0 before format.json); FormatError for a newer one."""
    if not (root / "queue").is_dir():
        raise BackupError(f"{root} is not an rqsys state root (no queue/ in it)")
    found = formats.read(root)
    if found is not None and found > formats.FORMAT:
        raise formats.FormatError(f"the state root {root} is in on-disk format {found}, newer "
                                  f"than this rqsys knows (format {formats.FORMAT}): back it "
                                  "up with the rqsys that wrote it")
    return 0 if found is None else found


def _check_dest(root: Path, dest: Path) -> None:
    if not files.is_empty_dir(dest):
        raise BackupError(f"backup: {dest} exists and is not empty: give a new or empty "
                          "directory")
    if dest == root or root in dest.parents:
        raise BackupError(f"backup: {dest} is inside the state root {root}: give a directory "
                          "outside it")


def _left_out(rel: str) -> bool:
    parts = rel.split("/")
    if len(parts) == 1:
        return parts[0] in LEFT_OUT
    if len(parts) == 2 and parts[0] == "audit":
        return parts[1].endswith(audit.RESERVE_SUFFIX)  # the trail's room on a full disk: made anew
    return len(parts) == 3 and parts[0] == "queue" and (
        parts[2] in QUEUE_LEFT_OUT or parts[2].startswith(INDEX))


def _message(copier: files.Copier, root: Path, tree: Path, key: Key, place: Place | None,
             report: Report) -> Row | None:
    """Copy one message from a state it is in; its manifest row (None: gone)."""
    queue, msg_id = key
    view, into = QueueView(root / "queue" / queue), QueueView(tree / "queue" / queue)
    for _copy in range(COPIES):
        if place is None:
            place = walk.locate(view, msg_id)
        if place is None:
            report.gone += 1
            return None
        copy = into.msg_dir(place.state, msg_id)
        copy.parent.mkdir(parents=True, exist_ok=True)
        vanished = copier.vanished
        copier.tree(place.path, copy)
        if copier.vanished == vanished or walk.still_there(place):
            report.messages += 1
            report.running += place.state == "run"
            return manifest.message_row(queue, place.state, msg_id, copy)
        durable.remove_tree(copy)  # it moved while copied: copied again from where it is
        place = None
    raise BackupError(f"message {queue}/{msg_id} kept moving while it was copied "
                      f"({COPIES} times)")


def _make_states(copier: files.Copier, root: Path, tree: Path) -> None:
    """Every queue of the copy with all its state directories (empty ones
    too) and shards, each with the mode and owner of the one it copies (a
    queue daemon of its own user must rename in them after a restore)."""
    for queue in walk.queues(tree):
        src, copy = root / "queue" / queue, tree / "queue" / queue
        for state in (*STATES, TMP_DIR):
            (copy / state).mkdir(exist_ok=True)
            _like(copier, src / state, copy / state, copy)
            if state in SHARDED_STATES:
                for shard in listdir(copy / state):
                    _like(copier, src / state / shard, copy / state / shard, copy / state)


def _like(copier: files.Copier, src: Path, dest: Path, fallback: Path) -> None:
    try:
        st = os.lstat(src)
    except FileNotFoundError:  # a shard pruned meanwhile, a queue trashed
        st = os.lstat(fallback)
    copier.keep(st, dest)
