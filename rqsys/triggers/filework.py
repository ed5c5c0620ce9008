"""A files trigger's work off rq-scan's loop: a file made one message, its end awaited, then done.

Runs on the trigger's own lane of rq-scan's ``Background`` (one thread, its
jobs in turn), so :class:`Work` and its state file have one writer.  A file
is taken only when no one has it open for writing (a read lease can be
taken: the kernel says so), else it is left for the close that will come.
Its message carries ``unique_key`` ``file:<trigger>:<dev>:<ino>:<size>:<mtime_ns>``
(held a week after it ended), so a file version made into a message and not
yet noted here (a crash between the two) is answered ``duplicate`` when it
is taken again: never lost, never sent twice.  The messages made wait in
``triggers/.state/<name>.files.json`` (``pending``) until their state says
how they ended: ``done`` runs ``then``, ``err`` keeps them waiting (a retry
may make them done), any other end leaves the file.  A file whose message
ended and that stays is remembered (``kept``) while it is there, so a
restart does not make it again.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqsys.errors import NotFound, QueueDown, RQError, Unavailable
from rqsys.store import Layout, durable
from rqsys.triggers import record, spec
from rqsys.triggers.spec import Trigger
from rqsys.wire.client import QueueClient

UNIQUE_FOR = 604800.0  # seconds a file version's key is held after its message ended
SLOW = 30.0  # seconds between looks at a message in err (or a `then` that failed)
QUIET = 2.0  # where no lease can be taken: a file this young may still be written
SAVE_EVERY = 32  # files taken between writes of the state file in a long job
TIMEOUT = 60.0  # a create waits for its file's copy and MD5
WAITING = ("prep", "que", "run")
THEN_FAILED = "then_failed"  # a count of the record beside made/duplicate/refused
BAD_CHAR = re.compile(r"[^A-Za-z0-9_.+=-]")


@dataclass(frozen=True)
class FileSpec:
    """What a files trigger says: where, which names, the message, and ``then``."""

    name: str
    path: str
    glob: str
    recursive: bool
    msg: dict[str, Any]
    then: Any  # "keep", "delete" or {"move": DIR}

    @property
    def dest(self) -> str:
        return str(self.msg["dest"])


def file_spec(trigger: Trigger, then: Any) -> FileSpec:
    files = trigger.settings
    return FileSpec(trigger.name, os.path.normpath(str(files["path"])),
                    str(files.get("glob", "*")), bool(files.get("recursive", False)),
                    dict(trigger.msg), then if then is not None else "keep")


def unique_key(name: str, st: os.stat_result) -> str:
    return f"file:{name}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def matches(fs: FileSpec, filename: str) -> bool:
    """The glob matches the file's own name; a dot file only a glob starting with a dot."""
    if filename.startswith(".") and not fs.glob.startswith("."):
        return False
    return fnmatch.fnmatchcase(filename, fs.glob)


def attachment_name(filename: str) -> str:
    """The file's name as an attachment's (characters an attachment may not have as ``_``)."""
    name = BAD_CHAR.sub("_", filename)[:200]
    return name if name[:1].isalnum() or name[:1] == "_" else f"_{name}"[:200]


def message(fs: FileSpec, relname: str, key: str) -> dict[str, Any]:
    """The trigger's ``msg``, ``param1`` the file's name (under the path) unless it names one."""
    return {"param1": relname, **fs.msg, "unique_key": key, "unique_for": UNIQUE_FOR}


def being_written(fd: int, st: os.stat_result, now: float) -> bool:
    """Whether someone has the file open for writing: a read lease is refused
    then.  Without leases (not the file's owner, no CAP_LEASE; a file system
    without them) a file modified in the last QUIET seconds counts as written."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        if exc.errno == errno.EAGAIN:
            return True
        return now - st.st_mtime < QUIET
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    return False


def fd_md5(fd: int) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


def listing(fs: FileSpec, top: str) -> list[str]:
    """The matching names under ``top`` (below it too when recursive); OSError
    for ``top`` itself (a directory below that vanishes is skipped)."""
    found: list[str] = []
    with os.scandir(top) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if fs.recursive:
                    try:
                        found += listing(fs, entry.path)
                    except OSError:
                        continue
            elif matches(fs, entry.name):
                found.append(entry.path)
    return found


@dataclass
class Result:
    """What a job tells the loop: lines to log, paths to look at again, and how it went."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    again: list[str] = field(default_factory=list)  # look again after a while
    dir_error: str = ""  # the watched directory could not be listed
    pending: int = 0  # messages whose end is still awaited


class Work:
    """One files trigger's state and work, on its lane."""

    def __init__(self, layout: Layout, name: str) -> None:
        self.layout, self.name = layout, name
        self.triggers = spec.triggers_dir(layout)
        self.path = self.triggers / record.STATE_DIR / f"{name}.files.json"
        self.pending: dict[str, dict[str, str]] | None = None  # loaded by the first job
        self.kept: dict[str, str] = {}  # key -> path: ended, the file left where it is
        self.refused: set[str] = set()  # keys refused (counted once, not tried again)
        self.next_look: dict[str, float] = {}  # key -> when to ask its state again
        self.clients: dict[str, QueueClient] = {}
        self.dirty = False

    # ------------------------------------------------------------ the job
    def run(self, fs: FileSpec, paths: list[str], dirs: list[str], poll: bool) -> Result:
        """Take ``paths`` and what ``dirs`` hold (``fs.path`` among them: a
        full catch-up), then (``poll``) follow the messages made."""
        self._load()
        out = Result()
        try:
            todo = set(paths)
            for top in dirs:
                todo |= self._listed(fs, top, out)
            for n, path in enumerate(sorted(todo), 1):
                self._take(fs, path, out)
                if n % SAVE_EVERY == 0:
                    self._save()  # fewer to be answered duplicate after a crash
            if poll:
                self._poll(fs, out)
        finally:
            for conn in self.clients.values():
                conn.close()
            self.clients.clear()
            self._save()
        assert self.pending is not None
        out.pending = len(self.pending)
        return out

    def _listed(self, fs: FileSpec, top: str, out: Result) -> set[str]:
        try:
            found = listing(fs, top)
        except OSError as exc:
            if top == fs.path:
                out.dir_error = f"{top}: {exc.strerror or exc}"
            return set()
        if top == fs.path:
            self._prune_kept(found)
        return set(found)

    def _prune_kept(self, found: list[str]) -> None:
        """A full listing: forget the ended files that are no longer there as they were."""
        there = set(found)
        for key, path in list(self.kept.items()):
            if path not in there or self._key_at(path) != key:
                del self.kept[key]
                self.dirty = True

    def _key_at(self, path: str) -> str | None:
        try:
            return unique_key(self.name, os.stat(path, follow_symlinks=False))
        except OSError:
            return None

    # ------------------------------------------------------------ taking a file
    def _take(self, fs: FileSpec, path: str, out: Result) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_NOCTTY)
        except OSError:
            return  # gone (moved on, deleted), a symlink, or unreadable: nothing to take
        try:
            self._take_open(fs, path, fd, out)
        finally:
            os.close(fd)

    def _take_open(self, fs: FileSpec, path: str, fd: int, out: Result) -> None:
        st = os.fstat(fd)
        key = unique_key(self.name, st)
        assert self.pending is not None
        if not stat.S_ISREG(st.st_mode) or key in self.pending or key in self.kept \
                or key in self.refused:
            return
        now = time.time()
        if being_written(fd, st, now):
            if now - st.st_mtime < QUIET:
                out.again.append(path)  # no lease: looked at again once quiet
            return  # else its writer's close will tell
        relname = os.path.relpath(path, fs.path)
        try:
            got = self._create(fs, relname, key, fd)
        except RQError as exc:
            self._refused(fs, path, key, exc, out)
            return
        self._made(fs, path, key, got, out)

    def _create(self, fs: FileSpec, relname: str, key: str, fd: int) -> dict[str, Any]:
        if not self.layout.queue_dir(fs.dest).is_dir():
            raise NotFound(f"no queue named {fs.dest}")
        by = f"trigger {self.name}"
        attached = [{"name": attachment_name(os.path.basename(relname)), "md5": fd_md5(fd),
                     "link": fs.then != "keep"}]  # the file leaves: linked, not copied
        return self._client(fs.dest).call(
            "create", fds=[fd], msg=message(fs, relname, key), by=by, attachments=attached,
            actor={"user": by, "address": "rq-scan", "role": "operator"})

    def _client(self, queue: str) -> QueueClient:
        if queue not in self.clients:
            self.clients[queue] = QueueClient(self.layout, queue, timeout=TIMEOUT)
        return self.clients[queue]

    def _made(self, fs: FileSpec, path: str, key: str, got: dict[str, Any],
              out: Result) -> None:
        assert self.pending is not None
        self.pending[key] = {"path": path, "msg_id": str(got["msg_id"]), "queue": fs.dest}
        self.dirty = True
        outcome = "duplicate" if got.get("duplicate") else "made"
        self._note(outcome, out, last_msg_id=str(got["msg_id"]), last_queue=fs.dest)
        said = "was made already: message" if outcome == "duplicate" else "made message"
        out.lines.append(("created", f"trigger {self.name}: {path}: {said} {got['msg_id']} "
                                     f"in {fs.dest}"))

    def _refused(self, fs: FileSpec, path: str, key: str, exc: RQError, out: Result) -> None:
        if self._key_at(path) != key:
            return  # changed while it was taken (its MD5 no longer the one sent): a close follows
        why = f"{path}: {type(exc).__name__}: {exc}"
        if isinstance(exc, Unavailable | QueueDown | NotFound):
            out.again.append(path)  # the queue may come back: tried again
            if key in self.refused:
                return
        self.refused.add(key)
        self._note("refused", out, error=why)
        out.lines.append(("err", f"trigger {self.name}: no message for {why}"))

    def _note(self, outcome: str, out: Result, **fields: Any) -> None:
        try:
            record.note(self.triggers, self.name, outcome, **fields)
        except OSError as exc:
            out.lines.append(("err", f"trigger {self.name}: record not written: {exc}"))

    # ------------------------------------------------------------ ends and then
    def _poll(self, fs: FileSpec, out: Result) -> None:
        assert self.pending is not None
        now = time.monotonic()
        for key, entry in sorted(self.pending.items()):
            if self.next_look.get(key, 0.0) > now:
                continue
            try:
                state = self._client(entry["queue"]).call("state", msg_id=entry["msg_id"])
            except Unavailable:
                return  # asked again at the next poll
            except RQError as exc:
                state = {"state": None, "error": str(exc)}
            self._ended(fs, key, entry, state.get("state"), out)

    def _ended(self, fs: FileSpec, key: str, entry: dict[str, str], state: Any,
               out: Result) -> None:
        assert self.pending is not None
        if state in WAITING:
            return
        if state == "err":
            self.next_look[key] = time.monotonic() + SLOW
            return
        if state == "done":
            try:
                kept = self._then(fs, key, entry["path"], out)
            except OSError as exc:
                why = f"{entry['path']}: then {json.dumps(fs.then)}: {exc}"
                self._note_error(why, out)
                self.next_look[key] = time.monotonic() + SLOW
                return
        else:
            kept = True  # relayed, or gone: the file is left where it is
        del self.pending[key]
        self.next_look.pop(key, None)
        if kept:
            self.kept[key] = entry["path"]
        self.dirty = True

    def _note_error(self, why: str, out: Result) -> None:
        out.lines.append(("err", f"trigger {self.name}: {why}; tried again in {SLOW:.0f} s"))
        self._note(THEN_FAILED, out, error=why)

    def _then(self, fs: FileSpec, key: str, path: str, out: Result) -> bool:
        """Do ``then`` to the file if it is still the version the message took;
        whether the file stays where it is."""
        if self._key_at(path) != key:
            return False  # moved on or changed meanwhile: nothing of ours to do
        if fs.then == "delete":
            durable.unlink_durably(Path(path))
            out.lines.append(("daemon", f"trigger {self.name}: {path} deleted (its message "
                                        "is done)"))
            return False
        if isinstance(fs.then, dict):
            dest = move(Path(path), Path(fs.then["move"]))
            out.lines.append(("daemon", f"trigger {self.name}: {path} moved to {dest} (its "
                                        "message is done)"))
            return False
        return True

    # ------------------------------------------------------------ the state file
    def _load(self) -> None:
        if self.pending is not None:
            return
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError):
            data = {}  # torn or unreadable: the unique keys still answer what was made
        self.pending = {str(k): dict(v) for k, v in dict(data.get("pending", {})).items()}
        self.kept = {str(k): str(v) for k, v in dict(data.get("kept", {})).items()}

    def _save(self) -> None:
        if not self.dirty:
            return
        text = json.dumps({"pending": self.pending, "kept": self.kept}, sort_keys=True)
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        durable.write_file_durably(self.path, text.encode())
        self.dirty = False


def move(src: Path, into: Path) -> Path:
    """``src`` moved into directory ``into`` (a name already there: ``.N`` added), durably;
    across file systems, copied (data synced) and then removed."""
    dest = into / src.name
    n = 0
    while os.path.lexists(dest):
        n += 1
        dest = into / f"{src.name}.{n}"
    try:
        durable.rename_durably(src, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        tmp = into / f".{src.name}.rqsys-move"
        shutil.copy2(src, tmp)
        durable.fsync_path(tmp)
        durable.rename_durably(tmp, dest)
        durable.unlink_durably(src)
    return dest
