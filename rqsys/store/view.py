"""A read-only view of one queue's messages: finding, reading, listing, counting.

What the web front end and the CLI get.  ``QueueView`` has no method that
changes anything on disk, so "read-only" is the type, not a promise; the
queue's daemon writes through :class:`rqsys.store.queue.QueueStore`, which
builds on it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rqsys.errors import NotFound, StoreError
from rqsys.store import msgshare
from rqsys.store.attachments import md5_path
from rqsys.store.layout import (
    ADMIN_STATES,
    ENDED_STATES,
    MSG_ID_RE,
    SHARDED_STATES,
    STATES,
    arrival,
    check_msg_id,
)


class QueueView:
    """The message directories of one queue, read only."""

    def __init__(self, qdir: Path) -> None:
        self.qdir = qdir
        self.name = qdir.name
        self._base = str(qdir)  # the run path builds plain strings: pathlib costs

    # -- paths ---------------------------------------------------------------
    def state_dir(self, state: str) -> Path:
        return self.qdir / state

    def msg_dir(self, state: str, msg_id: str) -> Path:
        return Path(self._path(state, msg_id))

    def msg_path(self, state: str, msg_id: str) -> str:
        """:meth:`msg_dir` as a plain string (for the loop's hot paths)."""
        return self._path(state, msg_id)

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

    # -- message files -------------------------------------------------------
    def read_msg(self, state: str, msg_id: str) -> dict[str, Any]:
        """The message JSON; an ended message's ``count`` file has its count."""
        path = self.msg_dir(state, msg_id) / "msg"
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError as exc:
            raise NotFound(f"no message {msg_id} in {self.name}/{state}") from exc
        except (ValueError, OSError) as exc:  # not JSON; no directory (e2fsck), EIO
            raise StoreError(f"{path}: unreadable message: {exc}") from exc
        if not isinstance(data, dict):
            raise StoreError(f"{path}: message is not a JSON object")
        if state in ENDED_STATES:
            data["count"] = _read_count(path.with_name("count"))
        return data

    def read_status(self, state: str, msg_id: str) -> str:
        """The script's last status line ("" before it wrote one)."""
        try:
            return (self.msg_dir(state, msg_id) / "status").read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def admin_state(self) -> str:
        """UP, PAUSE or DOWN (UP when never set or unreadable)."""
        try:
            state = (self.qdir / "admin_state").read_text().strip()
        except FileNotFoundError:
            return "UP"
        return state if state in ADMIN_STATES else "UP"

    # -- attachments ---------------------------------------------------------
    def attach_dir(self, state: str, msg_id: str) -> Path:
        return self.msg_dir(state, msg_id) / "attach"

    def attachments(self, state: str, msg_id: str) -> list[Path]:
        """A message's attachment files, by name (not their ``.md5`` files)."""
        adir = self.attach_dir(state, msg_id)
        if not adir.is_dir():
            return []
        return sorted(p for p in adir.iterdir() if not p.name.startswith("."))

    @staticmethod
    def attachment_md5(path: Path) -> str:
        """The MD5 recorded beside an attachment when it was placed ("" if none)."""
        try:
            return md5_path(path).read_text()
        except FileNotFoundError:
            return ""

    # -- listing and counting ------------------------------------------------
    def ids(self, state: str) -> Iterator[str]:
        """Ids in a state, read from the directory as they are taken (a walk of
        a million never holds them all); a shard pruned meanwhile is passed."""
        base = self.state_dir(state)
        for shard in sorted(listdir(base)) if state in SHARDED_STATES else [""]:
            try:
                with os.scandir(base / shard if shard else base) as entries:
                    yield from (e.name for e in entries if MSG_ID_RE.match(e.name))
            except FileNotFoundError:
                continue

    def newest(self, state: str, offset: int = 0, limit: int = 50) -> list[str]:
        """Newest-first page of ids; sharded states only read needed shards."""
        base = self.state_dir(state)
        if state not in SHARDED_STATES:
            return sorted(ids_in(base), key=arrival, reverse=True)[offset:offset + limit]
        page: list[str] = []
        for shard in sorted(listdir(base), reverse=True):
            ids = sorted(ids_in(base / shard), key=arrival, reverse=True)
            if offset >= len(ids):
                offset -= len(ids)
                continue
            page.extend(ids[offset:offset + limit - len(page)])
            offset = 0
            if len(page) >= limit:
                break
        return page

    def count(self, state: str) -> int:
        """Messages in a state, from link counts where the file system keeps them."""
        base = self.state_dir(state)
        if state not in SHARDED_STATES:
            return _subdir_count(base)
        return sum(_subdir_count(base / shard) for shard in listdir(base))

    def ended_at(self, state: str, msg_id: str) -> float:
        """When a message ended: the newer mtime of its directory and ``status``."""
        return newest_mtime(self.msg_dir(state, msg_id), ("status",))

    def read_all(self, state: str) -> Iterator[tuple[str, dict[str, Any] | StoreError]]:
        """(id, msg or the error reading it) for every message of a flat state
        (for loading que/ at start-up)."""
        for dfd, msg_id in self.ids_at(state):
            msg = _read_json_at(dfd, f"{msg_id}/msg")
            # held in memory until it runs: one copy of the strings all messages repeat
            yield msg_id, msg if isinstance(msg, StoreError) else msgshare.shared(msg_id, msg)

    def read_queued(self, msg_id: str) -> dict[str, Any] | StoreError | None:
        """A queued message as its daemon holds it (one copy of the strings
        all of them repeat: ``msgshare``), the error reading it, or None when
        it is gone (deleted or moved since que/ was listed)."""
        path = f"{self._base}/que/{msg_id}"
        msg = _read_json_at(None, f"{path}/msg")  # an absolute path: no directory fd
        if isinstance(msg, StoreError):  # a directory without its msg (e2fsck): unreadable
            return msg if os.path.isdir(path) else None
        return msgshare.shared(msg_id, msg)

    def ids_at(self, state: str) -> Iterator[tuple[int, str]]:
        """(the state directory's descriptor, id) of each message of a flat
        state, for walks that read relative to it (openat and one read each,
        as 100,000 messages must be read in seconds); FileNotFoundError
        without the directory.  The descriptor is closed after the last."""
        dfd = os.open(self.state_dir(state), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for msg_id in os.listdir(dfd):
                if MSG_ID_RE.match(msg_id):
                    yield dfd, msg_id
        finally:
            os.close(dfd)


def listdir(path: Path) -> list[str]:
    """The names in a directory; none if it is missing."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def newest_mtime(path: Path, inside: tuple[str, ...]) -> float:
    """The newest mtime of ``path`` and of those of its entries that exist."""
    times = [path.stat().st_mtime]
    for name in inside:
        with contextlib.suppress(FileNotFoundError):
            times.append((path / name).stat().st_mtime)
    return max(times)


def ids_in(path: Path) -> list[str]:
    """The message ids in one directory (a flat state or a shard)."""
    return [i for i in listdir(path) if MSG_ID_RE.match(i)]


def read_whole(fd: int) -> bytes:
    """All of an open file, from its offset (one read for a small one)."""
    chunks = [os.read(fd, 1 << 16)]
    while len(chunks[-1]) == 1 << 16:
        chunks.append(os.read(fd, 1 << 16))
    return b"".join(chunks)


def _read_count(path: Path) -> int:
    """An ended message's count (RQ's: its resends): the ``count`` file, 0 without one."""
    try:
        return int(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return 0


def _subdir_count(path: Path) -> int:
    """Subdirectories of ``path``: st_nlink - 2 on ext4/xfs, else a scan."""
    try:
        nlink = os.stat(path).st_nlink
    except FileNotFoundError:
        return 0
    if nlink >= 2:
        return nlink - 2
    return sum(1 for entry in os.scandir(path) if entry.is_dir())


def _read_json_at(dfd: int | None, relpath: str) -> dict[str, Any] | StoreError:
    """A JSON object read from ``relpath`` under directory fd ``dfd``."""
    try:
        fd = os.open(relpath, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as exc:
        return StoreError(f"{relpath}: {exc.strerror}")
    try:
        whole = read_whole(fd)
    finally:
        os.close(fd)
    try:
        data = msgshare.parse(whole)
    except ValueError as exc:
        return StoreError(f"{relpath}: unreadable message: {exc}")
    return data if isinstance(data, dict) else StoreError(f"{relpath}: not a JSON object")
