"""``QueueStore``: one queue's messages as its daemon (the sole writer) changes them.

It adds to the read-only :class:`QueueView` every change on disk: creating
messages, moving them between states, rewriting their files, attachments,
pruning and the admin state.  The renames and syncs are in ``durable.py``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rqsys.errors import BadRequest, NotFound, StoreError
from rqsys.store import attachments, durable, recovery
from rqsys.store.attachments import Upload
from rqsys.store.durable import dir_size, fsync_dirs, sync_if_grown
from rqsys.store.layout import (
    ADMIN_STATES,
    CREATED_BY,
    LAST_LINES,
    SHARDED_STATES,
    SPARE_PREFIX,
    TMP_DIR,
    IdMaker,
    check_attach_name,
    check_msg_id,
)
from rqsys.store.room import Room, is_no_space
from rqsys.store.spares import SpareMaker
from rqsys.store.view import QueueView


@dataclass
class Staged:
    """A new message written under ``.tmp/`` but not yet renamed into place."""

    msg_id: str
    tmp: str
    msg: dict[str, Any]
    attached: bool = False
    origin: str = ""  # who made it: "socket pid 12 uid 0", "http ::1", ... (msg's CREATED_BY)
    msg_fd: int = -1  # a spare's blank msg, open for writing until published or discarded

    def attach_dir(self) -> Path:
        """Make the staged message's ``attach/`` directory."""
        adir = Path(self.tmp) / "attach"
        adir.mkdir()
        self.attached = True
        return adir


class QueueStore(QueueView):
    """The message directories of one queue; used by its daemon (sole writer)."""

    def __init__(self, qdir: Path, ids: IdMaker | None = None, room: Room | None = None) -> None:
        super().__init__(qdir)
        self.id_maker = ids or IdMaker()
        self.dirty = durable.DirtyDirs()  # parents of batched transitions
        self.room = room or Room(str(qdir))  # how full its file system is
        self.spares = SpareMaker(f"{self._base}/{TMP_DIR}", room=self.room)
        self.ordered = False  # ext4 without a journal: set by recover() (see dirsync.py)
        self.found = recovery.Found()  # by recover(): what it set aside, que/'s ids
        self._sizes: dict[str, int] = {}  # ordered: directories' sizes after our last renames
        self._move_parents: dict[tuple[str, str], tuple[str, ...]] = {}  # see _parents_of
        self._shards: set[str] = set()  # done/ shards known to be there (_ready_shard)

    # -- creation (synchronous) -------------------------------------------
    def stage(self, msg: dict[str, Any], state: str = "que") -> Staged:
        """Start a new message in a temp directory, no msg yet (attachments may come
        before :meth:`publish`): a ready spare for ``que``, else a new ``.tmp/<id>.<state>/``.
        NoSpace when the file system is full: its spares are for the running ones' ends."""
        self.room.refuse_when_full()
        msg_id = self.id_maker.next_id()
        taken = self.spares.take() if state == "que" else None
        if taken is None:
            spare, fd = f"{self._base}/{TMP_DIR}/{msg_id}.{state}", -1
            try:
                os.mkdir(spare)
            except OSError as exc:
                if is_no_space(exc):
                    raise self.room.no_space() from exc
                raise
        else:
            spare, fd = taken
        return Staged(msg_id, spare, dict(msg, msg_id=msg_id), msg_fd=fd)

    def publish(self, batch: list[Staged]) -> None:
        """Write staged messages' msg files and make them durable.

        Once durable a message is safe: :meth:`recover` moves into place any
        temp directory holding a readable msg.  One message: fsync its msg
        (which also makes its directory entry durable, see the durability
        table in ``recovery.py``); several: one syncfs.
        """
        if not batch:
            return
        single = len(batch) == 1 and not (self.ordered and self._new_inodes(batch[0]))
        for staged in batch:
            if staged.origin:  # its timeline's first event says so (rqsys.observe.timeline)
                staged.msg[CREATED_BY] = sys.intern(staged.origin)
            fd, staged.msg_fd = staged.msg_fd, -1  # write_msg closes it, whatever happens
            durable.write_msg(f"{staged.tmp}/msg", json.dumps(staged.msg).encode(), single,
                              fd)
        if not single:
            durable.syncfs(self.qdir)
        elif batch[0].attached:
            durable.fsync_tree(Path(batch[0].tmp) / "attach")

    @staticmethod
    def _new_inodes(staged: Staged) -> bool:
        """Whether a staged message made inodes of its own (not a spare's):
        on ext4 without a journal they need a syncfs (see spares._make)."""
        return staged.attached or not os.path.basename(staged.tmp).startswith(SPARE_PREFIX)

    def place(self, batch: list[Staged], state: str) -> tuple[list[Staged], OSError | None]:
        """Move published messages into ``state`` (batched like any transition;
        on ext4 without a journal ``state``'s new entries are on disk before
        the answer: see :meth:`move`).  A rename that fails (a full disk: the
        directory needed a new block) stops it: the ones not placed, and why;
        they stay durable in ``.tmp/``."""
        dest = f"{self._base}/{state}"
        size = self._size_before(dest)
        placed, error = 0, None
        for staged in batch:
            try:
                durable.rename(staged.tmp, f"{dest}/{staged.msg_id}")
            except OSError as exc:
                error = exc
                break
            placed += 1
        if placed:
            with contextlib.suppress(OSError):  # placed: the dirty set's flush syncs it
                self._synced_if_grown(dest, size)
            self.dirty.add(f"{self._base}/{TMP_DIR}", dest)
        return batch[placed:], error

    def create(self, msg: dict[str, Any], state: str = "que") -> str:
        """Create one message durably in ``prep`` or ``que``; returns its id."""
        staged = self.stage(msg, state)
        self.publish([staged])
        _left, error = self.place([staged], state)
        if error is not None:
            raise error
        return staged.msg_id

    def discard(self, staged: Staged) -> None:
        """Remove a staged message that will not be published."""
        if staged.msg_fd >= 0:
            os.close(staged.msg_fd)
            staged.msg_fd = -1
        shutil.rmtree(staged.tmp, ignore_errors=True)

    # -- transitions -------------------------------------------------------
    def move(self, msg_id: str, src: str, dest: str, durable: bool = False) -> None:
        """Rename a message directory from one state to another."""
        old, new = self._path(src, msg_id), self._path(dest, msg_id)
        cut = len(msg_id) + 1
        parents = self._parents_of(old[:-cut], new[:-cut])
        # ext4 without a journal: dest's block is written inside the rename
        # (chattr +D), its inode here if the entry took a new block
        size = self._size_before(parents[0])
        try:
            self._rename_with_room(old, new, dest in SHARDED_STATES)
        except FileNotFoundError as exc:
            raise NotFound(f"no message {msg_id} in {self.name}/{src}") from exc
        except OSError as exc:
            if is_no_space(exc):
                raise self.room.no_space(f"{msg_id} stays in {src}/") from exc
            raise StoreError(f"cannot move {msg_id} {src}->{dest}: {exc}") from exc
        if durable:
            fsync_dirs(list(parents))  # the parameter hides the module here
        else:
            self._synced_if_grown(parents[0], size)
            self.dirty.add(*parents)
        if dest == "run":
            self._ready_shard(msg_id)

    def _ready_shard(self, msg_id: str) -> None:
        """Its end's done/ shard, made as it starts (once an hour): on a disk
        that fills meanwhile its end needs no mkdir (xfs refuses one early)."""
        shard = f"{self._base}/done/{msg_id[:11]}"
        if shard in self._shards:
            return
        try:
            if not os.path.isdir(shard):
                os.mkdir(shard)
                fsync_dirs([shard, os.path.dirname(shard)])
                if self.ordered:  # its block group too (see spares._make)
                    durable.syncfs(shard)
        except OSError:
            return  # a full disk: the end's rename makes it, with the spares' room
        self._shards = {shard} if len(self._shards) > 64 else {*self._shards, shard}

    def _parents_of(self, old_parent: str, new_parent: str) -> tuple[str, ...]:
        """The directories a move changes, the destination first: its parent,
        that one's parent (a shard's state directory), the source's parent.
        Kept per pair: a busy loop moves between the same few thousand times a second."""
        key = (old_parent, new_parent)
        parents = self._move_parents.get(key)
        if parents is None:
            if len(self._move_parents) > 1024:  # a new hour's shards: drop the old pairs
                self._move_parents.clear()
            parents = tuple(dict.fromkeys([new_parent, os.path.dirname(new_parent), old_parent]))
            self._move_parents[key] = parents
        return parents

    def _size_before(self, path: str) -> int:
        """Ordered: a directory's size before a rename into it (the one
        seen after the last, else a stat); -1 when not ordered."""
        if not self.ordered:
            return -1
        size = self._sizes.get(path)
        return dir_size(path) if size is None else size

    def _synced_if_grown(self, path: str, size: int) -> None:
        if self.ordered:
            self._sizes[path] = sync_if_grown(path, size)

    def _rename_with_room(self, old: str, new: str, sharded: bool) -> None:
        """A rename that finds the file system full (a new shard, a
        directory's new block) gives back a spare's room and tries again,
        while there are spares: they are the room held back for this."""
        while True:
            try:
                return self._rename(old, new, sharded)
            except OSError as exc:
                if not is_no_space(exc) or not self.spares.release():
                    raise

    @staticmethod
    def _rename(old: str, new: str, sharded: bool) -> None:
        if sharded:
            durable.rename_into_shard(old, new)
        else:
            durable.rename(old, new)

    def flush(self, force: bool = False) -> None:
        """fsync the directories touched by batched transitions.

        At most once per FLUSH_INTERVAL unless forced (at exit), so that a
        busy queue pays one journal commit per interval, not per message.
        """
        self.dirty.flush(force)

    def flush_due(self) -> float | None:
        """Seconds until the batched fsyncs are due (None: nothing to flush)."""
        return self.dirty.due()

    def delete(self, msg_id: str, state: str) -> None:
        """Remove a message: rename it out of its state (durable), then rmtree."""
        doomed = self.qdir / TMP_DIR / f"deleted.{msg_id}.{os.getpid()}"
        try:
            durable.remove_dir(self.msg_dir(state, msg_id), doomed)
        except FileNotFoundError as exc:
            raise NotFound(f"no message {msg_id} in {self.name}") from exc

    def delete_later(self, msg_id: str, state: str) -> Callable[[], None]:
        """A delete in two halves, for a daemon that must not wait on the disk:
        rename the message out of its state now (NotFound if it is not
        there), and return the rest, to run on another thread: it syncs the
        directory the message left and removes its files; once it has
        returned, the delete is durable (as after :meth:`delete`)."""
        src = self.msg_dir(state, msg_id)
        doomed = self.qdir / TMP_DIR / f"deleted.{msg_id}.{os.getpid()}"
        try:
            durable.rename(src, doomed)
        except FileNotFoundError as exc:
            raise NotFound(f"no message {msg_id} in {self.name}") from exc
        return functools.partial(durable.remove_renamed, src.parent, doomed)

    # -- message files -------------------------------------------------------
    def write_count(self, state: str, msg_id: str, count: int) -> str:
        """Record an ending message's count (RQ's: its resends; not synced, like status).

        A separate small file, so the ``msg`` is not replaced at the end of
        every run (a rename over a file makes ext4 write it back at once);
        not written for the common count 0 (one run, no resend), which is what
        its absence means.  Why it was not written, or "".
        """
        if count == 0:  # only an ending writes it, once: no older count file to replace
            return ""
        return _advisory(f"{self._path(state, msg_id)}/count", str(count).encode(), self.room)

    def write_msg(self, state: str, msg_id: str, msg: dict[str, Any]) -> None:
        """Replace a message's ``msg`` file atomically and durably."""
        durable.write_file_durably(self.msg_dir(state, msg_id) / "msg",
                                   json.dumps(msg).encode())

    def write_status(self, state: str, msg_id: str, text: str) -> None:
        """Record the script's last status line (not synced: advisory).  Not
        written when the message moved on meanwhile, or when fds or disk run
        out: every status also goes to the log and the timeline, and the state
        move it goes with must not fail for it (out of fds, a failed start's
        move back to que ended the daemon)."""
        _advisory(f"{self._path(state, msg_id)}/status", text.encode("utf-8", "replace"),
                  self.room)

    def write_started(self, msg_id: str, at: float) -> str:
        """Record when a run with a timeout started (not synced: recovery's
        estimate of the time a crash cut short, see ``recovery``); why it was
        not written, or ""."""
        return _advisory(f"{self._path('run', msg_id)}/{recovery.STARTED}", f"{at:.3f}".encode(),
                         self.room)

    def write_last_lines(self, msg_id: str, data: bytes) -> str:
        """Keep what a failed run wrote last (``rqsys.observe.lastlines``; not
        synced: its history, not its state); why it was not written, or ""."""
        return _advisory(f"{self._path('run', msg_id)}/{LAST_LINES}", data, self.room)

    def job_path(self, msg_id: str) -> str:
        """The ``job/`` dir of a running message: a spare brings it, a run after
        a resend reuses it, and the script's start makes it when missing."""
        return f"{self._path('run', msg_id)}/job"

    def set_admin_state(self, state: str) -> None:
        """Record UP, PAUSE or DOWN durably."""
        if state not in ADMIN_STATES:
            raise BadRequest(f"invalid admin state: {state!r}")
        durable.write_file_durably(self.qdir / "admin_state", (state + "\n").encode())

    # -- attachments (see attachments.py) ----------------------------------------
    def prep_attach_dir(self, msg_id: str) -> Path:
        """The ``attach/`` directory of a prep message, made if missing."""
        adir = self.attach_dir("prep", check_msg_id(msg_id))
        adir.mkdir(exist_ok=True)
        return adir

    def new_upload(self, src_fd: int, link: bool = False) -> Upload:
        """Start taking in an attachment sent as an open file (in ``.tmp/``)."""
        return attachments.new_upload(f"{self._base}/{TMP_DIR}", src_fd, link)

    fill_upload = staticmethod(attachments.fill_upload)

    def place_upload(self, upload: Upload, adir: Path, name: str, md5: str, actual: str,
                     sync: bool) -> Path:
        """Put a filled upload into ``adir`` (see attachments.place_upload);
        ``sync`` on ext4 without a journal is a syncfs (see spares._make)."""
        path = attachments.place_upload(upload, adir, name, md5, actual,
                                        sync and not self.ordered)
        if sync and self.ordered:
            durable.syncfs(self.qdir)
        return path
    drop_upload = staticmethod(attachments.drop_upload)

    def remove_attachment(self, msg_id: str, name: str) -> None:
        """Remove an attachment of a prep message, durably."""
        path = self.attach_dir("prep", check_msg_id(msg_id)) / check_attach_name(name)
        try:
            durable.unlink_durably(path)
        except FileNotFoundError as exc:
            raise NotFound(f"no attachment {name}") from exc

    def link_attachments(self, src_state: str, src_id: str, staged: Staged) -> None:
        """Hard-link a message's attachments into a staged (cloned) message."""
        files = self.attachments(src_state, src_id)
        if files:
            attachments.link_into(files, staged.attach_dir())

    # -- recovery and the que snapshot (see recovery.py) -------------------------
    def recover(self) -> list[str]:
        """Clean temp files, move ``run/`` back to ``que/``; returns recovered ids."""
        return recovery.recover(self)

    def save_que_snapshot(self, msgs: Mapping[str, dict[str, Any]]) -> None:
        """At a clean stop: every queued message in one file, durably (not on
        a full disk: the next start reads que/ instead)."""
        try:
            recovery.save_que_snapshot(self.qdir, msgs)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            self.room.skip("que snapshot")

    def take_que_snapshot(self, ids: list[str]) -> dict[str, dict[str, Any]] | None:
        """The last clean stop's snapshot if its ids are exactly ``ids``, que/'s."""
        return recovery.take_que_snapshot(self, ids)


def _advisory(path: str, data: bytes, room: Room) -> str:
    """Write a file the message's state does not hang on (unsynced); why it
    failed (out of fds), or "": the caller logs it and goes on (it ended the
    daemon, with the message in run/ to be run again).  A full disk is
    counted in ``room``, not told each time."""
    try:
        durable.overwrite(path, data)
    except OSError as exc:
        if is_no_space(exc):
            room.skip(path.rsplit("/", 1)[-1])
            return ""
        return f"{path.rsplit('/', 1)[-1]} not written: {exc.strerror or exc}"
    return ""
