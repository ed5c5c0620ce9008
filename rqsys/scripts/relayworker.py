"""The relay worker: one long-lived process that relays the messages ``rqrelay`` hands it.

A relay in a Python process of its own pays the interpreter's start-up and
imports on every message (about 0.1 s of CPU), and a new connection to the
far end for every request.  Here the relay queue's script is ``rqrelay``, a
small C program: it connects to this worker's socket (``RQ_RELAY_SOCKET``),
passes its fds 1-4 and its environment, and waits for ``exit N``.  Each
message is relayed by ``relay.relay`` on a thread of this process, with
kept-alive connections to the far ends, writing its status lines on the
passed fd 3 exactly as the script would, so the queue daemon and RQ's exit
rules see one ordinary script per message.

Crash rules stay the script's: the message is worked only while its
``rqrelay`` process lives (its end of the connection closing cancels the
relay before its next step), one message is never worked twice at once,
and if this worker dies ``rqrelay`` runs the relay in a process of its own,
which resumes from ``job/relay_id``.  Only processes of this worker's own
user are served.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rqsys.scripts.jobkit import Job
from rqsys.scripts.relay import Cancelled, relay
from rqsys.scripts.rqhttp import Connections

MAGIC = b"RQRELAY1 "
MAX_ENV = 1 << 20  # bytes of environment a request may carry
RECV_SIZE = 1 << 16  # bytes of the request read with its fds
FDS = 4  # the script's fds 1 (output), 2, 3 (RQ_WRITE) and 4 (RQ_READ)
# Threads kept waiting for connections after a busy spell: as many as the
# relay queue's workers (16 by default), or each burst starts threads anew.
SPARE_THREADS = 32
UID = os.getuid()  # only processes of this user are served
SHORT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class BadRequest(Exception):
    """A connection that is not an rqrelay process asking for a relay."""


class Worker:
    """Accepts rqrelay connections and relays each message on a thread."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.conns = Connections()
        self._busy: dict[str, tuple[threading.Lock, list[int]]] = {}  # lock, users
        self._busy_lock = threading.Lock()
        self._accepting = 0  # threads waiting in accept()

    def serve_forever(self, spare: bool = False) -> None:
        """Until the listening socket is shut down.  Each thread accepts one
        connection and serves it, after starting another thread if none is left
        accepting: as many threads as relays at once, not one started per message.
        A ``spare`` thread ends when enough others wait (never the first)."""
        while (conn := self.accept()) is not None:
            self.serve(conn)
            with self._busy_lock:
                if spare and self._accepting >= SPARE_THREADS:
                    return

    def accept(self) -> socket.socket | None:
        with self._busy_lock:
            self._accepting += 1
        try:
            conn, _ = accept_when_possible(self.listener)
        except OSError:
            return None  # the listening socket was shut down
        finally:
            with self._busy_lock:
                self._accepting -= 1
                alone = self._accepting == 0
        if alone:
            threading.Thread(target=self.serve_forever, args=(True,), daemon=True).start()
        return conn

    def serve(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            pid = peer_pid(conn)
            env, fds = read_request(conn)
            code = self.run(conn, env, fds, pid)
            if code is not None:
                conn.sendall(f"exit {code}\n".encode())
        except (BadRequest, OSError) as exc:
            print(f"relay worker: connection refused: {exc}", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - a bug: this connection ends, not the worker
            print(f"relay worker: internal error:\n{traceback.format_exc()}", file=sys.stderr,
                  flush=True)
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def run(self, conn: socket.socket, env: dict[str, str], fds: list[int],
            pid: int) -> int | None:
        """Relay one message; its exit code, or None when its process is gone."""
        with self.only_one(env.get("RQ_MSG_DIR", "")):
            job = Job(env, out=fds[0], write=fds[2], pid=pid)
            try:
                return relay(job, self.conns, ShimGone(conn))
            except Cancelled:
                return None

    @contextmanager
    def only_one(self, key: str) -> Iterator[None]:
        """One message is worked by one thread at a time (a rerun waits for the last)."""
        with self._busy_lock:
            lock, users = self._busy.setdefault(key, (threading.Lock(), [0]))
            users[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._busy_lock:
                users[0] -= 1
                if not users[0]:
                    del self._busy[key]


def accept_when_possible(listener: socket.socket) -> tuple[socket.socket, Any]:
    """accept(); out of fds or memory for a moment, try again (rqrelay waits)."""
    while True:
        try:
            return listener.accept()
        except OSError as exc:
            if exc.errno not in SHORT_OF:
                raise
            print(f"relay worker: accept: {exc}; trying again", file=sys.stderr, flush=True)
            time.sleep(0.5)


class ShimGone:
    """Whether the rqrelay process is gone: its end of the connection closed (it
    ended or was killed).  Asked before each step of the relay, so no thread
    per message watches the connection."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def is_set(self) -> bool:
        try:  # rqrelay sends nothing after its request: readable means closed
            return self.conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Until the process is gone (or ``timeout`` seconds); whether it is."""
        poller = select.poll()
        poller.register(self.conn, select.POLLIN)
        poller.poll(None if timeout is None else timeout * 1000)
        return self.is_set()


def peer_pid(conn: socket.socket) -> int:
    """The connecting process's pid; BadRequest for another user's process."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != UID:
        raise BadRequest(f"uid {uid} is not this worker's ({UID})")
    return pid


def read_request(conn: socket.socket) -> tuple[dict[str, str], list[int]]:
    """The environment and the fds an rqrelay process sent."""
    # the daemon sends head and environment in one sendmsg: one recv takes both
    data, fds, _flags, _addr = socket.recv_fds(conn, RECV_SIZE, FDS)
    try:
        head, newline, rest = data.partition(b"\n")
        size = parse_head(head + newline)
        if len(fds) != FDS:
            raise BadRequest(f"{len(fds)} fds passed, not {FDS}")
        return parse_environ(rest + recv_exactly(conn, size - len(rest))), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def parse_head(head: bytes) -> int:
    if not head.startswith(MAGIC) or not head.endswith(b"\n"):
        raise BadRequest(f"not an rqrelay request: {head[:40]!r}")
    size = head[len(MAGIC):-1]
    if not (size.isascii() and size.isdigit()) or int(size) > MAX_ENV:
        raise BadRequest(f"bad environment size {size[:20]!r}")
    return int(size)


def recv_exactly(conn: socket.socket, size: int) -> bytes:
    chunks, got = [], 0
    while got < size:
        chunk = conn.recv(min(size - got, 65536))
        if not chunk:
            raise BadRequest("connection closed before the whole environment")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def parse_environ(block: bytes) -> dict[str, str]:
    # one decode of the whole block, as os.fsdecode would each item (surrogateescape)
    items = block.decode("utf-8", "surrogateescape").split("\0")
    env = dict(item.split("=", 1) for item in items if "=" in item)
    if not env.get("RQ_MSG_DIR"):
        raise BadRequest("no RQ_MSG_DIR in the environment")
    return env


def main() -> int:
    """Serve the socket handed over (LISTEN_FDS), as the supervisor or systemd starts it."""
    from rqsys.systemd import Notifier, listen_sockets

    sockets = listen_sockets()
    if not sockets:
        print("relay worker: no listening socket handed over (LISTEN_FDS)", file=sys.stderr)
        return 2
    worker = Worker(next(iter(sockets.values())))
    Notifier().ready("relaying")
    worker.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
