"""Files triggers in rq-scan: trigger files taken in, directories watched, events made jobs.

rq-scan watches ``<root>/triggers/`` as it watches ``timers/``; each files
trigger there (a file, or a link to one; one refused is logged and the
others carry on; an edited one is taken at once) gets an inotify watch on
its directory (and those below it when recursive) for ``IN_CLOSE_WRITE``
and ``IN_MOVED_TO``: a file written in place is seen when its writer closes
it, one renamed in when it arrives.  An event only adds the path to the
trigger's candidates; the loop hands them to a job on the trigger's lane
(:mod:`rqsys.triggers.filework`), so the loop waits on no daemon and no
disk.  A catch-up listing of the whole directory follows each watch made
(start, a changed trigger, a directory back) and each inotify overflow.  A
directory that is missing, unreadable or goes away is one log line, and a
new watch is tried every ``RETRY`` seconds until it works (then one line
more).  While messages made wait for their end, the job asks for their
states every ``POLL`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyinotify  # type: ignore[import-untyped]

from rqsys import config
from rqsys.background import Background
from rqsys.errors import ConfigError, RQError
from rqsys.observe.events import EventLog
from rqsys.scan.watches import Watches
from rqsys.store import Layout
from rqsys.triggers import spec
from rqsys.triggers.filework import FileSpec, Result, Work, file_spec, matches

RETRY = 5.0  # seconds between tries to watch a directory that is not there, or to re-send
POLL = 1.0  # seconds between asking for the states of the messages made
MASK = (pyinotify.IN_CLOSE_WRITE | pyinotify.IN_MOVED_TO | pyinotify.IN_CREATE
        | pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF | pyinotify.IN_ONLYDIR)
GONE = pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF | pyinotify.IN_UNMOUNT
KEY = "g"  # the settler's and watches' key kind of a trigger file (beside "q" and "t")


def load(layout: Layout, name: str) -> tuple[spec.Trigger, Any]:
    """The trigger file checked, and its ``then`` (which ``spec.Trigger`` does not keep)."""
    path = spec.path_of(layout, name)
    if not path.is_file():
        raise ConfigError(f"{path}: {'broken link' if path.is_symlink() else 'not a file'}")
    data = config.load_json(path)
    trigger = spec.parse(name, data, str(path))
    return trigger, data.get("then") if isinstance(data, dict) else None


@dataclass
class Watched:
    """One files trigger on the loop: its watch, its candidates, its job."""

    fs: FileSpec
    work: Work
    wd: int | None = None
    candidates: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)  # to list (fs.path among them: catch-up)
    later: dict[str, float] = field(default_factory=dict)  # path -> when to look again
    busy: bool = False
    retry_at: float | None = None  # monotonic: watch again
    poll_at: float | None = None
    failing: str = ""  # why the directory is not watched (said once)

    def due(self, now: float) -> bool:
        return not self.busy and bool(self.candidates or self.dirs or self._polled(now)
                                      or self._later(now))

    def _polled(self, now: float) -> bool:
        return self.poll_at is not None and self.poll_at <= now

    def _later(self, now: float) -> bool:
        return any(when <= now for when in self.later.values())

    def wake(self) -> float | None:
        """When this trigger has something to do next (monotonic), if ever."""
        if self.busy:
            return None
        if self.candidates or self.dirs:
            return 0.0
        times = [t for t in (self.retry_at, self.poll_at, min(self.later.values(), default=None))
                 if t is not None]
        return min(times, default=None)


class FileTriggers:
    """Every files trigger of the root, for rq-scan's loop."""

    def __init__(self, layout: Layout, log: EventLog, watches: Watches, background: Background,
                 mark: Callable[[Any], None]) -> None:
        self.layout, self.log, self.watches, self.background = layout, log, watches, background
        self.mark = mark  # the watcher's handler for a change of a link's target
        self.where = spec.triggers_dir(layout)
        self.triggers: dict[str, Watched] = {}
        self.works: dict[str, Work] = {}  # kept across edits of a trigger (its state, once)
        # a read lease (filework.being_written) taken while a writer opens the
        # file sends SIGIO, whose default action would end rq-scan
        signal.signal(signal.SIGIO, signal.SIG_IGN)

    # ---------------------------------------------------------------- trigger files
    def file_names(self) -> set[str]:
        """The trigger files there, and those known (to notice one that went)."""
        with contextlib.suppress(OSError):  # not there, none can be: no trigger
            self.where.mkdir(mode=0o755, exist_ok=True)
        known = {f"{name}.json" for name in self.triggers}
        return known | {f"{name}.json" for name in spec.names(self.layout)}

    def sync(self, fname: str) -> None:
        """Bring trigger file ``fname`` in: watch, change or drop its trigger."""
        name = spec.trigger_name(fname)
        if name is None:
            return
        path = self.where / fname
        if not os.path.lexists(path):
            self.watches.unuse((KEY, fname))
            self._drop(name, "its file was removed")
            return
        self.watches.use_link_target((KEY, fname), path, None, self.mark)
        try:
            trigger, then = load(self.layout, name)
        except RQError as exc:
            kept = "; the previous one is kept" if name in self.triggers else ""
            self.log.event("err", f"trigger file refused: {exc}{kept}")
            return
        if trigger.kind != "files":
            self._drop(name, f"it is a {trigger.kind} trigger now")
            return
        self._set(file_spec(trigger, then))

    def _set(self, fs: FileSpec) -> None:
        old = self.triggers.get(fs.name)
        if old is not None and old.fs == fs:
            return
        if old is not None:
            self._unwatch(old)
        work = self.works.setdefault(fs.name, Work(self.layout, fs.name))
        watched = Watched(fs, work)
        self.triggers[fs.name] = watched
        self.log.event("daemon", f"trigger {fs.name} {'changed' if old else 'added'}: files "
                       f"{fs.glob!r} in {fs.path} to {fs.dest}")
        self._watch(watched)

    def _drop(self, name: str, why: str) -> None:
        watched = self.triggers.pop(name, None)
        if watched is not None:
            self._unwatch(watched)
            self.log.event("daemon", f"trigger {name} removed: {why}")

    def rescan(self) -> None:
        """After an inotify overflow (or SIGHUP): list every directory again."""
        for watched in self.triggers.values():
            if watched.wd is not None:
                watched.dirs.add(watched.fs.path)

    # ---------------------------------------------------------------- watches
    def _watch(self, watched: Watched) -> None:
        """Watch the trigger's directory, then list it (the files already there)."""
        fs = watched.fs
        why = _unwatchable(fs.path)
        wd = None
        if not why:
            added = self.watches.wm.add_watch(fs.path, MASK, proc_fun=self._handler(watched),
                                              rec=fs.recursive, auto_add=fs.recursive,
                                              quiet=True)
            wd = added.get(fs.path)
            why = "" if wd is not None and wd >= 0 else "cannot watch it (inotify watches?)"
        if why:
            self._lost(watched, why)
            return
        watched.wd, watched.retry_at = wd, None
        if watched.failing:
            self.log.event("daemon", f"trigger {fs.name}: {fs.path} is watched again")
            watched.failing = ""
        watched.dirs.add(fs.path)

    def _handler(self, watched: Watched) -> Callable[[Any], None]:
        return lambda event: self._on_event(watched, event)

    def _lost(self, watched: Watched, why: str) -> None:
        """The directory is not watched: said once, tried again every RETRY seconds."""
        self._unwatch(watched)
        watched.retry_at = time.monotonic() + RETRY
        if watched.failing != why:
            watched.failing = why
            self.log.event("err", f"trigger {watched.fs.name}: {watched.fs.path}: {why}; "
                           f"trying again every {RETRY:.0f} s")

    def _unwatch(self, watched: Watched) -> None:
        if watched.wd is not None and self.watches.wm.get_path(watched.wd) is not None:
            self.watches.wm.rm_watch(watched.wd, rec=watched.fs.recursive, quiet=True)
        watched.wd = None

    def _on_event(self, watched: Watched, event: Any) -> None:
        if self.triggers.get(watched.fs.name) is not watched:
            return  # an event of a watch being replaced
        if event.mask & (GONE | pyinotify.IN_IGNORED):
            if event.wd == watched.wd:
                self._lost(watched, "the directory went away")
            return
        if event.mask & pyinotify.IN_ISDIR:
            if watched.fs.recursive and event.mask & (pyinotify.IN_CREATE
                                                      | pyinotify.IN_MOVED_TO):
                watched.dirs.add(event.pathname)  # what it holds already is listed
            return
        if event.mask & (pyinotify.IN_CLOSE_WRITE | pyinotify.IN_MOVED_TO) \
                and matches(watched.fs, event.name):
            watched.candidates.add(event.pathname)

    # ---------------------------------------------------------------- jobs
    def turn(self) -> None:
        """The loop's phase: watch again what is due, hand the due work to jobs."""
        now = time.monotonic()
        for watched in list(self.triggers.values()):
            if watched.retry_at is not None and watched.retry_at <= now:
                self._watch(watched)
            if watched.due(now):
                self._submit(watched, now)

    def next_wake(self) -> float | None:
        """Seconds until a trigger has something to do, if any has."""
        wakes = [w for w in (t.wake() for t in self.triggers.values()) if w is not None]
        return max(0.0, min(wakes) - time.monotonic()) if wakes else None

    def _submit(self, watched: Watched, now: float) -> None:
        paths = set(watched.candidates) | {p for p, t in watched.later.items() if t <= now}
        dirs = sorted(watched.dirs)
        poll = watched.poll_at is not None and watched.poll_at <= now
        watched.candidates.clear()
        watched.dirs.clear()
        watched.later = {p: t for p, t in watched.later.items() if t > now}
        watched.busy = True
        fs, work = watched.fs, watched.work
        self.background.submit(lambda: work.run(fs, sorted(paths), dirs, poll),
                               lambda result, error: self._done(watched, result, error),
                               f"trigger:{fs.name}")

    def _done(self, watched: Watched, result: Result | None, error: BaseException | None) -> None:
        watched.busy = False
        if error is not None:
            if not isinstance(error, RQError | OSError):
                raise error
            self.log.event("err", f"trigger {watched.fs.name}: {error}; trying again in "
                           f"{RETRY:.0f} s")
            watched.retry_at = time.monotonic() + RETRY
            return
        assert result is not None
        for kind, text in result.lines:
            self.log.event(kind, text)
        now = time.monotonic()
        for path in result.again:
            watched.later.setdefault(path, now + RETRY)
        watched.poll_at = now + POLL if result.pending else None
        if result.dir_error and self.triggers.get(watched.fs.name) is watched:
            self._lost(watched, result.dir_error)


def _unwatchable(path: str) -> str:
    """Why directory ``path`` cannot be watched and listed ("" when it can)."""
    if not os.path.isdir(path):
        return "no such directory" if not os.path.lexists(path) else "not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "not readable"
    return ""
