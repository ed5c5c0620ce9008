"""Reading the audit trail: every writer's files, newest record first, filtered and paged.

What ``GET /audit.json``, the ``/audit`` page and ``rq audit`` show.  The
files are read whole (all writers', rotated ones too, but a rotated file
last written before ``since``): at the default sizes that is at most some
100 MiB a writer, read on each request; a filter on ``queue`` reads only
that queue's files and the web's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rqsys.errors import BadRequest
from rqsys.observe.audit import SUFFIX, WEB, Record

MAX_LIMIT = 1000  # records on one page


@dataclass(frozen=True)
class Filter:
    """What a reader asks for: each given field must match (times: since <= t < until)."""

    actor: str = ""
    action: str = ""
    queue: str = ""
    since: float | None = None
    until: float | None = None

    def matches(self, rec: Record) -> bool:
        at = float(rec.get("time", 0))
        return ((not self.actor or rec.get("actor") == self.actor)
                and (not self.action or rec.get("action") == self.action)
                and (not self.queue or rec.get("queue") == self.queue)
                and (self.since is None or at >= self.since)
                and (self.until is None or at < self.until))


def parse_time(text: str, field: str) -> float:
    """Epoch seconds, or an ISO 8601 date or time (UTC unless it names its zone)."""
    try:
        return float(text) if text.isascii() and text.replace(".", "", 1).isdigit() else _iso(text)
    except ValueError:
        raise BadRequest(f"{field}: not epoch seconds or an ISO 8601 time: {text[:40]!r}") \
            from None


def _iso(text: str) -> float:
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def parse_count(text: str, field: str, default: int, most: int | None = None) -> int:
    """A non-negative integer field (``limit``, ``offset``); BadRequest naming it."""
    if text == "":
        return default
    if not (text.isascii() and text.isdigit()):
        raise BadRequest(f"{field}: not a whole number >= 0: {text[:40]!r}")
    value = int(text)
    if most is not None and value > most:
        raise BadRequest(f"{field}: at most {most}, not {value}")
    return value


READ_TRIES = 5  # reads of the trail while rotations keep renaming its files


def files(audit_dir: Path, flt: Filter) -> list[Path]:
    """The files that may hold matching records."""
    try:
        names = os.listdir(audit_dir)
    except FileNotFoundError:
        return []
    found = []
    for name in sorted(names):
        writer, sep, _rotation = name.partition(SUFFIX)
        if not sep or (flt.queue and writer not in (flt.queue, WEB)):
            continue
        path = audit_dir / name
        if flt.since is not None and name != writer + SUFFIX and \
                path.stat().st_mtime < flt.since:
            continue
        found.append(path)
    return found


def records(audit_dir: Path, flt: Filter) -> list[Record]:
    """Every matching record, newest first.  Read again when a rotation
    renamed the files meanwhile: between the listing and the reading, it
    shows some records twice (a file read under its old name and its new)
    or not at all (one renamed before it was opened)."""
    for _try in range(READ_TRIES):
        listed = _identities(audit_dir, flt)
        found: list[Record] = []
        for path, _ino in listed:
            found.extend(rec for rec in _read(path) if flt.matches(rec))
        if _identities(audit_dir, flt) == listed:
            break
    found.sort(key=lambda rec: float(rec.get("time", 0)), reverse=True)
    return found


def _identities(audit_dir: Path, flt: Filter) -> list[tuple[Path, int]]:
    """The files ``records`` reads, each with its inode (0: gone already)."""
    found = []
    for path in files(audit_dir, flt):
        try:
            found.append((path, path.stat().st_ino))
        except FileNotFoundError:
            found.append((path, 0))
    return found


def page(audit_dir: Path, flt: Filter, offset: int, limit: int) -> dict[str, Any]:
    matching = records(audit_dir, flt)
    return {"records": matching[offset:offset + limit], "total": len(matching),
            "offset": offset, "limit": limit}


def _read(path: Path) -> list[Record]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # rotated away meanwhile
        return []
    found = []
    for raw in data.splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:  # a line a crash cut short
            continue
        if isinstance(rec, dict):
            found.append(rec)
    return found
