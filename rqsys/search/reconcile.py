"""Making the index agree with the store, a chunk of ids at a time (a start's, a prune's, a mend's).

The store's state directories are listed one by one, and each chunk of
LOOKUP ids is looked up in the index: a message it lacks, or has in another
state, is read from its directory and written again (``rows.add``).  Then
each state's rows are counted: where the index has more (or fewer) than the
store listed, its rows of that state are walked and those whose directory is
gone are dropped.  So a reconcile holds a chunk of ids, read from the
directory as it goes, not every id twice: with a million queued it was two
dicts of them, 300 MB the daemon kept after its start.

While messages run, the thread rests after each chunk and each PACE_ROWS
messages read (``pause``: see ``SearchIndex``).
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterable, Iterator

from rqsys.search.rows import add
from rqsys.store import STATES, QueueView

LOOKUP = 5000  # ids looked up in the index at once
PACE_ROWS = 100  # rows read from disk between the pauses
Pause = Callable[[float], None]


def reconcile(db: sqlite3.Connection, view: QueueView, reread: Collection[str] = (),
              pause: Pause = lambda _took: None) -> dict[str, int]:
    """Make the index agree with the store; how many rows were added, dropped,
    moved (``reread``: messages whose rows are read again, whatever their state).
    ``pause(took)``: after each chunk's work, with the seconds it took."""
    tally = {"added": 0, "moved": 0, "dropped": 0}
    listed = dict.fromkeys(STATES, 0)
    for state in STATES:
        if view.state_dir(state).is_dir():
            for chunk in _chunks(view.ids(state), LOOKUP):
                listed[state] += len(chunk)
                _agree(db, view, state, chunk, reread, tally, pause)
    for state, rows in db.execute("SELECT state, count(*) FROM msgs GROUP BY state").fetchall():
        if rows != listed.get(state, 0):
            tally["dropped"] += _drop_gone(db, view, state, pause)
    return tally


def _chunks(ids: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(ids)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def _agree(db: sqlite3.Connection, view: QueueView, state: str, chunk: list[str],
           reread: Collection[str], tally: dict[str, int], pause: Pause) -> None:
    """One chunk of a state's ids: those the index lacks or has elsewhere, read again."""
    began = time.monotonic()
    marks = ",".join("?" * len(chunk))
    indexed = dict(db.execute(f"SELECT id, state FROM msgs WHERE id IN ({marks})", chunk))
    changed = [i for i in chunk if indexed.get(i) != state or i in reread]
    pause(time.monotonic() - began)
    if not changed:
        return
    db.execute("BEGIN")
    for start in range(0, len(changed), PACE_ROWS):
        began = time.monotonic()
        for msg_id in changed[start:start + PACE_ROWS]:
            tally["moved" if msg_id in indexed else "added"] += 1
            add(db, view, msg_id, state)
        pause(time.monotonic() - began)
    db.execute("COMMIT")


def _drop_gone(db: sqlite3.Connection, view: QueueView, state: str, pause: Pause) -> int:
    """The rows of ``state`` whose message is not there (deleted, pruned, moved
    by hand while the events were lost), dropped; how many."""
    dropped, after = 0, ""
    while True:
        began = time.monotonic()
        ids = [r[0] for r in db.execute(
            "SELECT id FROM msgs WHERE state = ? AND id > ? ORDER BY id LIMIT ?",
            (state, after, LOOKUP))]
        if not ids:
            return dropped
        after = ids[-1]
        gone = [(i,) for i in ids if state not in STATES
                or not os.path.isdir(view.msg_path(state, i))]
        if gone:
            db.execute("BEGIN")
            db.executemany("DELETE FROM msgs WHERE id=?", gone)
            db.execute("COMMIT")
            dropped += len(gone)
        pause(time.monotonic() - began)
