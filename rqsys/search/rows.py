"""The search index's rows: one event, or a message read from its directory, written as SQL.

The index's thread (``rqsys.search.index``), the folding of a batch
(``rqsys.search.fold``) and the reconcile (``rqsys.search.reconcile``) write
through these, so none needs another's module for them.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from rqsys.errors import RQError
from rqsys.observe import lastlines, timeline
from rqsys.observe.stats import id_time
from rqsys.store import QueueView

BATCH = 2000  # events applied in one transaction
PARAMS = ("param1", "param2", "param3", "param4", "src", "dest")
STATE_OF = {"committed": "que", "retried": "que", "retry": "que", "resend": "que",
            "recovered": "que", "run_now": "que", "started": "run"}
ENDS = ("done", "err", "relayed")
# kind, text, msg id, state, run_s, time, and a new message as it was queued
# (``created`` in que: taken from memory, so its files are not read back)
Event = tuple[str, str, str, str, Any, float, "dict[str, Any] | None"]


def row_text(params: str, tags: list[str], status: str, last: str = "") -> str:
    """What full-text search looks in: params, tags, the status text and, for a
    failed message, the last line its run wrote (the exception: ``ValueError``)."""
    return " ".join([params, *tags, status, *([last] if last else [])])


def last_line(view: QueueView, state: str, msg_id: str) -> str:
    """A failed message's last kept line (``observe.lastlines``); "" for others."""
    if state != "err":
        return ""
    lines = lastlines.read(view.msg_dir(state, msg_id))
    return _text(lines[-1]) if lines else ""


def roll_back(db: sqlite3.Connection) -> None:
    """The failed transaction undone, so the next one can begin."""
    try:
        if db.in_transaction:
            db.execute("ROLLBACK")
    except sqlite3.Error:
        pass  # SQLite rolled it back itself (an I/O error does)


def apply(db: sqlite3.Connection, view: QueueView, event: Event) -> bool:
    """One event into the index; True when a walk is needed (a prune)."""
    kind, text, msg_id, state, run_s, at, made = event
    if kind == "deleted":
        if not msg_id:
            return True
        db.execute("DELETE FROM msgs WHERE id = ?", (msg_id,))
        return False
    state = state or STATE_OF.get(kind, "")
    if kind == "created" and made is not None:
        insert(db, msg_id, state, made, "", {"created_at": at})
    elif kind == "created":
        add(db, view, msg_id, state)
    elif kind == "started":
        db.execute("UPDATE msgs SET state='run', started=coalesce(started, ?) WHERE id=?",
                   (at, msg_id))
    elif kind == "exit" and run_s is not None:
        db.execute("UPDATE msgs SET run_s=? WHERE id=?", (run_s, msg_id))
    elif kind in ENDS and state in ENDS:
        _set_status(db, view, msg_id, state, text, at)
    elif state and kind in STATE_OF:
        _move(db, view, msg_id, state, kind == "retried")
    return False


def _move(db: sqlite3.Connection, view: QueueView, msg_id: str, state: str,
          blank: bool) -> None:
    """A message moved on without ending: its state (and, retried, its blank
    status; its text keeps the last failure's words, findable until it ends
    again, and the full-text index is not rewritten for 100,000 retries)."""
    sql = ("UPDATE msgs SET state=?, ended=NULL" + (", status=''" if blank else "")
           + " WHERE id=?")
    if db.execute(sql, (state, msg_id)).rowcount == 0:
        add(db, view, msg_id, state)  # its creation was not indexed


def _set_status(db: sqlite3.Connection, view: QueueView, msg_id: str, state: str,
                status: str | None, ended: float | None) -> None:
    row = db.execute("SELECT params, tags, status FROM msgs WHERE id=?", (msg_id,)).fetchone()
    if row is None:  # its creation was not indexed (it moved on before it was read)
        add(db, view, msg_id, state)
        return
    params, tags, old = row
    status = old if status is None else status
    text = row_text(params, tags.split(), status, last_line(view, state, msg_id))
    db.execute("UPDATE msgs SET state=?, status=?, ended=?, text=? WHERE id=?",
               (state, status, ended, text, msg_id))


def add(db: sqlite3.Connection, view: QueueView, msg_id: str, state: str) -> None:
    """A message's row, read from its directory (wherever it is now; passed
    over if it is gone)."""
    try:
        if not view.msg_dir(state, msg_id).is_dir():
            state = view.find(msg_id)
        msg = view.read_msg(state, msg_id)
        status = view.read_status(state, msg_id)
        times = timeline.times(timeline.read_folded(view.msg_dir(state, msg_id)),
                               float(msg.get("due") or 0))
    except (RQError, OSError):
        return
    insert(db, msg_id, state, msg, status, times, last_line(view, state, msg_id))


def insert(db: sqlite3.Connection, msg_id: str, state: str, msg: dict[str, Any],
           status: str, times: dict[str, Any], last: str = "") -> None:
    """A message's row (and its tags), replacing any it had."""
    params = _text(" ".join(str(msg[k]) for k in PARAMS if msg.get(k) not in (None, "")))
    tags, status = [_text(str(t)) for t in msg.get("tags") or []], _text(status)
    each = [_text(str(msg.get(k) if msg.get(k) is not None else "")) for k in PARAMS[:4]]
    db.execute("DELETE FROM msgs WHERE id=?", (msg_id,))
    cur = db.execute(
        "INSERT INTO msgs(id, state, created, started, ended, run_s, status, params, tags,"
        " text, p1, p2, p3, p4, priority) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (msg_id, state, times.get("created_at") or id_time(msg_id), times.get("started_at"),
         times.get("ended_at"), times.get("run_s"), status, params, " ".join(tags),
         row_text(params, tags, status, last), *each, _priority(msg)))
    db.executemany("INSERT OR IGNORE INTO msg_tags(tag, rid) VALUES (?, ?)",
                   [(t, cur.lastrowid) for t in tags])


def _priority(msg: dict[str, Any]) -> int:
    try:
        return int(msg.get("priority") or 0)
    except (TypeError, ValueError):  # a message edited by hand
        return 0


def _text(text: str) -> str:
    """``text`` as SQLite can take it: a lone surrogate (in a message stored
    before intake refused them) made "?", or it raised, and its batch with it."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode()
