"""The daemons' own log: structured journal entries, or plain stderr lines.

Under systemd every event is a journal entry with a MESSAGE_ID (so
``journalctl MESSAGE_ID=...`` finds all of one kind) and RQ_QUEUE / RQ_MSG_ID
fields; elsewhere it is one line on stderr.

A queue daemon's log is *batched*: its stderr lines and the files its sinks
keep (timelines, the stats journal) are written once per loop turn, when the
loop calls :meth:`EventLog.flush` before it waits again, and before any
answer is sent (so a client told ``ok`` reads the events before it), not
once per event: at thousands of messages a second the writes were most of
the daemon's system calls.  Other daemons write each line at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from types import FunctionType, MethodType
from typing import Any, Protocol

# MESSAGE_IDs (journalctl --new-id128), one per kind of event.
MESSAGE_IDS = {
    "created": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a11",
    "started": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a12",
    "done": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a13",
    "err": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a14",
    "resend": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a15",
    "relayed": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a16",
    "recovered": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a17",
    "deleted": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a18",
    "script": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a19",
    "daemon": "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a1a",
}
PRIORITY = {"err": 3, "script": 4, "warning": 4, "daemon": 6}
# A sink sees every event of a message: (kind, text, msg_id, fields); the
# message timeline and the queue's stats are sinks (rqsys.observe.timeline, rqsys.observe.stats).
# A sink with a ``kinds`` attribute (a set of kinds; see ``listening``) is
# told only those: most events of a run matter to two or three sinks of six.
Sink = Callable[[str, str, str, dict[str, Any]], None]


def listening(*kinds: str) -> Callable[[Any], Any]:
    """Mark a sink function as told only events of these ``kinds``."""
    def mark(sink: Any) -> Any:
        sink.kinds = frozenset(kinds)
        return sink
    return mark


class Flushing(Protocol):
    """A batching sink: what it holds is written when the loop turn ends."""

    def flush(self) -> None: ...


class _Sinks(list):  # type: ignore[type-arg]
    """An EventLog's sinks: a change forgets the routes made from them."""

    def __init__(self, routes: dict[str, list[Sink]]) -> None:
        super().__init__()
        self._routes = routes

    def append(self, sink: Sink) -> None:
        self._routes.clear()
        super().append(sink)

    def __iadd__(self, sinks: Any) -> _Sinks:  # type: ignore[misc]
        self._routes.clear()
        return super().__iadd__(sinks)

    def extend(self, sinks: Any) -> None:
        self._routes.clear()
        super().extend(sinks)

    def remove(self, sink: Sink) -> None:
        self._routes.clear()
        super().remove(sink)


def journal_available() -> bool:
    """True when stderr is connected to journald (systemd sets JOURNAL_STREAM)."""
    return bool(os.environ.get("JOURNAL_STREAM")) and os.path.exists(
        "/run/systemd/journal/socket")


class EventLog:
    """Logs daemon events for one component (a queue name, 'web', 'scan', ...)."""

    def __init__(self, component: str, journal: bool | None = None,
                 batched: bool = False) -> None:
        self.component = component
        self.batched = batched  # stderr lines held until flush() (see the module's docstring)
        self._lines: list[str] = []
        self.flushing: list[Flushing] = []  # batching sinks, flushed with the lines
        self.journal = journal_available() if journal is None else journal
        self._send: Any = None
        if self.journal:
            from systemd import journal as sd_journal

            self._send = sd_journal.send
        self._routes: dict[str, list[Sink]] = {}  # kind -> the sinks told of it
        self.sinks: list[Sink] = _Sinks(self._routes)

    def event(self, kind: str, text: str, msg_id: str = "", **fields: Any) -> None:
        self.record(kind, msg_id, text, **fields)
        line = f"{self.component}: {msg_id + ': ' if msg_id else ''}{kind}: {text}"
        if self._send is None:  # the journal stamps its entries; a plain line gets a time
            self._lines.append(f"{_stamp()}Z {line}\n")
            if not self.batched:
                self._write_lines()
            return
        extra = {k.upper(): "\n".join(map(str, v)) if isinstance(v, list) else str(v)
                 for k, v in fields.items()}  # a list: a line each (riders, last lines)
        if msg_id:
            extra["RQ_MSG_ID"] = msg_id
        self._send(line, MESSAGE_ID=MESSAGE_IDS.get(kind, MESSAGE_IDS["daemon"]),
                   PRIORITY=str(PRIORITY.get(kind, 6)), RQ_QUEUE=self.component,
                   RQ_EVENT=kind, **_CODE, **extra)

    def record(self, kind: str, msg_id: str, text: str = "", **fields: Any) -> None:
        """Tell the sinks only (no log line): what is too frequent or too
        detailed for the journal, such as a script's status lines and rusage."""
        sinks = self._routes.get(kind)
        if sinks is None:
            sinks = self._routes[kind] = [_direct(sink) for sink in self.sinks
                                          if kind in getattr(sink, "kinds", (kind,))]
        for sink in sinks:
            sink(kind, text, msg_id, fields)

    def moved(self, msg_id: str, state: str) -> None:
        """A message's directory moved with no event of its own yet (a start the
        fork server has not answered): the sinks that write into it follow."""
        for sink in self.sinks:
            follow = getattr(sink, "moved", None)
            if follow is not None:
                follow(msg_id, state)

    def warn(self, text: str, msg_id: str = "") -> None:
        self.event("script" if msg_id else "daemon", text, msg_id)

    def flush(self) -> None:
        """Write what this turn's events left: the batching sinks' files, then
        the stderr lines (one write(2) for all of them)."""
        for sink in self.flushing:
            sink.flush()
        if self._lines:
            self._write_lines()

    def _write_lines(self) -> None:
        text, self._lines = "".join(self._lines), []
        sys.stderr.write(text)  # print() would make two write(2)s a line
        sys.stderr.flush()


def _direct(sink: Sink) -> Sink:
    """An object sink's bound ``__call__`` (a call through the type's slot cost
    more than one of a bound method; a function or method is itself)."""
    if isinstance(sink, FunctionType | MethodType):
        return sink
    return getattr(sink, "__call__", sink)  # noqa: B004 (a Mock is callable all the same)


# What journal.send would find by walking the stack at every entry (it does
# unless told: a tenth of an event's cost), always this module's ``event``.
_CODE = {"CODE_FILE": __file__, "CODE_LINE": EventLog.event.__code__.co_firstlineno,
         "CODE_FUNC": "event"}
_STAMP: list[Any] = [0, ""]  # (second, its text): a busy loop logs many events a second


def _stamp() -> str:
    now = int(time.time())
    if _STAMP[0] != now:
        _STAMP[:] = [now, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))]
    return str(_STAMP[1])
