"""rq-scan: the long-running loop that keeps queues and timers in line with their files.

One selector holds the inotify fd (pyinotify), a signal wake-up socket and
the pidfds of ``systemctl disable`` runs; the loop sleeps until one of them
is readable or the next timer is due — no polling.  An event only marks an
entry or timer file dirty; dirty ones are synced once events have settled
for ``SETTLE`` seconds (so a burst of edits, or ``mv -T tmp q`` over an entry,
is one change; a ``tmp`` link made inside the scandir is an entry of its own
if it lives longer than that).
inotify does not follow symlinks, so the directory each link points at is
watched too.  A full rescan runs at start, on SIGHUP and after an inotify
queue overflow.  A removed entry's queue is marked disabled, its daemon
stopped (running scripts are requeued by the daemon), then it moves to trash/.
What an entry means is :mod:`rqsys.scandir`'s business; who serves a queue
is the enabler's (:mod:`rqsys.enabler`).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyinotify  # type: ignore[import-untyped]

from rqsys import config, enabler, scandir, timers
from rqsys.errors import ConfigError, RQError
from rqsys.events import EventLog
from rqsys.signals import STOP_SIGNALS, SignalFlags
from rqsys.special import SPECIAL_QUEUES, install_special_queues
from rqsys.store import QUEUE_NAME_RE, Layout
from rqsys.systemd import Notifier

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


class Watcher:
    """The rq-scan program: inotify events in, queues and timer messages out."""

    def __init__(self, layout: Layout, scandir_path: Path, enable: enabler.Enabler,
                 log: EventLog, clock: Callable[[], float] = time.time) -> None:
        self.layout, self.scandir, self.enabler, self.log = layout, scandir_path, enable, log
        self.timer_dirs = [layout.timers, scandir_path / scandir.TIMERS_SUBDIR]
        self.sysconfig = config.load_system_config(layout)
        self.timers = timers.TimerTable(layout.timer_state, self._send, log, clock)
        self.watches = Watches(log, self._on_unwatched)
        self.settler = Settler()
        self.selector = selectors.DefaultSelector()
        self.notifier = Notifier()
        self.removing: dict[str, int | None] = {}  # queue -> pidfd to wait on
        self.deferred: set[str] = set()  # entries re-added while their queue was removed
        self.rescan = self.check_removals = False

    # ---------------------------------------------------------------- set-up
    def start(self) -> None:
        self.layout.make_dirs()
        self.layout.socket_dir.mkdir(parents=True, exist_ok=True)
        self.signals = SignalFlags()
        self.selector.register(self.signals, selectors.EVENT_READ, self.signals.drain)
        self.selector.register(self.watches, selectors.EVENT_READ, lambda _key: self.watches.read())
        if not self.scandir.is_dir():
            self.log.event("err", f"scandir {self.scandir} is not a directory; create it "
                           "and send SIGHUP")
        self._watch_fixed()
        self.watches.watch(self.layout.socket_dir, self._on_socket_dir, fixed=True)
        self._initial_sync()
        names = scandir.scandir_queues(self.layout)
        self.enabler.enable(names + self._special_queues())
        status = f"{len(names)} queues, {len(self.timers.timers)} timers"
        self.log.event("daemon", f"rq-scan ready: {status}; watching {self.scandir}")
        self.notifier.ready(status)

    def _watch_fixed(self) -> None:
        """The scandir and the timer directories (again after SIGHUP: they may be new)."""
        self.watches.watch(self.scandir, self._on_scandir, fixed=True)
        for tdir in self.timer_dirs:
            self.watches.watch(tdir, self._on_timer_dir, fixed=True)

    def _initial_sync(self) -> None:
        """Removals a restart interrupted, then every entry and timer (all enabled after)."""
        for name in scandir.removals_pending(self.layout):
            self._begin_removal(name)
        self._full_rescan()
        self._sync_dirty(enable=False)
        self._finish_removals()
        self._sync_dirty(enable=False)  # entries re-added while their removal was pending
        self.timers.forget_missing()

    # ---------------------------------------------------------------- events
    def _on_scandir(self, event: Any) -> None:
        if event.name == scandir.TIMERS_SUBDIR:
            self._watch_fixed()
            self.rescan = True
        elif scandir.is_entry_name(event.name):
            self.settler.mark(("q", event.name))

    def _on_timer_dir(self, event: Any) -> None:
        if scandir.is_entry_name(event.name):
            self.settler.mark(("t", event.name))

    def _on_target(self, event: Any) -> None:
        for key in self.watches.keys_for(event):
            self.settler.mark(key)

    def _on_socket_dir(self, event: Any) -> None:
        if event.mask & pyinotify.IN_DELETE:
            self.check_removals = True

    def _on_unwatched(self, event: Any) -> None:
        if event.mask & pyinotify.IN_Q_OVERFLOW:
            self.log.event("err", "inotify queue overflowed; rescanning everything")
            self.rescan = True

    # ---------------------------------------------------------------- syncing
    def _full_rescan(self) -> None:
        names = set(scandir.entry_names(self.scandir)) | set(scandir.scandir_queues(self.layout))
        for name in names:
            self.settler.mark(("q", name), changed=False)
        files = self.watches.keys("t") | {f"{n}.json" for n in self.timers.timers}
        for tdir in self.timer_dirs:
            files |= set(scandir.entry_names(tdir))
        for fname in files:
            if scandir.is_entry_name(fname):
                self.settler.mark(("t", fname), changed=False)

    def _special_queues(self) -> list[str]:
        """Under systemd, relay, webhook and cleaner are created here when missing
        (embedded mode: the supervisor does it; with neither, nothing is served)."""
        if not isinstance(self.enabler, enabler.SystemdEnabler):
            return []
        for name in install_special_queues(self.layout):
            self.log.event("daemon", f"created the built-in {name} queue")
        return [n for n in SPECIAL_QUEUES if n in self.layout.queue_names()]

    def _sync_dirty(self, enable: bool = True) -> None:
        new = []
        for (kind, name), changed in sorted(self.settler.take().items()):
            if kind == "t":
                self._sync_timer(name)
            elif self._sync_entry(name, changed):
                new.append(name)
        if new and enable:
            self.enabler.enable(new)

    def _sync_entry(self, name: str, changed: bool) -> bool:
        """Bring queue ``name`` in line with its scandir entry; True if it is new."""
        if name in self.removing:
            self.deferred.add(name)  # install again once the old one is in trash/
            return False
        entry = self.scandir / name
        if not os.path.lexists(entry):
            self.watches.unuse(("q", name))
            if scandir.installed_from_scandir(self.layout, name):
                self._begin_removal(name)
            return False
        valid_name = bool(QUEUE_NAME_RE.match(name))
        self.watches.use_link_target(("q", name), entry, scandir.QUEUE_FILES if valid_name
                                     else None, self._on_target)
        try:
            return self._install(name, entry, changed)
        except (RQError, OSError) as exc:
            kept = " (the installed queue is kept as it was)" if valid_name and \
                self.layout.queue_dir(name).is_dir() else ""
            self.log.event("err", f"scandir entry {name!r}: no queue: {exc}{kept}")
            return False

    def _install(self, name: str, entry: Path, changed: bool) -> bool:
        change = scandir.apply_entry(self.layout, name, entry, changed)
        if change is scandir.Change.NEW:
            self.log.event("daemon", f"queue {name} created from {entry}")
        elif change is scandir.Change.UPDATED:
            self.log.event("daemon", f"queue {name} updated from {entry}; reloading it")
            self.enabler.reload(name)
        return change is scandir.Change.NEW

    # ---------------------------------------------------------------- removal
    def _begin_removal(self, name: str) -> None:
        scandir.mark_removed(self.layout, name)
        self.log.event("daemon", f"queue {name}: scandir entry gone; stopping it, then "
                       "moving it to trash/")
        pidfd = self.enabler.disable(name)
        if pidfd is not None:
            self.selector.register(pidfd, selectors.EVENT_READ, self._on_disable_done)
        self.removing[name] = pidfd
        self.check_removals = True

    def _on_disable_done(self, key: Any) -> None:
        self.selector.unregister(key.fd)
        self.check_removals = True

    def _finish_removals(self) -> None:
        self.check_removals = False
        for name, pidfd in list(self.removing.items()):
            if not self.enabler.stopped(name):
                continue
            if pidfd is not None:
                os.close(pidfd)
            del self.removing[name]
            dest = scandir.trash(self.layout, name)
            self.log.event("daemon", f"queue {name} moved to {dest}")
            if name in self.deferred:
                self.deferred.discard(name)
                self.settler.mark(("q", name))

    # ---------------------------------------------------------------- timers
    def _sync_timer(self, fname: str) -> None:
        name, path = timers.timer_name(fname), timers.first_file(self.timer_dirs, fname)
        if path is None:
            self.watches.unuse(("t", fname))
            if name is not None:
                self.timers.remove(name)
            return
        self.watches.use_link_target(("t", fname), path, None, self._on_target)
        try:
            timer = timers.load_timer(path)
        except ConfigError as exc:
            kept = "; the previous one is kept" if name in self.timers.timers else ""
            self.log.event("err", f"timer file refused: {exc}{kept}")
            return
        if self.timers.timers.get(timer.name) != timer:
            self.timers.set(timer)

    def _send(self, timer: timers.Timer, due: float) -> str:
        return timers.deliver(self.layout, self.sysconfig, timer, due)

    # ---------------------------------------------------------------- the loop
    def run(self) -> int:
        self.start()
        while not self.signals.pending & STOP_SIGNALS:
            for key, _mask in self.selector.select(self._timeout()):
                key.data(key)
            self._handle_flags()
            self._phases()
        self.notifier.stopping()
        self.log.event("daemon", "rq-scan stopping")
        return 0

    def _phases(self) -> None:
        """One turn's work after the events: rescan, sync, removals, timers, watchdog."""
        if self.rescan:
            self.rescan = False
            self._full_rescan()
        due = self.settler.due_in()
        if due is not None and due <= 0:
            self._sync_dirty()
        if self.check_removals:
            self._finish_removals()
        self.timers.fire_due()
        self.notifier.kick_watchdog(time.monotonic())

    def _timeout(self) -> float | None:
        waits = [self.settler.due_in(), self.notifier.watchdog_due(time.monotonic())]
        wake = self.timers.next_wake()
        if wake is not None:
            waits.append(wake - self.timers.clock())
        found = [w for w in waits if w is not None]
        return max(0.0, min(found)) if found else None

    def _handle_flags(self) -> None:
        if signal.SIGHUP in self.signals.pending:
            self.signals.pending.discard(signal.SIGHUP)
            self.log.event("daemon", "SIGHUP: rescanning the scandir and timers")
            self.sysconfig = config.load_system_config(self.layout)
            self.rescan = True
            self._watch_fixed()


def main(layout: Layout, scandir_path: Path) -> int:
    """``rqsys scan``: run rq-scan until SIGTERM."""
    log = EventLog("rq-scan")
    return Watcher(layout, scandir_path.absolute(), enabler.choose(layout, log), log).run()
