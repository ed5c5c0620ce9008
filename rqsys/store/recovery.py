"""Recovery at start, the que snapshot, and what is durable when (the durability table).

Every state change of a message is one ``rename(2)`` of its directory
(``durable.py`` holds every rename and sync of the store).  This table says
what is on disk before anything is acknowledged, and what is batched.  A
crash may at worst re-run a message; it never loses one.

=============================  ==================================  ===========================
transition                     on disk when                        after a crash before that
=============================  ==================================  ===========================
create in que, local dup       before ``ok``: msg written into a   no ``ok`` was sent: removed
                               spare directory (already durable)   at start (unless its msg is
                               and fdatasynced; then moved into    complete: then, as after
                               que/ (batched)                      ``ok``, moved into place)
create in prep, or without a   before ``ok``: msg written in        as above
ready spare                    a new ``.tmp/<id>.<state>/`` and
                               fsynced; then moved (batched)
create (several in one loop    before ``ok``: the same with one     as above
turn: group commit)            syncfs for all
commit, attach, clone, delete  before ``ok`` (fsync file + dirs)    as above
admin state, msg rewritten on  before ``ok`` / before the move      old admin state / old due
resend or run_now
que -> run, run -> done / err  renamed at once; parents fsynced     found in its earlier dir:
/ relayed / que                at most every FLUSH_INTERVAL and     run/ goes back to que/ at
                               at exit (:meth:`QueueStore.flush`)   start; a lost ``done`` means
                                                                    one more run
err -> que (a retry: one, a    before ``ok``: renamed, then err/    in err/ (retry it again) or
group's, a bulk batch)         and que/ fsynced off the loop (a     in que/, its status not yet
                               bulk batch: per batch of 250; its    set aside (blanked when it
                               status set aside as status.last)     starts)
``status`` and ``count`` files written in place, never synced       old, empty or missing; an
                               (advisory)                           ended message without its
                                                                    ``count`` reads as count 0
a run a crash cut short        at start: its msg's count raised     counted again at the next
                               by one (and, with a timeout, the     start
                               time it used added to its
                               ``timeout_used``), durably, before
                               the move back to que/
=============================  ==================================  ===========================

A clean stop with many queued messages writes them all to ``que.snapshot``
(durably); the next start uses it only if its ids are exactly those in
``que/``, and removes it durably before anything else happens.

Why one sync of ``msg`` makes a new message durable: its temp directory's
entry must be on disk too.  A spare's entry was made durable when the spare
was made, off the create's path (:class:`SpareMaker` fsyncs its new blank
msg); a new ``.tmp/<id>.<state>/`` gets it from the fsync of its new msg.
Both rely on the file system making a new file's new directory durable with
it: on journalling ext4 and xfs, fsync commits the transaction that created
the directory; ext4 without a journal syncs a new file's newly made parent
directories on fsync (``ext4_sync_parent``).

What each file system needs for a rename (every move above) to keep the
message in one directory or the other across a power cut:

- ext4 with a journal, xfs: nothing more; a rename is one transaction, whole
  or not at all, and the fsyncs above say when it is on disk.
- ext4 without a journal: the rename's two directory blocks reach the disk
  independently, and the source's can go first (a spare's fsync syncs
  ``.tmp/``, a group commit's syncfs writes everything, a later rename into
  the source writes its block), leaving the message in neither: e2fsck puts
  it in ``lost+found/``.  So recovery sets ``chattr +D`` on every state
  directory and shard (``dirsync.py``): ext4 then writes the destination's
  block inside ``rename(2)``, before it removes the source's entry.  The flag
  does not write the destination's inode, so a rename that grew the
  destination by a block fsyncs it at once (:func:`durable.sync_if_grown`),
  a new hour's shard is fsynced with its parent before a message goes in,
  and the batched fsyncs go destinations first (shards, done, err, relayed,
  then run, que, prep, ``.tmp/``).  A cut between the two halves leaves the
  message in both; e2fsck keeps one entry, and either is a state recovery
  knows (``.tmp/`` is moved into place, ``run/`` goes back to ``que/``).
  And an fsync there does not write the block group's descriptor, whose
  count of never-used inodes e2fsck trusts: a new inode past it is taken for
  unused and its blocks for free, which e2fsck then hands to its clones of
  other blocks.  So whatever makes new inodes before an answer ends with a
  syncfs there: a batch of spares, a create not on a spare (prep) or with
  attachments, an attachment, a durable file write, a new shard, and
  recovery (what it freed is free on disk before anything reuses it).

New messages for que/ take *spare* directories made ahead of time in
``.tmp/`` by a thread of the daemon (holding a blank ``msg``; see
:class:`SpareMaker`), so a create does not wait for an inode to be made.  A
message's other files are made when first needed (``job/`` and its
``stdio.log`` as it starts, ``status`` and ``timeline`` at their first
line): two inodes a queued message.

Recovery at start (:meth:`QueueStore.recover`): a temp directory with a
readable msg (``.tmp/<id>.<state>``, or a spare: que) is moved into place,
everything else in ``.tmp/`` is removed, ``run/`` goes back to ``que/``,
``prep/`` is kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rqsys.errors import RQError
from rqsys.store import dirsync, durable, msgshare
from rqsys.store.layout import (
    MSG_ID_RE,
    QUE_SNAPSHOT,
    SET_ASIDE_DIR,
    SHARDED_STATES,
    SPARE_PREFIX,
    STATES,
    TMP_DIR,
)
from rqsys.store.room import is_no_space

STARTED = "started"  # in a message's directory: when its last run with a timeout began
TIME_USED = "timeout_used"  # msg field: seconds of its timeout runs cut short used
READ_AT_START = ("prep", "que", "run")  # the states whose every message a start reads

if TYPE_CHECKING:
    from rqsys.store.queue import QueueStore


def recover(store: QueueStore) -> list[str]:
    """Clean temp files, move ``run/`` back to ``que/``; returns recovered ids."""
    for state in STATES:
        store.state_dir(state).mkdir(parents=True, exist_ok=True)
    _order_renames(store)
    _recover_tmp(store)
    store.found = _set_aside_strays(store)
    recovered = list(store.ids("run"))
    for msg_id in recovered:
        _count_crashed_run(store, msg_id)
        store.move(msg_id, "run", "que")
    store.found.queued += recovered
    store.flush(force=True)
    if store.ordered:  # what recovery freed is free on disk before anything reuses it
        durable.syncfs(store.qdir)
    return recovered


@dataclass
class Found:
    """What a start's recovery found: what it set aside (by name), and the ids
    in ``que/`` once it is over (one listing of que/ a start: a million names
    take a second)."""

    set_aside: list[str] = field(default_factory=list)
    queued: list[str] = field(default_factory=list)


def _set_aside_strays(store: QueueStore) -> Found:
    """Move what sits in ``prep``, ``que`` or ``run`` under a message's name but
    is no directory (``e2fsck`` makes a half-written one a file, an operator
    drops one there) to ``.set-aside/<state>.<id>``: kept for a person to look
    at, and out of the way of a start that reads every message there and
    would fail on it every time.  (In an ended state nothing reads it at
    start; a read of it fails alone, in ``read_msg``.)  Their names, and the
    messages in que/."""
    strays: list[Path] = []
    found = Found()
    for state in READ_AT_START:
        with os.scandir(store.state_dir(state)) as entries:  # d_type: no stat each
            for entry in entries:
                if not MSG_ID_RE.match(entry.name):
                    continue
                if not entry.is_dir():
                    strays.append(Path(entry.path))
                elif state == "que":
                    found.queued.append(entry.name)
    if not strays:
        return found
    aside = store.qdir / SET_ASIDE_DIR
    aside.mkdir(exist_ok=True)
    names = [f"{path.relative_to(store.qdir).parts[0]}.{path.name}" for path in strays]
    for path, name in zip(strays, names, strict=True):
        durable.rename(path, aside / name)
    durable.fsync_dirs([aside, *{path.parent for path in strays}])
    found.set_aside = names
    return found


def _order_renames(store: QueueStore) -> None:
    """On ext4 without a journal, make the state directories (every rename's
    destination) and their shards update synchronously (see dirsync.py)."""
    store.ordered = store.spares.whole_fs = dirsync.unjournalled_ext4(store.qdir)
    if not store.ordered:
        return
    for state in STATES:
        base = store.state_dir(state)
        dirsync.set_dirsync(base)
        if state in SHARDED_STATES:
            for shard in os.listdir(base):
                dirsync.set_dirsync(base / shard)


def _recover_tmp(store: QueueStore) -> None:
    """Finish publishes a crash cut short (a temp directory holding a
    readable msg: ``.tmp/<id>.<state>``, or a spare, which only ``que``
    creates take); remove everything else under ``.tmp/``."""
    tmp = store.qdir / TMP_DIR
    tmp.mkdir(exist_ok=True)
    for entry in os.listdir(tmp):
        path = tmp / entry
        msg_id, state = _published_as(path)
        if msg_id and _placed_whole(store, msg_id):
            durable.remove_tree(path)  # its publish reached the disk; this is the leftover
        elif msg_id:
            _replace_torn(store, state, msg_id)
            durable.rename(path, store.state_dir(state) / msg_id)
            store.dirty.add(str(tmp), str(store.state_dir(state)))
        elif path.is_dir() and not path.is_symlink():
            durable.remove_tree(path)  # what it cannot remove waits for the next start
        else:
            path.unlink()


def _placed_whole(store: QueueStore, msg_id: str) -> bool:
    """True when ``msg_id`` is in some state with a readable msg.  After a power
    cut (and fsck) a temp directory can survive beside the message it became."""
    for state in STATES:
        try:
            store.read_msg(state, msg_id)
        except (RQError, OSError):  # missing or unreadable: not placed whole
            continue
        return True
    return False


def _replace_torn(store: QueueStore, state: str, msg_id: str) -> None:
    """Remove a directory left at the target without a readable msg, so the
    temp copy that holds the message can take its place."""
    target = store.state_dir(state) / msg_id
    if target.is_dir() and not target.is_symlink():
        durable.remove_tree(target)


def _published_as(path: Path) -> tuple[str, str]:
    """(id, state) of a temp directory holding a complete new message, else ("", "")."""
    name_id, _, state = path.name.rpartition(".")
    if path.name.startswith(SPARE_PREFIX):
        state = "que"
    elif state not in ("que", "prep") or not MSG_ID_RE.match(name_id):
        return "", ""
    try:
        msg = json.loads((path / "msg").read_bytes())
    except (OSError, ValueError):
        return "", ""
    msg_id = msg.get("msg_id") if isinstance(msg, dict) else None
    if not isinstance(msg_id, str) or not MSG_ID_RE.match(msg_id):
        return "", ""
    return msg_id, state


def _count_crashed_run(store: QueueStore, msg_id: str) -> None:
    """A message found in ``run/`` ran once more than its msg says.

    Its msg holds the count from before that run (a run does not rewrite
    it), so the cut-short run counts as a resend here (RQ does not count
    it), durably: a message that keeps crashing its daemon still reaches
    max_count.  On a full file system the count is skipped (counted in the
    store's room), never the start.
    """
    try:
        msg = store.read_msg("run", msg_id)
    except RQError:  # unreadable, or missing (NotFound: e2fsck, an operator)
        return  # reported, and the message put in err, when que/ is loaded
    msg = dict(msg, count=int(msg.get("count", 0)) + 1)
    used = _time_used(store.msg_dir("run", msg_id))
    if used:
        msg[TIME_USED] = float(msg.get(TIME_USED) or 0) + used
    try:
        store.write_msg("run", msg_id, msg)
    except OSError as exc:  # a full disk (the new msg needs an inode): it runs again uncounted
        if not is_no_space(exc):
            raise
        store.room.skip("crashed run's count")


def _time_used(run_dir: Path) -> float:
    """Seconds of its timeout a run cut short by a crash used: from its
    ``started`` file (written when a run with a timeout starts) to its last
    sign of life (the latest change of that file, its status or its
    output).  The time the daemon was down is not the message's."""
    try:
        started = float((run_dir / STARTED).read_text())
    except (OSError, ValueError):
        return 0.0  # no timeout, or never written
    last = max(_mtime(run_dir / name) for name in (STARTED, "status", "job/stdio.log"))
    return max(0.0, last - started)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def save_que_snapshot(qdir: Path, msgs: Mapping[str, dict[str, Any]]) -> None:
    """At a clean stop: every queued message in one file (durably), so the
    next start reads one file instead of one per message."""
    lines = "".join(json.dumps([msg_id, msg]) + "\n" for msg_id, msg in msgs.items())
    durable.write_file_durably(qdir / QUE_SNAPSHOT, lines.encode())


def take_que_snapshot(store: QueueStore, ids: list[str]) -> dict[str, dict[str, Any]] | None:
    """The last clean stop's snapshot if its ids are exactly ``ids``, those in que/.

    It is removed durably first, so a crash later can never bring back a
    stale one; anything unexpected means None (read que/ one by one).
    """
    path = store.qdir / QUE_SNAPSHOT
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    durable.unlink_durably(path)
    msgs = _parse_snapshot(data)
    if msgs is None:
        return None
    return msgs if len(msgs) == len(ids) and set(msgs) == set(ids) else None


def _parse_snapshot(data: bytes) -> dict[str, dict[str, Any]] | None:
    """The snapshot's lines as one JSON array: one parse in C instead of one
    call a message (about half the start after a clean stop), and the keys
    of all the messages' fields are one string each (the parser memoizes
    them within a call), their ``dest`` and ``msg_id`` too (``msgshare``).
    Anything but [id, object] rows is None."""
    try:
        rows = json.loads(b"[" + b",".join(data.splitlines()) + b"]")
        msgs = {i: msgshare.shared_values(i, m) for i, m in rows
                if type(i) is str and type(m) is dict}
    except (ValueError, TypeError):
        return None
    return msgs if len(msgs) == len(rows) else None
