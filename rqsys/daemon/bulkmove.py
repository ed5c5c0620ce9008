"""A bulk move: messages of this queue made anew in another queue, then deleted
here, ``STEP`` at a time.

Each step waits until none of its messages is busy (in a retry batch), then
reads them on the loop (passing over one no longer in the searched state, or
with attachments: they are not carried), sends them to
the other queue's daemon as one ``create_many`` on that daemon's peer lane
(off the loop; a hung peer holds up only this move), and once they are
durable there deletes the originals; the next step starts once those deletes
are durable.  From the moment a step is decided until the other queue has
answered, its messages are busy (``Ledger.hold_moving``): a queued one is
out of the que, so it neither starts nor rides along here while its copy is
made.  One the other queue refuses, or all of a step whose send failed, are
released: a queued one back in the que in its place, startable again.
A crash between the two halves of a step leaves a message in both queues
(never in neither): the copy is made before the original goes; the hold is
in memory only, so the next start queues the original again.

Each copy's ``created`` line names where it came from and who moved it
(``by``: ``moved from billing by alice (10.0.0.5)``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from rqsys import tunables
from rqsys.background import Background, peer_lane
from rqsys.daemon.bulksteps import Finish, Steps
from rqsys.daemon.context import QueueContext
from rqsys.daemon.transitions import Transitions
from rqsys.errors import RQError
from rqsys.observe.lastlines import LOG_AT
from rqsys.store import QueueStore
from rqsys.store.layout import CREATED_BY
from rqsys.store.recovery import TIME_USED
from rqsys.wire.client import QueueClient

STEP = 50
# the copy is a new message, due now, by the mover, with no runs behind it
DROPPED = ("msg_id", "count", "url", "due", CREATED_BY, LOG_AT, TIME_USED)
MAX_BY = 200  # a creator's length (``rqsys.wire.schema.BY``)


class Mover:
    """Moves lists of messages to other queues, a step at a time."""

    def __init__(self, ctx: QueueContext, store: QueueStore, transitions: Transitions,
                 background: Background) -> None:
        self.ctx, self.store, self.background = ctx, store, background
        self.transitions, self.ledger = transitions, transitions.ledger

    def run(self, ids: list[str], dest: str, state: str, finish: Finish, by: str = "",
            acting: dict[str, Any] | None = None) -> None:
        """``by``: who asked (``Request.actor``), named on each copy's timeline;
        ``acting``: who asked as the other queue's daemon checks and records it
        (``Request.acting``: this daemon does not lend it its own role)."""
        Move(self, ids, dest, state, finish, by, acting or {}).step()

    def origin(self, by: str) -> str:
        """The copies' creator: ``moved from <this queue>[ by <who>]``."""
        origin = f"moved from {self.ctx.name}" + (f" by {by}" if by else "")
        return origin[:MAX_BY]

    def copy(self, msg_id: str, dest: str, state: str) -> dict[str, Any] | None:
        """The message as the other queue gets it (None: passed over: one
        running, or riding along with a running one, stays here)."""
        try:
            where = self.store.find(msg_id)
            if (state and where != state) or where == "run" or self.ledger.busy(msg_id):
                return None
            if self.store.attachments(where, msg_id):
                return None  # attachments are not carried: it stays here
            msg = self.store.read_msg(where, msg_id)
        except (RQError, OSError):
            return None
        return dict({k: v for k, v in msg.items() if k not in DROPPED}, dest=dest)

    def send(self, dest: str, msgs: list[dict[str, Any]], origin: str,
             acting: dict[str, Any]) -> list[dict[str, Any]]:
        """On the peer lane: one create_many to the other queue's daemon, for ``acting``."""
        carried: dict[str, Any] = {"actor": acting} if acting else {}
        with QueueClient(self.ctx.layout, dest, timeout=tunables.DUP_TIMEOUT) as client:
            return list(client.call("create_many", msgs=msgs, by=origin, **carried)["results"])


class Move(Steps):
    """One bulk move of a list of ids to ``dest``, answered through ``finish``."""

    def __init__(self, mover: Mover, ids: list[str], dest: str, state: str,
                 finish: Finish, by: str, acting: dict[str, Any]) -> None:
        super().__init__(mover.transitions, ids, finish, STEP, by)
        self.mover, self.dest, self.state, self.acting = mover, dest, state, acting
        self.origin = mover.origin(by)  # the copies' creator

    def act(self, batch: list[str]) -> bool:
        """Send the step's copies; True if there are some (the step's deletes
        call back once durable)."""
        chosen = [(i, m) for i in batch
                  if (m := self.mover.copy(i, self.dest, self.state)) is not None]
        self.passed += len(batch) - len(chosen)
        if chosen:
            self.transitions.hold_moving([i for i, _m in chosen])
            self._send(chosen)
        return bool(chosen)

    def _send(self, chosen: list[tuple[str, Any]]) -> None:
        """The copies to the other queue, on its peer lane (off the loop)."""
        msgs = [m for _i, m in chosen]
        self.mover.background.submit(lambda: self.mover.send(self.dest, msgs, self.origin,
                                                             self.acting),
                                     lambda got, error: self._created(chosen, got, error),
                                     peer_lane(self.dest))

    def _created(self, chosen: list[tuple[str, Any]], results: Any,
                 error: BaseException | None) -> None:
        """On the loop: the other queue has them (those it took are deleted here)."""
        if error is not None:
            for msg_id, _m in chosen:
                self.transitions.release_moving(msg_id)
            self.finish(self.done, self.passed, error)
            return
        made = [old for (old, _m), got in zip(chosen, results, strict=True) if "msg_id" in got]
        for (msg_id, _m), got in zip(chosen, results, strict=True):
            if "msg_id" not in got:  # refused there: it stays here, startable again
                self.transitions.release_moving(msg_id)
        self.passed += len(chosen) - len(made)
        self._delete(made)

    def _delete(self, made: list[str]) -> None:
        """Delete the originals; the next step once those deletes are durable."""
        left = [len(made)]

        def one(_error: BaseException | None) -> None:
            left[0] -= 1
            if left[0] == 0:
                self.step()
        if not made:
            self.step()
            return
        for msg_id in made:
            self.transitions.release_moving(msg_id, partial(self._delete_one, msg_id, one))

    def _delete_one(self, msg_id: str, then: Callable[[BaseException | None], None]) -> None:
        """The original of a copy the other queue took (held until now, so it
        cannot have started; gone meanwhile, by a crash-free prune, say: passed)."""
        if not self.delete(msg_id, then):
            then(None)
