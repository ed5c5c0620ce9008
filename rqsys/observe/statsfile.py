"""Keeping a queue's statistics across daemon restarts: a snapshot and a journal.

Each counted event is appended to ``queue/<q>/stats.log`` as one JSON line
numbered ``n``, no fsync; a loop turn's lines go in one ``write(2)`` when
the turn ends (``flush``).  Every ``SAVE_INTERVAL`` the
loop renames the journal to ``stats.log.old`` (new lines go to a new one)
and hands a snapshot of the numbers (with the last line number it holds)
to the background ``files`` lane, which writes ``stats.json`` durably
(temp file, fsync, rename) and then removes ``stats.log.old``.  At start
the snapshot is read and the journals' lines numbered after it are applied
again.  So a counter never goes backwards when the daemon crashes, is
killed or restarts once the turn of its events has ended: every line
written is in the kernel.  A power cut can
lose the journal lines of the seconds before it (never the snapshot): then
counters may step back by those, which Prometheus' ``rate()`` reads as a
counter reset.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rqsys.background import Background
from rqsys.observe import stamps
from rqsys.observe.events import listening
from rqsys.observe.stats import ENDED, REQUEUED, QueueStats, observed
from rqsys.store import durable
from rqsys.store.room import Room

SNAPSHOT, JOURNAL, OLD = "stats.json", "stats.log", "stats.log.old"
SAVE_INTERVAL = 60.0  # seconds between snapshots (the journal is replayed from the last)
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps makes one a call
LANE = "stats"  # the background lane of the snapshots (not behind attachment hashing)


class StatsFile:
    """A ``QueueStats`` kept on disk; its ``sink`` is the daemon's EventLog sink."""

    def __init__(self, qdir: Path, stats: QueueStats, background: Background,
                 room: Room | None = None, say: Callable[[str], None] | None = None) -> None:
        self.qdir, self.stats, self.background = qdir, stats, background
        self.room = room or Room(str(qdir))  # a full file system: lines skipped, counted
        self.say = say  # logs the room's news (filled, cleared), once a turn
        self._fd = -1
        self._lines: list[str] = []  # this turn's, written by flush()
        self._saving = False
        self._lock = threading.Lock()  # a snapshot being written, and the one at stop
        self._closed = False
        self._next_save = time.monotonic() + SAVE_INTERVAL
        self.fsync_s: float | None = None  # how long the last snapshot's fsyncs took
        self.requeued: dict[str, float] = {}  # retried or resent since this start: when

    def load(self) -> None:
        """Read the snapshot, apply the journals after it, count this start."""
        try:
            self.stats.restore(json.loads((self.qdir / SNAPSHOT).read_bytes()))
        except (FileNotFoundError, ValueError):
            pass  # none yet (a torn one cannot be: it is renamed in whole)
        for name in (OLD, JOURNAL):
            for line in _lines(self.qdir / name):
                if line.get("n", 0) > self.stats.seq:
                    self.stats.apply(line)
        self._open()
        self._count({"k": "start", "t": round(time.time(), 3)})
        self.flush()
        if (self.qdir / OLD).exists():  # a crash mid-snapshot: save now, before a rotation
            self._write_snapshot()      # could replace the old journal (rare: no hurry)

    def _write_snapshot(self) -> None:
        data = json.dumps(self.stats.state(), separators=(",", ":")).encode()
        try:
            durable.write_file_durably(self.qdir / SNAPSHOT, data)
        except OSError:  # a full disk: the journals keep the lines, tried at the next save
            self.room.skip("stats")
            return
        (self.qdir / OLD).unlink(missing_ok=True)

    @listening(*QueueStats.kinds, *REQUEUED, "deleted")  # what ``observed`` counts, and
    def sink(self, kind: str, text: str, msg_id: str, fields: dict[str, Any]) -> None:
        """when a message went back to the que (its next wait starts there)."""
        now, enqueued = time.time(), None
        if kind in REQUEUED:
            self.requeued[msg_id] = now
        elif kind == "started":
            enqueued = self.requeued.pop(msg_id, None)
        elif kind in ("deleted", *ENDED):  # gone, or ended without starting again
            self.requeued.pop(msg_id, None)
        event = observed(kind, msg_id, fields, now, stamps.now()[0], enqueued)
        if event is not None:
            self._count(event)

    def _count(self, event: dict[str, Any]) -> None:
        self.stats.apply(event)
        self._lines.append(_line(event, self.stats.seq))

    def flush(self) -> None:
        """Append this turn's lines to the journal, in one write(2)."""
        if not self._lines:
            return
        data, self._lines = "".join(self._lines).encode(), []
        if self._fd >= 0:
            try:
                os.write(self._fd, data)
            except OSError:  # a full disk: the numbers in memory stay right until a restart
                self.room.skip("stats")
        else:
            self._open()  # none at start (a full disk): once there is room
            self.room.skip("stats")

    def tick(self, now: float) -> None:
        """Once a loop turn: the file system's room looked at (at most once
        a second, its news said), a snapshot started when one is due."""
        self.room.check(now)
        for line in self.room.take_news():
            if self.say is not None:
                self.say(line)
        if now >= self._next_save and not self._saving and not self.room.full:
            self._next_save = now + SAVE_INTERVAL
            self.save()

    def save(self) -> None:
        """Rotate the journal and write the snapshot off the loop."""
        if self._saving or not (self.qdir / JOURNAL).exists():
            return
        self._saving = True
        self.flush()  # the old journal holds every line the snapshot covers
        durable.rename(self.qdir / JOURNAL, self.qdir / OLD)  # the snapshot covers all of it
        self._open()
        data = json.dumps(self.stats.state(), separators=(",", ":")).encode()

        def work() -> float:
            with self._lock:
                if self._closed:  # the stop's snapshot is newer
                    return 0.0
                began = time.monotonic()
                durable.write_file_durably(self.qdir / SNAPSHOT, data)
                (self.qdir / OLD).unlink(missing_ok=True)
                return time.monotonic() - began

        def then(took: Any, error: BaseException | None) -> None:
            self._saving = False
            if error is None:
                self.fsync_s = took

        self.background.submit(work, then, LANE)

    def close(self) -> None:
        """At stop: the snapshot written now, on the loop (nothing else is left to do)."""
        self._lines.clear()  # the snapshot has them
        data = json.dumps(self.stats.state(), separators=(",", ":")).encode()
        with self._lock:  # waits for a snapshot being written, which then has none to write
            self._closed = True
            try:
                durable.write_file_durably(self.qdir / SNAPSHOT, data)
            except OSError:  # a full disk: the journals are replayed at the next start
                self.room.skip("stats")
            else:
                for name in (OLD, JOURNAL):
                    (self.qdir / name).unlink(missing_ok=True)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _open(self) -> None:
        """Open a new journal; none (-1) when the file system has no inode left."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            self._fd = os.open(self.qdir / JOURNAL, flags, 0o644)
        except OSError:
            self.room.skip("stats")


def _line(event: dict[str, Any], n: int) -> str:
    """A journal line, ``{"k":..,"t":..[,"v":..],"n":n}``, formatted as text
    when its values are plain numbers (the encoder cost more than the count)."""
    value, at = event.get("v"), event["t"]
    if type(at) is float and type(value) in _NUMBERS and len(event) == 2 + (value is not None):
        if value is None:
            return f'{{"k":"{event["k"]}","t":{stamps.text(at)},"n":{n}}}\n'
        if math.isfinite(value):
            return f'{{"k":"{event["k"]}","t":{stamps.text(at)},"v":{value!r},"n":{n}}}\n'
    return _ENCODE({**event, "n": n}) + "\n"


_NUMBERS = frozenset({float, int, type(None)})


def _lines(path: Path) -> list[dict[str, Any]]:
    """A journal's lines (a torn last one skipped)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for text in raw.splitlines():
        try:
            item = json.loads(text)
        except ValueError:
            continue
        if isinstance(item, dict) and "k" in item:
            out.append(item)
    return out
