"""A bulk move: messages of this queue made anew in another queue, then deleted
here, ``STEP`` at a time.

Each step reads its messages on the loop (passing over one no longer in the
searched state, or with attachments: they are not carried), sends them to
the other queue's daemon as one ``create_many`` on that daemon's peer lane
(off the loop; a hung peer holds up only this move), and once they are
durable there deletes the originals; the next step starts once those deletes
are durable.  A message the other queue refuses stays here, passed over.
A crash between the two halves of a step leaves a message in both queues
(never in neither): the copy is made before the original goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rqsys import tunables
from rqsys.background import Background, peer_lane
from rqsys.client import QueueClient
from rqsys.daemon.context import QueueContext
from rqsys.daemon.transitions import Transitions
from rqsys.errors import RQError
from rqsys.store import QueueStore

STEP = 50
DROPPED = ("msg_id", "count", "url", "due")  # the copy is a new message, due now
Finish = Callable[[int, int, "BaseException | None"], None]


class Mover:
    """Moves lists of messages to other queues, a step at a time."""

    def __init__(self, ctx: QueueContext, store: QueueStore, ledger: Transitions,
                 background: Background) -> None:
        self.ctx, self.store, self.ledger, self.background = ctx, store, ledger, background

    def run(self, ids: list[str], dest: str, state: str, finish: Finish) -> None:
        self._step(ids, 0, dest, state, [0, 0], finish)

    def _step(self, ids: list[str], start: int, dest: str, state: str, tally: list[int],
              finish: Finish) -> None:
        if start >= len(ids):
            finish(tally[0], tally[1], None)
            return
        batch = ids[start:start + STEP]
        chosen = [(i, m) for i in batch if (m := self._copy(i, dest, state)) is not None]
        tally[1] += len(batch) - len(chosen)
        if not chosen:
            self._step(ids, start + STEP, dest, state, tally, finish)
            return

        def created(results: Any, error: BaseException | None) -> None:
            if error is not None:
                finish(tally[0], tally[1], error)
                return
            made = [old for (old, _m), got in zip(chosen, results, strict=True) if "msg_id" in got]
            tally[1] += len(chosen) - len(made)
            self._delete(made, tally, lambda: self._step(ids, start + STEP, dest, state,
                                                         tally, finish))
        msgs = [m for _i, m in chosen]
        self.background.submit(lambda: self._send(dest, msgs), created, peer_lane(dest))

    def _copy(self, msg_id: str, dest: str, state: str) -> dict[str, Any] | None:
        """The message as the other queue gets it (None: passed over)."""
        try:
            where = self.store.find(msg_id)
            if (state and where != state) or where == "run" or msg_id in self.ledger.running:
                return None
            if self.store.attachments(where, msg_id):
                return None  # attachments are not carried: it stays here
            msg = self.store.read_msg(where, msg_id)
        except (RQError, OSError):
            return None
        return dict({k: v for k, v in msg.items() if k not in DROPPED}, dest=dest)

    def _send(self, dest: str, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """On the peer lane: one create_many to the other queue's daemon."""
        with QueueClient(self.ctx.layout, dest, timeout=tunables.DUP_TIMEOUT) as client:
            return list(client.call("create_many", msgs=msgs,
                                    by=f"moved from {self.ctx.name}")["results"])

    def _delete(self, made: list[str], tally: list[int], then: Callable[[], None]) -> None:
        left = [len(made)]

        def one(_error: BaseException | None) -> None:
            left[0] -= 1
            if left[0] == 0:
                then()
        if not made:
            then()
            return
        for msg_id in made:
            try:
                self.ledger.delete(msg_id, one)
                tally[0] += 1
            except RQError:  # it started meanwhile: its copy stays too
                tally[1] += 1
                one(None)
