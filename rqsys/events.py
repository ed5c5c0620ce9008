"""The daemons' own log: structured journal entries, or plain stderr lines.

Under systemd every event is a journal entry with a MESSAGE_ID (so
``journalctl MESSAGE_ID=...`` finds all of one kind) and RQ_QUEUE / RQ_MSG_ID
fields; elsewhere it is one line on stderr.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

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
PRIORITY = {"err": 3, "script": 4, "daemon": 6}
# A sink sees every event of a message: (kind, text, msg_id, fields); the
# message timeline and the queue's stats are sinks (rqsys.timeline, rqsys.stats).
Sink = Callable[[str, str, str, dict[str, Any]], None]


def journal_available() -> bool:
    """True when stderr is connected to journald (systemd sets JOURNAL_STREAM)."""
    return bool(os.environ.get("JOURNAL_STREAM")) and os.path.exists(
        "/run/systemd/journal/socket")


class EventLog:
    """Logs daemon events for one component (a queue name, 'web', 'scan', ...)."""

    def __init__(self, component: str, journal: bool | None = None) -> None:
        self.component = component
        self.journal = journal_available() if journal is None else journal
        self._send: Any = None
        if self.journal:
            from systemd import journal as sd_journal

            self._send = sd_journal.send
        self.sinks: list[Sink] = []

    def event(self, kind: str, text: str, msg_id: str = "", **fields: Any) -> None:
        self.record(kind, msg_id, text, **fields)
        line = f"{self.component}: {msg_id + ': ' if msg_id else ''}{kind}: {text}"
        if self._send is None:  # the journal stamps its entries; a plain line gets a time
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
            sys.stderr.write(f"{stamp}Z {line}\n")  # one write(2) per event: print() makes two
            sys.stderr.flush()
            return
        extra = {k.upper(): str(v) for k, v in fields.items()}
        if msg_id:
            extra["RQ_MSG_ID"] = msg_id
        self._send(line, MESSAGE_ID=MESSAGE_IDS.get(kind, MESSAGE_IDS["daemon"]),
                   PRIORITY=str(PRIORITY.get(kind, 6)), RQ_QUEUE=self.component,
                   RQ_EVENT=kind, **extra)

    def record(self, kind: str, msg_id: str, text: str = "", **fields: Any) -> None:
        """Tell the sinks only (no log line): what is too frequent or too
        detailed for the journal, such as a script's status lines and rusage."""
        for sink in self.sinks:
            sink(kind, text, msg_id, fields)

    def warn(self, text: str, msg_id: str = "") -> None:
        self.event("script" if msg_id else "daemon", text, msg_id)
