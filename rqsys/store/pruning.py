"""The cleaner's prune of one queue's store, in two halves: the messages are
renamed out of sight at once, and synced away and removed later, off the
daemon's loop.

A prune may meet thousands of messages.  Removing each in turn (a rename,
an fsync of the directory it left, an rmtree of its files) on the loop kept
the queue's clients waiting for tens of seconds under load (bench_load).
Here the loop only decides and renames: a message, or a whole shard whose
messages are all old, goes to ``.tmp/deleted.*``, where a crash leaves it for
recovery to remove; :meth:`Removal.finish` then syncs each directory they
left once and deletes them, on a background lane.  Deciding stays on the
loop, so no message can end, be deleted or be committed between the choice
and the rename.
"""

from __future__ import annotations

import os
from collections.abc import Container
from pathlib import Path
from typing import TYPE_CHECKING

from rqsys.store import durable
from rqsys.store.layout import TMP_DIR
from rqsys.store.view import ids_in, listdir, newest_mtime

if TYPE_CHECKING:
    from rqsys.store.queue import QueueStore


class Removal:
    """Directories renamed out of a queue's states, to be synced and removed."""

    def __init__(self, store: QueueStore) -> None:
        self._tmp = store.qdir / TMP_DIR
        self._left: set[Path] = set()  # the directories they were renamed out of
        self._doomed: list[Path] = []

    def take(self, path: Path, tag: str) -> None:
        """Rename ``path`` (a message or a shard) out of its state, not synced yet."""
        doomed = self._tmp / f"deleted.{tag}.{os.getpid()}"
        durable.rename(path, doomed)
        self._left.add(path.parent)
        self._doomed.append(doomed)

    def finish(self) -> None:
        """Make the renames durable (each directory once), then delete the files:
        the slow half, for a background lane."""
        durable.fsync_dirs(self._left, missing_ok=True)
        for doomed in self._doomed:
            durable.remove_tree(doomed)  # what it cannot remove, recovery tries again


def untouched(store: QueueStore, state: str, before: float, removal: Removal) -> list[str]:
    """Take the messages of an unsharded state untouched since ``before`` (the
    newest mtime of the directory, its ``msg`` and ``attach/``); their ids."""
    old = [i for i in store.ids(state)
           if newest_mtime(store.msg_dir(state, i), ("msg", "attach")) < before]
    for msg_id in old:
        removal.take(store.msg_dir(state, msg_id), msg_id)
    return old


def ended(store: QueueStore, state: str, before: float, removal: Removal) -> int:
    """Take the messages of a sharded state that ended before ``before``; how many."""
    base = store.state_dir(state)
    return sum(_shard(store, state, base / shard, before, removal)
               for shard in sorted(listdir(base)))


def _shard(store: QueueStore, state: str, shard: Path, before: float,
           removal: Removal) -> int:
    """One shard: taken whole when every message in it is old."""
    ids = ids_in(shard)
    old = [i for i in ids if store.ended_at(state, i) < before]
    if old and len(old) == len(ids):
        removal.take(shard, f"shard.{state}.{shard.name}")
    else:
        for msg_id in old:
            removal.take(shard / msg_id, msg_id)
    return len(old)


def acked(store: QueueStore, state: str, removal: Removal,
          busy: Container[str] = ()) -> tuple[int, list[str]]:
    """Take the messages of ``state`` that hold an ``ack`` file, but for the
    ``busy`` (a background lane may be renaming them): how many were taken,
    and the busy ones that hold one, found in the same walk (no check of
    each busy id after it: a bulk retry has hundreds busy)."""
    taken: list[str] = []
    late: list[str] = []
    for msg_id in store.ids(state):
        if is_acked(store, state, msg_id):
            (late if msg_id in busy else taken).append(msg_id)
    for msg_id in taken:
        removal.take(store.msg_dir(state, msg_id), msg_id)
    return len(taken), late


def is_acked(store: QueueStore, state: str, msg_id: str) -> bool:
    return (store.msg_dir(state, msg_id) / "ack").exists()
