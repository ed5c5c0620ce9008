"""What every special queue script needs: its message, its pipe, its back-off.

A queue script runs with cwd ``<msg>/job``; the message JSON is ``../msg``,
attachments are in ``../attach``.  Verdicts are written as RQ pipe lines on
fd 3 (RQ_WRITE); ``dup`` answers are read on fd 4 (RQ_READ).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from rqsys.store import Layout, write_file_durably
from rqsys.store.durable import overwrite, write_note_durably

_PASSWORD = re.compile(r"(?<=://)([^/@\s:]*):[^/@\s]*@")  # user:pass@ in a URL
BACKOFF_UNIT = 10  # RQ: count² × 10 seconds ...
BACKOFF_MAX = 3600  # ... capped at an hour


class Job:
    """The running message, as seen by its queue script."""

    def __init__(self, environ: dict[str, str] | None = None, out: int = 1,
                 write: int | None = None, pid: int = 0) -> None:
        """``out``: where the job's output goes (``job/stdio.log``); ``write``: its
        status pipe (RQ_WRITE); ``pid``: the script process's.  A relay worker
        runs jobs for other processes, with the fds they passed it."""
        self.env = dict(os.environ if environ is None else environ)
        self.out = out
        self.write = int(self.env.get("RQ_WRITE", "3")) if write is None else write
        self.pid = pid or os.getpid()
        self.job_dir = Path(self.env.get("RQ_MSG_DIR") or os.getcwd())
        self.msg_dir = self.job_dir.parent
        self.msg: dict[str, Any] = json.loads(read_small(self.msg_dir / "msg"))
        self.count = int(self.env.get("RQ_COUNT") or self.msg.get("count") or 1)
        self.full_id = self.env.get("RQ_FULL_MSG_ID", "")
        self.host = self.env.get("RQ_HOST", "")
        self._attachments: list[Path] | None = None

    # -- files in job/ ------------------------------------------------------
    def read_note(self, name: str) -> str:
        try:
            return (self.job_dir / name).read_text().strip()
        except FileNotFoundError:
            return ""

    def write_note(self, name: str, text: str) -> None:
        """Keep ``text`` in ``job/<name>`` durably (it must survive a crash)."""
        write_file_durably(self.job_dir / name, (text + "\n").encode())

    def write_whole_note(self, name: str, text: str) -> None:
        """Keep one line in ``job/<name>`` durably, written in place (cheaper);
        read it back with :meth:`read_whole_note`, which ignores a torn one."""
        write_note_durably(self.job_dir / name, (text + "\n").encode())

    def write_passing_note(self, name: str, text: str) -> None:
        """One line in ``job/<name>``, not synced: it survives a crash of the
        process, not a power cut (an fsync a message costs a relay's rate)."""
        overwrite(self.job_dir / name, (text + "\n").encode())

    def read_whole_note(self, name: str) -> str:
        """The line in ``job/<name>``; "" when missing or torn (no final newline)."""
        try:
            data = read_small(self.job_dir / name)
        except FileNotFoundError:
            return ""
        return data.decode(errors="replace").strip() if data.endswith(b"\n") else ""

    def attachments(self) -> list[Path]:
        """The message's attachments (listed once: they do not change while it runs)."""
        if self._attachments is None:
            adir = self.msg_dir / "attach"
            self._attachments = sorted(p for p in adir.iterdir() if not p.name.startswith(
                ".")) if adir.is_dir() else []
        return self._attachments

    def layout(self) -> Layout:
        """The state root: ``RQ_ROOT``, else four levels above ``<msg>`` (queue/<q>/run)."""
        root = self.env.get("RQ_ROOT") or str(self.msg_dir.parents[3])
        return Layout.from_root(root)

    # -- the pipe -------------------------------------------------------------
    def say(self, kind: str, text: str) -> None:
        """Write one pipe line on fd 3 (one line: newlines become spaces), a
        password in a URL (a dest's ``user:pass@``) shown as ``***``."""
        line = f"{kind} {' '.join(hide_passwords(str(text)).split())}\n".encode()
        os.write(self.write, line)
        os.write(self.out, line)  # also in job/stdio.log

    def log(self, text: str) -> None:
        """One line of output to ``job/stdio.log`` (passwords in URLs hidden)."""
        os.write(self.out, f"{hide_passwords(text)}\n".encode())

    def resend(self, why: str) -> int:
        """Ask for a retry after the growing back-off; the script's exit code."""
        self.say("resend", f"{self.backoff()}-{why}")
        return 0

    def backoff(self) -> int:
        """count² × unit seconds, capped; BACKOFF_UNIT / BACKOFF_MAX in the queue's env_vars."""
        unit = float(self.env.get("BACKOFF_UNIT") or BACKOFF_UNIT)
        cap = float(self.env.get("BACKOFF_MAX") or BACKOFF_MAX)
        return int(min(self.count * self.count * unit, cap))


def read_small(path: Path) -> bytes:
    """A file's bytes in plain reads (no buffered file object: fewer syscalls)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def hide_passwords(text: str) -> str:
    """``http://ops:s3cret@h/q/x`` -> ``http://ops:***@h/q/x``: a status line
    and the log are read by whoever reads the queue."""
    return _PASSWORD.sub(r"\1:***@", text)
