"""inotify bookkeeping for rq-scan: which directories are watched for whom, and when to sync.

inotify does not follow symlinks, so besides the scandir and the timer
directories, the directory each link points at is watched on behalf of the
entries (or timer files) that use it, and dropped when none does.  An
event only marks its key dirty; :class:`Settler` says when the dirty keys
have been quiet long enough to sync.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyinotify  # type: ignore[import-untyped]

from rqsys.observe.events import EventLog

SETTLE, SETTLE_MAX = 0.02, 0.5  # seconds of quiet before syncing; longest wait
DIR_MASK = (pyinotify.IN_CREATE | pyinotify.IN_DELETE | pyinotify.IN_MOVED_FROM
            | pyinotify.IN_MOVED_TO | pyinotify.IN_ATTRIB | pyinotify.IN_CLOSE_WRITE
            | pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF)

Key = tuple[str, str]  # ("q", entry name) or ("t", timer file name)
Handler = Callable[[Any], None]


class Watches:
    """inotify watches on the directories that entries and timer links point at."""

    def __init__(self, log: EventLog, default: Handler) -> None:
        # pyinotify logs an ERROR when a watched directory moves out of sight; we
        # track watches by descriptor, not path, so that is expected here.
        pyinotify.log.setLevel(logging.CRITICAL)
        self.log = log
        self.wm = pyinotify.WatchManager()
        self.inotify = pyinotify.Notifier(self.wm, default_proc_fun=default)
        self.fixed: set[str] = set()  # directories watched for themselves, never dropped
        self.users: dict[str, set[Key]] = {}  # watched target dir -> keys depending on it
        self.uses: dict[Key, tuple[str, frozenset[str]]] = {}  # key -> (dir, names in it)
        self.wd_target: dict[int, str] = {}  # watch descriptor -> target dir it was added for

    def fileno(self) -> int:
        return int(self.wm.get_fd())

    def read(self) -> None:
        """Read the pending events and run their handlers."""
        self.inotify.read_events()
        self.inotify.process_events()

    def watch(self, path: Path | str, handler: Handler, fixed: bool = False) -> int | None:
        """Watch directory ``path`` (once); its watch descriptor, None if it is no dir."""
        if fixed:
            self.fixed.add(str(path))
        wd = self.wm.get_wd(str(path))
        if wd is None and os.path.isdir(path):
            wd = self.wm.add_watch(str(path), DIR_MASK, proc_fun=handler,
                                   quiet=True).get(str(path))
            if wd is None or wd < 0:
                self.log.event("err", f"cannot watch {path}: changes there go unseen until "
                               "SIGHUP (raise fs.inotify.max_user_watches?)")
        return wd if wd is not None and wd >= 0 else None

    def use(self, key: Key, target: str | None, names: frozenset[str], handler: Handler) -> None:
        """Watch directory ``target`` for changes of ``names`` in it on behalf of ``key``."""
        if self.uses.get(key, ("", names))[0] != target:
            self.unuse(key)
        if target is None:
            return
        self.uses[key] = (target, names)
        self.users.setdefault(target, set()).add(key)
        wd = self.watch(target, handler)  # again if the directory was re-created
        if wd is not None:
            self.wd_target[wd] = target  # a moved directory keeps its wd, not its path

    def use_link_target(self, key: Key, link: Path, dir_names: frozenset[str] | None,
                        handler: Handler) -> None:
        """Watch what ``link`` points at: a directory holding ``dir_names``, or
        (``dir_names`` None, or no directory there) the name where it would appear."""
        real = os.path.realpath(link)
        if dir_names is not None and os.path.isdir(real):
            self.use(key, real, dir_names, handler)
        elif link.is_symlink():
            self.use(key, os.path.dirname(real), frozenset({os.path.basename(real)}), handler)
        else:
            self.unuse(key)

    def unuse(self, key: Key) -> None:
        target, _names = self.uses.pop(key, (None, frozenset()))
        if target is None:
            return
        self.users[target].discard(key)
        if not self.users[target]:
            del self.users[target]
            if target not in self.fixed:
                self._unwatch(target)

    def _unwatch(self, target: str) -> None:
        for wd in [wd for wd, path in self.wd_target.items() if path == target]:
            del self.wd_target[wd]
            self.wm.rm_watch(wd, quiet=True)

    def keys_for(self, event: Any) -> list[Key]:
        """The keys a change in a watched target directory concerns."""
        target = self.wd_target.get(event.wd, event.path)
        return [key for key in self.users.get(target, set())
                if not event.name or event.name in self.uses[key][1]]

    def keys(self, kind: str) -> set[str]:
        return {name for k, name in self.uses if k == kind}


class Settler:
    """Dirty keys, synced once events have been quiet for SETTLE (at most SETTLE_MAX)."""

    def __init__(self) -> None:
        self.dirty: dict[Key, bool] = {}  # key -> changed by an event (reload even if same)
        self.span: tuple[float, float] | None = None  # (first event, last event)

    def mark(self, key: Key, changed: bool = True) -> None:
        self.dirty[key] = self.dirty.get(key, False) or changed
        now = time.monotonic()
        self.span = (self.span[0] if self.span else now, now)

    def due_in(self) -> float | None:
        """Seconds until the dirty keys are due (None: nothing is dirty)."""
        if self.span is None:
            return None
        first, last = self.span
        return min(last + SETTLE, first + SETTLE_MAX) - time.monotonic()

    def take(self) -> dict[Key, bool]:
        dirty, self.dirty, self.span = self.dirty, {}, None
        return dirty
