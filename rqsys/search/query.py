"""Searching a queue's index (``rqsys.search.index``): what a search may ask, checked,
and the SQL that answers it a page at a time.

A search names any of: ``state``, ``text`` (words found in params, tags or
status text, all of them; ``datab*`` matches as a prefix), ``tag`` (exactly),
``params`` (``{"1": {"op": "eq"|"has", "value": V}}``: param 1 is V, or holds
it), ``priority`` (``{"op": ">", "value": 5}``),
``since``/``until`` (Unix seconds, on the ``when`` time: created, started or
ended), ``sort`` (created, started, ended, run_s, wait_s) and ``desc``
(``by_state``: the answer counts the matches in each state too).  The
default order, newest created first, follows the index's row order, so a
first page stops after its 25 rows even when a million match; ``total`` is
counted up to ``COUNT_CAP`` (``more`` says there are more).
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rqsys.errors import BadRequest
from rqsys.store import STATES

ACTIONS = ("retry", "delete", "move")  # what a bulk action over a search may do
COUNT_CAP = 10_000
MAX_LIMIT = 1000
SORTS = {"created": "m.rowid", "started": "m.started", "ended": "m.ended",
         "run_s": "m.run_s", "wait_s": "(m.started - m.created)"}
WHENS = ("created", "started", "ended")
COLUMNS = ("id", "state", "created", "started", "ended", "run_s", "status", "params", "tags")
COMPARE = (">", ">=", "<", "<=", "=")  # a priority's comparisons (SQL's own)
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
TEXT_FIELDS = ("state", "text", "tag", "when", "sort")
SCHEMA: dict[str, Any] = {
    "state": {"title": "state", "enum": list(STATES)},
    "text": {"title": "search text", "type": "string", "maxLength": 500},
    "tag": {"title": "tag", "type": "string", "maxLength": 200},
    "since": {"title": "since", "type": "number", "minimum": 0},
    "until": {"title": "until", "type": "number", "minimum": 0},
    "when": {"title": "when", "enum": list(WHENS)},
    "sort": {"title": "sort", "enum": list(SORTS)},
    "desc": {"title": "desc", "type": "boolean"},
    "offset": {"title": "offset", "type": "integer", "minimum": 0, "maximum": 10**9},
    "limit": {"title": "limit", "type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
    "by_state": {"title": "by_state", "type": "boolean"},
    "params": {"title": "params", "type": "object", "additionalProperties": False,
               "patternProperties": {"^[1-4]$": {
                   "type": "object", "required": ["op", "value"], "additionalProperties": False,
                   "properties": {"op": {"enum": ["eq", "has"]},
                                  "value": {"type": "string", "maxLength": 500}}}}},
    "priority": {"title": "priority", "type": "object", "required": ["op", "value"],
                 "additionalProperties": False,
                 "properties": {"op": {"enum": list(COMPARE)},
                                "value": {"type": "integer", "minimum": -10**9,
                                          "maximum": 10**9}}},
}
_local = threading.local()


def reader(path: Path) -> sqlite3.Connection:
    """This thread's connection to the index at ``path`` (a search lane keeps one),
    opened again when the file is another than the one it read (made again: an
    older rqsys's at start, or one removed by hand)."""
    conns: dict[Path, tuple[sqlite3.Connection, int]] = _local.__dict__.setdefault(
        "conns", {})
    held = conns.get(path)
    if held is None or held[1] != _inode(path):
        from rqsys.search.index import open_reader
        if held is not None:
            held[0].close()
        conns[path] = held = (open_reader(path), _inode(path))
    return held[0]


def _inode(path: Path) -> int:
    try:
        return os.stat(path).st_ino
    except OSError:
        return -1  # not made yet: SQLite makes an empty one, the thread fills it


def match_expr(text: str) -> str:
    """The FTS5 query of a search text: every word (ANDed); a word ending in
    ``*`` also as a prefix (a prefix merges every word it starts: slower)."""
    words = re.findall(r"(\w+)(\*?)", text.lower())
    return " ".join(f'"{w}"{star}' for w, star in words)


def _plan(args: dict[str, Any]) -> tuple[str, str, str, list[Any]]:
    """FROM, the default order, WHERE and its values.  What is most selective
    drives, in row order, so a first page stops early: the text (FTS5 walks its
    own rowids), else the tag (its table's key is tag, row), else the rows."""
    clauses: list[str] = ["1"]
    values: list[Any] = []
    expr = match_expr(args.get("text") or "")
    if expr:
        source, order = "fts CROSS JOIN msgs m ON m.rowid = fts.rowid", "fts.rowid"
        clauses.append("fts MATCH ?")
        values.append(expr)
    elif args.get("tag"):
        source, order = "msg_tags t CROSS JOIN msgs m ON m.rowid = t.rid", "t.rid"
    else:
        source, order = "msgs m", "m.rowid"
    if args.get("tag"):
        clauses.append("t.tag = ?" if not expr else
                       "EXISTS (SELECT 1 FROM msg_tags t WHERE t.tag = ? AND t.rid = m.rowid)")
        values.append(args["tag"])
    if args.get("state"):
        clauses.append("m.state = ?")
        values.append(args["state"])
    for number, want in sorted((args.get("params") or {}).items()):
        column = f"m.p{int(number)}"  # 1-4: the schema's pattern
        clauses.append(f"{column} = ?" if want["op"] == "eq" else f"instr({column}, ?) > 0")
        values.append(want["value"])
    if args.get("priority"):
        clauses.append(f"m.priority {COMPARE[COMPARE.index(args['priority']['op'])]} ?")
        values.append(int(args["priority"]["value"]))
    when = f"m.{args.get('when') or 'created'}"
    for field, op in (("since", ">="), ("until", "<")):
        if args.get(field) is not None:
            clauses.append(f"{when} {op} ?")
            values.append(float(args[field]))
    return source, order, " AND ".join(clauses), values


def search(db: sqlite3.Connection, args: dict[str, Any]) -> dict[str, Any]:
    """A page of matches (rows as dicts) and how many match (to COUNT_CAP)."""
    source, order, where, values = _plan(args)
    if (args.get("sort") or "created") != "created":
        order = SORTS[args["sort"]]
    way = "DESC" if args.get("desc", True) else "ASC"
    limit, offset = int(args.get("limit") or 25), int(args.get("offset") or 0)
    cols = ", ".join(f"m.{c}" for c in COLUMNS)
    rows = db.execute(f"SELECT {cols} FROM {source} WHERE {where} "
                      f"ORDER BY {order} {way} LIMIT ? OFFSET ?",
                      [*values, limit, offset]).fetchall()
    total = db.execute(f"SELECT count(*) FROM (SELECT 1 FROM {source} WHERE {where} "
                       "LIMIT ?)", [*values, COUNT_CAP + 1]).fetchone()[0]
    found = {"rows": [_row(r) for r in rows], "total": min(total, COUNT_CAP),
             "more": total > COUNT_CAP}
    return dict(found, states=_by_state(db, args)) if args.get("by_state") else found


def _by_state(db: sqlite3.Connection, args: dict[str, Any]) -> dict[str, int]:
    """How many match in each state, whatever ``state`` asks (to COUNT_CAP each)."""
    source, _order, where, values = _plan(dict(args, state=None))
    counts = {}
    for state in STATES:
        counts[state] = db.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {source} WHERE {where} AND m.state = ? "
            "LIMIT ?)", [*values, state, COUNT_CAP]).fetchone()[0]
    return counts


def all_ids(db: sqlite3.Connection, args: dict[str, Any]) -> list[str]:
    """Every matching id, oldest first (for a bulk action)."""
    source, order, where, values = _plan(args)
    return [r[0] for r in db.execute(
        f"SELECT m.id FROM {source} WHERE {where} ORDER BY {order}", values)]


def _row(row: tuple[Any, ...]) -> dict[str, Any]:
    out = dict(zip(COLUMNS, row, strict=True))
    out["tags"] = out["tags"].split() if out["tags"] else []
    started, created = out["started"], out["created"]
    out["wait_s"] = round(started - created, 3) if started and created else None
    return out


# ------------------------------------------------------------ from text (web, CLI)
def parse_when(text: str, field: str, now: float | None = None) -> float:
    """A time as typed: ``90m`` / ``2h`` / ``3d`` ago, Unix seconds, or an
    ISO date or date-time (UTC unless it says)."""
    text = text.strip()
    now = time.time() if now is None else now
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", text):
        return now - float(m.group(1)) * UNITS[m.group(2)]
    if re.fullmatch(r"\d{9,11}(\.\d+)?", text):
        return float(text)
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{field}: not a time: {text[:40]!r} (say 2h, 3d, a Unix time "
                         "or an ISO date like 2026-11-24T08:00)") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def from_params(get: Any) -> dict[str, Any]:
    """A search from text parameters (``get(name)`` → str or None), checked."""
    args: dict[str, Any] = {}
    for field in TEXT_FIELDS:
        value = get(field)
        if value:
            choices = SCHEMA[field].get("enum")
            if choices and value not in choices:
                raise BadRequest(f"{field} must be one of {', '.join(choices)}, "
                                 f"not {value[:40]!r}")
            args[field] = value
    for field in ("since", "until"):
        if get(field):
            args[field] = parse_when(get(field), field)
    if get("desc") in ("0", "false", "no"):
        args["desc"] = False
    return args
