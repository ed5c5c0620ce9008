"""rq-scan: the long-running loop that keeps queues and timers in line with their files.

One selector holds the inotify fd (pyinotify), a signal wake-up socket, the
pidfds of the enabler's ``systemctl`` runs, the pipe of the background
thread that delivers timer messages and each journal trigger's reader;
the loop sleeps until one of them is readable or the next timer is due —
no polling, and no waiting on another process.  An event only marks an
entry or timer file dirty; dirty ones are synced once events have settled
for ``SETTLE`` seconds (so a burst of edits, or ``mv -T tmp q`` over an entry,
is one change; a ``tmp`` link made inside the scandir is an entry of its own
if it lives longer than that).
inotify does not follow symlinks, so the directory each link points at is
watched too.  A full rescan runs at start, on SIGHUP and after an inotify
queue overflow.  A removed entry's queue is marked disabled, its daemon
stopped (running scripts are requeued by the daemon), then it moves to trash/.
What an entry means is :mod:`rqsys.scan.scandir`'s business; who serves a queue
is the enabler's (:mod:`rqsys.scan.enabler`).
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyinotify  # type: ignore[import-untyped]

from rqsys import config
from rqsys.background import Background
from rqsys.errors import ConfigError, RQError
from rqsys.observe.events import EventLog
from rqsys.scan import enabler, scandir
from rqsys.scan.watches import Settler, Watches
from rqsys.signals import STOP_SIGNALS, SignalFlags
from rqsys.special import SPECIAL_QUEUES, install_special_queues
from rqsys.store import QUEUE_NAME_RE, Layout
from rqsys.store.durable import write_file_durably
from rqsys.systemd import Notifier
from rqsys.timers import listing, periodic, slots, units
from rqsys.triggers import spec
from rqsys.triggers.files import KEY as TRIGGER
from rqsys.triggers.files import FileTriggers
from rqsys.triggers.journal import JournalTriggers

SLOT_STATE = listing.SLOT_STATE  # beside timer-state.json: calendar and cron timers


class Watcher:
    """The rq-scan program: inotify events in, queues and timer messages out."""

    def __init__(self, layout: Layout, scandir_path: Path, enable: enabler.Enabler,
                 log: EventLog, clock: Callable[[], float] = time.time) -> None:
        self.layout, self.scandir, self.enabler, self.log = layout, scandir_path, enable, log
        self.timer_dirs = [layout.timers, scandir_path / scandir.TIMERS_SUBDIR]
        self.sysconfig = config.load_system_config(layout)
        self.background = Background()  # timer deliveries: a hung destination holds no loop
        self.timers = periodic.TimerTable(layout.timer_state, self._send, log, clock,
                                        self.background.submit)
        self.slots = slots.SlotTable(layout.timer_state.with_name(SLOT_STATE), self._send_slot,
                                     log, clock, self.background.submit)
        if isinstance(enable, enabler.SystemdEnabler):  # calendar and cron: systemd timers
            self.slots.units = units.SystemdTimers(log, self._steps, enable.systemctl)
        self.watches = Watches(log, self._on_unwatched)
        self.settler = Settler()
        self.files = FileTriggers(layout, log, self.watches, self.background, self._on_target)
        self.selector = selectors.DefaultSelector()
        self.journals = JournalTriggers(layout, log, self.background, self.selector)
        self.notifier = Notifier()
        self.removing: set[str] = set()  # queues whose daemon is being stopped
        self.deferred: set[str] = set()  # entries re-added while their queue was removed
        self.rescan = self.check_removals = False

    # ---------------------------------------------------------------- set-up
    def start(self) -> None:
        self.layout.make_dirs()
        self._note_scandir()
        self.layout.socket_dir.mkdir(parents=True, exist_ok=True)
        self.signals = SignalFlags()
        self.selector.register(self.signals, selectors.EVENT_READ, self.signals.drain)
        self.selector.register(self.background, selectors.EVENT_READ,
                               lambda _key: self.background.run_finished())
        self.selector.register(self.watches, selectors.EVENT_READ, lambda _key: self.watches.read())
        if not self.scandir.is_dir():
            self.log.event("err", f"scandir {self.scandir} is not a directory; create it "
                           "and send SIGHUP")
        self._watch_fixed()
        self.watches.watch(self.layout.socket_dir, self._on_socket_dir, fixed=True)
        self._initial_sync()
        names = scandir.scandir_queues(self.layout)
        self._enable_at_start(names + self._special_queues())
        status = f"{len(names)} queues, {len(self.timers.timers) + len(self.slots.timers)} timers"
        self.log.event("daemon", f"rq-scan ready: {status}; watching {self.scandir}")
        self.notifier.ready(status)


    def _note_scandir(self) -> None:
        """Where the timer listings (the web's, rq's) find the scandir watched here."""
        note = self.layout.watched_note
        try:
            write_file_durably(note, f"{self.scandir}\n".encode())
        except OSError as exc:
            self.log.event("warning", f"{note} not written ({exc}): the timer listings "
                           f"read {self.layout.scandir}")
    def _watch_fixed(self) -> None:
        """The scandir and the timer directories (again after SIGHUP: they may be new)."""
        self.watches.watch(self.scandir, self._on_scandir, fixed=True)
        for tdir in self.timer_dirs:
            self.watches.watch(tdir, self._on_timer_dir, fixed=True)
        self.files.file_names()  # makes triggers/ if need be
        self.watches.watch(spec.triggers_dir(self.layout), self._on_trigger_dir, fixed=True)

    def _enable_at_start(self, names: list[str]) -> None:
        """Before the loop, waiting is right: READY=1 then means the queues are served."""
        pidfd = self.enabler.enable(names)
        if pidfd is not None:
            select.select([pidfd], [], [])
            os.close(pidfd)
            self.enabler.reap()

    def _initial_sync(self) -> None:
        """Removals a restart interrupted, then every entry and timer (all enabled after)."""
        for name in scandir.removals_pending(self.layout):
            self._begin_removal(name)
        self._full_rescan()
        self._sync_dirty(enable=False)
        self._finish_removals()
        self._sync_dirty(enable=False)  # entries re-added while their removal was pending
        self.timers.forget_missing()
        self.slots.forget_missing()

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

    def _on_trigger_dir(self, event: Any) -> None:
        if spec.trigger_name(event.name) is not None:
            self.settler.mark((TRIGGER, event.name))

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
        files = self.watches.keys("t") | {f"{n}.json" for n in [*self.timers.timers,
                                                                *self.slots.timers]}
        for tdir in self.timer_dirs:
            files |= set(scandir.entry_names(tdir))
        for fname in files:
            if scandir.is_entry_name(fname):
                self.settler.mark(("t", fname), changed=False)
        for fname in self.files.file_names() | self.journals.file_names():
            self.settler.mark((TRIGGER, fname), changed=False)
        self.files.rescan()

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
            elif kind == TRIGGER:
                self.files.sync(name)
                self.journals.sync(name)
            elif self._sync_entry(name, changed):
                new.append(name)
        if new and enable:
            self._wait_on(self.enabler.enable(new))

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
            self._wait_on(self.enabler.reload(name))
        return change is scandir.Change.NEW

    # ---------------------------------------------------------------- removal
    def _begin_removal(self, name: str) -> None:
        scandir.mark_removed(self.layout, name)
        self.log.event("daemon", f"queue {name}: scandir entry gone; stopping it, then "
                       "moving it to trash/")
        self._wait_on(self.enabler.disable(name))
        self.removing.add(name)
        self.check_removals = True

    def _wait_on(self, pidfd: int | None) -> None:
        """Hear of an enabler's helper process when it exits (not wait for it)."""
        if pidfd is not None:
            self.selector.register(pidfd, selectors.EVENT_READ, self._on_helper_done)

    def _on_helper_done(self, key: Any) -> None:
        self.selector.unregister(key.fd)
        os.close(key.fd)
        self.enabler.reap()
        self.check_removals = True

    def _finish_removals(self) -> None:
        self.check_removals = False
        for name in sorted(self.removing):
            if not self.enabler.stopped(name):
                continue
            self.removing.discard(name)
            dest = scandir.trash(self.layout, name)
            self.log.event("daemon", f"queue {name} moved to {dest}")
            if name in self.deferred:
                self.deferred.discard(name)
                self.settler.mark(("q", name))

    # ---------------------------------------------------------------- timers
    def _sync_timer(self, fname: str) -> None:
        name, path = periodic.timer_name(fname), periodic.first_file(self.timer_dirs, fname)
        if path is None:
            self.watches.unuse(("t", fname))
            if name is not None:
                self.timers.remove(name)
                self.slots.remove(name)
            return
        self.watches.use_link_target(("t", fname), path, None, self._on_target)
        try:
            timer = periodic.load_timer(path)
        except ConfigError as exc:
            kept = "; the previous one is kept" if name in self.timers.timers or \
                name in self.slots.timers else ""
            self.log.event("err", f"timer file refused: {exc}{kept}")
            return
        table, other = (self.slots, self.timers) if timer.spec else (self.timers, self.slots)
        if name in other.timers:
            other.remove(timer.name)
        if table.timers.get(timer.name) != timer:
            table.set(timer)

    def _send(self, timer: periodic.Timer, due: float) -> str:
        msg_id = periodic.deliver(self.layout, self.sysconfig, timer, due)
        listing.record(self.layout, timer, due or time.time(), msg_id)
        return msg_id

    def _steps(self, steps: list[list[str]], all_of: bool) -> None:
        assert isinstance(self.enabler, enabler.SystemdEnabler)
        self._wait_on(self.enabler.run_steps(steps, all_of))

    def _send_slot(self, timer: periodic.Timer, due: float, extra: dict[str, Any]) -> str:
        msg_id = periodic.deliver(self.layout, self.sysconfig, timer, due, extra)
        listing.record(self.layout, timer, extra["slot"], msg_id)
        return msg_id

    # ---------------------------------------------------------------- the loop
    def run(self) -> int:
        self.start()
        while not self.signals.pending & STOP_SIGNALS:
            for key, _mask in self.selector.select(self._timeout()):
                key.data(key)
            self._handle_flags()
            self._phases()
        self.notifier.stopping()
        self.background.close()
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
        self.slots.fire_due()
        self.files.turn()
        self.journals.turn()
        self.notifier.kick_watchdog(time.monotonic())

    def _timeout(self) -> float | None:
        waits = [self.settler.due_in(), self.notifier.watchdog_due(time.monotonic()),
                 self.files.next_wake(), self.journals.next_wake()]
        for table in (self.timers, self.slots):
            wake = table.next_wake()
            if wake is not None:
                waits.append(wake - table.clock())
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
