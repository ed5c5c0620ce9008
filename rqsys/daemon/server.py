"""The daemon's socket server: listener, connections, framing, and dispatch
over an explicit table of operations.

Framing is ``rqsys.wire.framing``'s.  A request is checked against its op's JSON
Schema (``rqsys.wire.schema``), and its client's role against the op's
(``rqsys.wire.roles``: the kernel says who the client is), before its
handler sees it.  A handler answers at once
(returns the answer) or later (returns None and calls ``request.answer``);
a connection's next request waits for the answer before, so answers keep
the order of the requests.  An ``RQError`` is answered as itself; any other
exception is a bug in rqsys: logged with its traceback and answered as an
``InternalError``, and the connection goes on with its next request.

Out of fds (``EMFILE``), a connection cannot be accepted: the listener is
left alone for ``ACCEPT_PAUSE`` (the loop does not spin on a backlog it
cannot take), clients wait in the backlog, and it is watched again when
the pause ends; the log says when that began and when it ended.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rqsys.daemon.audit import actor as actor_of
from rqsys.errors import (
    BadRequest,
    InternalError,
    ProtocolError,
    RQError,
    StoreError,
)
from rqsys.observe.events import EventLog
from rqsys.wire import framing as wire
from rqsys.wire import roles, schema

Reply = dict[str, Any]
ACCEPT_PAUSE = 0.5  # seconds the listener is left alone when a connection cannot be accepted
GONE_BEFORE_ACCEPT = (errno.ECONNABORTED, errno.EPROTO)  # that client only: take the next


@dataclass
class Request:
    """One request as a handler gets it."""

    op: str
    args: dict[str, Any]  # the request's JSON object, checked against the op's schema
    fds: list[int]  # files sent with it; a handler keeping one removes it from the list
    answer: Callable[[Reply], None]  # for an answer that comes later
    errors: Callable[[str, BaseException], Reply]  # the answer to an exception
    peer: str = ""  # who is asking: "socket pid <pid> uid <uid>" (SO_PEERCRED)
    push: Callable[[Reply], bool] | None = None  # one more answer line (watch); False: closed
    conn: Connection | None = None  # the client's connection (None: asked inside the daemon)

    def actor(self) -> str:
        """Who asks, as the audit trail names them (``rqsys.daemon.audit.actor``):
        ``alice (10.0.0.5)`` for the web's user, else the peer the kernel names;
        "" for a request made inside the daemon."""
        if self.conn is None:
            return ""
        return actor_of(self.conn, self.args.get("actor")).text

    def require_on(self, queue: str, need: str = "operator") -> None:
        """Forbidden unless who asks may do what needs ``need`` on ``queue`` too
        (a request whose effect reaches another queue of this host)."""
        if self.conn is not None:
            roles.require(self.conn.role, self.args.get("actor"), queue, need)

    def acting(self) -> dict[str, Any]:
        """The ``actor`` to carry when this request makes the daemon ask another
        queue's (``rqsys.wire.roles.require``): the one an admin peer acts for,
        else the peer itself with its role; {} for a request made inside the daemon."""
        given = self.args.get("actor")
        if self.conn is None:
            return {}
        if self.conn.role == "admin" and isinstance(given, dict):
            return given
        who = actor_of(self.conn, None)
        return {"user": who.who, "address": who.where[:100], "role": self.conn.role}

    def claimed(self) -> str:
        """Who the request says made it (its ``by``: ``timer t``, ``batch b``...),
        believed from an admin peer (the web, timers, the daemons) or inside the
        daemon; from any other peer, the kernel's name for it, beside its claim."""
        said = str(self.args.get("by") or "")
        if self.conn is None or (said and self.conn.role == "admin"):
            return said or self.peer
        return f"{self.peer} (says: {said[:80]})" if said else self.peer

    def fail(self, exc: BaseException) -> None:
        """Answer later with the error ``exc`` (an exception that is no RQError is a bug)."""
        self.answer(self.errors(self.op, exc))


Handler = Callable[[Request], "Reply | None"]
Audit = Callable[["Connection", str, dict[str, Any], Reply], None]  # rqsys.daemon.audit


class Connection:
    """A client connection: its input lines and pending output."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lines = wire.LineBuffer()
        self.out = bytearray()
        self.closing = False
        self.waiting = False  # a request's answer comes later; the next ones wait
        self.pid, self.uid = _creds(sock)
        self.peer = f"socket pid {self.pid} uid {self.uid}" if self.pid >= 0 else "socket"
        self.role = roles.peer_role(sock)  # what it may do (rqsys.wire.roles)
        self.events = selectors.EVENT_READ  # as registered in the selector


class Server:
    """Accepts clients on the listening socket and runs their requests."""

    def __init__(self, queue: str, selector: selectors.BaseSelector,
                 ops: Mapping[str, Handler], schemas: Mapping[str, dict[str, Any]],
                 log: EventLog, audit: Audit | None = None,
                 audit_ready: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.queue, self.selector, self.log = queue, selector, log  # roles are on this queue
        self.audit = audit  # told of each answered request that may change something
        self.audit_ready = audit_ready  # raises when such a request's record cannot be written
        self.ops = dict(ops)
        self.checker = schema.Checker(schemas)
        missing = set(self.ops) ^ set(schemas)
        if missing:
            raise InternalError(f"operations and schemas differ: {sorted(missing)}")
        self.listener: socket.socket | None = None
        self._conn_of: dict[int, Connection] = {}
        self._paused_until: float | None = None  # the listener left alone (out of fds)
        self._accept_failed = ""  # why accepting failed, until a connection is taken again

    def listen(self, listener: socket.socket) -> None:
        self.listener = listener
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, self._accept)

    def stop_listening(self) -> None:
        """Take no new connections (they wait in the backlog for the next daemon)."""
        if self.listener is not None and self._paused_until is None:
            self.selector.unregister(self.listener)
        self.listener, self._paused_until = None, None

    def next_wait(self) -> float | None:
        """Seconds until a paused listener is watched again (None: not paused)."""
        return None if self._paused_until is None else self._paused_until - time.monotonic()

    def resume_accepting(self) -> None:
        """Once a turn: watch the listener again when its pause is over."""
        if self._paused_until is not None and time.monotonic() >= self._paused_until:
            self._paused_until = None
            if self.listener is not None:
                self.selector.register(self.listener, selectors.EVENT_READ, self._accept)

    def connections(self) -> int:
        return len(self._conn_of)

    # ------------------------------------------------------------ connections
    def _accept(self, _key: Any, _mask: int) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in GONE_BEFORE_ACCEPT:
                    continue
                self._pause_accepting(exc)
                return
            if self._accept_failed:
                self.log.event("daemon", f"connections taken again (after: {self._accept_failed})")
                self._accept_failed = ""
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, self._conn_event)
            self._conn_of[sock.fileno()] = Connection(sock)

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of fds or memory: leave the listener alone for ACCEPT_PAUSE."""
        if not self._accept_failed:
            self._accept_failed = exc.strerror or str(exc)
            self.log.event("warning", f"cannot take connections: {self._accept_failed}; "
                           "clients wait until fds are free")
        assert self.listener is not None
        self.selector.unregister(self.listener)
        self._paused_until = time.monotonic() + ACCEPT_PAUSE

    def _conn_event(self, key: Any, mask: int) -> None:
        conn = self._conn_of[key.fd]
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if mask & selectors.EVENT_READ and conn.sock.fileno() >= 0:
            self._readable(conn)

    def _readable(self, conn: Connection) -> None:
        try:
            data, fds = wire.recv(conn.sock)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data:
            self._close(conn)
            return
        if conn.closing:  # an error was answered: the rest of the input is dropped
            _close_fds(fds)
            return
        try:
            conn.lines.feed(data, fds)
        except ProtocolError as exc:
            _close_fds(conn.lines.fds)
            conn.lines = wire.LineBuffer()
            self._reply(conn, wire.error_reply(exc))
            conn.closing = True
            return
        self._run_lines(conn)

    def _run_lines(self, conn: Connection) -> None:
        """Run the connection's complete requests in order; one whose answer
        comes later holds back the rest."""
        while not conn.waiting and (got := conn.lines.next_line()) is not None:
            line, fds = got
            try:
                reply = self._dispatch(conn, line, fds)
            finally:
                _close_fds(fds)  # those a handler kept for later it took out of the list
            if reply is None:
                conn.waiting = True  # the handler answers later, through request.answer
            else:
                self._reply(conn, reply)

    # ------------------------------------------------------------ dispatch
    def _dispatch(self, conn: Connection, line: bytes, fds: list[int]) -> Reply | None:
        op, args = "?", {}
        try:
            args = wire.decode_request(line)
            op = str(args.get("op"))
            handler = self.ops.get(op)
            if handler is None:
                raise BadRequest(f"unknown operation {op[:40]!r}")
            roles.require(conn.role, args.get("actor"), self.queue, roles.op_role(op))
            self.checker.check(op, args)
            if self.audit_ready is not None and roles.mutates(op):
                self.audit_ready(op, args)  # a full disk: refused unless it can be recorded
            reply = handler(Request(op, args, fds,
                                    lambda reply: self._answer(conn, reply, op, args),
                                    self.error_reply, conn.peer,
                                    lambda reply: self._push(conn, reply), conn))
        except Exception as exc:
            reply = self.error_reply(op, exc)
        if reply is not None:
            self._audit(conn, op, args, reply)
        return reply

    def _audit(self, conn: Connection, op: str, args: dict[str, Any], reply: Reply) -> None:
        """A request that may change something, answered: its audit record
        (written before the answer leaves: see ``rqsys.daemon.audit``)."""
        if self.audit is not None and op in self.ops and roles.mutates(op):
            self.audit(conn, op, args, reply)

    def error_reply(self, op: str, exc: BaseException) -> Reply:
        """The answer to an exception: an RQError as itself, a failing disk as
        a StoreError, anything else as the bug it is."""
        if isinstance(exc, RQError):
            return wire.error_reply(exc)
        if isinstance(exc, OSError):  # not the client's fault, nor a bug
            self.log.event("err", f"{op}: store error: {exc}")
            return wire.error_reply(StoreError(f"store error: {exc.strerror or exc}"))
        trace = "".join(traceback.format_exception(exc))
        self.log.event("err", f"internal error in {op}: {exc!r}\n{trace}")
        self.log.flush()  # a bug is logged at once, not at the turn's end
        return wire.error_reply(InternalError(
            f"internal error: {type(exc).__name__} in {op[:40]} (see the queue's log)"))

    def _answer(self, conn: Connection, reply: Reply, op: str, args: dict[str, Any]) -> None:
        """Send an answer that came later, then run the requests after it."""
        self._audit(conn, op, args, reply)
        conn.waiting = False
        self._reply(conn, reply)
        if conn.sock.fileno() >= 0:
            self._run_lines(conn)

    def _push(self, conn: Connection, reply: Reply) -> bool:
        """One more line to a connection that asked for several (``watch``):
        written now, nothing else run; False once the connection is closed."""
        if conn.sock.fileno() < 0:
            return False
        self._reply(conn, reply)
        return conn.sock.fileno() >= 0

    def _reply(self, conn: Connection, reply: Reply) -> None:
        self.log.flush()  # events told before an answer are written before it (events.py)
        conn.out += wire.encode(reply)
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        try:
            while conn.out:
                del conn.out[: conn.sock.send(conn.out)]
        except BlockingIOError:
            pass
        except OSError:
            self._close(conn)
            return
        if conn.closing and not conn.out:
            self._close(conn)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        if conn.events != events:  # kept on the connection: no selector look-up per answer
            self.selector.modify(conn.sock, events, self._conn_event)
            conn.events = events

    def _close(self, conn: Connection) -> None:
        fd = conn.sock.fileno()
        if fd < 0:
            return
        self.selector.unregister(conn.sock)
        self._conn_of.pop(fd, None)
        conn.sock.close()


def _creds(sock: socket.socket) -> tuple[int, int]:
    """The client's pid and uid, as the kernel tells them ((-1, -1) if it does not)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return -1, -1
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()
