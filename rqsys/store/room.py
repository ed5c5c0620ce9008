"""How full the state file system is: statvfs at most once a second, a line when it fills or clears.

The store is *full* when fewer than ``FLOOR_INODES`` inodes or
``FLOOR_BYTES`` bytes are free to it (``f_favail``, ``f_bavail``).  While
full, a queue daemon takes no new message (``NoSpace``, said with the
figures), starts no queued one, and makes no spare directories: the spares
it holds are the room its running messages' ends are recorded in
(``QueueStore.move`` gives one back when a rename finds no room).  Writes
that only keep records (the stats journal, timelines, the search index, a
failed run's last lines) are skipped and counted here, never fatal.
"""

from __future__ import annotations

import collections
import errno
import os
import time
from typing import NamedTuple

from rqsys.errors import NoSpace

FLOOR_INODES = 64  # fewer free inodes than this: full (a message takes six or seven)
FLOOR_BYTES = 4 << 20  # fewer free bytes than this: full
CHECK_EVERY = 1.0  # seconds a reading is trusted


class Reading(NamedTuple):
    """One statvfs of the state file system, as the messages and metrics say it."""

    mount: str
    free_bytes: int
    total_bytes: int
    free_inodes: int
    total_inodes: int  # 0: a file system without an inode count (btrfs)

    @property
    def full(self) -> bool:
        few = self.total_inodes > 0 and self.free_inodes < FLOOR_INODES
        return few or self.free_bytes < FLOOR_BYTES

    def text(self) -> str:
        """``/srv has 0 free inodes (0 of 3000), 12.3 MiB free``."""
        return f"{self.mount} has {self.figures()}"

    def figures(self) -> str:
        """``0 free inodes (0 of 3000), 12.3 MiB free`` (no path: for the web)."""
        return (f"{self.free_inodes} free inodes ({self.free_inodes} of {self.total_inodes}), "
                f"{size_text(self.free_bytes)} free")


def full_figures(path: str) -> str:
    """The figures of the file system holding ``path`` when it is full, else ""
    (the console's banner)."""
    try:
        now = read(path)
    except OSError:
        return ""
    return now.figures() if now.full else ""


def read(path: str) -> Reading:
    """The file system holding ``path`` now."""
    st = os.statvfs(path)
    return Reading(mount_point(path), st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize,
                   st.f_favail, st.f_files)


def mount_point(path: str) -> str:
    """The mount point of the file system holding ``path``."""
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def size_text(n: int) -> str:
    """``0 B``, ``512 KiB``, ``12.3 MiB``, ``1.5 GiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n} B"


def is_no_space(exc: BaseException) -> bool:
    """An OSError that says the file system is full (blocks, inodes or quota)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


class Room:
    """The state file system's room as one daemon sees it, checked at most once a second."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.full = False
        self.news: list[str] = []  # lines to log: filled, cleared (taken by the daemon's tick)
        self.reading: Reading | None = None
        self.skipped: collections.Counter[str] = collections.Counter()  # while full, by kind
        self._checked_at = -CHECK_EVERY

    def check(self, now: float | None = None) -> bool:
        """Read the file system when the last reading is a second old; whether
        it is full.  A change is a line in ``news``."""
        now = time.monotonic() if now is None else now
        if now - self._checked_at < CHECK_EVERY:
            return self.full
        self._checked_at = now
        try:
            self._take(read(self.path))
        except OSError:
            pass  # the queue's directory removed under it: nothing to say
        return self.full

    def _take(self, reading: Reading) -> None:
        """A new reading; a change of full is a line in ``news``."""
        self.reading = reading
        if reading.full != self.full:
            self.full = reading.full
            self.news.append(self._filled() if self.full else self._cleared())

    def take_news(self) -> list[str]:
        """The lines to log since the last call."""
        news, self.news = self.news, []
        return news

    def recheck_in(self) -> float:
        """Seconds until the next reading is due."""
        return max(0.0, self._checked_at + CHECK_EVERY - time.monotonic())

    def _filled(self) -> str:
        assert self.reading is not None
        self.skipped.clear()
        return (f"the state file system is full: {self.reading.text()}; new messages are "
                "refused, queued ones wait, running ones finish")

    def _cleared(self) -> str:
        assert self.reading is not None
        skipped = ", ".join(f"{kind} {n}" for kind, n in sorted(self.skipped.items()))
        return (f"the state file system has room again: {self.reading.text()}; queued "
                f"messages start" + (f"; record writes skipped while full: {skipped}"
                                     if skipped else ""))

    def skip(self, kind: str) -> None:
        """A record-keeping write (``stats``, ``timeline``, ``index``, ``last lines``)
        the file system did not take: counted, said when room comes back."""
        self.skipped[kind] += 1
        self.doubt()

    def doubt(self) -> None:
        """A write found no room: read the file system again at the next check."""
        self._checked_at = -CHECK_EVERY

    def no_space(self, tail: str = "the message was not taken") -> NoSpace:
        """The refusal, with the figures of a fresh reading."""
        try:
            self._take(read(self.path))
            figures = self.reading.text() if self.reading is not None else ""
        except OSError:
            figures = "the state file system is full"
        return NoSpace(f"no space left on device: {figures}; {tail}")

    def refuse_when_full(self, tail: str = "the message was not taken") -> None:
        """Raise NoSpace when the file system is full (read again if the reading is old)."""
        if self.check():
            raise self.no_space(tail)
