"""rq-scan: the long-running watcher of the scandir and the timer files.

One selector loop holds the inotify fd (pyinotify), a signal wake-up socket
and the pidfds of ``systemctl disable`` runs; it sleeps until one of them is
readable or the next timer is due — no polling.  An event only marks an
entry or timer file dirty; dirty ones are synced once events have settled
for ``SETTLE`` seconds (so ``ln -sfn new tmp && mv -T tmp q`` is one change).
inotify does not follow symlinks, so the directory each link points at is
watched too.  A full reconcile runs at start, on SIGHUP and after an inotify
queue overflow.  A removed entry's queue is marked disabled, its daemon
stopped (running scripts are requeued by the daemon), then it moves to trash/.
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

from rqsys import config, enabler, scan, timers
from rqsys.errors import ConfigError, RQError
from rqsys.events import EventLog
from rqsys.signals import STOP_SIGNALS, SignalFlags
from rqsys.special import SPECIAL_QUEUES, install_special_queues
from rqsys.store import DISABLED_MARK, QUEUE_NAME_RE, Layout
from rqsys.systemd import Notifier

SETTLE, SETTLE_MAX = 0.02, 0.5  # seconds of quiet before syncing; longest wait
DIR_MASK = (pyinotify.IN_CREATE | pyinotify.IN_DELETE | pyinotify.IN_MOVED_FROM
            | pyinotify.IN_MOVED_TO | pyinotify.IN_ATTRIB | pyinotify.IN_CLOSE_WRITE
            | pyinotify.IN_DELETE_SELF | pyinotify.IN_MOVE_SELF)
QUEUE_FILES = frozenset({"run", "config.json", "form.json"})
TIMERS_SUBDIR = ".timers"  # <scandir>/.timers holds timers shipped with the scripts

Key = tuple[str, str]  # ("q", entry name) or ("t", timer file name)


class Scanner:
    """The rq-scan program: inotify events in, queues and timer messages out."""

    def __init__(self, layout: Layout, scandir: Path, enable: enabler.Enabler,
                 log: EventLog, clock: Callable[[], float] = time.time) -> None:
        self.layout, self.scandir, self.enabler, self.log = layout, scandir, enable, log
        self.timer_dirs = [layout.timers, scandir / TIMERS_SUBDIR]
        self.sysconfig = config.load_system_config(layout)
        self.timers = timers.TimerTable(layout.timer_state, self._send, log, clock)
        # pyinotify logs an ERROR when a watched directory moves out of sight; we
        # track watches by descriptor, not path, so that is expected here.
        pyinotify.log.setLevel(logging.CRITICAL)
        self.wm = pyinotify.WatchManager()
        self.inotify = pyinotify.Notifier(self.wm, default_proc_fun=self._on_unwatched)
        self.selector = selectors.DefaultSelector()
        self.notifier = Notifier()
        self.users: dict[str, set[Key]] = {}  # watched target dir -> keys depending on it
        self.uses: dict[Key, tuple[str, frozenset[str]]] = {}  # key -> (dir, names in it)
        self.wd_target: dict[int, str] = {}  # watch descriptor -> target dir it was added for
        self.dirty: dict[Key, bool] = {}  # key -> changed by an event (reload even if same)
        self.settle: tuple[float, float] | None = None  # (first event, last event)
        self.removing: dict[str, int | None] = {}  # queue -> pidfd to wait on
        self.deferred: set[str] = set()  # entries re-added while their queue was removed
        self.rescan = self.check_removals = False

    # ---------------------------------------------------------------- set-up
    def start(self) -> None:
        self.layout.make_dirs()
        self.layout.socket_dir.mkdir(parents=True, exist_ok=True)
        self._install_signals()
        self.selector.register(self.wm.get_fd(), selectors.EVENT_READ, self._read_inotify)
        if not self.scandir.is_dir():
            self.log.event("err", f"scandir {self.scandir} is not a directory; create it "
                           "and send SIGHUP")
        self._watch(self.scandir, self._on_scandir)
        self._watch_timer_dirs()
        self._watch(self.layout.socket_dir, self._on_socket_dir)
        self._resume_removals()
        self._full_rescan()
        self._sync_dirty(enable=False)  # all of them are enabled below
        self._finish_removals()
        self._sync_dirty(enable=False)  # entries re-added while their removal was pending
        self.timers.forget_missing()
        names = self._scandir_queues()
        self.enabler.enable(names + self._special_queues())
        status = f"{len(names)} queues, {len(self.timers.timers)} timers"
        self.log.event("daemon", f"rq-scan ready: {status}; watching {self.scandir}")
        self.notifier.ready(status)

    def _resume_removals(self) -> None:
        """Removals interrupted by a restart: their queues still carry DISABLED_MARK."""
        for qdir in self.layout.queues.iterdir() if self.layout.queues.is_dir() else []:
            if QUEUE_NAME_RE.match(qdir.name) and (qdir / DISABLED_MARK).exists():
                self._begin_removal(qdir.name)

    def _install_signals(self) -> None:
        self.signals = SignalFlags()
        self.selector.register(self.signals, selectors.EVENT_READ, self.signals.drain)

    # ---------------------------------------------------------------- watches
    def _watch(self, path: Path | str, handler: Callable[[Any], None]) -> int | None:
        """Watch directory ``path`` (once); its watch descriptor, None if it is no dir."""
        wd = self.wm.get_wd(str(path))
        if wd is None and os.path.isdir(path):
            wd = self.wm.add_watch(str(path), DIR_MASK, proc_fun=handler,
                                   quiet=True).get(str(path))
            if wd is None or wd < 0:
                self.log.event("err", f"cannot watch {path}: changes there go unseen until "
                               "SIGHUP (raise fs.inotify.max_user_watches?)")
        return wd if wd is not None and wd >= 0 else None

    def _unwatch(self, target: str) -> None:
        for wd in [wd for wd, path in self.wd_target.items() if path == target]:
            del self.wd_target[wd]
            self.wm.rm_watch(wd, quiet=True)

    def _watch_timer_dirs(self) -> None:
        for tdir in self.timer_dirs:
            self._watch(tdir, self._on_timer_dir)

    def _use(self, key: Key, target: str | None, names: frozenset[str] = frozenset()) -> None:
        """Watch directory ``target`` for changes of ``names`` in it on behalf of ``key``."""
        if self.uses.get(key, ("", names))[0] != target:
            self._unuse(key)
        if target is None:
            return
        self.uses[key] = (target, names)
        self.users.setdefault(target, set()).add(key)
        wd = self._watch(target, self._on_target)  # again if the directory was re-created
        if wd is not None:
            self.wd_target[wd] = target  # a moved directory keeps its wd, not its path

    def _use_link_target(self, key: Key, link: Path) -> None:
        """Watch what ``link`` points at: the directory, or where it would appear."""
        real = os.path.realpath(link)
        if key[0] == "q" and os.path.isdir(real):
            self._use(key, real, QUEUE_FILES)
        elif link.is_symlink():
            self._use(key, os.path.dirname(real), frozenset({os.path.basename(real)}))
        else:
            self._use(key, None)

    def _unuse(self, key: Key) -> None:
        target, _names = self.uses.pop(key, (None, frozenset()))
        if target is None:
            return
        self.users[target].discard(key)
        if not self.users[target]:
            del self.users[target]
            if target not in map(str, [self.scandir, *self.timer_dirs, self.layout.socket_dir]):
                self._unwatch(target)

    # ---------------------------------------------------------------- events
    def _read_inotify(self, _key: Any) -> None:
        self.inotify.read_events()
        self.inotify.process_events()

    def _mark(self, key: Key, changed: bool = True) -> None:
        self.dirty[key] = self.dirty.get(key, False) or changed
        now = time.monotonic()
        self.settle = (self.settle[0] if self.settle else now, now)

    def _on_scandir(self, event: Any) -> None:
        if event.name == TIMERS_SUBDIR:
            self._watch_timer_dirs()
            self.rescan = True
        elif event.name and not event.name.startswith("."):
            self._mark(("q", event.name))

    def _on_timer_dir(self, event: Any) -> None:
        if event.name and not event.name.startswith("."):
            self._mark(("t", event.name))

    def _on_target(self, event: Any) -> None:
        target = self.wd_target.get(event.wd, event.path)
        for key in self.users.get(target, set()).copy():
            names = self.uses[key][1]
            if not event.name or event.name in names:
                self._mark(key)

    def _on_socket_dir(self, event: Any) -> None:
        if event.mask & pyinotify.IN_DELETE:
            self.check_removals = True

    def _on_unwatched(self, event: Any) -> None:
        if event.mask & pyinotify.IN_Q_OVERFLOW:
            self.log.event("err", "inotify queue overflowed; rescanning everything")
            self.rescan = True

    # ---------------------------------------------------------------- syncing
    def _full_rescan(self) -> None:
        names = {p.name for p in self.scandir.iterdir()} if self.scandir.is_dir() else set()
        names |= set(self._scandir_queues())
        for name in names:
            if not name.startswith("."):
                self._mark(("q", name), changed=False)
        files = {k[1] for k in self.uses if k[0] == "t"}
        files |= {f"{n}.json" for n in self.timers.timers}
        for tdir in self.timer_dirs:
            files |= {p.name for p in tdir.iterdir()} if tdir.is_dir() else set()
        for fname in files:
            if not fname.startswith("."):
                self._mark(("t", fname), changed=False)

    def _special_queues(self) -> list[str]:
        """Under systemd, relay, webhook and cleaner are created here when missing
        (embedded mode: the supervisor does it; with neither, nothing is served)."""
        if not isinstance(self.enabler, enabler.SystemdEnabler):
            return []
        for name in install_special_queues(self.layout):
            self.log.event("daemon", f"created the built-in {name} queue")
        return [n for n in SPECIAL_QUEUES if n in self.layout.queue_names()]

    def _scandir_queues(self) -> list[str]:
        return [n for n in self.layout.queue_names() if scan.installed_from_scandir(self.layout, n)]

    def _settled(self) -> bool:
        if self.settle is None:
            return False
        first, last = self.settle
        now = time.monotonic()
        return now - last >= SETTLE or now - first >= SETTLE_MAX

    def _sync_dirty(self, enable: bool = True) -> None:
        dirty, self.dirty, self.settle = self.dirty, {}, None
        new = []
        for (kind, name), changed in sorted(dirty.items()):
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
            self._unuse(("q", name))
            if scan.installed_from_scandir(self.layout, name):
                self._begin_removal(name)
            return False
        valid_name = bool(QUEUE_NAME_RE.match(name))
        self._use_link_target(("q", name), entry) if valid_name else self._use(("q", name), None)
        try:
            return self._install(name, entry, changed)
        except (RQError, OSError) as exc:
            kept = " (the installed queue is kept as it was)" if valid_name and \
                self.layout.queue_dir(name).is_dir() else ""
            self.log.event("err", f"scandir entry {name!r}: no queue: {exc}{kept}")
            return False

    def _install(self, name: str, entry: Path, changed: bool) -> bool:
        before = scan.installed_state(self.layout, name)
        is_new = before[0] is None
        scan.install_from_scandir(self.layout, name, entry)
        if is_new:
            self.log.event("daemon", f"queue {name} created from {entry}")
            return True
        if changed or scan.installed_state(self.layout, name) != before:
            self.log.event("daemon", f"queue {name} updated from {entry}; reloading it")
            self.enabler.reload(name)
        return False

    # ---------------------------------------------------------------- removal
    def _begin_removal(self, name: str) -> None:
        if not (self.layout.queue_dir(name) / DISABLED_MARK).exists():
            self.layout.mark_queue(name, DISABLED_MARK, "scandir entry removed\n")
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
            dest = self.layout.trash_queue(name)
            self.log.event("daemon", f"queue {name} moved to {dest}")
            if name in self.deferred:
                self.deferred.discard(name)
                self._mark(("q", name))

    # ---------------------------------------------------------------- timers
    def _timer_file(self, fname: str) -> Path | None:
        """The first timer directory's file called ``fname``, if any."""
        return next((d / fname for d in self.timer_dirs if os.path.lexists(d / fname)), None)

    def _sync_timer(self, fname: str) -> None:
        name, path = timers.timer_name(fname), self._timer_file(fname)
        if path is None:
            self._unuse(("t", fname))
            if name is not None:
                self.timers.remove(name)
            return
        self._use_link_target(("t", fname), path)
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
            if self.rescan:
                self.rescan = False
                self._full_rescan()
            if self._settled():
                self._sync_dirty()
            if self.check_removals:
                self._finish_removals()
            self.timers.fire_due()
            self.notifier.kick_watchdog(time.monotonic())
        self.notifier.stopping()
        self.log.event("daemon", "rq-scan stopping")
        return 0

    def _timeout(self) -> float | None:
        waits = []
        if self.settle is not None:
            first, last = self.settle
            waits.append(min(last + SETTLE, first + SETTLE_MAX) - time.monotonic())
        wake = self.timers.next_wake()
        if wake is not None:
            waits.append(wake - self.timers.clock())
        watchdog = self.notifier.watchdog_due(time.monotonic())
        if watchdog is not None:
            waits.append(watchdog)
        return max(0.0, min(waits)) if waits else None

    def _handle_flags(self) -> None:
        if signal.SIGHUP in self.signals.pending:
            self.signals.pending.discard(signal.SIGHUP)
            self.log.event("daemon", "SIGHUP: rescanning the scandir and timers")
            self.sysconfig = config.load_system_config(self.layout)
            self.rescan = True
            self._watch(self.scandir, self._on_scandir)
            self._watch_timer_dirs()


def main(layout: Layout, scandir: Path) -> int:
    """``rqsys scan``: run rq-scan until SIGTERM."""
    log = EventLog("rq-scan")
    return Scanner(layout, scandir.absolute(), enabler.choose(layout, log), log).run()
