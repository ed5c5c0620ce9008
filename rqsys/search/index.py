"""The search index of one queue: an SQLite file of its messages' states, times
and text, kept up to date by a thread of the queue daemon from its events.

The store is authoritative; the index (``<queue dir>/search.sqlite``) is a
copy made for searching 1,000,000 messages without walking them.  The
daemon's ``EventLog`` feeds :class:`SearchIndex` (a sink) every event; the
sink only keeps it, and a loop turn's events are put on a queue together
(``flush``), so the loop never waits on SQLite or the disk.
One thread takes the events in batches (one transaction each) and reads what
an event does not tell (a new message's params and tags) from its directory.

At each daemon start the thread first *reconciles* the index with the store
(lists every state directory, adds the messages it lacks, drops the ones
gone, fixes states), so a missing, old or damaged file is rebuilt; the same
happens after a prune (its event names no message).  Until then searches are
answered from what the index has, marked ``partial``.  Nothing is fsynced:
losing the last lines in a crash costs a reconcile, not a message.  At a
stop the thread writes what is left and closes the file (SQLite folds its
``-wal`` back in); a file removed by hand is made again from nothing, its
``-wal`` and ``-shm`` removed first (SQLite would replay that old log into
the new file, and the thread never came to the reconcile).

A batch or reconcile that fails (a full disk, an I/O error) is rolled back and
counted (``failed``, ``error``, in the daemon's ``stats``); the index is then
*behind*: searches answer ``partial``, and every HEAL_WAIT seconds the thread
reconciles again, re-reading the messages whose events were lost, until it
succeeds.

A reconcile that reads messages from disk rests between its reads while
messages run (``busy``), RECONCILE_REST times as long as it read: the thread
holds the GIL the loop needs for every start and end (10,000 rows read at a
start held a drain to half its rate for five seconds).
"""

from __future__ import annotations

import ctypes
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rqsys.search import fold
from rqsys.search.reconcile import reconcile
from rqsys.search.rows import BATCH, ENDS, STATE_OF, Event, roll_back
from rqsys.store import QueueView

FILE = "search.sqlite"
GATHER = 0.05  # seconds a burst of events has to join one transaction
GATHER_BUSY = 0.5  # at most this long while events keep coming (a busy queue)
STOP_WAIT = 2.0  # seconds the daemon's stop waits for the thread's last batch
HEAL_WAIT = 5.0  # seconds between tries to mend an index a failed write left behind
RECONCILE_REST = 3.0  # while messages run, a reconcile reads a quarter of the time
BACKLOG_MAX = 100_000  # events handed to the thread and not taken yet, at most (some 30 MB)
LEFTOVERS = ("-wal", "-shm")  # SQLite's files beside the index
VERSION = 2  # the index's schema (PRAGMA user_version); an older file is made again
SCHEMA = """
PRAGMA journal_mode=WAL;
PRAGMA synchronous=OFF;
CREATE TABLE IF NOT EXISTS msgs(id TEXT UNIQUE NOT NULL, state TEXT NOT NULL,
  created REAL, started REAL, ended REAL, run_s REAL, status TEXT DEFAULT '',
  params TEXT DEFAULT '', tags TEXT DEFAULT '', text TEXT DEFAULT '',
  p1 TEXT DEFAULT '', p2 TEXT DEFAULT '', p3 TEXT DEFAULT '', p4 TEXT DEFAULT '',
  priority INTEGER DEFAULT 0);
CREATE INDEX IF NOT EXISTS msgs_state ON msgs(state);
CREATE INDEX IF NOT EXISTS msgs_created ON msgs(state, created);
CREATE INDEX IF NOT EXISTS msgs_started ON msgs(state, started);
CREATE INDEX IF NOT EXISTS msgs_ended ON msgs(state, ended);
CREATE INDEX IF NOT EXISTS msgs_run ON msgs(state, run_s);
CREATE INDEX IF NOT EXISTS msgs_wait ON msgs(state, (started - created));
CREATE TABLE IF NOT EXISTS msg_tags(tag TEXT NOT NULL, rid INTEGER NOT NULL,
  PRIMARY KEY(tag, rid)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS msg_tags_rid ON msg_tags(rid);
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(text, content='msgs', content_rowid='rowid');
CREATE TRIGGER IF NOT EXISTS msgs_ai AFTER INSERT ON msgs BEGIN
  INSERT INTO fts(rowid, text) VALUES (new.rowid, new.text); END;
CREATE TRIGGER IF NOT EXISTS msgs_ad AFTER DELETE ON msgs BEGIN
  INSERT INTO fts(fts, rowid, text) VALUES ('delete', old.rowid, old.text);
  DELETE FROM msg_tags WHERE rid = old.rowid; END;
CREATE TRIGGER IF NOT EXISTS msgs_au AFTER UPDATE OF text ON msgs BEGIN
  INSERT INTO fts(fts, rowid, text) VALUES ('delete', old.rowid, old.text);
  INSERT INTO fts(rowid, text) VALUES (new.rowid, new.text); END;
"""
# ``paramN:V`` looked up, not scanned (285 ms at a million rows; 0.3 ms so).  Made
# by the thread before its reconcile, not in SCHEMA: an index an older rqsys
# made gets them (some 2 s a million rows) without holding up the daemon's start
PARAM_INDEXES = "".join(f"CREATE INDEX IF NOT EXISTS msgs_p{n} ON msgs(p{n});\n"
                        for n in range(1, 5))
Lookup = Callable[[str], "dict[str, Any] | None"]


def connect(path: Path) -> sqlite3.Connection:
    """A connection with the schema in place (made if missing, made again from
    nothing when an older rqsys made it): the index's own (searches use
    :func:`open_reader`).  The reconcile that follows fills it from the store."""
    db = open_reader(path)
    old = db.execute("PRAGMA user_version").fetchone()[0]
    made = db.execute("SELECT 1 FROM sqlite_master WHERE name='msgs'").fetchone()
    if made and old < VERSION:
        db.close()
        for suffix in ("", *LEFTOVERS):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        db = open_reader(path)
    db.executescript(SCHEMA)
    db.execute(f"PRAGMA user_version={VERSION}")
    return db


def open_reader(path: Path) -> sqlite3.Connection:
    """A connection to the index as it is (WAL: reading never waits on the thread)."""
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout=10000")
    # statement journals (every INSERT or UPDATE that fires the full-text
    # triggers) in memory: on disk they were a temp file in /var/tmp written
    # three times a create, more system calls than the rest of the index
    db.execute("PRAGMA temp_store=MEMORY")
    return db


def drop_leftovers(path: Path) -> None:
    """Without the index file, its ``-wal`` and ``-shm`` belong to nothing."""
    if not path.exists():
        for suffix in LEFTOVERS:
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def name_thread(name: bytes) -> None:
    """Give this thread its name in /proc (``top -H``, bench/bench_drain.py's
    CPU of the index thread); Python 3.11 names only its own Thread object."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, name, 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass  # not Linux: the name is only a convenience


class SearchIndex:
    """The EventLog sink and its thread that keep ``search.sqlite`` up to date."""

    # the events ``rows.apply`` (and the fold) act on: a status line or a timeout is not
    kinds = frozenset({"deleted", "created", "exit", *ENDS, *STATE_OF})

    def __init__(self, view: QueueView, queued: Lookup | None = None,
                 busy: Callable[[], bool] = lambda: False) -> None:
        self.view = view
        self.queued = queued  # msg id -> the message in que (the loop's Schedule), or None
        self.busy = busy  # whether messages run (read from this thread: one len())
        self.path = view.qdir / FILE
        self.todo: queue.SimpleQueue[list[Event] | set[str] | None] = queue.SimpleQueue()
        self._handed = 0  # events put on todo (the loop's count)
        self._taken = 0  # events taken from it (the thread's count)
        self._passed: set[str] = set()  # ids whose events were not handed over (backlog)
        self._turn: list[Event] = []  # this loop turn's events, handed over by flush()
        self.ready = threading.Event()  # the first reconcile has ended
        self.failed = 0  # batches or rebuilds that raised (the index is a copy)
        self.error = ""  # the last one's reason
        self.behind = False  # events were lost: mended by a reconcile (HEAL_WAIT)
        self._lost: set[str] = set()  # the ids whose events were lost
        self._heal_at = 0.0
        self._thread: threading.Thread | None = None
        drop_leftovers(self.path)  # at the daemon's start, before a search opens it
        self._db = self._open()  # the thread's; made here so a search never makes the file

    def __call__(self, kind: str, text: str, msg_id: str, fields: dict[str, Any]) -> None:
        """The sink: O(1), no disk."""
        if msg_id or kind == "deleted":
            made = self.queued(msg_id) if kind == "created" and self.queued else None
            self._turn.append((kind, text, msg_id, fields.get("RQ_STATE") or "",
                               fields.get("RQ_RUN_S"), time.time(),
                               None if made is None else dict(made)))

    def flush(self) -> None:
        """Hand the turn's events to the thread in one put (one wake-up a
        turn, not one per event: they were most of the daemon's futex calls).
        While the thread is BACKLOG_MAX events behind, only their ids are kept,
        handed over once it has caught up: it reads those messages again."""
        behind = self._handed - self._taken > BACKLOG_MAX
        if self._passed and not behind:  # caught up: what was passed over, read again
            passed, self._passed = self._passed, set()
            self.todo.put(passed)
        if not self._turn:
            return
        events, self._turn = self._turn, []
        if behind:  # far behind: the ids only (some 30 MB held, not the 600 MB of a drain)
            self._passed.update(event[2] for event in events)  # "": a prune's (a reconcile)
            return
        self._handed += len(events)
        self.todo.put(events)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="rq-search", daemon=True)
            self._thread.start()

    def _open(self) -> sqlite3.Connection | None:
        try:
            return connect(self.path)
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)  # the thread tries again; searches answer errors meanwhile
            return None

    def _failed(self, exc: BaseException, lost: set[str] | None = None) -> None:
        """A write that raised: counted, and the index behind until mended."""
        if lost is not None:
            self._lost |= lost
            self.behind = True
            self.ready.clear()  # searches say partial until the index is mended
            self._heal_at = time.monotonic() + HEAL_WAIT
        self.error = str(exc) or type(exc).__name__
        self.failed += 1  # last: who sees the count sees the rest (stats, another thread)

    def close(self) -> None:
        """At the daemon's stop: the last events written, the file closed."""
        self.flush()
        self.todo.put(None)
        if self._thread is not None:
            self._thread.join(STOP_WAIT)

    def _work(self) -> None:
        name_thread(b"rq-search")
        db = self._db or self._open()
        if db is None:  # searches answer errors; the queue goes on
            self.ready.set()
            while self.todo.get() is not None:
                pass  # the events are let go, not kept for ever
            return
        if self._reconcile(db):
            self.ready.set()
        while (batch := self._next_batch()) is not None:
            if batch:
                self._apply(db, batch)
            if self.behind and time.monotonic() >= self._heal_at:
                self._heal(db)
        db.close()

    def _heal(self, db: sqlite3.Connection) -> None:
        """Reconcile, re-reading the messages whose events were lost."""
        lost, self._lost = self._lost, set()
        if self._reconcile(db, lost):
            self.behind = False
            self.ready.set()

    def _next_batch(self) -> list[Event] | None:
        """The next events, up to BATCH: after the first, what comes within
        GATHER seconds joins it, and while events keep coming the batch keeps
        gathering, up to GATHER_BUSY (one transaction for a burst, not one
        each: a busy queue's commits were most of the daemon's writes).  So a
        lone event is searchable within GATHER, and one in a stream of them
        within GATHER_BUSY.  The thread sleeps through GATHER rather than
        waiting on the queue: one wake-up a GATHER, not one per loop turn's put."""
        try:  # behind: back in time to mend it, events or not
            first = self.todo.get(timeout=HEAL_WAIT if self.behind else None)
        except queue.Empty:
            return []
        if first is None:
            return None
        batch, until = self._took(first), time.monotonic() + GATHER_BUSY
        while len(batch) < BATCH and time.monotonic() < until:
            time.sleep(GATHER)
            if not self._gather(batch):
                break  # nothing came meanwhile (the burst is over), or closing
        return batch

    def _gather(self, batch: list[Event]) -> bool:
        """Move what is queued into ``batch`` (up to BATCH); False when
        nothing was, or the index is closing."""
        took = False
        while len(batch) < BATCH:
            try:
                item = self.todo.get_nowait()
            except queue.Empty:
                return took
            if item is None:
                self.todo.put(None)
                return False
            batch.extend(self._took(item))
            took = True
        return took

    def _took(self, item: list[Event] | set[str]) -> list[Event]:
        """A turn's events, counted taken; or the ids of those the loop did not
        hand over (far behind, ``BACKLOG_MAX``): read again at the next mend."""
        if isinstance(item, set):
            self._lost |= item
            self.behind = True
            self.ready.clear()  # searches say partial until the index is mended
            self._heal_at = time.monotonic() + HEAL_WAIT
            return []
        self._taken += len(item)
        return list(item)

    def _reconcile(self, db: sqlite3.Connection, lost: set[str] | None = None) -> bool:
        try:
            db.executescript(PARAM_INDEXES)
            reconcile(db, self.view, lost or set(), self._rest)
        except Exception as exc:  # noqa: BLE001 - a disk's or a bug's: the thread goes on
            roll_back(db)
            self._failed(exc, lost or set())
            return False
        return True

    def _rest(self, took: float) -> None:
        """A reconcile's pause after ``took`` seconds of reading, while messages run."""
        if self.busy():
            time.sleep(took * RECONCILE_REST)

    def _apply(self, db: sqlite3.Connection, batch: list[Event]) -> None:
        try:
            db.execute("BEGIN")
            rebuild = fold.apply_batch(db, self.view, batch)
            db.execute("COMMIT")
        except Exception as exc:  # noqa: BLE001 - a disk's or a bug's: the thread goes on
            roll_back(db)
            self._failed(exc, {event[2] for event in batch if event[2]})
            return
        if rebuild:
            self._reconcile(db)
