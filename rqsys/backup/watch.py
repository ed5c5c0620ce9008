"""The names moved in or out of the state directories while a backup walks them (inotify).

A directory listing made while entries are renamed in and out may miss an
entry that moved meanwhile; one that stayed put it returns.  Every move
of a message has ``prep/``, ``que/``, ``run/`` or ``err/`` for its source
or its destination (a delete's destination is ``.tmp/``), so a watch on
those four of each queue, set before the walk, names every message that
moved while it walked: the walk looks for those again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from pathlib import Path

from rqsys.errors import StoreError

IN_MOVED_FROM, IN_MOVED_TO, IN_Q_OVERFLOW = 0x40, 0x80, 0x4000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
WATCHED = ("prep", "que", "run", "err")  # every move's source or destination (see above)


class Overflow(StoreError):
    """The kernel dropped moves (its queue of events overflowed): the walk starts over."""


class Moves:
    """An inotify descriptor watching state directories; the names moved there, by place."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            raise StoreError(f"inotify: {os.strerror(ctypes.get_errno())}")
        self._places: dict[int, tuple[str, str]] = {}  # wd -> (queue, state)
        self.moved: set[tuple[str, str]] = set()  # (queue, name) seen moving

    def watch(self, queue: str, qdir: Path) -> None:
        """Watch the states of one queue that every move touches."""
        for state in WATCHED:
            wd = self._libc.inotify_add_watch(self.fd, str(qdir / state).encode(),
                                              IN_MOVED_FROM | IN_MOVED_TO | IN_ONLYDIR)
            if wd < 0 and ctypes.get_errno() == errno.ENOENT:
                continue  # a queue being made or trashed: none of its messages to miss
            if wd < 0:
                raise StoreError(f"inotify watch of {qdir / state}: "
                                 f"{os.strerror(ctypes.get_errno())}")
            self._places[wd] = (queue, state)

    def drain(self) -> None:
        """Read the events queued so far into :attr:`moved`; Overflow if some were lost."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            self._parse(data)

    def _parse(self, data: bytes) -> None:
        at = 0
        while at < len(data):
            wd, mask, _cookie, size = HEADER.unpack_from(data, at)
            name = data[at + HEADER.size:at + HEADER.size + size].rstrip(b"\0")
            at += HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                raise Overflow("inotify dropped events (fs.inotify.max_queued_events)")
            place = self._places.get(wd)
            if place is not None and name:
                self.moved.add((place[0], os.fsdecode(name)))

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Moves:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
