"""Journal triggers in rq-scan: trigger files taken in, readers' fds in the loop, entries made jobs.

Each journal trigger of ``<root>/triggers/`` has a ``systemd.journal.Reader``
matching its fields, opened and read on the trigger's lane
(:mod:`rqsys.triggers.journalwork`); the loop only holds the reader's fd in
its selector.  When the fd is readable and no job of the trigger is queued
or running, the loop calls ``reader.process()`` and hands the trigger a job;
while one is, the fd is out of the selector (the reader is the lane's then,
and an unread fd would wake the loop for nothing).  A job says when it is
due again anyway: more entries than a batch, a folded message waiting for
the rate window, a journal not readable or a queue that cannot take a
message (every ``RETRY`` seconds).  Trigger files refused are logged by
:mod:`rqsys.triggers.files`, which reads the same files; a journal trigger's
PRIORITY range that is none is logged here.
"""

from __future__ import annotations

import os
import selectors
import time
from dataclasses import dataclass
from typing import Any

from rqsys import config
from rqsys.background import Background
from rqsys.errors import ConfigError, RQError
from rqsys.observe.events import EventLog
from rqsys.store import Layout
from rqsys.triggers import spec
from rqsys.triggers.journalwork import RETRY, JournalSpec, Result, Work, journal_spec

KIND = "journal"


def read(layout: Layout, name: str) -> tuple[spec.Trigger, Any]:
    """The trigger file checked against the schema, and its ``rate_limit``."""
    path = spec.path_of(layout, name)
    if not path.is_file():
        raise ConfigError(f"{path}: {'broken link' if path.is_symlink() else 'not a file'}")
    data = config.load_json(path)
    return spec.parse(name, data, str(path)), data.get("rate_limit")


def load(layout: Layout, name: str) -> JournalSpec | None:
    """The trigger file's JournalSpec; None when it is of another kind (RQError: refused)."""
    trigger, rate_limit = read(layout, name)
    return None if trigger.kind != KIND else checked(layout, trigger, rate_limit)


def checked(layout: Layout, trigger: spec.Trigger, rate_limit: Any) -> JournalSpec:
    """A journal trigger's JournalSpec; ConfigError naming the file for a range that is none."""
    try:
        return journal_spec(trigger, rate_limit)
    except ConfigError as exc:
        raise ConfigError(f"{spec.path_of(layout, trigger.name)}: journal: match: {exc}") from exc


@dataclass
class Followed:
    """One journal trigger on the loop: its work, its fd in the selector, when it is due."""

    js: JournalSpec
    work: Work
    fd: int | None = None  # registered in the selector
    due: bool = True  # a job is to run (at the start: what came while rq-scan was down)
    wake_at: float | None = None  # monotonic: due then

    def ready(self, now: float) -> bool:
        return not self.work.busy and (self.due or (self.wake_at is not None
                                                    and self.wake_at <= now))


class JournalTriggers:
    """Every journal trigger of the root, for rq-scan's loop."""

    def __init__(self, layout: Layout, log: EventLog, background: Background,
                 selector: selectors.BaseSelector) -> None:
        self.layout, self.log, self.background, self.selector = layout, log, background, selector
        self.triggers: dict[str, Followed] = {}
        self.works: dict[str, Work] = {}  # kept across edits of a trigger (its cursor, once)

    # ---------------------------------------------------------------- trigger files
    def file_names(self) -> set[str]:
        """The journal triggers' files (to notice one that went at a rescan)."""
        return {f"{name}.json" for name in self.triggers}

    def sync(self, fname: str) -> None:
        """Bring trigger file ``fname`` in: follow, change or drop its trigger."""
        name = spec.trigger_name(fname)
        if name is None:
            return
        if not os.path.lexists(spec.triggers_dir(self.layout) / fname):
            self._drop(name, "its file was removed")
            return
        try:
            trigger, rate_limit = read(self.layout, name)
        except RQError:
            return  # refused by the schema: rqsys.triggers.files says so
        if trigger.kind != KIND:
            self._drop(name, "it is of another kind now")
            return
        try:
            js = checked(self.layout, trigger, rate_limit)
        except ConfigError as exc:
            kept = "; the previous one is kept" if name in self.triggers else ""
            self.log.event("err", f"trigger file refused: {exc}{kept}")
            return
        self._set(js)

    def _set(self, js: JournalSpec) -> None:
        old = self.triggers.get(js.name)
        if old is not None and old.js == js:
            return
        if old is not None:
            self._unregister(old)
        work = self.works.setdefault(js.name, Work(self.layout, js.name))
        self.triggers[js.name] = Followed(js, work)
        self.log.event("daemon", f"trigger {js.name} {'changed' if old else 'added'}: "
                       f"journal {' '.join(js.terms)} to {js.dest}")

    def _drop(self, name: str, why: str) -> None:
        followed = self.triggers.pop(name, None)
        if followed is None:
            return
        self._unregister(followed)
        if not followed.work.busy:
            followed.work.close()  # else once its job is done
        self.log.event("daemon", f"trigger {name} removed: {why}")

    # ---------------------------------------------------------------- the fds
    def _register(self, followed: Followed, fd: int | None) -> None:
        if fd is not None and followed.fd is None:
            self.selector.register(fd, selectors.EVENT_READ, self._handler(followed))
            followed.fd = fd

    def _unregister(self, followed: Followed) -> None:
        if followed.fd is not None:
            self.selector.unregister(followed.fd)
            followed.fd = None

    def _handler(self, followed: Followed) -> Any:
        return lambda _key: self._on_ready(followed)

    def _on_ready(self, followed: Followed) -> None:
        if self.triggers.get(followed.js.name) is not followed or followed.work.busy:
            self._unregister(followed)
            return
        followed.work.process()
        followed.due = True

    # ---------------------------------------------------------------- jobs
    def turn(self) -> None:
        """The loop's phase: hand the due triggers to jobs."""
        now = time.monotonic()
        for followed in list(self.triggers.values()):
            if followed.ready(now):
                self._submit(followed)

    def next_wake(self) -> float | None:
        """Seconds until a trigger is due, if one will be."""
        now = time.monotonic()
        wakes = [0.0 if f.due or f.wake_at is None else max(0.0, f.wake_at - now)
                 for f in self.triggers.values()
                 if not f.work.busy and (f.due or f.wake_at is not None)]
        return min(wakes) if wakes else None

    def _submit(self, followed: Followed) -> None:
        self._unregister(followed)  # the reader is the lane's until the job is done
        followed.due, followed.wake_at = False, None
        work, js = followed.work, followed.js
        work.busy = True
        self.background.submit(lambda: work.run(js),
                               lambda result, error: self._done(followed, result, error),
                               f"trigger:{js.name}")

    def _done(self, followed: Followed, result: Result | None,
              error: BaseException | None) -> None:
        work, name = followed.work, followed.js.name
        work.busy = False
        if error is not None:
            if not isinstance(error, RQError | OSError):
                raise error
            self.log.event("err", f"trigger {name}: {error}; trying again in {RETRY:.0f} s")
            work.close()
            result = Result(wake_in=RETRY)
        assert result is not None
        for kind, text in result.lines:
            self.log.event(kind, text)
        if self.triggers.get(name) is not followed:
            if name not in self.triggers:
                work.close()  # dropped meanwhile (a changed trigger keeps its work)
            return
        self._register(followed, result.fd)
        if result.wake_in is not None:
            followed.wake_at = time.monotonic() + result.wake_in
