"""any → gone: a client's delete and the cleaner's prune, two transitions of the daemon's."""

from __future__ import annotations

from rqsys.daemon.ledger import COUNTED, Done, Ledger, Offload, batch_of
from rqsys.errors import BadRequest, RQError
from rqsys.store import pruning


class Removals:
    """Messages removed for good, on the ledger ``Transitions`` holds."""

    def __init__(self, ledger: Ledger, offload: Offload, slow: Offload) -> None:
        self.ledger, self.store, self.log = ledger, ledger.store, ledger.log
        self._offload = offload  # the sync lane (a delete's sync and rmtree)
        self._slow = slow  # a lane of its own (prunes)

    def delete(self, msg_id: str, done: Done, by: str = "") -> None:
        """prep | que | done | err | relayed → gone (a running one is destroyed
        instead); ``done`` is called once the delete is durable; ``by``: who
        asked (in the ``deleted`` entry: the message's timeline goes with it)."""
        if self.ledger.wait_while_busy(msg_id, lambda: self.delete(msg_id, done, by), done):
            return
        why = self.ledger.busy(msg_id)
        if why:
            raise BadRequest(why)
        state = self.store.find(msg_id)
        finish = self.store.delete_later(msg_id, state)  # its sync and rmtree: off the loop
        queued = self.ledger.unqueue(msg_id)
        if state == "que" and queued is None:
            self.ledger.deleted_unread()  # in the que's tail
        self.ledger.removed(msg_id)
        if state in COUNTED:
            self.ledger.counted(state, -1)
        self.log.event("deleted", f"deleted from {state}" + (f" by {by}" if by else ""), msg_id,
                       **batch_of(queued), **({"RQ_BY": by} if by else {}))
        self._offload(finish, lambda _result, error: done(error))

    def prune(self, now: float, days: float, prep_days: float | None,
              done: Done) -> dict[str, int]:
        """done | relayed ended ``days`` ago, acknowledged err (one in a retry batch
        once that has landed), prep untouched ``prep_days`` → gone: the cleaner's
        request, out of sight now, ``done`` once removed for good.  How many of each."""
        removal = pruning.Removal(self.store)
        removed = {state: pruning.ended(self.store, state, now - days * 86400, removal)
                   for state in ("done", "relayed")}
        removed["err"], late = pruning.acked(self.store, "err", removal, self.ledger.busy_ids())
        if prep_days is not None:
            prep = pruning.untouched(self.store, "prep", now - prep_days * 86400, removal)
            for msg_id in prep:
                self.ledger.removed(msg_id)
            removed["prep"] = len(prep)
        for state, count in removed.items():
            self.ledger.counted(state, -count)
        self.log.event("deleted", f"pruned {removed} (older than {days:g} days)")
        finished = _prune_late(self, late, removed, done)
        self._slow(removal.finish, lambda _result, error: finished(error))
        return removed


def _prune_late(t: Removals, late: list[str], removed: dict[str, int], done: Done) -> Done:
    """The acknowledged err messages a prune met busy (in a retry batch): once
    their batches have landed, those still in err are deleted together
    (counted in ``removed``); ``done`` once they and the rest are durable."""
    left, errors = [2], []  # the rest's removal, and the late ones as one batch

    def one(error: BaseException | None) -> None:
        errors.extend([error] if error is not None else [])
        left[0] -= 1
        if left[0] == 0:
            done(errors[0] if errors else None)

    def landed() -> None:
        for msg_id in late:
            if not pruning.is_acked(t.store, "err", msg_id):
                continue  # retried: in que now, not pruned
            left[0] += 1  # before: its ``one`` may come at once
            try:
                t.delete(msg_id, one)
            except RQError:  # gone or busy again meanwhile: left for the next prune
                left[0] -= 1
                continue
            removed["err"] += 1
        one(None)
    if not t.ledger.wait_until_free(late, landed):
        landed()
    return one


