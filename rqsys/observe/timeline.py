"""A message's timeline: one JSON line per event, appended to ``<msg dir>/timeline``.

The daemon's ``EventLog`` feeds :class:`Timeline` (a sink) every event of
a message, with ``RQ_STATE`` naming the state directory the message is in
when the event is told.  A loop turn's lines of one message are appended
together, with one ``write(2)`` on an ``O_APPEND`` file, when the turn ends
(``flush``), and never fsynced: the loop does not wait for the disk on the
hot path.  A running message's file stays open from its start to its end
(the fd follows the directory through its renames), so a run costs one
open and one close, not one of each per line; it is opened when the run's
``started`` is told, right after the start made its pipes and pidfd, so
the run's fds are neighbours and its end closes them in one call.  The lines survive a crash of
the daemon once their turn has ended (the kernel has them), but a power cut
can lose the lines of the last seconds (until writeback): the message's
state and status stay durable as before, and the timeline is its history,
not its truth.  Times are Unix seconds (UTC), rounded to ms.

A message's creation is no line of its file: its id says when, to the ms,
and :func:`read` puts a ``created`` event first (a timeline an older version
wrote has it as a line, read as it is).  So a queued message has no
timeline file until something happens to it: two inodes, not three (who
made it is its msg's ``created_by``).

:func:`times` reads a timeline back into the ``created_at``, ``started_at``,
``ended_at``, ``wait_s`` and ``run_s`` of the message JSON.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
from pathlib import Path
from typing import Any

from rqsys.fdclose import FdBatch
from rqsys.observe import stamps
from rqsys.observe.stats import id_time
from rqsys.store.layout import CREATED_BY

FILE = "timeline"
ENDS = ("done", "err", "relayed")
# the events a timeline keeps (``deleted``: the message is gone, nothing to write to)
KINDS = frozenset({"started", "status", "exit", "resend", "recovered",
                   "coalesced", "committed", "run_now", "destroy", "retry", "retried", "timeout",
                   "cancel",
                   "usage", *ENDS})
# after these a message's run is over: its held file is closed
RUN_ENDS = frozenset({*ENDS, "resend", "retry", "deleted"})
MAX_TEXT = 2000  # a status text is cut here in the timeline (the status file has it whole)
TIME_FIELDS = ("created_at", "started_at", "ended_at", "wait_s", "run_s")
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


class Timeline:
    """The sink that appends a message's events to its directory, a turn at a time."""

    kinds = KINDS | {"deleted"}  # the events it is told (EventLog)

    def __init__(self, msg_path: Any, host: str | None = None,
                 closing: FdBatch | None = None) -> None:
        self._msg_path = msg_path  # (state, msg_id) -> its directory, a str (QueueView._path)
        # ended runs' files: the loop's batch (closed with the runs' pipes), else at each flush
        self._ended = closing or FdBatch(limit=1)
        self.host = host or socket.gethostname()
        self.failed = 0  # lines not written (the message had gone, a full disk)
        self.error = ""  # why the last one was not
        self._pending: dict[str, tuple[str, list[str]]] = {}  # id -> (its state, lines)
        self._held: dict[str, int] = {}  # a running message's open timeline
        self._closing: set[str] = set()  # held ones whose run is over: closed at flush

    def __call__(self, kind: str, text: str, msg_id: str, fields: dict[str, Any]) -> None:
        if kind == "deleted" and msg_id:  # gone: nowhere to write; its held file closed
            self._pending.pop(msg_id, None)
            self._close(msg_id)
            return
        state = fields.get("RQ_STATE")
        if not msg_id or kind not in KINDS or not state:
            return
        host = ""
        if kind == "started":
            host = self.host
            if self._held.get(msg_id, -1) < 0:  # opened now, the start's fds' neighbour
                self._held[msg_id] = self._open(state, msg_id)
        elif kind in RUN_ENDS and msg_id in self._held:
            self._closing.add(msg_id)
        line = _line(stamps.now(), kind, fields, text[:MAX_TEXT], host)
        lines = self._pending.get(msg_id)
        if lines is None:
            self._pending[msg_id] = (state, [line])
        else:
            lines[1].append(line)
            self.moved(msg_id, state)  # the newest state: where it is now

    def moved(self, msg_id: str, state: str) -> None:
        """The message's directory is in ``state`` now: its turn's lines go there."""
        lines = self._pending.get(msg_id)
        if lines is not None and lines[0] != state:
            self._pending[msg_id] = (state, lines[1])

    def flush(self) -> None:
        """Write the turn's lines: one write(2) per message."""
        pending, self._pending = self._pending, {}
        for msg_id, (state, lines) in pending.items():
            self._write(msg_id, state, "".join(lines).encode())
        ended = [self._held.pop(msg_id, -1) for msg_id in self._closing]
        self._closing.clear()
        self._ended.add(fd for fd in ended if fd >= 0)  # a turn's ended runs': neighbours

    def close(self) -> None:
        """At stop: everything written, every held file closed."""
        self.flush()
        for msg_id in list(self._held):
            self._close(msg_id)

    def _open(self, state: str, msg_id: str) -> int:
        """The message's timeline opened to append, or -1 (tried again at the flush)."""
        try:
            return os.open(f"{self._msg_path(state, msg_id)}/{FILE}", APPEND, 0o644)
        except OSError:
            return -1

    def _write(self, msg_id: str, state: str, data: bytes) -> None:
        fd = self._held.get(msg_id)
        try:
            if fd is None or fd < 0:
                opened = os.open(f"{self._msg_path(state, msg_id)}/{FILE}", APPEND, 0o644)
                if fd is None:
                    _write_close(opened, data)
                    return
                fd = self._held[msg_id] = opened
            os.write(fd, data)
        except OSError as exc:
            self.failed += 1
            self.error = str(exc)

    def _close(self, msg_id: str) -> None:
        fd = self._held.pop(msg_id, None)
        if fd is not None and fd >= 0:
            os.close(fd)


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps makes one a call
_QUOTE: Any = getattr(json.encoder, "c_encode_basestring_ascii", None) or (
    json.encoder.encode_basestring_ascii)  # what _ENCODE does to a str
_RESERVED = frozenset({"t", "ev", "text", "host"})  # a field of these names: the dict path


def _json(line: dict[str, Any]) -> str:
    return _ENCODE(line) + "\n"


def _line(stamp: tuple[float, str], kind: str, fields: dict[str, Any], text: str,
          host: str) -> str:
    """The line ``_json`` makes of ``{"t", "ev", fields..., "text", "host"}``,
    built as text: a run's four lines were a tenth of the daemon's CPU as
    dicts through the encoder.  Values other than str, int and float (a list
    of riders), or a field named like the line's own keys, take the encoder.
    ``stamp``: the time and its text (``rqsys.observe.stamps``)."""
    at = stamp[0]
    parts = [f'{{"t":{stamp[1]},"ev":{_QUOTE(kind)}']
    for key, value in fields.items():
        prefix = _PREFIXES.get(key) or _prefix(key)
        kind_of = type(value)
        if prefix is _OWN:
            return _json_line(at, kind, fields, text, host)
        if kind_of is str:
            parts += (prefix, _QUOTE(value))
        elif kind_of is int or (kind_of is float and math.isfinite(value)):
            parts += (prefix, repr(value))
        else:
            return _json_line(at, kind, fields, text, host)
    if text:
        parts.append(f',"text":{_QUOTE(text)}')
    if host:
        parts.append(f',"host":{_QUOTE(host)}')
    parts.append("}\n")
    return "".join(parts)


_PREFIXES: dict[str, str] = {}  # field name -> ``,"its key":`` (a few names, made once)


_OWN = "own"  # the prefix of a field named like the line's own keys (the dict path)


def _prefix(field: str) -> str:
    name = _KEYS.get(field) or _key(field)
    prefix = _PREFIXES[field] = _OWN if name in _RESERVED else f",{_QUOTE(name)}:"
    return prefix


def _json_line(at: float, kind: str, fields: dict[str, Any], text: str, host: str) -> str:
    line: dict[str, Any] = {"t": at, "ev": kind}
    line.update(_plain(fields))
    if text:
        line["text"] = text
    if host:
        line["host"] = host
    return _json(line)


def _write_close(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """Journal field names as timeline keys: ``RQ_EXIT_STATUS`` → ``exit_status``."""
    return {_KEYS.get(key) or _key(key): value for key, value in fields.items()}


_KEYS: dict[str, str] = {}  # the few field names there are, converted once


def _key(field: str) -> str:
    name = field.lower()
    name = _KEYS[field] = name[3:] if name.startswith("rq_") else name
    return name


def append(path: Path | str, line: dict[str, Any]) -> None:
    """One line, one write(2), no fsync (see the module's docstring)."""
    _write_close(os.open(path, APPEND, 0o644), _json(line).encode())


def read(msg_dir: Path) -> list[dict[str, Any]]:
    """A message's timeline, oldest first, its creation first; a torn last
    line (a crash mid-write) is skipped."""
    return _with_created(msg_dir, _parsed(_raw(msg_dir)))


def read_folded(msg_dir: Path) -> list[dict[str, Any]]:
    """A message's timeline with each run of status lines folded as ``shown``
    folds it, reading only the lines a fold keeps: a job that reported
    10,000 progress lines costs 21 of them, not 10,000 (``times`` needs none)."""
    events: list[dict[str, Any]] = []
    run: list[bytes] = []
    for line in _raw(msg_dir):
        if line.find(STATUS_LINE, 0, 48) >= 0:  # how _line writes one: t, then ev
            run.append(line)
            continue
        events += _fold_lines(run)
        run = []
        events += _parsed([line])
    return _with_created(msg_dir, events + _fold_lines(run))


def _with_created(msg_dir: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with the message's ``created`` first where no line says it
    (see the module's docstring): when from its id (to the ms), who from its
    msg; in prep if it was committed later."""
    if events and events[0].get("ev") == "created":
        return events
    made = id_time(msg_dir.name)
    if not made:
        return events
    state = "prep" if any(e.get("ev") == "committed" for e in events) else "que"
    created: dict[str, Any] = {"t": made, "ev": "created", "state": state}
    by = _creator(msg_dir)
    if by:
        created["by"] = by
    return [dict(created, text=f"in {state}"), *events]


def _creator(msg_dir: Path) -> str:
    try:
        msg = json.loads((msg_dir / "msg").read_bytes())
    except (OSError, ValueError):
        return ""
    by = msg.get(CREATED_BY) if isinstance(msg, dict) else None
    return by if isinstance(by, str) else ""


STATUS_LINE = b'"ev":"status"'


def _fold_lines(run: list[bytes]) -> list[dict[str, Any]]:
    run = [line for line in run if line.endswith(b"}")]  # a torn line is not counted
    kept = _parsed(run[-FOLD_KEEPS - 1:])
    if len(run) < 2 or not kept:
        return kept
    earlier = [{"t": e.get("t"), "text": e.get("text", "")} for e in kept[:-1]]
    return [dict(kept[-1], folded=len(run), earlier=earlier)]


def _raw(msg_dir: Path) -> list[bytes]:
    try:
        return (msg_dir / FILE).read_bytes().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []


def _parsed(lines: list[bytes]) -> list[dict[str, Any]]:
    events = []
    for text in lines:
        try:
            item = json.loads(text)
        except ValueError:
            continue
        if isinstance(item, dict):
            events.append(item)
    return events


KEPT = frozenset({"created", "started", "exit", *ENDS})  # never left out of what is shown
FOLD_KEEPS = 20  # the newest texts of a fold, kept in it
LANDMARKS_SHOWN = 1000  # created/started/exit/end events shown at most (the first, the newest)


def shown(events: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """A timeline to show: each run of consecutive ``status`` lines folded into
    its last, with ``folded`` (how many) and ``earlier`` (the ones before it,
    the newest ``FOLD_KEEPS``); then, over ``limit``, the oldest other events
    left out, never a ``created``, ``started``, ``exit`` or an end."""
    folded: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []  # consecutive status lines, not yet folded

    def fold() -> None:
        if len(run) > 1:
            earlier = [{"t": e.get("t"), "text": e.get("text", "")}
                       for e in run[-FOLD_KEEPS - 1:-1]]
            folded.append(dict(run[-1], folded=len(run), earlier=earlier))
        else:
            folded.extend(run)
        run.clear()
    for item in events:
        if item.get("ev") == "status":
            run.append(item)
        else:
            fold()
            folded.append(item)
    fold()
    if len(folded) <= limit:
        return folded
    others = [n for n, item in enumerate(folded) if item.get("ev") not in KEPT]
    dropped = set(others[:max(0, len(folded) - limit)])
    kept = [item for n, item in enumerate(folded) if n not in dropped]
    if len(kept) > LANDMARKS_SHOWN:  # thousands of runs (a resend loop): bounded all the same
        kept = kept[:1] + kept[-(LANDMARKS_SHOWN - 1):]  # its creation and the newest
    return kept


def cancelled(events: list[dict[str, Any]]) -> bool:
    """Whether the message's last end was a cancel (``rq cancel``)."""
    for item in reversed(events):
        if item.get("ev") in RUN_ENDS:
            return item.get("ev") == "err" and item.get("kind") == "cancel"
    return False


def times(events: list[dict[str, Any]], due: float = 0.0) -> dict[str, float | None]:
    """``created_at``, ``started_at`` (the last run), ``ended_at``, ``wait_s``
    (from created, or the due time if later, to the first start) and
    ``run_s`` (the last run), from a timeline; None where it does not tell."""
    out: dict[str, float | None] = dict.fromkeys(TIME_FIELDS)
    first_start = None
    for item in events:
        ev, at = item.get("ev"), item.get("t")
        if ev == "created" and out["created_at"] is None:
            out["created_at"] = at
        elif ev == "started":
            out["started_at"], out["ended_at"], out["run_s"] = at, None, None
            first_start = at if first_start is None else first_start
        elif ev == "exit":
            out["run_s"] = item.get("run_s")
        elif ev in ENDS:
            out["ended_at"] = at
    created = out["created_at"]
    if created is not None and first_start is not None:
        out["wait_s"] = round(max(0.0, first_start - max(created, due or 0.0)), 3)
    return out


def exit_fields(wait_status: int, usage: Any, run_s: float | None) -> dict[str, Any]:
    """The ``exit`` event's fields: how the script ended and what it used
    (``usage``: ``os.wait4``'s rusage, or None)."""
    fields: dict[str, Any] = {"RQ_STATE": "run"}
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        fields["RQ_SIGNAL"] = signal.Signals(sig).name if sig in _SIGNALS else str(sig)
    else:
        fields["RQ_EXIT_STATUS"] = os.waitstatus_to_exitcode(wait_status)
    if run_s is not None:
        fields["RQ_RUN_S"] = round(run_s, 3)
    if usage is not None:
        fields.update(RQ_UTIME_S=round(usage.ru_utime, 3), RQ_STIME_S=round(usage.ru_stime, 3),
                      RQ_MAXRSS_KB=usage.ru_maxrss)
    return fields


_SIGNALS = {s.value for s in signal.Signals}
