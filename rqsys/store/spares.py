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
from rqsys.store.tunables import MSG_BLANK, SPARE_BATCH, SPARE_DIRS, SPARE_RETRY


class SpareMaker:
    """Makes spare message directories in ``.tmp/`` on a thread of their own.

    Making an inode is the dearest step of a create on a busy ext4 (0.2-0.5 ms
    each when its block group has seen many deletions), and a message needs
    five: its directory, ``msg``, ``status``, ``job/`` and ``job/stdio.log``.
    Made here, beside the daemon's loop, they cost neither the
    acknowledgement of a create nor the start of a run.  They are made
    SPARE_BATCH at a time: the fsyncs of a batch share their writes, and the
    daemon's own fsyncs meet this thread's on the disk once a batch, not once
    a message.  Spares are plain temp directories: recovery removes them.
    """

    def __init__(self, tmp_dir: str, count: int = SPARE_DIRS, batch: int = SPARE_BATCH) -> None:
        self._tmp_dir = tmp_dir
        self._count, self._batch = count, batch
        self._ready: collections.deque[str] = collections.deque()
        self._changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start making spares (once; only after recovery, which removes them)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._fill, name="spares", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for the batch it is making, if any."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(SPARE_RETRY * 5)

    def __len__(self) -> int:
        """How many spares are ready."""
        with self._changed:
            return len(self._ready)

    def take(self) -> str | None:
        """A ready spare directory, or None when none is ready."""
        with self._changed:
            if not self._ready:
                return None
            spare = self._ready.popleft()
            if self._wants_batch():
                self._changed.notify()
            return spare

    def _wants_batch(self) -> bool:
        return self._stopped or len(self._ready) <= self._count - self._batch

    def _fill(self) -> None:
        seq = itertools.count(1)
        while True:
            with self._changed:
                self._changed.wait_for(self._wants_batch)
                if self._stopped:
                    return
                wanted = self._count - len(self._ready)
            paths = [f"{self._tmp_dir}/{SPARE_PREFIX}{os.getpid()}.{next(seq)}"
                     for _ in range(wanted)]
            try:
                self._make(paths)
            except OSError:  # disk full or queue removed: try again later
                for path in paths:
                    shutil.rmtree(path, ignore_errors=True)
                time.sleep(SPARE_RETRY)
                continue
            with self._changed:
                self._ready.extend(paths)

    @staticmethod
    def _make(paths: list[str]) -> None:
        """Make spares, then fsync their blank msg files: each spare's entry
        in ``.tmp/`` and its msg's block are durable before it is handed
        out, so a create has only its message's bytes to write (see
        durable.write_msg).  (Not syncfs: that would flush the whole file system.)"""
        msg_fds: list[int] = []
        try:
            for path in paths:
                os.mkdir(path)
                os.mkdir(f"{path}/job")
                for name in ("status", "job/stdio.log"):
                    os.close(os.open(f"{path}/{name}", NEW_FILE, 0o644))
                msg_fds.append(os.open(f"{path}/msg", NEW_FILE, 0o644))
                os.write(msg_fds[-1], b" " * MSG_BLANK)
            durable.fsync_fds(msg_fds)
        finally:
            for fd in msg_fds:
                os.close(fd)
