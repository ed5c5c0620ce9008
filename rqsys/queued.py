"""The queue daemon: one process per queue, the sole writer of its directory.

An event loop in fixed phases (supervisor's ``runforever`` shape): wait in
the selector (listening socket, client connections, each script's status pipe
and pidfd, the signal wake-up socket, the background thread's wake-up pipe)
until the next due message or timer;
dispatch what is ready; publish the turn's new messages in one group commit
and answer their clients; act on signal flags; start due messages; flush the
batched directory fsyncs (at most every ``store.FLUSH_INTERVAL``); tell
systemd.  Work that can take seconds (checking attachments) runs on a
background thread (``rqsys.background``), and spare message directories are
made on another (``store.SpareMaker``); the loop itself never waits on either.
Signal handlers only set flags.  A clean stop with many queued
messages leaves ``que.snapshot`` for a fast next start (see ``rqsys.store``).

Socket operations are the ``op_*`` methods (see ``rqsys.wire`` for framing).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from rqsys import config, wire
from rqsys.background import Background
from rqsys.client import QueueClient, route
from rqsys.errors import BadRequest, ProtocolError, QueueDown, RQError, SpawnError
from rqsys.events import EventLog
from rqsys.message import is_remote, new_message, param_key
from rqsys.output import ScriptOutput
from rqsys.protocol import Command
from rqsys.scheduler import Schedule
from rqsys.scripts.webhook import WEBHOOK_QUEUE, webhook_message
from rqsys.signals import SignalFlags
from rqsys.spawn import script_argv, spawn
from rqsys.store import (
    STATES,
    Layout,
    QueueStore,
    Staged,
    Upload,
    check_attach_name,
    check_msg_id,
)
from rqsys.systemd import Notifier, child_environ, default_idle_timeout, listen_sockets
from rqsys.worker import Outcome, Worker

ADMIN_OPERS = {"up": "UP", "resume": "UP", "down": "DOWN", "pause": "PAUSE"}
MAX_LIST = 1000
DUP_TIMEOUT = 10.0
WEBHOOK_TIMEOUT = 2.0  # the daemon waits this long at most to queue a webhook call
SCRIPT_RECHECK = 5.0  # seconds between checks of a missing script
STATUS_INTERVAL = 0.1  # seconds between STATUS= updates (they are for people)
SNAPSHOT_MIN = 1000  # queued messages from which a clean stop leaves que.snapshot

Incoming = tuple[str, str, Upload, int]  # an attachment on its way in: name, md5 sent, file, fd


class Connection:
    """A client connection: its input lines and pending output."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lines = wire.LineBuffer()
        self.out = bytearray()
        self.closing = False
        self.waiting = False  # a request's answer comes later; the next ones wait


class QueueDaemon:
    def __init__(self, layout: Layout, name: str, listener: socket.socket | None = None,
                 notifier: Notifier | None = None, log: EventLog | None = None) -> None:
        self.layout, self.name = layout, name
        self.sysconfig = config.load_system_config(layout)
        self.config = config.load_queue_config(layout, name)
        self.store = QueueStore(layout.queue_dir(name))
        self.notifier = notifier or Notifier()
        self.log = log or EventLog(name)
        self.default_idle = default_idle_timeout()
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.output = ScriptOutput(name, self.selector, self.log.journal)
        self.schedule = Schedule(self.config["blocking_params"], self.config["coalesce_params"])
        self.workers: dict[str, Worker] = {}
        self.counts: dict[str, int] = {}
        self.pending: list[tuple[Connection, Staged, str]] = []
        self.background = Background()
        self.stopping_until: float | None = None
        self.idle_since = time.monotonic()
        self.admin = "UP"
        self.script_error = ""
        self._script_check_at = 0.0
        self._conn_of: dict[int, Connection] = {}
        self._fd_worker: dict[int, Worker] = {}
        self._env_cache: dict[str, str] | None = None
        self._status_sent, self._status_stale, self._status_at = "", False, 0.0

    # ---------------------------------------------------------------- start-up
    def start(self) -> None:
        """Recover the store, load que/, open the socket, then tell READY=1."""
        recovered = self.store.recover()
        for msg_id in recovered:
            self.log.event("recovered", "was running at the last stop; requeued", msg_id)
        self.admin = self.store.admin_state()
        self._load_que()
        self.counts = {state: self.store.count(state) for state in ("prep", "done", "err",
                                                                      "relayed")}
        self._open_listener()
        self._install_signals()
        self.notifier.ready(self.status_line())

    def _load_que(self) -> None:
        snapshot = self.store.take_que_snapshot()
        if snapshot is not None:
            for msg_id, saved in snapshot.items():
                self.schedule.add(msg_id, saved)
            return
        for msg_id, msg in self.store.read_all("que"):
            if not isinstance(msg, RQError):
                self.schedule.add(msg_id, msg)
            else:
                exc = msg
                self.log.event("err", f"unreadable queued message moved to err: {exc}", msg_id)
                self.store.write_status("que", msg_id, f"unreadable message: {exc}")
                self.store.move(msg_id, "que", "err")

    def _open_listener(self) -> None:
        if self.listener is None:
            path = self.layout.socket_path(self.name)
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                path.unlink()
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            self.listener.bind(str(path))
            self.listener.listen(128)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, self._accept)

    def _install_signals(self) -> None:
        self.signals = SignalFlags()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.selector.register(self.signals, selectors.EVENT_READ, self.signals.drain)
        self.selector.register(self.background, selectors.EVENT_READ,
                               lambda _key, _mask: self.background.run_finished())

    # ---------------------------------------------------------------- the loop
    def run(self) -> int:
        self.start()
        while True:
            for key, mask in self.selector.select(self._timeout()):
                key.data(key, mask)
            self._publish_pending()
            if self._handle_flags():
                break
            self._start_due()
            self.store.flush()
            self._report()
            if self._idle_expired():
                self.log.event("daemon", "idle: exiting until the next request")
                break
        self.store.spares.stop()
        self.background.close()
        self.output.close_all()
        self.store.flush(force=True)
        if len(self.schedule) >= SNAPSHOT_MIN:
            self.store.save_que_snapshot(self.schedule.msgs)
        self.notifier.stopping()
        return 0

    def _timeout(self) -> float:
        if self.pending:  # creates taken in after this turn's group commit
            return 0.0
        now = time.time()
        waits = [60.0]
        if self.script_error:
            waits.append(self._script_check_at - time.monotonic())
        elif self._can_start():
            due = self.schedule.next_due()
            if due is not None:
                waits.append(due - now)
        flush = self.store.flush_due()
        if flush is not None:
            waits.append(flush)
        if self._status_stale:
            waits.append(self._status_at - time.monotonic())
        wd = self.notifier.watchdog_due(time.monotonic())
        if wd is not None:
            waits.append(wd)
        if self.stopping_until is not None:
            waits.append(min(0.5, self.stopping_until - time.monotonic()))
        idle = self._idle_timeout()
        if idle and self._is_idle():
            waits.append(self.idle_since + idle - time.monotonic())
        return max(0.0, min(waits))

    def _report(self) -> None:
        """STATUS= to systemd when it changed, at most every STATUS_INTERVAL."""
        now = time.monotonic()
        line = self.status_line()
        self._status_stale = line != self._status_sent
        if self._status_stale and now >= self._status_at:
            self.notifier.status(line)
            self._status_sent, self._status_stale = line, False
            self._status_at = now + STATUS_INTERVAL
        self.notifier.kick_watchdog(now)

    def status_line(self) -> str:
        c = self.counts
        text = (f"que {len(self.schedule)}, run {len(self.workers)}/"
                f"{self.config['num_workers']}, done {c.get('done', 0)}, err {c.get('err', 0)}")
        if self.script_error:
            return f"SCRIPTERROR ({self.script_error}): {text}"
        return text if self.admin == "UP" else f"{self.admin}: {text}"

    def _is_idle(self) -> bool:
        busy = self.workers or len(self.schedule) or self.pending or self.background.busy()
        others = len(self.selector.get_map()) > 3  # beyond listener, signals, background
        return not busy and not others and self.stopping_until is None

    def _idle_timeout(self) -> float:
        """The queue's own idle_timeout, else the unit's RQ_IDLE_TIMEOUT."""
        return float(self.config["idle_timeout"] or self.default_idle)

    def _idle_expired(self) -> bool:
        idle = self._idle_timeout()
        if not self._is_idle():
            self.idle_since = time.monotonic()
            return False
        return bool(idle) and time.monotonic() - self.idle_since >= idle

    def _handle_flags(self) -> bool:
        """Act on signals; True when the loop should end."""
        flags = self.signals.take()
        if signal.SIGHUP in flags:
            self.reload()
        if flags & {signal.SIGTERM, signal.SIGINT} and self.stopping_until is None:
            self._begin_stop()
        if self.stopping_until is None:
            return False
        if self.workers and time.monotonic() >= self.stopping_until:
            for worker in self.workers.values():
                worker.child.signal_group(signal.SIGKILL)
        return not self.workers

    def _begin_stop(self) -> None:
        self.log.event("daemon", f"stopping; {len(self.workers)} script(s) told to stop")
        self.notifier.stopping()
        self.stopping_until = time.monotonic() + float(self.config["stop_grace"])
        if self.listener is not None:
            self.selector.unregister(self.listener)
        for worker in self.workers.values():
            worker.stop_reason = worker.stop_reason or "stopping"
            worker.child.signal_group(signal.SIGTERM)

    def reload(self) -> None:
        """Re-read the queue config; running scripts are not disturbed."""
        self.notifier.reloading()
        try:
            cfg = config.load_queue_config(self.layout, self.name)
            self.sysconfig = config.load_system_config(self.layout)
        except RQError as exc:
            self.log.event("err", f"reload failed, keeping the old config: {exc}")
        else:
            self.config = cfg
            self.schedule.blocking = list(cfg["blocking_params"])
            self.schedule.coalesce = list(cfg["coalesce_params"])
            self._script_check_at = 0.0  # re-check a SCRIPTERROR script now
            self._env_cache = None
            self.log.event("daemon", "configuration reloaded")
        self.notifier.send("READY=1")

    # ------------------------------------------------------------ connections
    def _accept(self, _key: Any, _mask: int) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, self._conn_event)
            self._conn_of[sock.fileno()] = Connection(sock)

    def _conn_event(self, key: Any, mask: int) -> None:
        conn = self._conn_of[key.fd]
        if mask & selectors.EVENT_WRITE:
            self._flush_conn(conn)
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
        self._dispatch_lines(conn)

    def _dispatch_lines(self, conn: Connection) -> None:
        """Run the connection's complete requests in order; one whose answer
        comes later holds back the rest, so answers keep the requests' order."""
        while not conn.waiting and (got := conn.lines.next_line()) is not None:
            self._dispatch(conn, *got)

    def _dispatch(self, conn: Connection, line: bytes, fds: list[int]) -> None:
        try:
            req = wire.decode(line)
            handler = getattr(self, f"op_{req.get('op')}", None)
            if handler is None:
                raise BadRequest(f"unknown operation {str(req.get('op'))[:40]!r}")
            reply = handler(conn, req, fds)
        except RQError as exc:
            reply = wire.error_reply(exc)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            reply = wire.error_reply(BadRequest(f"bad request: {exc}"))
        except OSError as exc:
            self.log.event("err", f"store error: {exc}")
            reply = wire.error_reply(RQError(f"store error: {exc.strerror or exc}"))
        finally:
            for fd in fds:  # those a handler kept for later it took out of the list
                os.close(fd)
        if reply is None:
            conn.waiting = True  # the handler answers later, through _answer
        else:
            self._reply(conn, reply)

    def _answer(self, conn: Connection, reply: dict[str, Any]) -> None:
        """Send an answer that came later, then run the requests after it."""
        conn.waiting = False
        self._reply(conn, reply)
        if conn.sock.fileno() >= 0:
            self._dispatch_lines(conn)

    def _reply(self, conn: Connection, reply: dict[str, Any]) -> None:
        conn.out += wire.encode(reply)
        self._flush_conn(conn)

    def _flush_conn(self, conn: Connection) -> None:
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
        if self.selector.get_key(conn.sock).events != events:
            self.selector.modify(conn.sock, events, self._conn_event)

    def _close(self, conn: Connection) -> None:
        fd = conn.sock.fileno()
        if fd < 0:
            return
        self.selector.unregister(conn.sock)
        self._conn_of.pop(fd, None)
        conn.sock.close()

    # ------------------------------------------------------------ creation
    def _url(self, msg_id: str) -> str:
        return config.message_url(self.sysconfig, self.name, msg_id)

    def _check_dest(self, msg: dict[str, Any]) -> None:
        dest = msg["dest"]
        remote = is_remote(dest) or msg.get("force_remote")
        if remote and self.name == "relay":
            return
        if dest == self.name:
            return
        if is_remote(dest) and route(dest, self.sysconfig) == self.name:
            msg["dest"] = self.name
            return
        raise BadRequest(f"dest {dest!r} is not queue {self.name}")

    def _check_accepting(self, strict: bool = False) -> None:
        if self.stopping_until is not None:
            raise QueueDown(f"queue {self.name} is stopping")
        if self.admin == "DOWN" or (strict and self.admin == "PAUSE"):
            raise QueueDown(f"queue {self.name} is {self.admin}")

    def op_create(self, conn: Connection, req: dict[str, Any],
                  fds: list[int]) -> dict[str, Any] | None:
        """New message in ``que`` (default) or ``prep``; answered by the group
        commit (after its attachments are checked, if it has any)."""
        state = req.get("state", "que")
        if state not in ("que", "prep"):
            raise BadRequest(f"cannot create a message in state {state!r}")
        self._check_accepting(strict=bool(req.get("refuse_paused")))
        msg = new_message(req.get("msg"), self.name)
        self._check_dest(msg)
        if req.get("single") and state == "que":
            existing = self.schedule.find_same_params(msg)
            if existing:
                return {"ok": True, "msg_id": existing, "url": self._url(existing)}
        staged = self.store.stage(msg, state)
        specs = req.get("attachments") or []
        if not specs and not fds:
            self.pending.append((conn, staged, state))
            return None
        try:
            uploads = self._take_uploads(specs, fds)
        except Exception:
            self.store.discard(staged)
            raise

        def place(actual: list[str]) -> None:
            adir = staged.attach_dir()
            for (name, md5, upload, _fd), got in zip(uploads, actual, strict=True):
                self.store.place_upload(upload, adir, name, md5, got, sync=False)
            self.pending.append((conn, staged, state))  # answered by the group commit

        self._check_uploads(conn, uploads, place, undo=lambda: self.store.discard(staged))
        return None

    def _take_uploads(self, specs: list[dict[str, Any]], fds: list[int]) -> list[Incoming]:
        """Check what the request says of its files, and start taking them in.

        Takes the fds out of ``fds``: they stay open until the files are
        checked (see _check_uploads).
        """
        if not isinstance(specs, list):
            raise BadRequest("attachments must be a list of {name, md5}")
        if len(specs) != len(fds):
            raise BadRequest(f"{len(specs)} attachments described but {len(fds)} files sent")
        named = [(check_attach_name(spec.get("name")), _check_md5(spec.get("md5")))
                 for spec in specs]
        uploads: list[Incoming] = []
        try:
            for (name, md5), fd in zip(named, fds, strict=True):
                uploads.append((name, md5, self.store.new_upload(fd), fd))
        except OSError:
            for _name, _md5, upload, _fd in uploads:
                self.store.drop_upload(upload)
            raise
        fds.clear()
        return uploads

    def _check_uploads(self, conn: Connection, uploads: list[Incoming],
                       place: Callable[[list[str]], dict[str, Any] | None],
                       undo: Callable[[], None] | None = None) -> None:
        """Copy if need be, sync and hash the uploads on the background thread
        (seconds for large files: the loop goes on meanwhile); then, on the
        loop, ``place`` them and answer with what it returns (None: the group
        commit answers)."""
        def work() -> list[str]:
            return [self.store.fill_upload(upload, fd) for _n, _m, upload, fd in uploads]

        def done(actual: list[str], error: BaseException | None) -> None:
            _close_fds([fd for _n, _m, _u, fd in uploads])
            try:
                if error is not None:
                    raise error
                reply = place(actual)
            except Exception as exc:  # whatever it was, the client hears it, the loop goes on
                for _name, _md5, upload, _fd in uploads:
                    self.store.drop_upload(upload)
                if undo is not None:
                    undo()
                if not isinstance(exc, RQError):
                    self.log.event("err", f"attachment not stored: {exc!r}")
                reply = wire.error_reply(exc if isinstance(exc, RQError)
                                         else RQError(f"attachment not stored: {exc}"))
            if reply is not None:
                self._answer(conn, reply)

        self.background.submit(work, done)

    def _publish_pending(self) -> None:
        """Group commit: make this turn's new messages durable, move them into
        place (a rename: whoever looks in que/ after the answer finds them
        there), then answer."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        for state in ("que", "prep"):
            group = [p for p in batch if p[2] == state]
            if not group:
                continue
            staged = [s for _c, s, _s in group]
            try:
                self.store.publish(staged)
            except OSError as exc:
                for conn, one, _s in group:
                    self.store.discard(one)
                    self._answer(conn, wire.error_reply(RQError(f"not stored: {exc}")))
                continue
            self._place(staged, state)
            for conn, one, _s in group:
                self._answer(conn, {"ok": True, "msg_id": one.msg_id, "url": self._url(one.msg_id)})

    def _place(self, staged: list[Staged], state: str) -> None:
        try:
            self.store.place(staged, state)
        except OSError as exc:  # durable in .tmp/: recovery places them at the next start
            self.log.event("err", f"new messages left in .tmp/ until restart: {exc}")
            return
        for one in staged:
            self._created(one, state)
        # Spares are made from the first create on, not at start: a daemon
        # started for one request (socket activation) does not wait for them.
        self.store.spares.start()

    def _created(self, staged: Staged, state: str) -> None:
        if state == "prep":
            self.counts["prep"] += 1
        else:
            self.schedule.add(staged.msg_id, staged.msg)
        self.log.event("created", f"in {state}", staged.msg_id)

    # ------------------------------------------------------------ message ops
    def _msg_id(self, req: dict[str, Any]) -> str:
        return check_msg_id(req.get("msg_id"))  # type: ignore[arg-type]

    def _state_of(self, msg_id: str) -> str:
        return "run" if msg_id in self.workers else self.store.find(msg_id)

    def op_ping(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        return {"ok": True, "queue": self.name, "pid": os.getpid()}

    def op_get(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        msg_id = self._msg_id(req)
        state = self._state_of(msg_id)
        worker = self.workers.get(msg_id)
        msg = dict(worker.msg) if worker else self.store.read_msg(state, msg_id)
        status = worker.status if worker else self.store.read_status(state, msg_id)
        return {"ok": True, "msg": msg, "state": state, "status": status,
                "url": self._url(msg_id), "attachments": self._attachments(state, msg_id)}

    def _attachments(self, state: str, msg_id: str) -> dict[str, Any]:
        found = {}
        for path in self.store.attachments(state, msg_id):
            found[path.name] = {"md5": self.store.attachment_md5(path),
                                "size": path.stat().st_size, "path": str(path)}
        return found

    def op_state(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        return {"ok": True, "state": self._state_of(self._msg_id(req))}

    def op_status(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        msg_id = self._msg_id(req)
        state = self._state_of(msg_id)
        worker = self.workers.get(msg_id)
        status = worker.status if worker else self.store.read_status(state, msg_id)
        return {"ok": True, "state": state, "status": status}

    def op_commit(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        msg_id = self._msg_id(req)
        self._check_accepting()
        state = self.store.find(msg_id)
        if state != "prep":
            if state in ("que", "run", "done", "relayed"):
                return {"ok": True, "msg_id": msg_id, "url": self._url(msg_id),
                        "already": state}
            raise BadRequest(f"message {msg_id} is in {state}, not prep")
        self.store.move(msg_id, "prep", "que", durable=True)
        self.counts["prep"] -= 1
        self.schedule.add(msg_id, self.store.read_msg("que", msg_id))
        return {"ok": True, "msg_id": msg_id, "url": self._url(msg_id)}

    def op_attach(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> None:
        """Attach the one open file sent with the request to a prep message;
        answered once the file is checked, off the loop."""
        msg_id = self._msg_id(req)
        if len(fds) != 1:
            raise BadRequest("attach needs exactly one open file")
        self._require_prep(msg_id)
        uploads = self._take_uploads([{"name": req.get("name"), "md5": req.get("md5")}], fds)

        def place(actual: list[str]) -> dict[str, Any]:
            self._require_prep(msg_id)  # it may have been committed or deleted meanwhile
            name, md5, upload, _fd = uploads[0]
            path = self.store.place_upload(upload, self.store.prep_attach_dir(msg_id), name, md5,
                                           actual[0], sync=True)
            return {"ok": True, "md5": md5, "size": path.stat().st_size, "name": name}

        self._check_uploads(conn, uploads, place)

    def _require_prep(self, msg_id: str) -> None:
        if self.store.find(msg_id) != "prep":
            raise BadRequest(f"message {msg_id} is not in prep")

    def op_delete(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        msg_id = self._msg_id(req)
        if msg_id in self.workers:
            raise BadRequest(f"message {msg_id} is running: destroy it instead")
        self._delete(msg_id, self.store.find(msg_id))
        return {"ok": True}

    def _delete(self, msg_id: str, state: str) -> None:
        self.store.delete(msg_id, state)
        self.schedule.remove(msg_id)
        if state not in ("que", "run"):
            self.counts[state] -= 1
        self.log.event("deleted", f"deleted from {state}", msg_id)

    def op_destroy(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Delete a message; a running one has its whole process group killed first."""
        msg_id = self._msg_id(req)
        worker = self.workers.get(msg_id)
        if worker is None:
            self._delete(msg_id, self.store.find(msg_id))
            return {"ok": True}
        worker.stop_reason = "destroy"
        worker.child.signal_group(signal.SIGKILL)
        return {"ok": True, "killed": True}

    def op_clone(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> None:
        msg_id = self._msg_id(req)
        self._check_accepting()
        state = self._state_of(msg_id)
        source = self.workers[msg_id].msg if state == "run" else self.store.read_msg(state, msg_id)
        msg = self._copy_fields(source, self.name, self._url(msg_id))
        staged = self.store.stage(msg)
        self.store.link_attachments(state, msg_id, staged)
        self.pending.append((conn, staged, "que"))

    @staticmethod
    def _copy_fields(source: dict[str, Any], dest: str, orig_url: str) -> dict[str, Any]:
        keep = ("src", "param1", "param2", "param3", "param4", "max_count",
                "force_remote", "post_run_webhook", "relay_via")  # relay_via: loop detection
        msg = {k: source[k] for k in keep if k in source}
        msg.update(dest=dest, count=0, due=0, orig_msg_id=source.get("orig_msg_id") or orig_url)
        return msg

    def op_run_now(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        msg_id = self._msg_id(req)
        msg = self.schedule.msgs.get(msg_id)
        if msg is None:
            raise BadRequest(f"message {msg_id} is not queued")
        msg = dict(msg, due=0)
        self.store.write_msg("que", msg_id, msg)
        self.schedule.add(msg_id, msg)
        return {"ok": True}

    def op_list(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        state = req.get("state", "que")
        offset, limit = int(req.get("offset", 0)), min(int(req.get("limit", 50)), MAX_LIST)
        if state not in STATES or offset < 0 or limit < 0:
            raise BadRequest("list needs a state and a non-negative offset and limit")
        if state == "que":
            ids = self.schedule.ordered_ids()[offset:offset + limit]
        elif state == "run":
            ids = sorted(self.workers)[offset:offset + limit]
        else:
            ids = self.store.newest(state, offset, limit)
        return {"ok": True, "ids": ids, "total": self._count(state)}

    def _count(self, state: str) -> int:
        if state == "que":
            return len(self.schedule)
        if state == "run":
            return len(self.workers)
        return self.counts[state]

    def op_counts(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        return {"ok": True, "counts": {s: self._count(s) for s in STATES}, "admin": self.admin,
                "num_workers": self.config["num_workers"], "status": self.status_line()}

    def op_config(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        return {"ok": True, "config": self.config, "admin": self.admin}

    def op_adminoper(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        oper = str(req.get("oper", ""))
        if oper not in ADMIN_OPERS:
            raise BadRequest(f"unknown admin operation {oper[:20]!r} (up, down, pause, resume)")
        self.store.set_admin_state(ADMIN_OPERS[oper])
        self.admin = ADMIN_OPERS[oper]
        self.log.event("daemon", f"admin state {self.admin}")
        return {"ok": True, "admin": self.admin}

    def op_reload(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        self.reload()
        return {"ok": True}

    def op_prune(self, conn: Connection, req: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """The cleaner's request: drop done/relayed older than ``days``, acknowledged
        errs, and, given ``prep_days``, prep messages untouched that long."""
        days = _days(req.get("days", 3), "days")
        now = time.time()
        removed = {state: self.store.prune(state, now - days * 86400)
                   for state in ("done", "relayed")}
        removed["err"] = self.store.prune_acked("err")
        if req.get("prep_days") is not None:
            prep_days = _days(req["prep_days"], "prep_days")
            removed["prep"] = self.store.prune_untouched("prep", now - prep_days * 86400)
        for state, count in removed.items():
            self.counts[state] -= count
        self.log.event("deleted", f"pruned {removed} (older than {days:g} days)")
        return {"ok": True, "removed": removed}

    # ------------------------------------------------------------ running
    def _can_start(self) -> bool:
        return (self.admin == "UP" and self.stopping_until is None
                and len(self.workers) < self.config["num_workers"] and self._script_ready())

    def _busy_keys(self) -> set[tuple[str, ...]]:
        keys = (param_key(w.msg, self.schedule.blocking) for w in self.workers.values())
        return {k for k in keys if k is not None}

    def _start_due(self) -> None:
        now = time.time()
        busy = self._busy_keys()
        while self._can_start():
            picked = self.schedule.pop_ready(now, busy)
            if picked is None:
                return
            self._start(*picked)
            key = param_key(picked[1], self.schedule.blocking)
            if key is not None:
                busy.add(key)

    def _start(self, msg_id: str, msg: dict[str, Any]) -> None:
        try:
            path, argv = script_argv(self.config["script"], self.config["exec_prefix"])
        except SpawnError as exc:
            self.schedule.add(msg_id, msg)
            self._set_script_error(str(exc))
            return
        queued, msg = msg, dict(msg, count=int(msg.get("count", 0)) + 1)
        self.store.move(msg_id, "que", "run")  # the new count is written when it ends
        job = self.store.job_dir(msg_id)
        out = self.output.open(f"{job}/stdio.log", msg_id, msg["count"])
        try:
            child = spawn(argv, path, self._script_env(msg_id, msg, argv[-1], job), job, out)
        except SpawnError as exc:
            self._back_to_que(msg_id, queued, f"SCRIPTERROR: {exc}")
            self._set_script_error(str(exc))
            return
        finally:
            os.close(out)
        worker = Worker(msg_id, msg, child)
        worker.dups = self._coalesce(msg_id, msg)
        self.workers[msg_id] = worker
        self.selector.register(child.status_r, selectors.EVENT_READ, self._on_status)
        self.selector.register(child.pidfd, selectors.EVENT_READ, self._on_exit)
        self._fd_worker[child.status_r] = self._fd_worker[child.pidfd] = worker
        self.log.event("started", f"pid {child.pid}, count {msg['count']}", msg_id,
                       RQ_COUNT=msg["count"])

    def _script_ready(self) -> bool:
        """False while the script is missing or not executable (SCRIPTERROR)."""
        if not self.script_error:
            return True
        if time.monotonic() < self._script_check_at:
            return False
        try:
            script_argv(self.config["script"], self.config["exec_prefix"])
        except SpawnError as exc:
            return self._set_script_error(str(exc))
        self.log.event("daemon", "script is executable again; SCRIPTERROR cleared")
        self.script_error = ""
        return True

    def _set_script_error(self, why: str) -> bool:
        if not self.script_error:
            self.log.event("err", f"SCRIPTERROR: {why}; messages stay queued")
        self.script_error = why
        self._script_check_at = time.monotonic() + SCRIPT_RECHECK
        return False

    def _back_to_que(self, msg_id: str, msg: dict[str, Any], why: str) -> None:
        self.store.write_status("run", msg_id, why)
        self.store.move(msg_id, "run", "que")
        self.schedule.add(msg_id, msg)

    def _coalesce(self, msg_id: str, msg: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        dups = self.schedule.take_coalesced(msg, time.time())
        for dup_id, _dup in dups:
            self.store.move(dup_id, "que", "run")
            self.store.write_status("run", dup_id, f"coalesced with {msg_id}")
        return dups

    def _queue_env(self) -> dict[str, str]:
        """The part of a script's environment that is the same for every run."""
        if self._env_cache is None:
            base = config.base_url(self.sysconfig)
            self._env_cache = {**child_environ(), **self.config["env_vars"],
                               "RQ_SCRIPT": self.config["script"], "RQ_HOST": base,
                               "RQ_DEST": f"{base}q/{self.name}/", "RQ_DEST_QUEUE": self.name,
                               "RQ_WRITE": "3", "RQ_READ": "4",
                               "RQ_PORT": str(self.sysconfig["port"]),
                               "RQ_ENV": str(self.sysconfig["env"]), "RQ_VER": _version()}
        return self._env_cache

    def _script_env(self, msg_id: str, msg: dict[str, Any], real: str, job: str) -> dict[str, str]:
        """The environment of one run; ``real`` is the resolved script path."""
        env = dict(self._queue_env())
        env.update({
            "RQ_REALSCRIPT": real,
            "RQ_MSG_ID": msg_id, "RQ_FULL_MSG_ID": self._url(msg_id), "RQ_MSG_DIR": job,
            "RQ_COUNT": str(msg["count"]),
            "RQ_FORCE_REMOTE": "1" if msg.get("force_remote") else "0",
            "RQ_ORIG_MSG_ID": str(msg.get("orig_msg_id", "")),
        })
        for n in range(1, 5):
            env[f"RQ_PARAM{n}"] = str(msg.get(f"param{n}", ""))
        return env

    def _on_status(self, key: Any, _mask: int) -> None:
        worker = self._fd_worker.get(key.fd)
        if worker is None:
            return  # its exit was handled earlier in this same select() batch
        lines, eof = worker.read_lines()
        for item in lines:
            self._apply(worker, item)
        if eof:
            self._unwatch(key.fd)

    def _unwatch(self, fd: int) -> None:
        if fd in self._fd_worker:
            self.selector.unregister(fd)
            del self._fd_worker[fd]

    def _apply(self, worker: Worker, item: Command | ProtocolError) -> None:
        if isinstance(item, ProtocolError):
            self.log.warn(f"bad status line ignored: {item}", worker.msg_id)
            return
        if item.kind == "dup":
            self._answer_dup(worker, item)
            return
        worker.status = item.text
        if item.terminal:
            worker.terminal = item
        self.store.write_status("run", worker.msg_id, item.text)

    def _answer_dup(self, worker: Worker, cmd: Command) -> None:
        try:
            url = self._dup(worker, cmd)
            answer = f"ok {url}\n"
        except RQError as exc:
            answer = f"fail {str(exc).splitlines()[0] if str(exc) else 'error'}\n"
        try:
            os.write(worker.child.reply_w, answer.encode())
        except OSError:
            self.log.warn("script does not read fd 4; dup answer dropped", worker.msg_id)

    def _dup(self, worker: Worker, cmd: Command) -> str:
        """Copy the running message (attachments hard-linked) to cmd.dest."""
        target = route(cmd.dest, self.sysconfig, bool(worker.msg.get("force_remote")))
        msg = self._copy_fields(worker.msg, cmd.dest, self._url(worker.msg_id))
        if cmd.due:
            msg["due"] = time.time() + cmd.due
        if target == self.name:
            self._check_accepting(strict=True)
            staged = self.store.stage(msg)
            self.store.link_attachments("run", worker.msg_id, staged)
            self.store.publish([staged])
            self._place([staged], "que")
            return self._url(staged.msg_id)
        return self._dup_elsewhere(worker, msg, target)

    def _dup_elsewhere(self, worker: Worker, msg: dict[str, Any], target: str) -> str:
        files = self.store.attachments("run", worker.msg_id)
        fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in files]
        specs = [{"name": p.name, "md5": self.store.attachment_md5(p)} for p in files]
        try:
            with QueueClient(self.layout, target, timeout=DUP_TIMEOUT) as client:
                reply = client.call("create", fds=fds, msg=msg, attachments=specs,
                                    refuse_paused=True)
        finally:
            for fd in fds:
                os.close(fd)
        return str(reply["url"])

    def _on_exit(self, key: Any, _mask: int) -> None:
        worker = self._fd_worker[key.fd]
        pid, wait_status = os.waitpid(worker.child.pid, os.WNOHANG)
        if pid == 0:
            return
        lines, _eof = worker.read_lines()
        for item in lines:
            self._apply(worker, item)
        self._unwatch(worker.child.status_r)
        self._unwatch(worker.child.pidfd)
        worker.child.signal_group(signal.SIGTERM)  # background children left behind
        worker.child.close()
        del self.workers[worker.msg_id]
        self._finish(worker, worker.verdict(wait_status, int(worker.msg.get("max_count", 15))))

    def _finish(self, worker: Worker, outcome: Outcome) -> None:
        self.schedule.release(param_key(worker.msg, self.schedule.blocking))
        self._settle(worker.msg_id, worker.msg, outcome, worker.status)
        for dup_id, dup in worker.dups:
            text = f"coalesced with {worker.msg_id}: {outcome.text}"
            self._settle(dup_id, dup, Outcome(outcome.state, text, outcome.delay)
                         if outcome.state != "deleted" else Outcome("que", "requeued"))

    def _settle(self, msg_id: str, msg: dict[str, Any], outcome: Outcome,
                written: str | None = None) -> None:
        if outcome.state == "deleted":
            self.store.delete(msg_id, "run")
            self.log.event("deleted", "destroyed while running", msg_id)
            return
        if outcome.text != written:
            self.store.write_status("run", msg_id, outcome.text)
        if outcome.state == "que":
            msg = dict(msg, due=time.time() + outcome.delay if outcome.delay else 0)
            self.store.write_msg("run", msg_id, msg)
            self.store.move(msg_id, "run", "que")
            self.schedule.add(msg_id, msg)
            self.log.event("resend", outcome.text, msg_id, RQ_COUNT=msg.get("count", 0))
            return
        self.store.write_count("run", msg_id, int(msg.get("count", 0)))
        self.store.move(msg_id, "run", outcome.state)
        self.counts[outcome.state] += 1
        self.log.event(outcome.state, outcome.text, msg_id, RQ_COUNT=msg.get("count", 0))
        if msg.get("post_run_webhook"):
            self._notify_webhook(msg_id, msg, outcome)

    def _notify_webhook(self, msg_id: str, msg: dict[str, Any], outcome: Outcome) -> None:
        """Queue the post_run_webhook call; a missing webhook queue is only logged."""
        if self.name == WEBHOOK_QUEUE:
            self.log.warn("post_run_webhook ignored on the webhook queue itself", msg_id)
            return
        note = webhook_message(self._url(msg_id), outcome.state, outcome.text, msg)
        try:
            with QueueClient(self.layout, WEBHOOK_QUEUE, timeout=WEBHOOK_TIMEOUT) as client:
                client.call("create", msg=note)
        except RQError as exc:
            self.log.event("err", f"webhook not queued: {exc}", msg_id)


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _days(value: Any, what: str) -> float:
    days = float(value)
    if not days >= 0:
        raise BadRequest(f"prune needs {what} >= 0")
    return days


def _check_md5(md5: Any) -> str:
    if not isinstance(md5, str) or len(md5) != 32 or not all(c in "0123456789abcdef" for c in md5):
        raise BadRequest("an attachment needs its md5 (32 lowercase hex digits)")
    return md5


def _version() -> str:
    from rqsys import __version__

    return __version__


def main(layout: Layout, name: str) -> int:
    """``rqsys queue NAME``: run one queue daemon until stopped (or idle)."""
    sockets = listen_sockets()
    listener = next(iter(sockets.values()), None)
    daemon = QueueDaemon(layout, name, listener)
    return daemon.run()
