"""Handing a relay message straight to the relay worker, without starting its script.

The relay queue's script is ``rqrelay PYTHON relay.py``: a small C program
that connects to the relay worker (``RQ_RELAY_SOCKET``), passes its fds 1-4
and its environment, and exits with the code the worker sends back
(``exit N``).  Its exec alone cost about as much CPU as the worker's whole
relay, so the daemon does what it would do itself: connects, passes the fds
the script would have had (output twice, the status pipe's write end, the
reply pipe's read end) and the script's environment.  The run then looks
like any other to the rest of the daemon: its status lines come on the
status pipe, and its end is the connection turning readable (``exit N``,
taken as that exit status, so RQ's exit rules apply unchanged).

A signal to the "script" maps onto the connection: TERM shuts our side for
writing, which the worker sees as its script gone (it stops before its next
step and closes); KILL shuts it both ways (we stop waiting).  A worker that
closes without an exit code that nobody asked to stop has gone away: the
message goes back to que, and its next run starts the rqrelay script, which
finishes it in a process of its own (resuming from ``job/relay_id``), as
rqrelay would have done.  Nothing is handed over, and the script is started
as usual, when the worker's socket does not take the connection and the whole
request at once, for runs with limits, with RELAY_HOLD_AT (fault injection
kills a script's process), or when the queue's ``env_vars`` say
``RELAY_HANDOFF=off``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
from collections.abc import Callable
from typing import Any

from rqsys.run.environment import RunEnvironment
from rqsys.run.spawn import Child

SHIM = "rqrelay"
MAGIC = b"RQRELAY1 "
EXIT_LINE_MAX = 32
NO_PROCESS = 0  # a hand-over's ``pid``, never shown (its listener is systemd or the supervisor)
HANDED = "relay worker"  # what the log, the timeline and RQ's exit texts say instead of a pid
ENDED = -1  # wait4's pid for a hand-over that ended (0 would say "still running")
LOST = signal.SIGKILL  # the wait status of a hand-over that ended without an exit code


class HandedChild(Child):
    """A relay handed to the worker, in the shape of a started script: ``pidfd``
    is the connection, ``pid`` 0 (no process of its own: its ``started`` event
    has ``RQ_HANDED`` instead of ``RQ_PID``, and RQ's exit texts name the
    ``process`` HANDED; nothing signals it, ``signal_group`` is the connection's).
    SO_PEERCRED on the connection would name whoever called listen(): the
    supervisor or systemd, not the worker."""

    process = HANDED

    sock: socket.socket
    msg_id: str
    dropped: Callable[[str], None]  # the HandOff's: its next run starts the script
    lost: bool = False  # ended without an exit code

    def release(self) -> list[int]:
        fds = super().release()  # our ends of the pipes, and the connection's fd
        self.sock.detach()
        return fds

    def signal_group(self, sig: int) -> None:
        """TERM: the worker stops before its next step; KILL: stop waiting for it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR if sig == signal.SIGKILL else socket.SHUT_WR)

    def wait(self) -> tuple[int, int, Any]:
        """As ``os.wait4`` of an ended child (its first item non-zero: ENDED):
        ``exit N`` as exit status N, and no rusage."""
        try:
            line = self.sock.recv(EXIT_LINE_MAX)
        except OSError:
            line = b""
        words = line.split()
        if len(words) == 2 and words[0] == b"exit" and words[1].isdigit():
            return ENDED, min(int(words[1]), 255) << 8, None
        self.lost = True  # stopped by us (the verdict says so first), or the worker died
        self.dropped(self.msg_id)
        return ENDED, LOST, None


class HandOff:
    """Hands the relay queue's runs to the worker when its script is rqrelay."""

    def __init__(self, env: RunEnvironment, present: Callable[[str], bool]) -> None:
        self.env = env
        self.present = present  # whether a message is still queued or running here
        self.again: set[str] = set()  # messages whose next run starts the script
        self._shared: dict[str, str] | None = None
        self._block = b""  # the shared environment, encoded once per configuration

    def start(self, program: str, run: dict[str, str], job: str,
              out: int | None) -> HandedChild | None:
        """The run handed to the worker, or None: start the script as usual."""
        shared = self.env.shared()
        path = shared.get("RQ_RELAY_SOCKET", "")
        msg_id = run["RQ_MSG_ID"]
        if (os.path.basename(program) != SHIM or not path or "RELAY_HOLD_AT" in shared
                or shared.get("RELAY_HANDOFF") == "off"):
            return None
        if msg_id in self.again:  # the worker dropped its last run
            self.again.discard(msg_id)
            return None
        sock = _connect(path)
        if sock is None:
            return None
        try:
            child = self._hand(sock, self._environ(shared, run), job, out)
        except OSError:
            sock.close()
            return None
        child.msg_id, child.dropped = msg_id, self._dropped
        return child

    def _dropped(self, msg_id: str) -> None:
        """The worker dropped ``msg_id``'s run: its next run starts the script.
        Those it holds that have left the queue meanwhile (deleted, moved, or
        ended in err after a later run) are let go first, so it holds at most
        the queue's messages; a rare event, so the sweep costs no run."""
        self.again = {i for i in self.again if self.present(i)}
        self.again.add(msg_id)

    def _environ(self, shared: dict[str, str], run: dict[str, str]) -> bytes:
        if shared is not self._shared:
            self._shared = shared
            self._block = _encode({k: v for k, v in shared.items() if k not in run})
        return self._block + _encode(run)

    def _hand(self, sock: socket.socket, environ: bytes, job: str,
              out: int | None) -> HandedChild:
        log = out if out is not None else _open_log(job)  # first: it may raise (ENOSPC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        reply_r, reply_w = os.pipe2(os.O_CLOEXEC)
        try:
            head = MAGIC + b"%d\n" % len(environ)
            data = head + environ
            sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(
                "4i", log, log, status_w, reply_r))], socket.MSG_DONTWAIT)
            if sent != len(data):
                raise BlockingIOError("the worker's socket took part of the request")
        except OSError:
            for fd in (status_r, reply_w):
                os.close(fd)
            raise
        finally:
            for fd in (status_w, reply_r, *(() if out is not None else (log,))):
                os.close(fd)
        os.set_blocking(status_r, False)
        os.set_blocking(reply_w, False)
        child = HandedChild(NO_PROCESS, sock.fileno(), status_r, reply_w)
        child.sock = sock
        return child


def _connect(path: str) -> socket.socket | None:
    """A connection to the worker, made without waiting (None: it does not take one)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setblocking(False)
        sock.connect(path)
        return sock
    except OSError:
        sock.close()
        return None


def _open_log(job: str) -> int:
    """``job/stdio.log`` for appending (``job/`` made if no spare brought it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    try:
        return os.open(f"{job}/stdio.log", flags, 0o644)
    except FileNotFoundError:
        os.mkdir(job)
        return os.open(f"{job}/stdio.log", flags, 0o644)


def _encode(env: dict[str, str]) -> bytes:
    return b"".join(os.fsencode(f"{k}={v}") + b"\0" for k, v in env.items())
