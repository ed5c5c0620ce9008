"""Names on disk: states, ids, name validators, markers, and ``Layout`` (paths under the root).

A message is a directory ``queue/<q>/<state>/<id>/`` holding ``msg`` (JSON),
``status``, ``job/`` and ``attach/``; its state is the directory it sits in.
``done/`` and ``relayed/`` grow without bound, so they are sharded by the
hour in the id (``done/YYYYmmdd.HH/<id>``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rqsys.errors import BadRequest
from rqsys.store import durable

STATES = ("prep", "que", "run", "done", "err", "relayed")
SHARDED_STATES = ("done", "relayed")  # sharded by the hour: they grow without bound
ENDED_STATES = ("done", "err", "relayed")  # a message there will not run again
ADMIN_STATES = ("UP", "PAUSE", "DOWN")
# RQ's admin operations (adminoper, the web form's field names) and the state each sets.
ADMIN_OPERS = {"up": "UP", "down": "DOWN", "pause": "PAUSE", "resume": "UP"}
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MSG_ID_RE = re.compile(r"^\d{8}\.\d{4}\.\d{2}\.\d{3}(\.\d{1,9})?$")
ATTACH_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}$")
DEFAULT_ROOT = "/var/lib/rq"
SYSTEMD_SOCKET_DIR = "/run/rq"
TMP_DIR = ".tmp"  # a queue's temp directories: new messages, uploads, spares
SET_ASIDE_DIR = ".set-aside"  # what recovery found in a state that is no message directory
SPARE_PREFIX = "spare."  # names of spare directories in .tmp/
QUE_SNAPSHOT = "que.snapshot"  # que/ in one file, left by a clean stop
DISABLED_MARK = "disabled"  # queue being taken out of service (rq-scan)
SCANDIR_MARK = ".scandir"  # the scandir entry a queue was installed from
CREATED_BY = "created_by"  # msg field: who made it (its timeline's first event says so)
LAST_LINES = "lastlines"  # in a message's directory: a failed run's last lines (observe.lastlines)


def check_queue_name(name: str) -> str:
    """Return ``name`` if it is a valid queue name, else raise BadRequest."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
        raise BadRequest(f"invalid queue name: {name!r}")
    return name


def check_msg_id(msg_id: str) -> str:
    """Return ``msg_id`` if it has RQ's id form, else raise BadRequest."""
    if not isinstance(msg_id, str) or not MSG_ID_RE.match(msg_id):
        raise BadRequest(f"invalid message id: {msg_id!r}")
    return msg_id


def arrival(msg_id: str) -> int:
    """A key ordering ids as they were made: the time stamp, then the counter as
    a number (``….000.2`` before ``….000.10``, which a string sort puts first);
    one int, small in a heap entry.  -1 for a name not of RQ's id form."""
    if not MSG_ID_RE.match(msg_id):
        return -1
    counter = msg_id[21:]
    stamp = msg_id[0:8] + msg_id[9:13] + msg_id[14:16] + msg_id[17:20]  # YYYYMMDD.HHMM.SS.mmm
    return int(stamp) * 10**10 + (int(counter) + 1 if counter else 0)


def check_attach_name(name: Any) -> str:
    """Return ``name`` if it is a safe attachment file name."""
    if not isinstance(name, str) or not ATTACH_NAME_RE.match(name) or ".." in name:
        raise BadRequest(f"invalid attachment name: {name!r}")
    return name


class IdMaker:
    """Makes RQ-style ids ``YYYYmmdd.HHMM.SS.mmm.<n>`` (UTC), strictly increasing."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._last_ms = 0
        self._n = 0
        self._stamp = (-1, "")  # (second, its text): a busy queue makes many ids a second

    def next_id(self) -> str:
        """The next id: now, or one more than the last in the same millisecond."""
        now_ms = int(self._clock() * 1000)
        if now_ms > self._last_ms:
            self._last_ms, self._n = now_ms, 0
        else:
            self._n += 1  # same millisecond, or the clock went back
        secs, ms = divmod(self._last_ms, 1000)
        if self._stamp[0] != secs:
            self._stamp = (secs, time.strftime("%Y%m%d.%H%M.%S", time.gmtime(secs)))
        return f"{self._stamp[1]}.{ms:03d}.{self._n}"


@dataclass(frozen=True)
class Layout:
    """Paths under the state root (``/var/lib/rq`` or ``--root``)."""

    root: Path
    socket_dir: Path

    @classmethod
    def from_root(cls, root: str | os.PathLike[str] | None = None) -> Layout:
        """The layout of ``root``, else $RQ_ROOT, else /var/lib/rq (sockets in
        $RQ_SOCKET_DIR, else /run/rq for the system root, else ``<root>/sock``)."""
        base = Path(root or os.environ.get("RQ_ROOT") or DEFAULT_ROOT).absolute()
        sock = os.environ.get("RQ_SOCKET_DIR")
        if not sock:
            sock = SYSTEMD_SOCKET_DIR if str(base) == DEFAULT_ROOT else str(base / "sock")
        return cls(base, Path(sock))

    @property
    def config_file(self) -> Path:
        return self.root / "config" / "config.json"

    @property
    def scandir(self) -> Path:
        return self.root / "scandir"

    @property
    def watched_note(self) -> Path:
        """Where ``rqsys scan`` notes the scandir it watches (its ``--scandir``)."""
        return self.root / "scandir.watched"

    def watched_scandir(self) -> Path:
        """The scandir ``rqsys scan`` watches, as it noted at its start; else
        the root's ``scandir/`` (no scan has run, or the note is unreadable)."""
        try:
            noted = self.watched_note.read_text()
        except (OSError, UnicodeDecodeError):
            return self.scandir
        return Path(noted[:-1]) if noted.endswith("\n") and noted.startswith("/") else self.scandir

    @property
    def timers(self) -> Path:
        return self.root / "timers"

    @property
    def trash(self) -> Path:
        return self.root / "trash"

    @property
    def queues(self) -> Path:
        return self.root / "queue"

    @property
    def batches(self) -> Path:
        """One directory per batch (``rqsys.batches.record``)."""
        return self.root / "batches"

    @property
    def audit_dir(self) -> Path:
        """The audit trail: one file per writer (``rqsys.observe.audit``)."""
        return self.root / "audit"

    def make_batch_dir(self, batch_id: str) -> Path:
        """``batches/<id>/``, owned as ``queue/`` is, and writable by its group
        (each member queue's daemon writes its ends there, as group rq when
        the queue runs as a user of its own: ``rqsys.run.unituser``)."""
        path = self.batches / batch_id
        path.mkdir(parents=True)
        path.chmod(0o2770)  # whatever the umask
        self._adopt(self.batches, path)
        return path

    def queue_dir(self, name: str) -> Path:
        return self.queues / check_queue_name(name)

    def socket_path(self, name: str) -> Path:
        return self.socket_dir / f"{check_queue_name(name)}.sock"

    @property
    def timer_state(self) -> Path:
        """rq-scan's record of each timer's last firing (survives restarts)."""
        return self.root / "timer-state.json"

    def queue_names(self) -> list[str]:
        """Names of the queues in service (have a config.json, not disabled)."""
        if not self.queues.is_dir():
            return []
        return sorted(
            p.name
            for p in self.queues.iterdir()
            if QUEUE_NAME_RE.match(p.name) and (p / "config.json").is_file()
            and not (p / DISABLED_MARK).exists()
        )

    def mark_queue(self, name: str, mark: str, text: str) -> None:
        """Write a marker file (DISABLED_MARK, SCANDIR_MARK) into a queue's directory."""
        durable.write_file_durably(self.queue_dir(name) / mark, text.encode())
        self._adopt(self.queue_dir(name) / mark, like=self.queue_dir(name))

    def _adopt(self, *paths: Path, like: Path | None = None) -> None:
        """Give paths root made to the owner of ``queue/`` (user rq under systemd),
        or of ``like`` (a queue's directory) once that is not root's: a queue
        handed to its own user (``rqsys.run.unituser``) keeps it.

        rq-scan runs as root (it enables units); the queue daemons run as the
        unprivileged owner of their directory and must own what rq-scan creates.
        """
        if os.geteuid() != 0:
            return
        owner = os.stat(self.queues)
        if owner.st_uid == 0:
            return  # embedded mode as root: root's daemons own it all
        if like is not None and (mine := os.stat(like)).st_uid != 0:
            owner = mine
        for path in paths:
            os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)

    def make_dirs(self) -> None:
        """Make the root's top-level directories (those missing)."""
        for path in (self.root, self.config_file.parent, self.scandir, self.timers,
                     self.trash, self.queues):
            path.mkdir(parents=True, exist_ok=True)

    def create_queue_dir(self, name: str, config: dict[str, Any]) -> Path:
        """Create (or update) a queue's directory and its effective config."""
        qdir = self.queue_dir(name)
        for state in STATES:
            (qdir / state).mkdir(parents=True, exist_ok=True)
        (qdir / TMP_DIR).mkdir(exist_ok=True)
        durable.write_file_durably(qdir / "config.json", json.dumps(config, indent=2).encode())
        self._adopt(qdir, qdir / TMP_DIR, qdir / "config.json", *(qdir / st for st in STATES),
                    like=qdir)
        return qdir

    def link_form(self, name: str, form: Path | None) -> None:
        """Point ``queue/<q>/form.json`` at ``form`` (or remove the link)."""
        link = self.queue_dir(name) / "form.json"
        tmp = link.with_name(".form.json.tmp")
        if tmp.is_symlink():
            tmp.unlink()
        if form is None:
            if link.is_symlink():
                link.unlink()
            return
        os.symlink(form, tmp)
        self._adopt(tmp, like=self.queue_dir(name))
        durable.replace(tmp, link, sync=False)

    def trash_queue(self, name: str) -> Path:
        """Move a queue's whole directory to ``trash/`` (nothing is deleted)."""
        src = self.queue_dir(name)
        dest = self.trash / f"{name}.{time.strftime('%Y%m%d.%H%M%S')}.{os.getpid()}"
        self.trash.mkdir(parents=True, exist_ok=True)
        durable.rename_durably(src, dest)
        return dest
