"""The disk half of a bulk retry: a batch of err messages renamed into que/,
their status set aside, then one fsync of both directories; run on a
background lane, never on a daemon's loop (``set_status_aside`` is also a
single retry's, one message on the loop).  It is given the queue's
``QueueStore``, the writer: a ``QueueView`` is read-only in type.

A crash in the middle leaves each message wholly in err/ or in que/ (a
rename is atomic), which the next start loads as it finds them; nothing
is reported retried before the fsync of both directories has returned.
"""

from __future__ import annotations

from typing import Any

from rqsys.errors import RQError, StoreError
from rqsys.store import durable
from rqsys.store.queue import QueueStore

LAST_STATUS = ".last"  # status.last: the status its run before the retry ended with
Moved = list[tuple[str, dict[str, Any]]]  # (id, its msg) of each message now in que/


def retry_batch(store: QueueStore, msg_ids: list[str]) -> Moved:
    """err → que for each of ``msg_ids`` still in err with a readable msg
    (the others are passed over); durable once it returns.  Raises
    :class:`BatchFailed`, naming the messages already in que/, if the disk
    fails on the way (their renames may not be durable: the caller's answer
    is the error, but its state follows the directories)."""
    moved: Moved = []
    try:
        _move(store, msg_ids, moved)
    except OSError as exc:
        raise BatchFailed(f"retry stopped after {len(moved)} of a batch: {exc}", moved) from exc
    return moved


class BatchFailed(StoreError):
    """A batch the disk stopped; ``moved`` are in que/ all the same."""

    def __init__(self, text: str, moved: Moved) -> None:
        super().__init__(text)
        self.moved = moved


def _move(store: QueueStore, msg_ids: list[str], moved: Moved) -> None:
    err, que = str(store.state_dir("err")), str(store.state_dir("que"))
    rename = _Renamer(store.ordered)
    for msg_id in msg_ids:
        try:
            rename(err, que, msg_id)
        except OSError:
            continue  # gone meanwhile: passed over
        try:
            msg = store.read_msg("que", msg_id)  # as queued (its count its msg's own)
        except RQError:
            rename(que, err, msg_id)  # unreadable: it stays in err
            continue
        set_status_aside(f"{que}/{msg_id}")
        moved.append((msg_id, msg))
    if msg_ids:
        durable.fsync_dirs([que, err])  # the destination first


class _Renamer:
    """Renames between two state directories.  On ext4 without a journal
    (``ordered``) a destination that grew a block has its inode fsynced at
    once, as ``QueueStore.move`` does (durable.sync_if_grown): the source's
    entry is gone from the disk inside the rename (``chattr +D``).  The sizes
    are this batch's own; the loop's remembered ones may go stale, which
    only costs it a needless fsync."""

    def __init__(self, ordered: bool) -> None:
        self.sizes: dict[str, int] | None = {} if ordered else None

    def __call__(self, src: str, dest: str, msg_id: str) -> None:
        if self.sizes is None:
            durable.rename(f"{src}/{msg_id}", f"{dest}/{msg_id}")
            return
        size = self.sizes.get(dest)
        if size is None:
            size = durable.dir_size(dest)
        durable.rename(f"{src}/{msg_id}", f"{dest}/{msg_id}")
        self.sizes[dest] = durable.sync_if_grown(dest, size)


def set_status_aside(msg_path: str) -> None:
    """A retried message's last status line goes aside (``LAST_STATUS``), for
    a single retry and a bulk one alike: its status reads blank (RQ), as a
    missing file does.  A rename inside the message's directory is ~10x
    cheaper on ext4 than truncating or unlinking the file (no block or inode
    freed: measured 0.02 ms against 0.15-1 ms a message), and it keeps the
    failure's text beside its timeline."""
    path = f"{msg_path}/status"
    try:
        durable.rename(path, f"{path}{LAST_STATUS}")
    except FileNotFoundError:
        pass
