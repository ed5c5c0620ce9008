"""New messages coming in: create, clone, a local dup, attachments, and the
group commit that makes a turn's new messages durable before any is answered.

A new message is staged in ``.tmp/`` (a spare directory for que) and waits
in ``pending``; once per loop turn ``publish_pending`` makes all of them
durable together (one fsync, or one syncfs for several), renames them into
place and only then answers.  Files sent with a request are copied if need
be, synced and hashed on the background ``files`` lane; the request is
answered when they are checked against the MD5 the client sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from rqsys import tunables
from rqsys.background import FILES, Background
from rqsys.daemon.after import After
from rqsys.daemon.context import QueueContext
from rqsys.daemon.room import check_create
from rqsys.daemon.server import Reply, Request
from rqsys.daemon.transitions import Transitions
from rqsys.daemon.unique import Duplicates
from rqsys.errors import BadRequest, StoreError
from rqsys.life.moments import Moments
from rqsys.message import new_message
from rqsys.observe.events import EventLog
from rqsys.run.deadlines import check_timeout
from rqsys.store import QueueStore, Staged, Upload
from rqsys.store.room import is_no_space

Published = Callable[[BaseException | None], None]  # after the group commit: error or None
Incoming = tuple[str, str, Upload, int]  # an attachment on its way in: name, md5 sent, file, fd
COPIED_FIELDS = ("src", "param1", "param2", "param3", "param4", "max_count",
                 "force_remote", "post_run_webhook", "relay_via",  # relay_via: loop detection
                 "timeout", "retry_max", "priority", "tags")


def copy_fields(source: dict[str, Any], dest: str, orig_url: str, due: float = 0,
                **extra: Any) -> dict[str, Any]:
    """A new message copying ``source`` (a clone or a dup) for ``dest``."""
    msg = {k: source[k] for k in COPIED_FIELDS if k in source}
    msg.update(dest=dest, count=0, due=due, orig_msg_id=source.get("orig_msg_id") or orig_url,
               **extra)
    return msg


class Intake:
    """Takes new messages and their files in, and publishes them once per turn."""

    def __init__(self, ctx: QueueContext, store: QueueStore, transitions: Transitions,
                 background: Background, log: EventLog, after: After,
                 moments: Moments) -> None:
        self.ctx, self.store, self.moments = ctx, store, moments
        self.transitions, self.ledger = transitions, transitions.ledger
        self.background, self.log = background, log
        self.pending: list[tuple[Staged, str, Published]] = []
        self.unplaced: list[tuple[list[Staged], str]] = []  # durable, not yet in their state
        self.place_at = 0.0
        self._place_failing = False  # told in the log, once until they are placed
        self.when_placed: set[str] = set()  # ids whose ``then`` waits for their placing
        self._deferred: dict[str, Published] = {}  # such ids not placed yet -> their then
        self.dups = Duplicates(ctx, self.ledger.unique)
        self.after = after  # the queue's dependencies

    # ------------------------------------------------------------ requests
    def create(self, r: Request) -> Reply | None:
        """New message in ``que`` (default) or ``prep``; answered by the group
        commit (after its attachments are checked, if it has any)."""
        state = r.args.get("state", "que")
        self.ctx.check_accepting(strict=bool(r.args.get("refuse_paused")))
        msg = new_message(r.args.get("msg"), self.ctx.name)
        self.ctx.check_dest(msg, r.require_on)
        check_timeout(msg, self.ctx.config)
        check_create(msg, self.ctx.config)  # slots and needs that could never fit
        remote = self.after.normalise(msg) if msg.get("after") else []
        if remote:  # known to their hosts? asked off the loop, then created
            self.after.check_remote(remote, r, lambda: self._create_checked(r, msg, state))
            return None
        return self._create_checked(r, msg, state)

    def _create_checked(self, r: Request, msg: dict[str, Any], state: str) -> Reply | None:
        holder = self.dups.holder_of(msg)
        if holder is not None:  # a duplicate: the holder's URL, once the holder is stored
            return self.dups.answer_for(holder, r)
        if r.args.get("single") and state == "que":
            existing = self.ledger.schedule.find_same_params(msg)
            if existing:
                return self._created(existing)
        for hook in self.moments.creating:
            hook(msg)
        staged = self.store.stage(msg, state)
        self.dups.hold(staged)
        staged.origin = r.claimed()
        for staged_hook in self.moments.staged:
            staged_hook(staged.msg_id, staged.msg, staged.origin)
        specs = r.args.get("attachments") or []
        if not specs and not r.fds:
            self._await_publish(staged, state, r)
            return None
        try:
            uploads = self._take_uploads(specs, r.fds, r.conn is not None
                                         and r.conn.role == "admin")
        except Exception as exc:
            self._discard(staged, exc)
            raise

        def place(actual: list[str]) -> None:
            adir = staged.attach_dir()
            for (name, md5, upload, _fd), got in zip(uploads, actual, strict=True):
                self.store.place_upload(upload, adir, name, md5, got, sync=False)
            self._await_publish(staged, state, r)

        self._check_uploads(r, uploads, place, undo=lambda exc: self._discard(staged, exc))
        return None

    def attach(self, r: Request) -> None:
        """Attach the one open file sent with the request to a prep message;
        answered once the file is checked, off the loop."""
        msg_id = r.args["msg_id"]
        if len(r.fds) != 1:
            raise BadRequest("attach needs exactly one open file")
        self._require_prep(msg_id)
        uploads = self._take_uploads([{"name": r.args["name"], "md5": r.args["md5"]}], r.fds)

        def place(actual: list[str]) -> Reply:
            self._require_prep(msg_id)  # it may have been committed or deleted meanwhile
            name, md5, upload, _fd = uploads[0]
            path = self.store.place_upload(upload, self.store.prep_attach_dir(msg_id), name, md5,
                                           actual[0], sync=True)
            return {"ok": True, "md5": md5, "size": path.stat().st_size, "name": name}

        self._check_uploads(r, uploads, place)

    def clone(self, r: Request) -> None:
        """A new queued copy of a message (attachments hard-linked)."""
        msg_id = r.args["msg_id"]
        self.ctx.check_accepting()
        source = self.ledger.running.get(msg_id)
        state = "run" if source is not None else self.store.find(msg_id)
        if source is None:
            source = self.store.read_msg(state, msg_id)
        msg = copy_fields(source, self.ctx.name, self.ctx.url(msg_id))
        if self._diverted(msg, state, msg_id, lambda new_id, error: r.fail(error) if error
                          else r.answer(self._created(new_id))):
            return
        staged = self._stage_copy(msg, state, msg_id)
        staged.origin = f"clone {self.ctx.url(msg_id)}"
        self._await_publish(staged, "que", r)

    def dup_here(self, msg: dict[str, Any], src_id: str,
                 published: Callable[[str, BaseException | None], None]) -> None:
        """A running message's dup to this same queue: ``published(url, error)``
        once it is durable (or could not be stored)."""
        self.ctx.check_accepting(strict=True)
        if self._diverted(msg, "run", src_id,
                          lambda new_id, error: published(self.ctx.url(new_id), error)):
            return
        staged = self._stage_copy(msg, "run", src_id)
        staged.origin = f"dup {self.ctx.url(src_id)}"

        def then(error: BaseException | None) -> None:
            published(self.ctx.url(staged.msg_id), error)

        self.pending.append((staged, "que", then))

    def _stage_copy(self, msg: dict[str, Any], state: str, src_id: str) -> Staged:
        staged = self.store.stage(msg)
        try:
            self.store.link_attachments(state, src_id, staged)
        except Exception:
            self.store.discard(staged)
            raise
        return staged

    def _diverted(self, msg: dict[str, Any], state: str, src_id: str,
                  then: Callable[[str, BaseException | None], None]) -> bool:
        """Whether a feature took the copy (a pool queue's goes to the pool,
        ``then`` once JetStream has it)."""
        return any(divert(msg, state, src_id, then) for divert in self.moments.diverting)

    def _require_prep(self, msg_id: str) -> None:
        """In prep, and not being sent away by a bulk move (an attachment taken
        meanwhile was lost with the original, its copy sent without it)."""
        if self.store.find(msg_id) != "prep":
            raise BadRequest(f"message {msg_id} is not in prep")
        if why := self.ledger.busy(msg_id):
            raise BadRequest(why)

    def _created(self, msg_id: str) -> Reply:
        return {"ok": True, "msg_id": msg_id, "url": self.ctx.url(msg_id)}

    def _discard(self, staged: Staged, error: BaseException) -> None:
        self.store.discard(staged)
        self.dups.dropped(staged.msg_id, error)

    def _await_publish(self, staged: Staged, state: str, r: Request) -> None:
        def then(error: BaseException | None) -> None:
            r.fail(error) if error else r.answer(self._created(staged.msg_id))
            self.dups.published(staged.msg_id, error)

        self.pending.append((staged, state, then))

    # ------------------------------------------------------------ attachments
    def _take_uploads(self, specs: list[dict[str, Any]], fds: list[int],
                      trusted: bool = False) -> list[Incoming]:
        """Start taking in the files (their names and md5 are checked by the
        request's schema).  Takes the fds out of ``fds``: they stay open
        until the files are checked (see _check_uploads).  A file whose spec
        says ``link`` is hard-linked, not copied, when the sender is an admin
        peer (rq-scan, for a files trigger whose file then leaves its place)."""
        if len(specs) != len(fds):
            raise BadRequest(f"{len(specs)} attachments described but {len(fds)} files sent")
        uploads: list[Incoming] = []
        try:
            for spec, fd in zip(specs, fds, strict=True):
                link = trusted and bool(spec.get("link"))
                uploads.append((spec["name"], spec["md5"], self.store.new_upload(fd, link), fd))
        except OSError:
            for _name, _md5, upload, _fd in uploads:
                self.store.drop_upload(upload)
            raise
        fds.clear()
        return uploads

    def _check_uploads(self, r: Request, uploads: list[Incoming],
                       place: Callable[[list[str]], Reply | None],
                       undo: Callable[[BaseException], None] | None = None) -> None:
        """Copy if need be, sync and hash the uploads on the ``files`` lane
        (seconds for large files: the loop goes on meanwhile); then, on the
        loop, ``place`` them and answer with what it returns (None: the group
        commit answers)."""
        def work() -> list[str]:
            return [self.store.fill_upload(upload, fd) for _n, _m, upload, fd in uploads]

        def done(actual: list[str], error: BaseException | None) -> None:
            _close_fds([fd for _n, _m, _u, fd in uploads])
            try:
                if error is not None:
                    raise error
                reply = place(actual)
            except Exception as exc:  # whatever it was, the client hears it, the loop goes on
                for _name, _md5, upload, _fd in uploads:
                    self.store.drop_upload(upload)
                if undo is not None:
                    undo(exc)
                r.fail(exc)
                return
            if reply is not None:
                r.answer(reply)

        self.background.submit(work, done, FILES)

    # ------------------------------------------------------------ group commit
    def publish_pending(self) -> None:
        """Group commit: make this turn's new messages durable, move them into
        place (a rename: whoever looks in que/ after the answer finds them
        there), then answer."""
        self.place_again()
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        for state in ("que", "prep"):
            group = [p for p in batch if p[1] == state]
            if group:
                self._publish(group, state)

    def _publish(self, group: list[tuple[Staged, str, Published]], state: str) -> None:
        staged = [one for one, _state, _then in group]
        try:
            self.store.publish(staged)
        except OSError as exc:
            error = (self.store.room.no_space() if is_no_space(exc)
                     else StoreError(f"not stored: {exc}"))
            for one, _state, then in group:
                self.store.discard(one)
                then(error)
            return
        left = {one.msg_id for one in self._place(staged, state)}
        for one, _state, then in group:
            if one.msg_id in left and one.msg_id in self.when_placed:
                self._deferred[one.msg_id] = then  # told once it is placed
            else:
                self.when_placed.discard(one.msg_id)
                then(None)  # durable: answered

    def add_placed(self, staged: Staged, state: str, then: Published) -> None:
        """A new message whose ``then`` needs it in its state (a pool delivery
        refused at once: failed in que), not only durable as a client's answer."""
        self.when_placed.add(staged.msg_id)
        self.pending.append((staged, state, then))

    def _place(self, staged: list[Staged], state: str) -> list[Staged]:
        """Into ``state``; those a failed rename left in ``.tmp/`` (tried again)."""
        left, error = self.transitions.placed(staged, state)
        for one in staged[:len(staged) - len(left)]:
            if (then := self._deferred.pop(one.msg_id, None)) is not None:
                self.when_placed.discard(one.msg_id)
                then(None)
        if error is not None:  # durable in .tmp/: answered ok, placed when the disk lets
            if not self._place_failing:
                self.log.event("err", f"new messages not yet in {state}/: {error}; tried "
                               f"again every {tunables.PLACE_RETRY:g} s")
                self._place_failing = True
            self.unplaced.append((left, state))
            self.place_at = time.monotonic() + tunables.PLACE_RETRY
            return left
        # Spares are made from the first create on, not at start: a daemon
        # started for one request (socket activation) does not wait for them.
        self.store.spares.start()
        return []

    def place_again(self) -> None:
        """New messages a failed rename left in ``.tmp/``, placed once it works."""
        if not self.unplaced or time.monotonic() < self.place_at:
            return
        waiting, self.unplaced = self.unplaced, []
        for staged, state in waiting:
            self._place(staged, state)
        if not self.unplaced:
            self._place_failing = False
            self.log.event("daemon", "new messages placed again: the disk takes them")

    def place_wait(self) -> float | None:
        """Seconds until the next try to place what waits (None: nothing waits)."""
        return max(0.0, self.place_at - time.monotonic()) if self.unplaced else None


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
