"""A queue daemon's audit trail: one record for each answered request that may change something.

The server calls :meth:`Auditor.answered` for every request of an operator
or admin op once its answer is known, just before it leaves (an answer at
once or a later ``Request.answer``; a refusal too).  The record is written
to ``<root>/audit/<queue>.jsonl`` in one write(2) then, so a daemon killed
right after answering has it in the file; its fdatasync follows on the
``audit`` lane (one job at a time, taking all written since): a power cut
may lose the records of the last moments' answers, never an action's own
durability, which its answer waited for.

Who asked: the ``actor`` a request names (``{"user", "address"}``: the web
acting for its HTTP user) is believed from an admin peer only (the web runs
as the daemon's own user); otherwise the actor is the peer the kernel names:
its user (name, else ``uid N``), and its pid and program as where (the
kernel's path of its executable; its self-set name only where the daemon may
not read that, said to be the process's own claim).
:func:`actor` is that rule, for the records here and for the timeline lines
of what a request does to a message (``Request.actor``: ``alice
(10.0.0.5)``, ``root (rq, pid 4242)``).
"""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rqsys.background import AUDIT, Background
from rqsys.observe import audit
from rqsys.observe.events import EventLog
from rqsys.store import durable
from rqsys.store.room import Room, is_no_space

if TYPE_CHECKING:
    from collections.abc import Callable

    from rqsys.daemon.server import Connection, Reply

CREATES = ("create", "create_many", "clone", "commit")  # refused as the store refuses them
RESERVE = 256 << 10  # bytes kept for the trail's records while the file system is full
MAX_IDS = 1000  # ids listed in one record; ``count`` says how many there were
NOT_FILTER = ("op", "action", "ids", "actor")  # a bulk request's fields that are no filter


class Actor(NamedTuple):
    """Who asked, and from where, as the audit trail and the timelines name them."""

    who: str  # the HTTP user (else ``http <address>``); a socket peer's user (else ``uid N``)
    where: str  # the HTTP client's address; a socket peer's ``pid N (process name)``
    text: str  # one phrase, for a timeline's ``by``: ``alice (10.0.0.5)``, ``root (rq, pid 42)``


def actor(conn: Connection, given: Any) -> Actor:
    """The given actor (``{"user", "address"}``) from an admin peer, else the peer."""
    if isinstance(given, dict) and conn.role == "admin":
        address = str(given.get("address") or "")
        who = str(given.get("user") or f"http {address}")
        return Actor(who, address, f"{who} ({address})" if address and address not in who
                     else who)
    who, program = _user(conn.uid), program_of(conn.pid)
    return Actor(who, f"pid {conn.pid} ({program})", f"{who} ({program}, pid {conn.pid})")


_NAMES: dict[int, str] = {}  # uid -> user name, looked up once


def _user(uid: int) -> str:
    name = _NAMES.get(uid)
    if name is None:
        try:
            name = pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError):
            name = f"uid {uid}"
        _NAMES[uid] = name
    return name


class Auditor:
    """The daemon's audit file, its journal entries, and the lane that syncs them.

    A full file system: the trail is the one record that is never skipped.
    Beside the file, ``<queue>.reserve`` holds ``RESERVE`` bytes while there
    is room; a record the file system refuses frees it and is written again
    into its room.  Once the reserve is spent and the file system is still
    full, an action that would change state is refused before it is done
    (:meth:`require_room`): its record could not be written.  The reserve is
    made again when there is room."""

    def __init__(self, audit_dir: Path, queue: str, background: Background, log: EventLog,
                 room: Room, send: Callable[..., Any] | None = None) -> None:
        self.queue, self.background, self.log, self.room = queue, background, log, room
        self.send = send if send is not None else (
            audit.journal_sender() if log.journal else None)
        self.file: audit.AuditFile | None = None
        try:
            self.file = audit.AuditFile(audit_dir / f"{queue}{audit.SUFFIX}")
        except OSError as exc:
            log.event("warning", f"no audit file in {audit_dir}: {exc}")
        self.reserve = audit_dir / f"{queue}{audit.RESERVE_SUFFIX}"
        self._syncing = False
        self._spent = False  # the reserve was given up to a record: made anew with room
        self._reserve()

    def _reserve(self) -> bool:
        """The reserve there (made if missing and there is room); whether it is."""
        if self.file is None:
            return True  # no trail to keep: nothing is refused for it
        try:
            if self.reserve.stat().st_size >= RESERVE:
                self._spent = False
                return True
        except FileNotFoundError:
            pass
        try:
            with open(self.reserve, "wb") as f:
                f.write(bytes(RESERVE))  # its blocks taken now (or ENOSPC), freed by unlink
        except OSError:
            self.reserve.unlink(missing_ok=True)
            self._spent = True
            return False
        self._spent = False
        return True

    def require_room(self, op: str, args: dict[str, Any]) -> None:
        """Before an action that would change state: NoSpace when the file
        system is full and the reserve is spent (its record could not be
        written), unless the action frees room before its record is written
        (a delete, a prune): an operator can always make room."""
        if frees_room(op, args):
            return
        full = self.room.check()
        if self._spent and not full:
            self._reserve()  # room again: made anew before the disk fills again
        elif full and not self._reserve():
            raise self.room.no_space("the message was not taken" if op in CREATES else
                                     "the action was refused: its audit record could not "
                                     "be written")

    def answered(self, conn: Connection, op: str, args: dict[str, Any], reply: Reply) -> None:
        """Record ``op``'s outcome (``reply``) for the client of ``conn``."""
        who, where, _text = actor(conn, args.get("actor"))
        action, target = describe(op, args, reply)
        rec = audit.record(who, where, action, self.queue, outcome(reply), time.time(),
                           **target)
        if self.send is not None:
            self.send(audit.text(rec), **audit.journal_fields(rec))
        if self.file is None:
            return
        try:
            self._write(audit.line(rec))
        except OSError as exc:
            self.log.event("err", f"audit record not written: {exc}: {audit.text(rec)}")
            return
        self._sync()

    def _write(self, line: bytes) -> None:
        """One record; refused for room, written again in the reserve's."""
        assert self.file is not None
        try:
            self.file.write(line)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            self._give_up_reserve()
            self._spent = True
            self.room.doubt()
            self.file.write(b"")  # what the file system did not take of it

    def _give_up_reserve(self) -> None:
        """The reserve's blocks freed for the record, its unlink committed: a
        journalled file system gives freed blocks again only once it is."""
        try:
            durable.unlink_durably(self.reserve)
        except FileNotFoundError:
            pass

    def _sync(self) -> None:
        if self._syncing or self.file is None or not self.file.dirty:
            return
        self._syncing = True
        self.background.submit(self.file.sync_job(), self._synced, AUDIT)

    def _synced(self, new_fd: int | None, error: BaseException | None) -> None:
        self._syncing = False
        if error is not None:
            self.log.event("err", f"audit file not synced: {error}")
        elif self.file is not None and new_fd is not None:
            self.file.synced(new_fd)
        self._sync()

    def close(self) -> None:
        """At stop: what is written, synced (the lanes are gone by then)."""
        if self.file is not None:
            self.file.sync_now()
            self.file.close()


def frees_room(op: str, args: dict[str, Any]) -> bool:
    """Whether ``op`` removes messages before its record is written."""
    return op in ("delete", "destroy", "prune") or (
        op in ("bulk", "group") and args.get("action") == "delete")


def outcome(reply: Reply) -> str:
    if reply.get("ok"):
        return "ok"
    return "refused" if reply.get("kind") == "Forbidden" else "failed"


def describe(op: str, args: dict[str, Any], reply: Reply) -> tuple[str, dict[str, Any]]:
    """The action's name and its target: message ids, a filter, a count, an error."""
    action = str(args.get("oper", op)) if op == "adminoper" else op
    if op in ("bulk", "group"):
        action = f"{op}_{args.get('action', '')}"
    ids = [args["msg_id"]] if "msg_id" in args else list(args.get("ids") or [])
    target: dict[str, Any] = {}
    if op in ("create", "clone") and reply.get("msg_id"):
        ids.append(reply["msg_id"])
    if op == "create_many" and reply.get("ok"):
        ids = [r["msg_id"] for r in reply.get("results", ()) if "msg_id" in r]
        target["count"] = len(ids)
    for key in ("count", "removed"):
        if isinstance(reply.get(key), int):
            target["count"] = reply[key]
    if op == "bulk":
        target["filter"] = {k: v for k, v in args.items() if k not in NOT_FILTER}
    elif op == "group":
        target["filter"] = {"group": args.get("group")}
    if not reply.get("ok"):
        target["error"] = f"{reply.get('kind', 'RQError')}: {reply.get('error', '')}"
    return action, {"msg_ids": ids[:MAX_IDS], **target}


def program_of(pid: int) -> str:
    """The process's program as the kernel names it (``/proc/<pid>/exe``'s
    target), else its name as it calls itself, said to be its own claim
    (``calls itself rqsys-web``: ``/proc/<pid>/comm``, which a process sets
    with prctl; a process of another user keeps its exe from this one),
    ``?`` once it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            comm = f.read().decode(errors="replace").strip()
    except OSError:
        return "?"
    return f"calls itself {comm}" if comm else "?"
