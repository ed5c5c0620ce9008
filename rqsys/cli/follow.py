"""Following a message from the shell: its state through the daemon's
``watch`` (pushed, never polled) and its ``job/stdio.log`` through inotify.

:class:`Follow` waits in ``select`` on two fds: the watch connection (one
line per event of the message, until it ends or is gone) and an inotify
instance watching the log file (or, until it exists, the directories it
will appear in).  A directory renamed to another state keeps its inode, so
an open log and the watches follow it to ``done/``.
"""

from __future__ import annotations

import logging
import os
import select
import socket
from typing import Any, BinaryIO

import pyinotify  # type: ignore[import-untyped]

from rqsys.errors import Unavailable
from rqsys.store import Layout, QueueView
from rqsys.wire import framing
from rqsys.wire.client import QueueClient

FINAL = ("done", "err", "relayed", "gone")
LOG = "stdio.log"
MASK = pyinotify.IN_MODIFY | pyinotify.IN_CREATE | pyinotify.IN_MOVED_TO


class Follow:
    """One message followed until it ends: ``state`` and ``status`` as last told."""

    def __init__(self, layout: Layout, queue: str, msg_id: str) -> None:
        self.queue, self.msg_id = queue, msg_id
        self.view = QueueView(layout.queue_dir(queue))
        self._sock: socket.socket = QueueClient(layout, queue).open_stream(
            "watch", msg_id=msg_id)
        self._sock.settimeout(None)  # a run may take hours: the end is pushed, not asked
        self._lines = framing.LineBuffer()
        first = self._next()
        self.state, self.status, self.url = first["state"], first["status"], first["url"]
        self._wm: Any = None
        self._log: BinaryIO | None = None

    def close(self) -> None:
        self._sock.close()
        if self._log is not None:
            self._log.close()
        if self._wm is not None:
            self._wm.close()

    @property
    def ended(self) -> bool:
        return self.state in FINAL

    def wait(self) -> None:
        """Block until the message has ended (or is gone)."""
        while not self.ended:
            self._take(self._next())

    def tail(self, out: BinaryIO, from_end: bool = False, follow: bool = True) -> None:
        """Copy its output to ``out`` as it comes, until the message has ended
        (not ``follow``: what there is now)."""
        pyinotify.log.setLevel(logging.CRITICAL)  # a watched directory moving is expected
        self._wm = pyinotify.WatchManager()
        self._open_log(from_end)
        self._copy(out)
        self._take_buffered()  # events that came in one read with the watch's answer
        while follow and not self.ended:
            ready, _, _ = select.select([self._sock, self._wm.get_fd()], [], [])
            if self._wm.get_fd() in ready:
                os.read(self._wm.get_fd(), 65536)  # which event does not matter: read on
            if self._sock in ready:
                self._take(self._next())
                self._take_buffered()
            self._copy(out)
        self._open_log(False)  # it ended before its log was seen: read it where it is now
        self._copy(out)

    # ------------------------------------------------------------ the watch connection
    def _take(self, line: dict[str, Any]) -> None:
        if line.get("state"):
            self.state = line["state"]
        if line.get("event") in ("status", *FINAL) or self.ended:
            self.status = line.get("status", self.status)

    def _next(self) -> dict[str, Any]:
        while (line := self._buffered()) is None:
            try:
                data, _fds = framing.recv(self._sock)
            except OSError as exc:
                raise Unavailable(f"queue {self.queue}: {exc}") from exc
            if not data:
                raise Unavailable(f"queue {self.queue}: the daemon closed the connection "
                                  f"before {self.msg_id} ended")
            self._lines.feed(data, [])
        return line

    def _take_buffered(self) -> None:
        while (line := self._buffered()) is not None:
            self._take(line)

    def _buffered(self) -> dict[str, Any] | None:
        got = self._lines.next_line()
        return None if got is None else framing.raise_for(framing.decode(got[0]))

    # ------------------------------------------------------------ the log file
    def _open_log(self, from_end: bool) -> None:
        """Open job/stdio.log when it exists, else watch where it will appear."""
        if self._log is not None or self.state in ("gone", "prep", "que"):
            return
        msg_dir = self.view.msg_dir(self.state, self.msg_id)
        for path in (msg_dir, msg_dir / "job"):
            if self._wm is not None and path.is_dir():
                self._wm.add_watch(str(path), MASK)
        try:
            self._log = open(msg_dir / "job" / LOG, "rb")  # noqa: SIM115 (kept open)
        except (FileNotFoundError, NotADirectoryError):
            return
        if from_end:
            self._log.seek(0, os.SEEK_END)

    def _copy(self, out: BinaryIO) -> None:
        self._open_log(False)
        if self._log is None:
            return
        while chunk := self._log.read(65536):
            out.write(chunk)
        out.flush()


def verdict_code(state: str) -> int:
    """0 for done or relayed, 1 for err or a message that is gone."""
    return 0 if state in ("done", "relayed") else 1


def describe(state: str, status: str) -> str:
    return f"{state} - {status}" if status else state
