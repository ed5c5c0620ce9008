"""A journal trigger's work off rq-scan's loop: entries after its cursor, each made one message.

Runs on the trigger's own lane of rq-scan's ``Background`` (one thread, its
jobs in turn), so :class:`Work`, its ``systemd.journal.Reader`` and its
state file have one user at a time; the loop touches the reader (its
``process()``) only while no job of it is queued or running.  Each matching
entry is one message: its fields as ``entry.json``, its ``MESSAGE`` as
``param1``, ``unique_key`` ``journal:<trigger>:<cursor>``.  The cursor is
written durably to ``triggers/.state/<name>.journal.json`` after each message
made, so a restart neither repeats nor skips an entry (and a crash between
"made" and "written" is answered ``duplicate`` by the unique key).  A trigger
seen for the first time starts at that moment (its ``since``), not at the
journal's head.  Past ``rate_limit`` entries are folded: counted, with their
first and last cursors, into one message (``folded N entries``) made as soon
as the window has room again.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rqsys.errors import ConfigError, NotFound, QueueDown, RQError, Unavailable
from rqsys.store import Layout, durable
from rqsys.triggers import params, record, spec
from rqsys.triggers.spec import Trigger
from rqsys.triggers.webhook import body_file
from rqsys.wire.client import QueueClient

UNIQUE_FOR = 604800.0  # seconds an entry's key is held after its message ended
RETRY = 5.0  # seconds before trying again: no journal readable, a queue missing or down
POLL = 1.0  # seconds between looks where the reader's fd cannot tell of new entries
BATCH = 256  # entries read by one job (the loop then hands it the next batch)
PARAM_MAX = 4000  # characters of MESSAGE kept in param1 (entry.json has it whole)
TIMEOUT = 60.0
FOLDED = "folded"  # the record's count of entries folded (beside made/duplicate/refused)
UNREADABLE = "unreadable"  # the record's count of times no journal could be read
RANGE = re.compile(r"^([0-7])\.\.([0-7])$")
NO_JOURNAL = ("no journal readable here (no journald writing /run/log/journal or "
              "/var/log/journal, or not readable by this user: the systemd-journal group)")


@dataclass(frozen=True)
class JournalSpec:
    """What a journal trigger says: its match terms, the message, its params, the rate limit."""

    name: str
    terms: tuple[str, ...]
    msg: dict[str, Any]
    params: dict[str, str]
    limit: int | None = None
    per: float = 0.0

    @property
    def dest(self) -> str:
        return str(self.msg["dest"])


def match_terms(match: dict[str, str]) -> tuple[str, ...]:
    """``{"PRIORITY": "0..3", "_SYSTEMD_UNIT": "x"}`` -> ``FIELD=value`` terms for
    ``Reader.add_match`` (terms of one field are ORed by the journal, fields ANDed)."""
    terms: list[str] = []
    for name, value in sorted(match.items()):
        if name == "PRIORITY" and ".." in value:
            found = RANGE.match(value)
            if found is None or int(found[1]) > int(found[2]):
                raise ConfigError(f"PRIORITY {value[:20]!r}: a range is a..b, 0 <= a <= b <= 7")
            terms += [f"PRIORITY={p}" for p in range(int(found[1]), int(found[2]) + 1)]
        else:
            terms.append(f"{name}={value}")
    return tuple(terms)


def journal_spec(trigger: Trigger, rate_limit: Any) -> JournalSpec:
    """The trigger's JournalSpec; ConfigError for a PRIORITY range that is none."""
    terms = match_terms(dict(trigger.settings["match"]))
    limit = dict(rate_limit) if isinstance(rate_limit, dict) else {}
    return JournalSpec(trigger.name, terms, dict(trigger.msg), dict(trigger.params),
                       limit.get("limit"), float(limit.get("per", 0.0)))


def plain(value: Any) -> Any:
    """A journal field's value as JSON: bytes, times and UUIDs as strings, lists kept."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return str(value // datetime.timedelta(microseconds=1))
    if isinstance(value, uuid.UUID):
        return value.hex
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def entry_doc(entry: dict[str, Any]) -> dict[str, Any]:
    return {str(k): plain(v) for k, v in entry.items()}


def message(js: JournalSpec, doc: dict[str, Any], body: bytes, key: str) -> dict[str, Any]:
    """``msg``, ``param1`` the entry's MESSAGE, the params taken from it (``$.FIELD``)."""
    text = doc.get("MESSAGE")
    text = text if isinstance(text, str) else json.dumps(text)
    got = params.gather(js.params, body, lambda _name: None)
    return {**js.msg, "param1": text[:PARAM_MAX], **got, "unique_key": key,
            "unique_for": UNIQUE_FOR}


def fold_message(js: JournalSpec, fold: dict[str, Any]) -> dict[str, Any]:
    return {**js.msg, "param1": f"folded {fold['count']} entries",
            "unique_key": f"journal:{js.name}:folded:{fold['first']}", "unique_for": UNIQUE_FOR}


@dataclass
class Window:
    """The rate limit: at most ``limit`` messages in any ``per`` seconds (no limit: None)."""

    limit: int | None
    per: float
    sent: list[float] = field(default_factory=list)  # times of the messages in the window

    def room(self, now: float) -> bool:
        self.sent = [t for t in self.sent if t > now - self.per]
        return self.limit is None or len(self.sent) < self.limit

    def take(self, now: float) -> None:
        if self.limit is not None:
            self.sent.append(now)

    def free_in(self, now: float) -> float:
        """Seconds until there is room again (0: there is)."""
        if self.room(now):
            return 0.0
        return max(0.0, min(self.sent) + self.per - now)


def open_reader(terms: tuple[str, ...]) -> Any:
    """A ``systemd.journal.Reader`` on the local journal, matching ``terms``."""
    from systemd import journal  # type: ignore[import-untyped]

    reader = journal.Reader()
    for term in terms:
        reader.add_match(term)
    return reader


@dataclass
class Result:
    """What a job tells the loop: lines to log, the reader's fd, and when to run again."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    fd: int | None = None
    wake_in: float | None = None  # seconds until a job is due anyway (None: on entries only)


class Stop(Exception):
    """The queue cannot take a message now: the entry is read again later."""


class Work:
    """One journal trigger's reader, cursor and rate window, on its lane."""

    def __init__(self, layout: Layout, name: str,
                 opener: Callable[[tuple[str, ...]], Any] = open_reader) -> None:
        self.layout, self.name, self.opener = layout, name, opener
        self.triggers = spec.triggers_dir(layout)
        self.path = self.triggers / record.STATE_DIR / f"{name}.journal.json"
        self.reader: Any = None
        self.terms: tuple[str, ...] | None = None
        self.state: dict[str, Any] | None = None  # cursor, since, fold, sent
        self.window = Window(None, 0.0)
        self.seek = True  # the reader is to be put at the saved cursor
        self.failing = ""  # why no entry can be read or made (said once)
        self.clients: dict[str, QueueClient] = {}
        self.busy = False  # the loop's: a job is queued or running (the reader is the lane's)

    # ------------------------------------------------------------ the job
    def run(self, js: JournalSpec) -> Result:
        """Read the entries after the cursor (a batch), each made a message or folded."""
        out = Result()
        self._load(js)
        reader = self._reader(js, out)
        if reader is None:
            out.wake_in = RETRY
            return out
        try:
            self._read(js, reader, out)
        except Stop:
            self.seek, out.wake_in = True, RETRY
        finally:
            for conn in self.clients.values():
                conn.close()
            self.clients.clear()
            self._save()
        out.fd = int(reader.fileno())
        if not reader.reliable_fd():  # (a journal on a network file system): look every POLL
            out.wake_in = min(POLL, POLL if out.wake_in is None else out.wake_in)
        return out

    def process(self) -> None:
        """The loop's, on the reader's readiness (no job queued or running)."""
        if self.reader is not None:
            with contextlib.suppress(OSError):  # the job that follows reads what it can
                self.reader.process()

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.reader, self.terms, self.seek = None, None, True

    def _reader(self, js: JournalSpec, out: Result) -> Any:
        if self.reader is not None and self.terms == js.terms:
            return self.reader
        self.close()
        try:
            reader = self.opener(js.terms)
            readable = reader.has_runtime_files() or reader.has_persistent_files()
        except OSError as exc:
            self._failed(f"journal: {exc}", out)
            return None
        if not readable:
            reader.close()
            self._failed(NO_JOURNAL, out)
            return None
        reader.fileno()  # its inotify watches, from now on
        self.reader, self.terms = reader, js.terms
        self._fine(f"reading the journal matching {' '.join(js.terms)}", out)
        return reader

    def _read(self, js: JournalSpec, reader: Any, out: Result) -> None:
        assert self.state is not None
        skip = self._seek(reader)
        for _n in range(BATCH):
            entry = reader.get_next()
            if not entry:
                break
            cursor = str(entry["__CURSOR"])
            if cursor != skip:
                self._entry(js, entry, cursor, out)
        else:
            out.wake_in = 0.0  # more to read: the next job goes on
        self._fold_out(js, out)

    def _seek(self, reader: Any) -> str | None:
        """Put the reader at the saved cursor (the entry there, returned, is skipped)."""
        assert self.state is not None
        if not self.seek:
            return None
        self.seek = False
        if self.state.get("cursor"):
            reader.seek_cursor(self.state["cursor"])
            return str(self.state["cursor"])
        reader.seek_realtime(float(self.state["since"]))
        return None

    # ------------------------------------------------------------ an entry
    def _entry(self, js: JournalSpec, entry: dict[str, Any], cursor: str, out: Result) -> None:
        assert self.state is not None
        now = time.time()
        fold = self.state.get("fold")
        if fold and self.window.room(now):
            self._make_fold(js, fold, out)
        if not self.window.room(now):
            fold = self.state.setdefault("fold", None) or {"count": 0, "first": cursor}
            fold.update(count=fold["count"] + 1, last=cursor)
            self.state.update(fold=fold, cursor=cursor)
            return
        doc = entry_doc(entry)
        body = json.dumps(doc, sort_keys=True).encode()
        key = f"journal:{self.name}:{cursor}"
        self._make(js, message(js, doc, body, key), "entry.json", body, out)
        self.state["cursor"] = cursor
        self._save(force=True)

    def _fold_out(self, js: JournalSpec, out: Result) -> None:
        """The folded entries' message once the window has room; else when to look again."""
        assert self.state is not None
        fold = self.state.get("fold")
        if not fold:
            return
        wait = self.window.free_in(time.time())
        if wait > 0:
            out.wake_in = min(wait, out.wake_in if out.wake_in is not None else wait)
            return
        self._make_fold(js, fold, out)
        self._save(force=True)

    def _make_fold(self, js: JournalSpec, fold: dict[str, Any], out: Result) -> None:
        assert self.state is not None
        body = json.dumps({"folded": fold["count"], "first_cursor": fold["first"],
                           "last_cursor": fold["last"]}, sort_keys=True).encode()
        folded = int(record.read(self.triggers, self.name).get(FOLDED) or 0) + fold["count"]
        self._make(js, fold_message(js, fold), "folded.json", body, out, {FOLDED: folded})
        self.state["fold"] = None

    def _make(self, js: JournalSpec, msg: dict[str, Any], attach: str, body: bytes,
              out: Result, made: dict[str, Any] | None = None) -> None:
        """Create the message (Stop when its queue cannot take it now); ``made``:
        fields of the record written with a message made (not a duplicate)."""
        try:
            got = self._create(js, msg, attach, body)
        except (Unavailable, QueueDown, NotFound) as exc:
            self._failed(f"no message in {js.dest}: {type(exc).__name__}: {exc}", out,
                         outcome="refused")
            raise Stop from exc
        except RQError as exc:
            why = f"{msg['unique_key']}: {type(exc).__name__}: {exc}"
            self._note("refused", out, error=why)
            out.lines.append(("err", f"trigger {self.name}: no message for {why}"))
            return
        self.window.take(time.time())
        outcome = "duplicate" if got.get("duplicate") else "made"
        extra = (made or {}) if outcome == "made" else {}
        self._note(outcome, out, last_msg_id=str(got["msg_id"]), last_queue=js.dest, **extra)
        self._fine("", out)

    def _create(self, js: JournalSpec, msg: dict[str, Any], attach: str,
                body: bytes) -> dict[str, Any]:
        if not self.layout.queue_dir(js.dest).is_dir():
            raise NotFound(f"no queue named {js.dest}")
        if js.dest not in self.clients:
            self.clients[js.dest] = QueueClient(self.layout, js.dest, timeout=TIMEOUT)
        by = f"trigger {self.name}"
        fd, md5 = body_file(body)
        try:
            return self.clients[js.dest].call(
                "create", fds=[fd], msg=msg, by=by, attachments=[{"name": attach, "md5": md5}],
                actor={"user": by, "address": "rq-scan", "role": "operator"})
        finally:
            os.close(fd)

    # ------------------------------------------------------------ saying so
    def _failed(self, why: str, out: Result, outcome: str = UNREADABLE) -> None:
        """Said once (a line and the record's last_error) until it works again."""
        if self.failing == why:
            return
        self.failing = why
        out.lines.append(("err", f"trigger {self.name}: {why}; trying again every "
                                 f"{RETRY:.0f} s"))
        self._note(outcome, out, error=why)

    def _fine(self, what: str, out: Result) -> None:
        if self.failing:
            out.lines.append(("daemon", f"trigger {self.name}: works again"
                                        f"{': ' + what if what else ''}"))
            self.failing = ""
        elif what:
            out.lines.append(("daemon", f"trigger {self.name}: {what}"))

    def _note(self, outcome: str, out: Result, **fields: Any) -> None:
        try:
            record.note(self.triggers, self.name, outcome, **fields)
        except OSError as exc:
            out.lines.append(("err", f"trigger {self.name}: record not written: {exc}"))

    # ------------------------------------------------------------ the state file
    def _load(self, js: JournalSpec) -> None:
        if self.state is None:
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError):
                data = {}  # none yet (or torn): from now on
            self.state = data if isinstance(data, dict) and data.get("since") else {}
            if not self.state:
                self.state = {"cursor": None, "since": time.time(), "fold": None, "sent": []}
                self._save(force=True)  # a restart goes on from here, not from its own now
            self.window.sent = [float(t) for t in self.state.get("sent") or []]
        self.window.limit, self.window.per = js.limit, js.per

    def _save(self, force: bool = False) -> None:
        if self.state is None or not force and not self.state.get("fold"):
            return
        self.state["sent"] = list(self.window.sent)
        self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        durable.write_file_durably(self.path, json.dumps(self.state, sort_keys=True).encode())
