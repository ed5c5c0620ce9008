"""The audit trail: who changed what, from where, and how it ended, one JSON line per action.

Every state-changing action (an op whose role in ``rqsys.wire.roles`` is
operator or admin) is recorded by the queue daemon that decided it, once it
has been answered (``rqsys.daemon.audit``); the web records what reaches no
daemon (``new_queue``, and its own refusals).  Each writer has its own file
under ``<root>/audit/`` (``<queue>.jsonl``, ``web.jsonl``), appended in one
write(2) before the answer leaves, fdatasynced after it on a background lane
(the web syncs at once), and rotated by size: at ``AUDIT_MAX_BYTES`` (16
MiB) the file becomes ``.1`` and the older ones move up, ``AUDIT_KEEP`` (5)
kept.  Under journald each record is also a journal entry of its own
``MESSAGE_ID`` with ``RQ_AUDIT_*`` fields.  See docs/AUDIT.md.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rqsys.store import durable

MESSAGE_ID = "5d0a6b1e2c3f4b7e9a1d8c2b4f6e0a20"  # every audit record's journal entries
AUDIT_MAX_BYTES = 16 << 20  # a file is rotated once it has grown past this
AUDIT_KEEP = 5  # rotated files kept: <name>.1 (newest) .. <name>.5
MAX_BYTES_ENV = "RQ_AUDIT_MAX_BYTES"  # tests (and the cautious) set a smaller size
WEB = "web"  # the web's own file: web.jsonl
SUFFIX = ".jsonl"
RESERVE_SUFFIX = ".reserve"  # a queue daemon's room for its records on a full disk
Record = dict[str, Any]


def max_bytes(environ: dict[str, str] | None = None) -> int:
    """The rotation size: ``$RQ_AUDIT_MAX_BYTES`` when set to a positive number."""
    text = (os.environ if environ is None else environ).get(MAX_BYTES_ENV, "")
    return int(text) if text.isdigit() and int(text) > 0 else AUDIT_MAX_BYTES


def record(actor: str, where: str, action: str, queue: str, result: str,
           at: float, **target: Any) -> Record:
    """One record: ``result`` is ok, failed or refused (``error`` then says why)."""
    return {"time": round(at, 3), "actor": actor, "from": where, "action": action,
            "queue": queue, **{k: v for k, v in target.items() if v not in (None, "", [])},
            "result": result}


def line(rec: Record) -> bytes:
    return (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def journal_fields(rec: Record) -> dict[str, str]:
    """The record as journal fields (sent beside its MESSAGE= text)."""
    fields = {"MESSAGE_ID": MESSAGE_ID, "PRIORITY": "5", "RQ_AUDIT_ACTOR": rec["actor"],
              "RQ_AUDIT_FROM": rec["from"], "RQ_AUDIT_ACTION": rec["action"],
              "RQ_AUDIT_RESULT": rec["result"], "RQ_QUEUE": rec["queue"]}
    ids = rec.get("msg_ids") or []
    if ids:
        fields["RQ_MSG_ID"] = ids[0]
        fields["RQ_AUDIT_MSG_IDS"] = " ".join(ids)
    for key in ("count", "error", "filter"):
        if key in rec:
            fields[f"RQ_AUDIT_{key.upper()}"] = json.dumps(rec[key]) if key == "filter" \
                else str(rec[key])
    return fields


def text(rec: Record) -> str:
    """The record as one readable line (the journal's MESSAGE=, ``rq audit``'s output)."""
    ids = rec.get("msg_ids") or []
    target = " ".join(ids[:3]) + (f" (+{len(ids) - 3})" if len(ids) > 3 else "")
    if "count" in rec:
        target += f" {rec['count']} messages"
    if "filter" in rec:
        target += " " + json.dumps(rec["filter"], sort_keys=True)
    said = rec["result"] + (f": {rec['error']}" if rec.get("error") else "")
    return f"audit: {rec['actor']} ({rec['from']}) {rec['action']} {rec['queue']} " \
           f"{target.strip()} -> {said}".replace("  ", " ")


def journal_sender() -> Callable[..., Any] | None:
    """systemd's ``journal.send`` when this process logs to journald, else None."""
    from rqsys.observe.events import journal_available

    if not journal_available():
        return None
    from systemd import journal

    return journal.send  # type: ignore[no-any-return]


class AuditFile:
    """One writer's audit file: lines written at once, synced on request, rotated by size.

    A sync is a job (``sync_job``) for a background lane or run at once
    (``sync_now``); the job fdatasyncs the file, and rotates it when it has
    grown past ``max_bytes``, opening the new one; ``synced`` takes the new
    fd on the writer's side (what was written to the old one meanwhile is
    synced, and the old fd closed, by the next job)."""

    def __init__(self, path: Path, max_size: int | None = None, keep: int = AUDIT_KEEP) -> None:
        self.path, self.keep = path, keep
        self.max_size = max_bytes() if max_size is None else max_size
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = durable.open_log(path)
        self.size = os.fstat(self.fd).st_size
        self.dirty = False  # written since the last sync job began
        self._closing: list[int] = []  # rotated away: synced and closed by the next job
        self.pending = b""  # a record's tail a full file system did not take (short write)

    def write(self, data: bytes) -> None:
        """Append ``data`` (O_APPEND: one write(2), whole, as a rule).  A full
        file system may take only part of it: the rest is kept in ``pending``
        and the OSError raised; the next write (``b""`` to retry) puts the
        rest first, so no record is torn by a later one."""
        view = memoryview(self.pending + data)
        try:
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
                self.size += written
                self.dirty = True
        finally:
            self.pending = bytes(view)

    def sync_job(self) -> Callable[[], int]:
        """The job syncing what is written so far: returns a new file's fd, or -1."""
        fd, closing, self._closing, self.dirty = self.fd, self._closing, [], False
        rotate = self.size >= self.max_size
        path, keep = self.path, self.keep

        def job() -> int:
            durable.fsync_logs([fd], closing)
            if not rotate:
                return -1
            durable.rotate_log(path, keep)
            return durable.open_log(path)
        return job

    def synced(self, new_fd: int) -> None:
        """On the writer's side, after a job: a rotated file's fd replaced."""
        if new_fd >= 0:
            self._closing.append(self.fd)
            self.fd, self.size, self.dirty = new_fd, 0, True  # the old fd's tail: next job

    def sync_now(self) -> None:
        self.synced(self.sync_job()())
        if self._closing:
            self.synced(self.sync_job()())

    def close(self) -> None:
        for fd in [*self._closing, self.fd]:
            os.close(fd)
        self._closing, self.fd = [], -1
