"""On-disk layout, message ids and atomic state transitions.

This is the only module that renames or fsyncs.  A message is a directory
``queue/<q>/<state>/<id>/`` holding ``msg`` (JSON), ``status``, ``job/`` and
``attach/``; its state is the directory it sits in, and every state change is
one ``rename(2)`` of that directory.  ``done/`` and ``relayed/`` grow without
bound, so they are sharded by the hour in the id (``done/YYYYmmdd.HH/<id>``)
and counted from directory link counts, never by walking them per request.

Durability: what is on disk before anything is acknowledged, and what is
batched.  A crash may at worst re-run a message; it never loses one.

=============================  ==================================  ===========================
transition                     on disk when                        after a crash before that
=============================  ==================================  ===========================
create in que, local dup       before ``ok``: msg written into a   no ``ok`` was sent: removed
                               spare directory (already durable)   at start (unless its msg is
                               and synced; then moved into que/    complete: then, as after
                               (batched)                           ``ok``, moved into place)
create in prep, or without a   before ``ok``: msg written in        as above
ready spare                    a new ``.tmp/<id>.<state>/`` and
                               fsynced; then moved (batched)
create (several in one loop    before ``ok``: the same with one     as above
turn: group commit)            syncfs for all
commit, attach, clone, delete  before ``ok`` (fsync file + dirs)    as above
admin state, msg rewritten on  before ``ok`` / before the move      old admin state / old due
resend or run_now
que -> run, run -> done / err  renamed at once; parents fsynced     found in its earlier dir:
/ relayed / que, ``status``    at most every FLUSH_INTERVAL and     run/ goes back to que/ at
and ``count`` files            at exit (:meth:`QueueStore.flush`)   start; a lost ``done`` means
                                                                    one more run
=============================  ==================================  ===========================

A clean stop with many queued messages writes them all to ``que.snapshot``
(durably); the next start uses it only if its ids are exactly those in
``que/``, and removes it durably before anything else happens.

Why one sync of ``msg`` makes a new message durable: its temp directory's
entry must be on disk too.  A spare's entry was made durable when the spare
was made, off the create's path (:class:`SpareMaker` fsyncs its new blank
msg); a new ``.tmp/<id>.<state>/`` gets it from the fsync of its new msg.
Both rely on the file system making a new file's new directory durable with
it: on journalling ext4 and xfs, fsync commits the transaction that created
the directory; ext4 without a journal syncs a new file's newly made parent
directories on fsync (``ext4_sync_parent``).

New messages for que/ take *spare* directories made ahead of time in
``.tmp/`` by a thread of the daemon (holding a blank ``msg``, ``status`` and
``job/stdio.log``; see :class:`SpareMaker`), so neither a create nor a run
waits for an inode to be made.

Recovery at start (:meth:`QueueStore.recover`): a temp directory with a
readable msg (``.tmp/<id>.<state>``, or a spare: que) is moved into place,
everything else in ``.tmp/`` is removed, ``run/`` goes back to ``que/``,
``prep/`` is kept.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import itertools
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rqsys.errors import BadRequest, NotFound, StoreError

STATES = ("prep", "que", "run", "done", "err", "relayed")
SHARDED_STATES = ("done", "relayed")
ENDED_STATES = ("done", "err", "relayed")
ADMIN_STATES = ("UP", "PAUSE", "DOWN")
QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
MSG_ID_RE = re.compile(r"^\d{8}\.\d{4}\.\d{2}\.\d{3}(\.\d{1,9})?$")
ATTACH_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]{0,199}$")
DEFAULT_ROOT = "/var/lib/rq"
SYSTEMD_SOCKET_DIR = "/run/rq"
TMP_DIR = ".tmp"
FLUSH_INTERVAL = 0.5  # seconds between fsyncs of batched transitions
SPARE_DIRS = 16  # message directories kept ready for new messages (see SpareMaker)
SPARE_PREFIX = "spare."  # names of spare directories in .tmp/
MSG_BLANK = 1024  # bytes of spaces in a spare's msg (see _write_msg)
SPARE_BATCH = 8  # spares made and synced together (see SpareMaker)
SPARE_RETRY = 1.0  # seconds before making spares again after a failure
QUE_SNAPSHOT = "que.snapshot"  # que/ in one file, left by a clean stop
DISABLED_MARK = "disabled"  # queue being taken out of service (rq-scan)
SCANDIR_MARK = ".scandir"  # the scandir entry a queue was installed from


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


def check_attach_name(name: Any) -> str:
    """Return ``name`` if it is a safe attachment file name."""
    if not isinstance(name, str) or not ATTACH_NAME_RE.match(name) or ".." in name:
        raise BadRequest(f"invalid attachment name: {name!r}")
    return name


def fsync_path(path: Path | str) -> None:
    """fsync a file or directory by path."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs(path: Path | str) -> None:
    """Flush the whole file system holding ``path`` (one journal commit)."""
    from rqsys._native._rqspawn import lib  # type: ignore[import-not-found]

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if lib.syncfs(fd) != 0:
            raise StoreError(f"syncfs {path} failed")
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes) -> None:
    """Write ``path`` through a temp file, fsync it, rename, fsync the dir."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _write_new(tmp, data, sync=True)
    os.replace(tmp, path)
    fsync_path(path.parent)


NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _write_new(path: str | Path, data: bytes, sync: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    _write_fd(os.open(path, flags, 0o644), data, sync)


def _write_msg(path: str, data: bytes, sync: bool) -> None:
    """Write a new message's ``msg``: over the spare's blank one when there
    is one, else into a new file.

    A spare's msg already holds MSG_BLANK bytes of spaces, written and synced
    with the spare, and JSON ignores the spaces left after the message.  A
    message that fits overwrites blocks the file already has, at the same
    size, so fdatasync has only that data to write: no inode, no journal
    commit.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        _write_new(path, data, sync)
        return
    _write_fd(fd, data, sync, data_only=True)


def _write_fd(fd: int, data: bytes, sync: bool, data_only: bool = False) -> None:
    """Write all of ``data`` to ``fd``, fsync (or fdatasync) it if asked, close it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            (os.fdatasync if data_only else os.fsync)(fd)
    finally:
        os.close(fd)


def _overwrite(path: Path | str, data: bytes) -> None:
    """Rewrite a small advisory file in place, never truncating it to zero
    first (ext4 would then flush it on close, costing a disk write per call)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, data, 0)
        if os.fstat(fd).st_size > len(data):  # a no-op truncate still costs a journal handle
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


class IdMaker:
    """Makes RQ-style ids ``YYYYmmdd.HHMM.SS.mmm.<n>`` (UTC), strictly increasing."""

    def __init__(self, clock=time.time) -> None:
        self._clock = clock
        self._last_ms = 0
        self._n = 0

    def next_id(self) -> str:
        now_ms = int(self._clock() * 1000)
        if now_ms > self._last_ms:
            self._last_ms, self._n = now_ms, 0
        else:
            self._n += 1  # same millisecond, or the clock went back
        secs, ms = divmod(self._last_ms, 1000)
        stamp = time.strftime("%Y%m%d.%H%M.%S", time.gmtime(secs))
        return f"{stamp}.{ms:03d}.{self._n}"


@dataclass(frozen=True)
class Layout:
    """Paths under the state root (``/var/lib/rq`` or ``--root``)."""

    root: Path
    socket_dir: Path

    @classmethod
    def from_root(cls, root: str | os.PathLike[str] | None = None) -> Layout:
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
    def timers(self) -> Path:
        return self.root / "timers"

    @property
    def trash(self) -> Path:
        return self.root / "trash"

    @property
    def queues(self) -> Path:
        return self.root / "queue"

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
        write_file_durably(self.queue_dir(name) / mark, text.encode())
        self._adopt(self.queue_dir(name) / mark)

    def _adopt(self, *paths: Path) -> None:
        """Give paths root made to the owner of ``queue/`` (user rq under systemd).

        rq-scan runs as root (it enables units); the queue daemons run as the
        unprivileged owner of ``queue/`` and must own what rq-scan creates.
        """
        if os.geteuid() != 0:
            return
        owner = os.stat(self.queues)
        if owner.st_uid == 0:
            return
        for path in paths:
            os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)

    def make_dirs(self) -> None:
        for path in (self.root, self.config_file.parent, self.scandir, self.timers,
                     self.trash, self.queues):
            path.mkdir(parents=True, exist_ok=True)

    def create_queue_dir(self, name: str, config: dict[str, Any]) -> Path:
        """Create (or update) a queue's directory and its effective config."""
        qdir = self.queue_dir(name)
        for state in STATES:
            (qdir / state).mkdir(parents=True, exist_ok=True)
        (qdir / TMP_DIR).mkdir(exist_ok=True)
        write_file_durably(qdir / "config.json", json.dumps(config, indent=2).encode())
        self._adopt(qdir, qdir / TMP_DIR, qdir / "config.json", *(qdir / st for st in STATES))
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
        self._adopt(tmp)
        os.replace(tmp, link)

    def trash_queue(self, name: str) -> Path:
        """Move a queue's whole directory to ``trash/`` (nothing is deleted)."""
        src = self.queue_dir(name)
        dest = self.trash / f"{name}.{time.strftime('%Y%m%d.%H%M%S')}.{os.getpid()}"
        self.trash.mkdir(parents=True, exist_ok=True)
        os.rename(src, dest)
        fsync_path(self.queues)
        fsync_path(self.trash)
        return dest


class SpareMaker:
    """Makes spare message directories in ``.tmp/`` on a thread of their own.

    Making an inode is the dearest step of a create on a busy ext4 (0.2-0.5 ms
    each when its block group has seen many deletions), and a message needs
    five: its directory, ``msg``, ``status``, ``job/`` and ``job/stdio.log``.
    Made here, beside the daemon's loop, they cost neither the
    acknowledgement of a create nor the start of a run.  They are made
    SPARE_BATCH at a time: the fsyncs of a batch share their writes, and the
    daemon's own fsyncs meet this thread's on the disk once a batch, not once
    a message.  Spares are plain temp directories: recovery removes them.
    """

    def __init__(self, tmp_dir: str, count: int = SPARE_DIRS, batch: int = SPARE_BATCH) -> None:
        self._tmp_dir = tmp_dir
        self._count, self._batch = count, batch
        self._ready: collections.deque[str] = collections.deque()
        self._changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start making spares (once; only after recovery, which removes them)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._fill, name="spares", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for the batch it is making, if any."""
        with self._changed:
            self._stopped = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(SPARE_RETRY * 5)

    def __len__(self) -> int:
        """How many spares are ready."""
        with self._changed:
            return len(self._ready)

    def take(self) -> str | None:
        """A ready spare directory, or None when none is ready."""
        with self._changed:
            if not self._ready:
                return None
            spare = self._ready.popleft()
            if self._wants_batch():
                self._changed.notify()
            return spare

    def _wants_batch(self) -> bool:
        return self._stopped or len(self._ready) <= self._count - self._batch

    def _fill(self) -> None:
        seq = itertools.count(1)
        while True:
            with self._changed:
                self._changed.wait_for(self._wants_batch)
                if self._stopped:
                    return
                wanted = self._count - len(self._ready)
            paths = [f"{self._tmp_dir}/{SPARE_PREFIX}{os.getpid()}.{next(seq)}"
                     for _ in range(wanted)]
            try:
                self._make(paths)
            except OSError:  # disk full or queue removed: try again later
                for path in paths:
                    shutil.rmtree(path, ignore_errors=True)
                time.sleep(SPARE_RETRY)
                continue
            with self._changed:
                self._ready.extend(paths)

    @staticmethod
    def _make(paths: list[str]) -> None:
        """Make spares, then fsync their blank msg files: each spare's entry
        in ``.tmp/`` and its msg's block are durable before it is handed
        out, so a create has only its message's bytes to write (see
        _write_msg).  (Not syncfs: that would flush the whole file system.)"""
        msg_fds: list[int] = []
        try:
            for path in paths:
                os.mkdir(path)
                os.mkdir(f"{path}/job")
                for name in ("status", "job/stdio.log"):
                    os.close(os.open(f"{path}/{name}", NEW_FILE, 0o644))
                msg_fds.append(os.open(f"{path}/msg", NEW_FILE, 0o644))
                os.write(msg_fds[-1], b" " * MSG_BLANK)
            for fd in msg_fds:
                os.fsync(fd)
        finally:
            for fd in msg_fds:
                os.close(fd)


@dataclass
class Upload:
    """An attachment on its way in: its own file in ``.tmp/`` until placed."""

    path: str
    linked: bool  # a hard link to the sender's file; else still to be copied


@dataclass
class Staged:
    """A new message written under ``.tmp/`` but not yet renamed into place."""

    msg_id: str
    tmp: str
    msg: dict[str, Any]
    attached: bool = False

    def attach_dir(self) -> Path:
        """Make the staged message's ``attach/`` directory."""
        adir = Path(self.tmp) / "attach"
        adir.mkdir()
        self.attached = True
        return adir


class QueueStore:
    """The message directories of one queue; used by its daemon (sole writer)."""

    def __init__(self, qdir: Path, ids: IdMaker | None = None) -> None:
        self.qdir = qdir
        self.name = qdir.name
        self.id_maker = ids or IdMaker()
        self._base = str(qdir)  # the run path builds plain strings: pathlib costs
        self._dirty: set[str] = set()
        self._flushed_at = 0.0
        self.spares = SpareMaker(f"{self._base}/{TMP_DIR}")
        self._upload_seq = 0

    # -- paths -----------------------------------------------------------
    def state_dir(self, state: str) -> Path:
        return self.qdir / state

    def msg_dir(self, state: str, msg_id: str) -> Path:
        return Path(self._path(state, msg_id))

    def _path(self, state: str, msg_id: str) -> str:
        if state in SHARDED_STATES:
            return f"{self._base}/{state}/{msg_id[:11]}/{msg_id}"
        return f"{self._base}/{state}/{msg_id}"

    def find(self, msg_id: str) -> str:
        """The state a message is in; NotFound if it is in none."""
        check_msg_id(msg_id)
        for state in STATES:
            if self.msg_dir(state, msg_id).is_dir():
                return state
        raise NotFound(f"no message {msg_id} in queue {self.name}")

    # -- creation (synchronous) -------------------------------------------
    def stage(self, msg: dict[str, Any], state: str = "que") -> Staged:
        """Start a new message in a temp directory, no msg yet (attachments
        may be added before :meth:`publish` writes it): a ready spare for
        ``que``, else a new ``.tmp/<id>.<state>/``."""
        msg_id = self.id_maker.next_id()
        spare = self.spares.take() if state == "que" else None
        if spare is None:
            spare = f"{self._base}/{TMP_DIR}/{msg_id}.{state}"
            os.mkdir(spare)
        return Staged(msg_id, spare, dict(msg, msg_id=msg_id))

    def publish(self, batch: list[Staged]) -> None:
        """Write staged messages' msg files and make them durable.

        Once durable a message is safe: :meth:`recover` moves into place any
        temp directory holding a readable msg.  One message: fsync its msg
        (which also makes its directory entry durable, see the module
        docstring); several: one syncfs.
        """
        if not batch:
            return
        single = len(batch) == 1
        for staged in batch:
            _write_msg(f"{staged.tmp}/msg", json.dumps(staged.msg).encode(), sync=single)
        if not single:
            syncfs(self.qdir)
        elif batch[0].attached:
            _fsync_attachments(Path(batch[0].tmp) / "attach")

    def place(self, batch: list[Staged], state: str) -> None:
        """Move published messages into ``state`` (batched like any transition)."""
        for staged in batch:
            os.rename(staged.tmp, f"{self._base}/{state}/{staged.msg_id}")
        if batch:
            self._dirty.update({f"{self._base}/{TMP_DIR}", f"{self._base}/{state}"})

    def create(self, msg: dict[str, Any], state: str = "que") -> str:
        """Create one message durably in ``prep`` or ``que``; returns its id."""
        staged = self.stage(msg, state)
        self.publish([staged])
        self.place([staged], state)
        return staged.msg_id

    def discard(self, staged: Staged) -> None:
        shutil.rmtree(staged.tmp, ignore_errors=True)

    # -- transitions -------------------------------------------------------
    def move(self, msg_id: str, src: str, dest: str, durable: bool = False) -> None:
        """Rename a message directory from one state to another."""
        old, new = self._path(src, msg_id), self._path(dest, msg_id)
        try:
            _rename_into_shard(old, new) if dest in SHARDED_STATES else os.rename(old, new)
        except FileNotFoundError as exc:
            raise NotFound(f"no message {msg_id} in {self.name}/{src}") from exc
        except OSError as exc:
            raise StoreError(f"cannot move {msg_id} {src}->{dest}: {exc}") from exc
        parents = {os.path.dirname(old), os.path.dirname(new),
                   os.path.dirname(os.path.dirname(new))}
        if durable:
            for parent in parents:
                fsync_path(parent)
        else:
            self._dirty.update(parents)

    def flush(self, force: bool = False) -> None:
        """fsync the directories touched by batched transitions.

        At most once per FLUSH_INTERVAL unless forced (at exit), so that a
        busy queue pays one journal commit per interval, not per message.
        """
        if not self._dirty or (not force and self.flush_due() != 0.0):
            return
        self._flushed_at = time.monotonic()
        dirty, self._dirty = self._dirty, set()
        for path in dirty:
            try:
                fsync_path(path)
            except FileNotFoundError:
                pass  # an empty shard removed by the cleaner

    def flush_due(self) -> float | None:
        """Seconds until the batched fsyncs are due (None: nothing to flush)."""
        if not self._dirty:
            return None
        return max(0.0, self._flushed_at + FLUSH_INTERVAL - time.monotonic())

    def delete(self, msg_id: str, state: str) -> None:
        """Remove a message: rename it out of its state (durable), then rmtree."""
        src = self.msg_dir(state, msg_id)
        doomed = self.qdir / TMP_DIR / f"deleted.{msg_id}.{os.getpid()}"
        try:
            os.rename(src, doomed)
        except FileNotFoundError as exc:
            raise NotFound(f"no message {msg_id} in {self.name}") from exc
        fsync_path(src.parent)
        shutil.rmtree(doomed, ignore_errors=True)

    # -- message files -------------------------------------------------------
    def read_msg(self, state: str, msg_id: str) -> dict[str, Any]:
        """The message JSON; an ended message's ``count`` file has its run count."""
        path = self.msg_dir(state, msg_id) / "msg"
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError as exc:
            raise NotFound(f"no message {msg_id} in {self.name}/{state}") from exc
        except ValueError as exc:
            raise StoreError(f"{path}: unreadable message: {exc}") from exc
        if not isinstance(data, dict):
            raise StoreError(f"{path}: message is not a JSON object")
        if state in ENDED_STATES:
            data["count"] = self._read_count(path.with_name("count"))
        return data

    @staticmethod
    def _read_count(path: Path) -> int:
        """An ended message's run count: the ``count`` file, 1 without one."""
        try:
            return int(path.read_bytes())
        except (FileNotFoundError, ValueError):
            return 1

    def write_count(self, state: str, msg_id: str, count: int) -> None:
        """Record how often an ending message ran (not synced, like status).

        A separate small file, so the ``msg`` is not replaced at the end of
        every run (a rename over a file makes ext4 write it back at once);
        not written for the common single run, which is what its absence means.
        """
        path = f"{self._path(state, msg_id)}/count"
        if count != 1 or os.path.exists(path):
            _overwrite(path, str(count).encode())

    def _count_crashed_run(self, msg_id: str) -> None:
        """Recovery: a message found in ``run/`` ran once more than its msg says.

        Its msg holds the count from before that run (a run does not rewrite
        it), so the run is counted here, durably: a message that keeps
        crashing its daemon still reaches max_count.
        """
        try:
            msg = self.read_msg("run", msg_id)
        except StoreError:
            return  # an unreadable msg is reported when que/ is loaded
        self.write_msg("run", msg_id, dict(msg, count=int(msg.get("count", 0)) + 1))

    def write_msg(self, state: str, msg_id: str, msg: dict[str, Any]) -> None:
        """Replace a message's ``msg`` file atomically and durably."""
        write_file_durably(self.msg_dir(state, msg_id) / "msg", json.dumps(msg).encode())

    def write_status(self, state: str, msg_id: str, text: str) -> None:
        """Record the script's last status line (not synced: advisory)."""
        path = f"{self._path(state, msg_id)}/status"
        try:
            _overwrite(path, text.encode("utf-8", "replace"))
        except FileNotFoundError:
            pass  # the message moved on meanwhile

    def read_status(self, state: str, msg_id: str) -> str:
        try:
            return (self.msg_dir(state, msg_id) / "status").read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def job_dir(self, msg_id: str) -> str:
        """Create and return the ``job/`` dir of a running message."""
        job = f"{self._path('run', msg_id)}/job"
        try:
            os.mkdir(job)
        except FileExistsError:
            pass  # a run after a resend reuses its job/
        return job

    # -- attachments ---------------------------------------------------------
    def attach_dir(self, state: str, msg_id: str) -> Path:
        return self.msg_dir(state, msg_id) / "attach"

    def prep_attach_dir(self, msg_id: str) -> Path:
        """The ``attach/`` directory of a prep message, made if missing."""
        adir = self.attach_dir("prep", check_msg_id(msg_id))
        adir.mkdir(exist_ok=True)
        return adir

    def new_upload(self, src_fd: int) -> Upload:
        """Start taking in an attachment sent as an open file: its own file
        in ``.tmp/``, hard-linked to the sender's when that lives on this
        file system (through ``/proc/self/fd``, instantly: large uploads are
        never copied), else to be copied by :meth:`fill_upload`."""
        self._upload_seq += 1
        path = f"{self._base}/{TMP_DIR}/upload.{os.getpid()}.{self._upload_seq}"
        return Upload(path, self._link_fd(src_fd, Path(path)))

    @staticmethod
    def fill_upload(upload: Upload, src_fd: int) -> str:
        """The slow part, for a thread: copy the file in if it was not
        linked, make its data durable, and return its MD5.  It touches only
        the upload's own file."""
        if not upload.linked:
            QueueStore._copy_fd(src_fd, Path(upload.path))
        fsync_path(upload.path)
        return file_md5(Path(upload.path))

    @staticmethod
    def place_upload(upload: Upload, adir: Path, name: str, md5: str, actual: str,
                     sync: bool) -> Path:
        """Put a filled upload into ``adir`` as ``name`` if its MD5 is the one
        sent (``actual`` is what :meth:`fill_upload` found), md5 file beside it."""
        check_attach_name(name)
        if actual != md5:
            raise BadRequest(f"attachment {name}: md5 mismatch (sent {md5}, got {actual})")
        _write_new(adir / f".{name}.md5", md5.encode(), sync=sync)
        dest = adir / name
        os.replace(upload.path, dest)
        if sync:
            fsync_path(adir)
        return dest

    @staticmethod
    def drop_upload(upload: Upload) -> None:
        """Remove an upload that was not placed (recovery would, at the next start)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(upload.path)

    @staticmethod
    def attachment_md5(path: Path) -> str:
        try:
            return path.with_name(f".{path.name}.md5").read_text()
        except FileNotFoundError:
            return ""

    @staticmethod
    def _link_fd(src_fd: int, dest: Path) -> bool:
        # linkat(AT_SYMLINK_FOLLOW) on the /proc magic link: os.link only
        # calls linkat (not link, which would link the symlink) given a dir fd.
        proc_fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.link(str(src_fd), dest, src_dir_fd=proc_fds, follow_symlinks=True)
            return True
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.ENOENT, errno.EPERM, errno.EACCES):
                return False
            raise
        finally:
            os.close(proc_fds)

    @staticmethod
    def _copy_fd(src_fd: int, dest: Path) -> None:
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.lseek(src_fd, 0, os.SEEK_SET)
            while os.sendfile(out, src_fd, None, 1 << 24) > 0:
                pass
        finally:
            os.close(out)

    def remove_attachment(self, msg_id: str, name: str) -> None:
        path = self.attach_dir("prep", check_msg_id(msg_id)) / check_attach_name(name)
        try:
            path.unlink()
        except FileNotFoundError as exc:
            raise NotFound(f"no attachment {name}") from exc
        fsync_path(path.parent)

    def attachments(self, state: str, msg_id: str) -> list[Path]:
        adir = self.attach_dir(state, msg_id)
        if not adir.is_dir():
            return []
        return sorted(p for p in adir.iterdir() if not p.name.startswith("."))

    def link_attachments(self, src_state: str, src_id: str, staged: Staged) -> None:
        """Hard-link a message's attachments into a staged (cloned) message."""
        files = self.attachments(src_state, src_id)
        if not files:
            return
        adir = staged.attach_dir()
        for path in files:
            os.link(path, adir / path.name)
            md5 = path.with_name(f".{path.name}.md5")
            if md5.exists():
                os.link(md5, adir / md5.name)

    # -- listing and counting ------------------------------------------------
    def read_all(self, state: str) -> Iterator[tuple[str, dict[str, Any] | StoreError]]:
        """(id, msg or the error reading it) for every message of a flat state.

        For loading que/ at start-up: openat() relative to the state
        directory and one read each, as 100,000 messages must load in seconds.
        """
        dfd = os.open(self.state_dir(state), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for msg_id in os.listdir(dfd):
                if MSG_ID_RE.match(msg_id):
                    yield msg_id, _read_json_at(dfd, f"{msg_id}/msg")
        finally:
            os.close(dfd)

    def save_que_snapshot(self, msgs: dict[str, dict[str, Any]]) -> None:
        """At a clean stop: every queued message in one file (durably), so the
        next start reads one file instead of one per message."""
        lines = "".join(json.dumps([msg_id, msg]) + "\n" for msg_id, msg in msgs.items())
        write_file_durably(self.qdir / QUE_SNAPSHOT, lines.encode())

    def take_que_snapshot(self) -> dict[str, dict[str, Any]] | None:
        """The last clean stop's snapshot if its ids are exactly those in que/.

        It is removed durably first, so a crash later can never bring back a
        stale one; anything unexpected means None (read que/ one by one).
        """
        path = self.qdir / QUE_SNAPSHOT
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        path.unlink()
        fsync_path(self.qdir)
        try:
            msgs = {str(i): dict(m) for i, m in map(json.loads, data.splitlines())}
        except (ValueError, TypeError):
            return None
        on_disk = {i for i in _listdir(self.state_dir("que")) if MSG_ID_RE.match(i)}
        return msgs if set(msgs) == on_disk else None

    def ids(self, state: str) -> Iterator[str]:
        """Ids in a state (walks the directory: for que/run/prep/err)."""
        base = self.state_dir(state)
        if state in SHARDED_STATES:
            for shard in sorted(_listdir(base)):
                yield from (i for i in _listdir(base / shard) if MSG_ID_RE.match(i))
            return
        yield from (i for i in _listdir(base) if MSG_ID_RE.match(i))

    def newest(self, state: str, offset: int = 0, limit: int = 50) -> list[str]:
        """Newest-first page of ids; sharded states only read needed shards."""
        base = self.state_dir(state)
        if state not in SHARDED_STATES:
            ids = sorted((i for i in _listdir(base) if MSG_ID_RE.match(i)), reverse=True)
            return ids[offset:offset + limit]
        page: list[str] = []
        skip = offset
        for shard in sorted(_listdir(base), reverse=True):
            ids = sorted((i for i in _listdir(base / shard) if MSG_ID_RE.match(i)),
                         reverse=True)
            if skip >= len(ids):
                skip -= len(ids)
                continue
            page.extend(ids[skip:skip + limit - len(page)])
            skip = 0
            if len(page) >= limit:
                break
        return page

    def count(self, state: str) -> int:
        """Messages in a state, from link counts where the file system keeps them."""
        base = self.state_dir(state)
        if state not in SHARDED_STATES:
            return _subdir_count(base)
        return sum(_subdir_count(base / shard) for shard in _listdir(base))

    # -- pruning (the cleaner) ---------------------------------------------------
    def ended_at(self, state: str, msg_id: str) -> float:
        """When a message ended: the newer mtime of its directory and ``status``."""
        return _newest_mtime(self.msg_dir(state, msg_id), ("status",))

    def prune_untouched(self, state: str, before: float) -> int:
        """Remove the messages of an unsharded state untouched since ``before``
        (the newest mtime of the directory, its ``msg`` and ``attach/``)."""
        old = [i for i in self.ids(state)
               if _newest_mtime(self.msg_dir(state, i), ("msg", "attach")) < before]
        for msg_id in old:
            self.delete(msg_id, state)
        return len(old)

    def prune(self, state: str, before: float) -> int:
        """Remove messages of a sharded state that ended before ``before``."""
        removed = 0
        base = self.state_dir(state)
        for shard in sorted(_listdir(base)):
            ids = [i for i in _listdir(base / shard) if MSG_ID_RE.match(i)]
            old = [i for i in ids if self.ended_at(state, i) < before]
            if old and len(old) == len(ids):
                self._remove_dir(base / shard, f"shard.{state}.{shard}")
            else:
                for msg_id in old:
                    self.delete(msg_id, state)
            removed += len(old)
        return removed

    def prune_acked(self, state: str = "err") -> int:
        """Remove the messages of ``state`` that hold an ``ack`` file."""
        acked = [i for i in self.ids(state) if (self.msg_dir(state, i) / "ack").exists()]
        for msg_id in acked:
            self.delete(msg_id, state)
        return len(acked)

    def _remove_dir(self, path: Path, label: str) -> None:
        """Rename ``path`` out of sight (durably), then delete it."""
        doomed = self.qdir / TMP_DIR / f"deleted.{label}.{os.getpid()}"
        os.rename(path, doomed)
        fsync_path(path.parent)
        shutil.rmtree(doomed, ignore_errors=True)

    # -- admin state -----------------------------------------------------------
    def admin_state(self) -> str:
        try:
            state = (self.qdir / "admin_state").read_text().strip()
        except FileNotFoundError:
            return "UP"
        return state if state in ADMIN_STATES else "UP"

    def set_admin_state(self, state: str) -> None:
        if state not in ADMIN_STATES:
            raise BadRequest(f"invalid admin state: {state!r}")
        write_file_durably(self.qdir / "admin_state", (state + "\n").encode())

    # -- recovery -----------------------------------------------------------------
    def recover(self) -> list[str]:
        """Clean temp files, move ``run/`` back to ``que/``; returns recovered ids."""
        for state in STATES:
            self.state_dir(state).mkdir(parents=True, exist_ok=True)
        self._recover_tmp()
        recovered = list(self.ids("run"))
        for msg_id in recovered:
            self._count_crashed_run(msg_id)
            self.move(msg_id, "run", "que")
        self.flush(force=True)
        return recovered

    def _recover_tmp(self) -> None:
        """Finish publishes a crash cut short (a temp directory holding a
        readable msg: ``.tmp/<id>.<state>``, or a spare, which only ``que``
        creates take); remove everything else under ``.tmp/``."""
        tmp = self.qdir / TMP_DIR
        tmp.mkdir(exist_ok=True)
        for entry in os.listdir(tmp):
            path = tmp / entry
            msg_id, state = _published_as(path)
            if msg_id:
                os.rename(path, self.state_dir(state) / msg_id)
                self._dirty.update({str(tmp), str(self.state_dir(state))})
            elif path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()


def _rename_into_shard(old: str, new: str) -> None:
    """Rename, creating the hour's shard directory only when it is missing."""
    try:
        os.rename(old, new)
    except FileNotFoundError:
        if not os.path.exists(old):
            raise
        os.makedirs(os.path.dirname(new), exist_ok=True)
        os.rename(old, new)


def _published_as(path: Path) -> tuple[str, str]:
    """(id, state) of a temp directory holding a complete new message, else ("", "")."""
    name_id, _, state = path.name.rpartition(".")
    if path.name.startswith(SPARE_PREFIX):
        state = "que"
    elif state not in ("que", "prep") or not MSG_ID_RE.match(name_id):
        return "", ""
    try:
        msg = json.loads((path / "msg").read_bytes())
    except (OSError, ValueError):
        return "", ""
    msg_id = msg.get("msg_id") if isinstance(msg, dict) else None
    if not isinstance(msg_id, str) or not MSG_ID_RE.match(msg_id):
        return "", ""
    return msg_id, state


def file_md5(path: Path) -> str:
    """The hex MD5 of a file's content (attachments are checked against it)."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _read_json_at(dfd: int, relpath: str) -> dict[str, Any] | StoreError:
    """A JSON object read from ``relpath`` under directory fd ``dfd``."""
    try:
        fd = os.open(relpath, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        return StoreError(f"{relpath}: {exc.strerror}")
    try:
        chunks = [os.read(fd, 1 << 16)]
        while len(chunks[-1]) == 1 << 16:
            chunks.append(os.read(fd, 1 << 16))
    finally:
        os.close(fd)
    try:
        data = json.loads(b"".join(chunks))
    except ValueError as exc:
        return StoreError(f"{relpath}: unreadable message: {exc}")
    return data if isinstance(data, dict) else StoreError(f"{relpath}: not a JSON object")


def _fsync_attachments(adir: Path) -> None:
    for path in adir.iterdir():
        fsync_path(path)
    fsync_path(adir)


def _newest_mtime(path: Path, inside: tuple[str, ...]) -> float:
    """The newest mtime of ``path`` and of those of its entries that exist."""
    times = [path.stat().st_mtime]
    for name in inside:
        with contextlib.suppress(FileNotFoundError):
            times.append((path / name).stat().st_mtime)
    return max(times)


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def _subdir_count(path: Path) -> int:
    """Subdirectories of ``path``: st_nlink - 2 on ext4/xfs, else a scan."""
    try:
        nlink = os.stat(path).st_nlink
    except FileNotFoundError:
        return 0
    if nlink >= 2:
        return nlink - 2
    return sum(1 for entry in os.scandir(path) if entry.is_dir())
