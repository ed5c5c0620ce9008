"""err → que: a client's retry of failed messages, one at a time or a bulk
retry's batch, as one transition of ``rqsys.daemon.transitions``.

Both kinds leave the message the same: its count kept, its last run's status
set aside as ``status.last`` (``retrybatch.set_status_aside``), so its status
reads blank as RQ's retried message's does, while the failure's text stays
beside its timeline for whoever looks into it; and both join the que through
``_requeued``, whose ``retried`` event names who asked (``by``: the
request's actor, ``rqsys.daemon.audit.actor``) on the message's timeline.
A single retry moves on the loop; a bulk one moves its batches
off the loop (``rqsys.daemon.bulkretry``: ``take_batch``, ``batch_landed``).  The
``Transitions`` object holds one ``Retries`` over its ``Ledger``.
"""

from __future__ import annotations

import time

from rqsys.daemon.ledger import Done, Ledger, Msg, Offload
from rqsys.errors import BadRequest
from rqsys.store import retrybatch
from rqsys.store.durable import fsync_dirs


class Retries:
    """The err → que transitions, on the ledger ``Transitions`` holds."""

    def __init__(self, ledger: Ledger, offload: Offload) -> None:
        self.ledger, self.store = ledger, ledger.store
        self._offload = offload  # runs work on the sync lane, then a callback on the loop

    def retry(self, msg_ids: list[str], done: Done, strict: bool = True, by: str = "") -> int:
        """err → que: each runs again as it was; ``done`` once the moves are
        durable.  Not ``strict``: those no longer in err are passed over.
        ``by``: who asked.  How many moved."""
        readable = []
        for msg_id in dict.fromkeys(msg_ids):  # every check and read before the first move
            state = self._retry_state(msg_id)
            if state != "err":
                if strict:
                    raise BadRequest(f"message {msg_id} is in {state}, not err")
                continue
            readable.append((msg_id, self.store.read_msg("err", msg_id)))
        for msg_id, msg in readable:
            self.ledger.move(msg_id, "err", "que")
            retrybatch.set_status_aside(self.store.msg_path("que", msg_id))
            self._requeued(msg_id, msg, by)
        moved = len(readable)
        dirs = [self.store.state_dir("err"), self.store.state_dir("que")]
        self._offload(lambda: fsync_dirs(dirs), lambda _r, error: done(error))
        return moved

    def _retry_state(self, msg_id: str) -> str:
        if self.ledger.is_busy(msg_id):
            return "busy"
        if self.store.msg_dir("err", msg_id).is_dir():  # most are (a bulk retry)
            return "err"
        return self.store.find(msg_id)

    def take_batch(self, msg_ids: list[str]) -> list[str]:
        """A bulk retry's batch, before its disk half (``rqsys.store.retrybatch``)
        runs off the loop: those no running or busy message, marked busy
        (a client's delete of one waits), so nothing else moves them meanwhile."""
        ledger = self.ledger
        chosen = [i for i in msg_ids if not ledger.is_busy(i) and i not in ledger.running]
        for msg_id in chosen:
            ledger.mark_busy(msg_id, "being retried")
        return chosen

    def batch_landed(self, chosen: list[str], moved: list[tuple[str, Msg]],
                     by: str = "") -> None:
        """err → que, the disk half durable: the moved join the schedule as
        ``retry`` adds one (``by``: who asked); every one of ``chosen`` is free again."""
        for msg_id, msg in moved:
            self._requeued(msg_id, msg, by)
        for msg_id in chosen:
            self.ledger.free(msg_id)

    def _requeued(self, msg_id: str, msg: Msg, by: str) -> None:
        """The picture follows a message retried into que/; its event names ``by``."""
        ledger = self.ledger
        ledger.counted("err", -1)
        ledger.unique.hold_again(msg_id, msg, time.time())
        ledger.queued(msg_id, msg)
        ledger.log.event("retried", "err → que", msg_id, RQ_STATE="que",
                         **({"RQ_BY": by} if by else {}))
