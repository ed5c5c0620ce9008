"""The daemon's picture of its messages: what ``rqsys.daemon.transitions`` keeps in step.

The que in memory (``Schedule``), the messages running, the counts of the
other states (``tally``), which messages are *busy* (their ``msg`` is being
rewritten: no transition takes them, and a client's request of them waits
until the rewrite is durable), and the one rename a transition makes
(``move``, guarded by ``MOVES``).  Everyone reads it; only ``Transitions``
and its retry collaborator (``rqsys.daemon.retries``) change it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rqsys.daemon.scheduler import Schedule
from rqsys.daemon.unique import UniqueIndex
from rqsys.errors import InternalError, NotFound, RQError
from rqsys.observe.events import EventLog
from rqsys.run.verdict import Outcome
from rqsys.store import STATES, QueueStore
from rqsys.store.layout import arrival

Msg = dict[str, Any]
Ended = tuple[str, Msg, Outcome]  # a message that reached done, err or relayed
Done = Callable[[BaseException | None], None]  # called on the loop once it is durable
Offload = Callable[[Callable[[], Any], Callable[[Any, BaseException | None], None]], None]

ENDED = ("done", "err", "relayed")
COUNTED = ("prep", "done", "err", "relayed")  # counted here; que and run are in memory
MOVES = frozenset({  # every rename between two states the daemon makes
    ("prep", "que"), ("que", "run"), ("run", "que"), ("run", "done"), ("run", "err"),
    ("run", "relayed"), ("que", "err"), ("que", "done"), ("que", "relayed"), ("err", "que")})
Riders = tuple[str, list[tuple[str, Msg]]]  # the primary's URL, and its riders


class Ledger:
    """The que, the running, the counts and the busy: read by all, changed only by
    Transitions and its collaborators (Retries; a bulk move's hold and release)."""

    def __init__(self, store: QueueStore, schedule: Schedule, log: EventLog) -> None:
        self.store, self.schedule, self.log = store, schedule, log
        self.running: dict[str, Msg] = {}  # run/: messages whose script runs
        self.riders: dict[str, Riders] = {}  # coalesced with a running one (still in que/)
        self._busy: dict[str, str] = {}  # id -> why: its msg is being rewritten
        self._after_busy: dict[str, list[Callable[[], None]]] = {}  # client requests waiting
        self.held: dict[str, list[tuple[str, Msg]]] = {}  # a resent primary's riders
        self._moving: dict[str, Msg] = {}  # queued ones a bulk move sends: out of the que
        self.tally = dict.fromkeys(COUNTED, 0)  # the counts of the states not in memory
        self.blank: set[str] = set()  # placed here, never run: its status file is blank
        self.unique = UniqueIndex(store.qdir)  # unique keys held (rqsys.daemon.unique)
        self.queued: Callable[[str, Msg], None] = lambda _id, _msg: None  # new in que: after

    # ------------------------------------------------------------ reading
    def count(self, state: str) -> int:
        if state == "que":
            return len(self.schedule)
        if state == "run":
            return len(self.running)
        return self.tally[state]

    def counts(self) -> dict[str, int]:
        return {state: self.count(state) for state in STATES}

    def page(self, state: str, offset: int, limit: int) -> list[str]:
        """Ids in ``state``: que in run order, run by arrival, the others newest first."""
        if state == "que":
            return self.schedule.ordered_ids(offset, limit)
        if state == "run":
            return sorted(self.running, key=arrival)[offset:offset + limit]
        return self.store.newest(state, offset, limit)

    def busy(self, msg_id: str) -> str:
        """Why no client may move the message now ("" when it may)."""
        if msg_id in self.running:
            return f"message {msg_id} is running: destroy it instead"
        for primary, (_url, riders) in self.riders.items():
            if any(rider == msg_id for rider, _msg in riders):
                return f"message {msg_id} runs coalesced with {primary}: destroy that one"
        why = self._busy.get(msg_id)
        return f"message {msg_id} is {why}: try again" if why else ""

    # ------------------------------------------------------------ busy messages
    def is_busy(self, msg_id: str) -> bool:
        """Whether the message's rewrite (or its retry batch, or its move) is under way."""
        return msg_id in self._busy

    def mark_busy(self, msg_id: str, why: str) -> None:
        """No transition takes it, and a client's request of it waits, until ``free``."""
        self._busy[msg_id] = why

    def wait_while_busy(self, msg_id: str, request: Callable[[], None], done: Done) -> bool:
        """Defer a client's request while the message's rewrite is on its way
        to disk; True if deferred. Its error, if any, then goes to ``done``."""
        if msg_id not in self._busy:
            return False

        def later() -> None:
            try:
                request()
            except RQError as error:
                done(error)
        self._after_busy.setdefault(msg_id, []).append(later)
        return True

    def busy_ids(self) -> frozenset[str]:
        """The messages busy now (a rewrite or a retry batch under way)."""
        return frozenset(self._busy)

    def wait_until_free(self, msg_ids: list[str], then: Callable[[], None]) -> bool:
        """If one of ``msg_ids`` is busy, call ``then`` once none is (their
        rewrites durable) and return True; else False, ``then`` not called.
        A bulk action waits so for a retry batch, not passing its messages over."""
        busy = [msg_id for msg_id in msg_ids if msg_id in self._busy]
        if not busy:
            return False

        def freed() -> None:
            if not self.wait_until_free(busy[1:], then):
                then()
        self._after_busy.setdefault(busy[0], []).append(freed)
        return True

    def hold_moving(self, msg_ids: list[str]) -> None:
        """A bulk move's step, sent to the other queue: busy until it answers
        (a client's request of one waits); the queued out of the que meanwhile,
        so none starts, rides along or is coalesced here while its copy is made."""
        for msg_id in msg_ids:
            self._busy[msg_id] = "being moved"
            msg = self.schedule.remove(msg_id)
            if msg is not None:
                self._moving[msg_id] = msg

    def release_moving(self, msg_id: str, then: Callable[[], None] | None = None) -> None:
        """The other queue answered for ``msg_id``.  ``then`` (the delete of one
        it took) runs first, before the requests that waited; without it the
        message stays here: a queued one back in the que, in its place (its
        msg, due and priority unchanged)."""
        msg = self._moving.pop(msg_id, None)
        del self._busy[msg_id]
        if then is not None:
            then()
        elif msg is not None:
            self.schedule.add(msg_id, msg)
        for request in self._after_busy.pop(msg_id, []):
            request()

    def free(self, msg_id: str) -> None:
        """The rewrite is durable: the message may move again; run what waited."""
        del self._busy[msg_id]
        for rider_id, rider in self.held.pop(msg_id, []):
            self.schedule.add(rider_id, rider)
            self.free(rider_id)
        for request in self._after_busy.pop(msg_id, []):
            request()

    # ------------------------------------------------------------ the one rename
    def move(self, msg_id: str, src: str, dest: str) -> None:
        guard((src, dest) in MOVES, f"no transition {src} → {dest}")
        self.store.move(msg_id, src, dest)
        if dest in ENDED:
            self.unique.ended(msg_id, time.time())

    def moved(self, msg_id: str, src: str, dest: str) -> bool:
        """``move`` of a message the daemon moves on its own (a start, an end):
        False when its directory is gone, removed by hand.  It is dropped as a
        delete is, and the daemon goes on (it ended, the running scripts to
        be run again at the restart)."""
        try:
            self.move(msg_id, src, dest)
        except NotFound:
            self.blank.discard(msg_id)
            self.schedule.remove(msg_id)
            self.unique.forget(msg_id)
            self.log.event("deleted", f"gone from {src}/: its directory was removed, not by "
                           "rqsys", msg_id)
            return False
        return True


def guard(ok: bool, why: str) -> None:
    """A transition the daemon itself asked for must be possible: else a bug."""
    if not ok:
        raise InternalError(f"transition refused: {why}")
