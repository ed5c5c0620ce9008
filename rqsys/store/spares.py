"""Spare message directories, made ahead of time on a thread of their own."""

from __future__ import annotations

import collections
import itertools
import os
import shutil
import threading
import time

from rqsys.store import durable
from rqsys.store.durable import NEW_FILE
from rqsys.store.layout import SPARE_PREFIX
from rqsys.store.room import Room
from rqsys.tunables import MSG_BLANK, SPARE_BATCH, SPARE_DIRS, SPARE_RETRY


class SpareMaker:
    """Makes spare message directories in ``.tmp/`` on a thread of their own.

    Making an inode is the dearest step of a create on a busy ext4 (0.2-0.5 ms
    each when its block group has seen many deletions), and a queued message
    has two: its directory and ``msg``.  Made here, beside the daemon's loop,
    they cost nothing of the acknowledgement of a create.  A message's other
    files (``status``, ``job/``, ``job/stdio.log``, ``timeline``) are made
    when first needed, mostly as it starts, so a deep que holds two inodes a
    message, not six (a million queued: two million inodes).  They are made
    SPARE_BATCH at a time: the fsyncs of a batch share their writes, and the
    daemon's own fsyncs meet this thread's on the disk once a batch, not once
    a message.  Spares are plain temp directories: recovery removes them.
    """

    def __init__(self, tmp_dir: str, count: int = SPARE_DIRS, batch: int = SPARE_BATCH,
                 room: Room | None = None) -> None:
        self._tmp_dir = tmp_dir
        self._room = room  # while its file system is full, none are made
        self._count, self._batch = count, batch
        self._ready: collections.deque[tuple[str, int]] = collections.deque()  # (dir, its msg)
        self._changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.whole_fs = False  # ext4 without a journal: a batch ends with a syncfs (see _make)

    def start(self) -> None:
        """Start making spares (once; only after recovery, which removes them)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._fill, name="spares", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for the batch it is making, if any (the
        ready spares can still be taken)."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(SPARE_RETRY * 5)

    def close(self) -> None:
        """Stop, and close the ready spares' msg files (recovery removes the spares)."""
        self.stop()
        with self._changed:
            while self._ready:
                os.close(self._ready.popleft()[1])

    def __len__(self) -> int:
        """How many spares are ready."""
        with self._changed:
            return len(self._ready)

    def take(self) -> tuple[str, int] | None:
        """A ready spare directory and its blank msg file, still open for
        writing (the taker closes it), or None when none is ready."""
        with self._changed:
            if not self._ready:
                return None
            spare = self._ready.popleft()
            if self._wants_batch():
                self._changed.notify()
            return spare

    def release(self) -> bool:
        """Remove one ready spare, giving its room back (a full file system:
        a running message's end needs it); False when none is left."""
        with self._changed:
            if not self._ready:
                return False
            path, fd = self._ready.pop()
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        return True

    def _wants_batch(self) -> bool:
        if self._stopped:
            return True
        held = self._room is not None and self._room.full
        return not held and len(self._ready) <= self._count - self._batch

    def _fill(self) -> None:
        """The thread: make a batch whenever enough spares have been taken."""
        seq = itertools.count(1)
        while (wanted := self._wait_for_demand()) is not None:
            paths = [f"{self._tmp_dir}/{SPARE_PREFIX}{os.getpid()}.{next(seq)}"
                     for _ in range(wanted)]
            fds = self._make_batch(paths, self.whole_fs)
            if fds is None:
                time.sleep(SPARE_RETRY)
                if self._room is not None:  # a full disk: none made until it has room
                    self._room.doubt()
                    self._room.check()
                continue
            with self._changed:
                self._ready.extend(zip(paths, fds, strict=True))

    def _wait_for_demand(self) -> int | None:
        """How many spares to make next; None once stopped."""
        with self._changed:
            self._changed.wait_for(self._wants_batch)
            return None if self._stopped else self._count - len(self._ready)

    @staticmethod
    def _make_batch(paths: list[str], whole_fs: bool) -> list[int] | None:
        """Make spares (their msg files open); on failure (disk full, queue
        removed) remove them and return None."""
        try:
            return _make(paths, whole_fs)
        except OSError:
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)
            return None


def _make(paths: list[str], whole_fs: bool = False) -> list[int]:
    """Make spares, then fsync their blank msg files, which stay open: each
    spare's entry in ``.tmp/`` and its msg's block are durable before it is
    handed out, so a create has only its message's bytes to write, through
    the open file (no path to look up again; see durable.write_msg).
    (Not syncfs: that would flush the whole file system; except on ext4
    without a journal, ``whole_fs``, where only a syncfs writes the block
    group's descriptor, whose count of never-used inodes e2fsck trusts: a
    new inode past it on disk is taken for unused, and its blocks for free.)"""
    msg_fds: list[int] = []
    try:
        for path in paths:
            msg_fds.append(_make_one(path))
        if whole_fs:
            durable.syncfs(os.path.dirname(paths[0]))
        else:
            durable.fsync_fds(msg_fds)
    except BaseException:
        for fd in msg_fds:
            os.close(fd)
        raise
    return msg_fds


def _make_one(path: str) -> int:
    """One spare directory and its msg; returns the blank msg, still open."""
    os.mkdir(path)
    fd = os.open(f"{path}/msg", NEW_FILE, 0o644)
    try:
        os.write(fd, b" " * MSG_BLANK)
    except OSError:
        os.close(fd)
        raise
    return fd
