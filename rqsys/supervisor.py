"""Embedded mode (``rqsys serve``): one process that plays systemd's part.

It binds the queue sockets (and the web port), starts the same programs
systemd would with the same ``LISTEN_FDS`` hand-over, restarts a crashed
child with back-off, restarts an idle-exited queue daemon when its socket
is readable (socket activation), rescans ``queue/`` on SIGHUP (rq-scan sends
it after creating or trashing a queue) and forwards TERM on shutdown.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqsys import config, tunables
from rqsys.errors import RQError
from rqsys.observe.events import EventLog
from rqsys.scan.scandir import reconcile
from rqsys.signals import SignalFlags
from rqsys.special import install_special_queues
from rqsys.store import Layout
from rqsys.systemd import child_environ
from rqsys.unixsock import listen_unix
from rqsys.web import listen


class CannotListen(RQError):
    """A socket the supervisor serves could not be bound (port taken, no right, ...)."""


@dataclass
class Program:
    """A supervised child: what to run, its listening socket, its state."""

    name: str
    argv: list[str]
    sock: socket.socket | None = None
    path: Path | None = None  # a unix socket's file, removed with the program
    fdname: str = ""
    pid: int = 0
    pidfd: int = -1
    started: float = 0.0
    backoff: float = tunables.BACKOFF_START
    restart_at: float | None = None
    waiting_for_socket: bool = False
    removed: bool = False
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class WebOptions:
    """Where the web listens (None: config.json's addr and port) and the allow flag."""

    addr: str | None = None
    port: int | None = None
    allow_unauthenticated: bool = False


class Supervisor:
    def __init__(self, layout: Layout, scandir: Path, web: WebOptions | None = None) -> None:
        self.layout, self.scandir = layout, scandir
        self.web = web or WebOptions()
        self.log = EventLog("rqsys")
        self.selector = selectors.DefaultSelector()
        self.programs: dict[str, Program] = {}
        self.stop_deadline: float | None = None

    # ---------------------------------------------------------------- set-up
    def start(self) -> None:
        extra = self._extra_programs()  # the web port first: if it is taken, nothing changed
        self.layout.make_dirs()
        self.layout.socket_dir.mkdir(parents=True, exist_ok=True)
        reconcile(self.layout, self.scandir, self.log)
        for name in install_special_queues(self.layout):
            self.log.event("daemon", f"created the built-in {name} queue")
        self._install_signals()
        for program in extra:
            self._add(program)
        self._relay_worker()
        self._sync_queues()

    def _install_signals(self) -> None:
        self.signals = SignalFlags()
        self.selector.register(self.signals, selectors.EVENT_READ, self.signals.drain)

    def _base_argv(self) -> list[str]:
        return [sys.executable, "-m", "rqsys", "--root", str(self.layout.root)]

    def _extra_programs(self) -> list[Program]:
        """The web front end and rq-scan, as systemd would run them."""
        programs = []
        web = _web_socket(self.layout, self.web)
        flag = [listen.ALLOW_FLAG] if self.web.allow_unauthenticated else []
        programs.append(Program("web", [*self._base_argv(), "web", *flag], web, fdname="web"))
        programs.append(Program("scan", [*self._base_argv(), "scan", "--scandir",
                                         str(self.scandir)]))
        return programs

    def _relay_worker(self) -> None:
        """The relay worker, started on its socket's first connection (rqrelay's)."""
        path = relay_socket(self.layout)
        argv = [sys.executable, "-m", "rqsys.scripts.relayworker"]
        program = Program("relay-worker", argv, _unix_socket(path), path, "relay-worker")
        self.programs[program.name] = program
        self._watch_socket(program)

    def _sync_queues(self, lazy: bool = False) -> None:
        """Start a daemon for every queue in queue/, stop those trashed.

        ``lazy`` (on SIGHUP: queues rq-scan just created, still empty) only
        binds the socket and starts the daemon on its first connection, as
        ``systemctl enable --now rq@q.socket`` does.
        """
        wanted = set(self.layout.queue_names())
        for name in sorted(wanted - {n[2:] for n in self.programs if n.startswith("q:")}):
            path = self.layout.socket_path(name)
            program = Program(f"q:{name}", [*self._base_argv(), "queue", name],
                              _unix_socket(path), path, f"{name}.sock")
            if lazy:
                self.programs[program.name] = program
                self._watch_socket(program)
            else:
                self._add(program)
        for key, program in list(self.programs.items()):
            if key.startswith("q:") and key[2:] not in wanted and not program.removed:
                self._remove(program)

    def _add(self, program: Program) -> None:
        self.programs[program.name] = program
        self._spawn(program)

    def _remove(self, program: Program) -> None:
        program.removed = True
        if program.pid:
            _kill(program.pid, signal.SIGTERM)
        else:
            self._forget(program)

    def _forget(self, program: Program) -> None:
        self.programs.pop(program.name, None)
        if program.sock is not None:
            self._unwatch_socket(program)
            program.sock.close()
        if program.path is not None:
            program.path.unlink(missing_ok=True)

    # ---------------------------------------------------------------- children
    def _spawn(self, program: Program) -> None:
        # the children's systemd is this process: nothing of an outer one's hand-over
        env = dict(child_environ(), RQ_SUPERVISOR_PID=str(os.getpid()),
                   RQ_RELAY_SOCKET=str(relay_socket(self.layout)), **program.env)
        pid = os.fork()
        if pid == 0:
            _exec_child(program, env)  # never returns
        program.pid, program.started = pid, time.monotonic()
        program.pidfd = os.pidfd_open(pid)
        program.restart_at = None
        self.selector.register(program.pidfd, selectors.EVENT_READ, self._reap)

    def _reap(self, program_key: Any) -> None:
        program = next(p for p in self.programs.values() if p.pidfd == program_key.fd)
        _, status = os.waitpid(program.pid, 0)
        self.selector.unregister(program.pidfd)
        os.close(program.pidfd)
        program.pid, program.pidfd = 0, -1
        if program.removed or self.stop_deadline is not None:
            self._forget(program) if program.removed else None
            return
        code = os.waitstatus_to_exitcode(status)
        if code == 0 and program.sock is not None and program.name.startswith("q:"):
            self._watch_socket(program)  # idle exit: start again on the next connection
            return
        self._schedule_restart(program, code)

    def _schedule_restart(self, program: Program, code: int) -> None:
        if time.monotonic() - program.started > tunables.STABLE_AFTER:
            program.backoff = tunables.BACKOFF_START
        program.restart_at = time.monotonic() + program.backoff
        self.log.event("err", f"{program.name} exited ({code}); restart in {program.backoff:.1f}s")
        program.backoff = min(program.backoff * 2, tunables.BACKOFF_MAX)

    def _watch_socket(self, program: Program) -> None:
        assert program.sock is not None
        program.waiting_for_socket = True
        self.selector.register(program.sock, selectors.EVENT_READ, self._activate)

    def _unwatch_socket(self, program: Program) -> None:
        if program.waiting_for_socket and program.sock is not None:
            self.selector.unregister(program.sock)
            program.waiting_for_socket = False

    def _activate(self, key: Any) -> None:
        program = next(p for p in self.programs.values() if p.sock is key.fileobj)
        self._unwatch_socket(program)
        self._spawn(program)

    # ---------------------------------------------------------------- the loop
    def run(self) -> int:
        self.start()
        while self.programs or self.stop_deadline is None:
            for key, _mask in self.selector.select(self._timeout()):
                key.data(key)
            self._handle_flags()
            self._restart_due()
            if self.stop_deadline is not None and not any(p.pid for p in self.programs.values()):
                break
        return 0

    def _timeout(self) -> float:
        times = [p.restart_at for p in self.programs.values() if p.restart_at is not None]
        if self.stop_deadline is not None:
            times.append(self.stop_deadline)
        return max(0.0, min(times) - time.monotonic()) if times else 60.0

    def _handle_flags(self) -> None:
        flags = self.signals.take()
        if signal.SIGHUP in flags and self.stop_deadline is None:
            self._sync_queues(lazy=True)
        if flags & {signal.SIGTERM, signal.SIGINT} and self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + tunables.STOP_TIMEOUT
            for program in self.programs.values():
                if program.pid:
                    _kill(program.pid, signal.SIGTERM)
        if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
            for program in self.programs.values():
                if program.pid:
                    _kill(program.pid, signal.SIGKILL)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for program in list(self.programs.values()):
            if program.restart_at is not None and program.restart_at <= now and not program.pid:
                self._spawn(program)


def _exec_child(program: Program, env: dict[str, str]) -> None:
    """In the forked child: hand over the socket as fd 3 and exec."""
    try:
        from rqsys._native._rqspawn import lib  # type: ignore[import-not-found]

        lib.rq_set_pdeathsig(signal.SIGTERM)
        signal.set_wakeup_fd(-1)
        if program.sock is not None:
            os.dup2(program.sock.fileno(), 3)
            env.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES=program.fdname)
        os.execve(program.argv[0], program.argv, env)
    finally:
        os._exit(127)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def relay_socket(layout: Layout) -> Path:
    """The relay worker's socket (a name no queue's socket can have)."""
    return layout.socket_dir / ".relay-worker.sock"


def _unix_socket(path: Path) -> socket.socket:
    """A queue's socket, on disk only once it listens (a stale file is replaced)."""
    try:
        return listen_unix(path)
    except OSError as exc:
        raise CannotListen(f"cannot listen on {path}: {_reason(exc)}") from exc


def _web_socket(layout: Layout, web: WebOptions) -> socket.socket:
    """The web's listening socket, refused on an open address without a password."""
    cfg = config.load_system_config(layout)
    addr = web.addr if web.addr is not None else str(cfg["addr"])
    port = web.port if web.port is not None else int(cfg["port"])
    listen.check_exposure(addr, cfg, web.allow_unauthenticated)  # the web child warns
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        where = listen.format_address(addr, port)
        raise CannotListen(f"cannot listen on {where}: {_reason(exc)}") from exc
    return sock


def _reason(exc: OSError) -> str:
    """The OS's reason (say "address already in use"), to end a sentence with."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def default_scandir(layout: Layout) -> Path:
    """scandir-examples/ of a source checkout, else ``<root>/scandir``."""
    examples = Path(__file__).resolve().parent.parent / "scandir-examples"
    return examples if examples.is_dir() else layout.scandir


def main(layout: Layout, scandir: Path | None, web: WebOptions) -> int:
    if web.port is not None:
        os.environ["RQ_WEB_PORT"] = str(web.port)  # children build URLs with it
    return Supervisor(layout, scandir or default_scandir(layout), web).run()
