"""Where a queue script's stdout and stderr go: job/stdio.log, and journald.

Without journald the script writes ``job/stdio.log`` itself (its fds 1 and 2
are that file).  Under journald they are a pipe instead: the queue daemon
reads it from its selector, appends every chunk to ``stdio.log`` (kept for the
web's tail and for relaying) and sends every line to journald with
``RQ_QUEUE``, ``RQ_MSG_ID`` and ``RQ_COUNT``, so ``journalctl RQ_MSG_ID=<id>``
shows one message's run.

The event loop never blocks here: the pipe is read non-blocking, a bounded
amount per turn, and journal entries go over a non-blocking datagram socket
(systemd-python's ``journal.send`` blocks when journald is slow), so a line
journald cannot take at once is dropped from the journal, never from
stdio.log.  Lines longer than MAX_LINE are cut into MAX_LINE pieces.
"""

from __future__ import annotations

import os
import selectors
import socket
from pathlib import Path
from typing import Any

from rqsys.errors import SpawnError

JOURNAL_SOCKET = "/run/systemd/journal/socket"
MAX_LINE = 8192  # bytes of one journal entry's MESSAGE
READ_SIZE = 65536
READS_PER_TURN = 16  # then let the loop serve others; the selector comes back
PRIORITY_INFO = "6"


def journal_fields(fields: dict[str, str | bytes]) -> bytes:
    """journald's native datagram format (systemd.journal-fields(7))."""
    out = bytearray()
    for key, value in fields.items():
        data = value if isinstance(value, bytes) else value.encode()
        if b"\n" in data:
            out += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalSender:
    """A non-blocking datagram socket to journald; counts what it had to drop."""

    def __init__(self, path: str = JOURNAL_SOCKET) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.sock.setblocking(False)
        self.path = path
        self.dropped = 0

    def send(self, fields: dict[str, str | bytes]) -> bool:
        try:
            self.sock.sendto(journal_fields(fields), self.path)
        except OSError:
            self.dropped += 1  # journald busy or gone: stdio.log still has the line
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def split_lines(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without newline, each at most MAX_LINE) and the rest."""
    buf = pending + data
    lines = []
    start = 0
    while (end := buf.find(b"\n", start)) >= 0:
        lines.extend(_cut(buf[start:end]))
        start = end + 1
    rest = buf[start:]
    while len(rest) >= MAX_LINE:
        lines.append(rest[:MAX_LINE])
        rest = rest[MAX_LINE:]
    return lines, rest


def _cut(line: bytes) -> list[bytes]:
    return [line[i:i + MAX_LINE] for i in range(0, len(line), MAX_LINE)] or [b""]


class Pump:
    """Copies one script's output pipe to its stdio.log and to journald."""

    def __init__(self, read_fd: int, log_fd: int, journal: JournalSender,
                 fields: dict[str, str]) -> None:
        self.read_fd, self.log_fd = read_fd, log_fd
        self.journal, self.fields = journal, fields
        self.pending = b""

    def pump(self) -> bool:
        """Move what the pipe has now (bounded); True at end of file."""
        for _ in range(READS_PER_TURN):
            try:
                data = os.read(self.read_fd, READ_SIZE)
            except BlockingIOError:
                return False
            if not data:
                return True
            self._write_log(data)
            lines, self.pending = split_lines(self.pending, data)
            for line in lines:
                self._journal(line)
        return False

    def _write_log(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.log_fd, view):]

    def _journal(self, line: bytes) -> None:
        self.journal.send({"MESSAGE": line, "PRIORITY": PRIORITY_INFO, **self.fields})

    def close(self) -> None:
        if self.pending:
            self._journal(self.pending)
            self.pending = b""
        os.close(self.read_fd)
        os.close(self.log_fd)


class ScriptOutput:
    """Opens each script's output and pumps the pipes from the daemon's selector."""

    def __init__(self, queue: str, selector: selectors.BaseSelector, journal: bool) -> None:
        self.queue, self.selector = queue, selector
        self.journal = JournalSender() if journal else None
        self.pumps: dict[int, Pump] = {}

    def stdout_fd(self, job: str, msg_id: str, count: int) -> int | None:
        """The fd to give a script as stdout/stderr (the caller closes it); None
        without journald: the script's start opens ``job/stdio.log`` itself."""
        if self.journal is None:
            return None
        try:
            try:
                return self.open(f"{job}/stdio.log", msg_id, count)
            except FileNotFoundError:
                os.mkdir(job)  # no spare brought it, and the script has not started to make it
                return self.open(f"{job}/stdio.log", msg_id, count)
        except OSError as exc:  # out of fds, or of disk: this start fails, not the daemon
            raise SpawnError(f"cannot open the script's output {job}/stdio.log: "
                             f"{exc.strerror or exc}") from exc

    def open(self, log_path: Path | str, msg_id: str, count: int) -> int:
        """The fd to give the script as stdout/stderr (the caller closes it)."""
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if self.journal is None:
            return log_fd
        try:
            read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        except OSError:
            os.close(log_fd)
            raise
        os.set_blocking(read_fd, False)
        try:
            self.selector.register(read_fd, selectors.EVENT_READ, self._readable)
        except OSError:  # no epoll room (max_user_watches)
            for fd in (read_fd, write_fd, log_fd):
                os.close(fd)
            raise
        fields = {"RQ_QUEUE": self.queue, "RQ_MSG_ID": msg_id, "RQ_COUNT": str(count),
                  "SYSLOG_IDENTIFIER": f"rq-{self.queue}"}
        self.pumps[read_fd] = Pump(read_fd, log_fd, self.journal, fields)
        return write_fd

    def _readable(self, key: Any, _mask: int) -> None:
        if self.pumps[key.fd].pump():
            self._close(key.fd)

    def _close(self, fd: int) -> None:
        self.selector.unregister(fd)
        self.pumps.pop(fd).close()

    def take_now(self, msg_id: str) -> None:
        """Copy what a message's pipe holds now into its stdio.log (its script
        has ended: what it wrote last is read before the log is)."""
        for fd, pump in list(self.pumps.items()):
            if pump.fields["RQ_MSG_ID"] == msg_id and pump.pump():
                self._close(fd)

    def close_all(self) -> None:
        """At daemon exit: take what the pipes still hold, then close them."""
        for fd in list(self.pumps):
            self.pumps[fd].pump()
            self._close(fd)
