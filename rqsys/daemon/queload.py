"""Start-up: recovery, then que/ read into memory a slice each loop turn while the daemon serves.

A queue daemon holds its queued messages in memory (``Schedule``).  Reading
them all before it listened made a start with a million queued take 20 s
after a clean stop (the snapshot) and over a minute after a crash (a file
each), and nothing was taken or started meanwhile.  Now a start recovers,
lists que/ (names only: a second or two for a million), counts, and tells
READY; then each loop turn reads the oldest unread messages for at most
``SLICE_S`` (from the clean stop's snapshot when there is one, else their
files), between the turn's other work: creates are taken at once, and the
first messages start as soon as they are read.

While it reads, the que in memory holds only what it has read so far:

- the count of que is the read ones and the unread ones (``Ledger.count``);
- it reads while nothing runs, and while messages run only while fewer
  than ``tunables.READ_AHEAD`` plain ones wait in memory, in slices of
  RUN_SLICE_S: reading a million files takes some 40 s of the loop, which a
  drain that had to share it ran at a fifth of its rate, and reading ahead
  to half the tail's window held a drain's first seconds to a third of it;
- messages start in the order they are read, oldest first: a message of
  a better priority that is not read yet waits until it is;
- a create with a ``unique_key`` first reads the rest (its duplicate may be
  one of them): that create waits, the others do not;
- the que tab lists what has been read, and a stop writes no snapshot
  (the next start reads the files, as after a crash).
"""

from __future__ import annotations

import math
import time

from rqsys import tunables
from rqsys.daemon.transitions import COUNTED, Msg, Transitions
from rqsys.daemon.unique import key_of
from rqsys.errors import RQError

NAME = "queload"  # its name among the features while it reads
SLICE_S = 0.02  # a loop turn's reading: a create waits at most about this for it
RUN_SLICE_S = 0.005  # ... while messages run: their ends wait for it too
CHECK_EVERY = 32  # messages read between looks at the clock


class QueLoad:
    """Recovery at start, then que/ into the ledger a slice a turn: the moments
    ``turn``, ``wait``, ``busy`` and ``creating``, registered while it reads."""

    def __init__(self, transitions: Transitions) -> None:
        self.transitions = transitions
        self.ledger, self.store, self.log = transitions.ledger, transitions.store, transitions.log
        self._snapshot: dict[str, Msg] = {}  # the last clean stop's, read from as it goes
        self._began = 0.0
        self.que_ids: frozenset[str] = frozenset()  # que/ at start (batch ends' recovery)

    def start(self) -> None:
        """Recovery (run → que, in the store), que/ listed, the counts, prep's unique keys."""
        for msg_id in self.store.recover():
            self.log.event("recovered", "was running at the last stop; requeued", msg_id,
                           RQ_STATE="que")
        for name in self.store.found.set_aside:  # no message's event: it has none left
            self.log.event("warning", f"{name.replace('.', '/', 1)} was no message "
                           f"directory: moved to .set-aside/{name}")
        self._began = time.monotonic()
        ids = self.store.found.queued
        self.que_ids = frozenset(ids)
        self._snapshot = self.store.take_que_snapshot(ids) or {}
        self.ledger.to_read(ids)
        if ids:  # a turn's slice until all is read, then gone from the loop's path
            self.transitions.moments.register(self, NAME)
        self.ledger.recount({state: self.store.count(state) for state in COUNTED})
        prep = ((i, m) for i, m in self.store.read_all("prep") if not isinstance(m, RQError))
        self.ledger.unique.load(prep, time.time())

    def read(self, budget: float = math.inf) -> None:
        """Read unread messages into the que for ``budget`` seconds (all: inf)."""
        until, read = time.perf_counter() + budget, 0
        while (msg_id := self.ledger.next_unread()) is not None:
            self._read_one(msg_id)
            read += 1
            if read % CHECK_EVERY == 0 and time.perf_counter() > until:
                return
        if self.que_ids:
            self.transitions.moments.unregister(self, NAME)
        if len(self.que_ids) >= tunables.SNAPSHOT_MIN:
            self.log.event("daemon", f"que read: {len(self.que_ids):,} messages in "
                           f"{time.monotonic() - self._began:.1f}s")
        self._snapshot, self.que_ids = {}, frozenset()

    def _read_one(self, msg_id: str) -> None:
        msg = self._snapshot.pop(msg_id, None) or self.store.read_queued(msg_id)
        if msg is None:
            return  # deleted or moved since que/ was listed
        if isinstance(msg, RQError):
            self.transitions.unreadable(msg_id, msg)
            return
        self.ledger.unique.hold(msg_id, msg)
        self.ledger.queued(msg_id, msg)  # back in the que: what it waits for is looked at again

    def on_turn(self) -> None:
        if self.ledger.wants_reading():
            self.read(RUN_SLICE_S if self.ledger.running else SLICE_S)

    def on_wait(self) -> float | None:
        return 0.0 if self.ledger.wants_reading() else None

    def on_busy(self) -> bool:
        return bool(self.ledger.unread)

    def on_creating(self, msg: Msg) -> None:
        if self.ledger.unread and key_of(msg) is not None:
            self.read()  # its duplicate may be one not read yet
