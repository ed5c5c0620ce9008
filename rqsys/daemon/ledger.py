"""The daemon's picture of its messages: what ``rqsys.daemon.transitions`` keeps in step.

The que in memory (``Schedule``), the messages running, the counts of the
other states (``tally``), which messages are *busy* (their ``msg`` is being
rewritten: no transition takes them, and a client's request of them waits
until the rewrite is durable), and the one rename a transition makes
(``move``, guarded by ``MOVES``).  Everyone reads it; only ``Transitions``
and its retry collaborator (``rqsys.daemon.retries``) change it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rqsys import tunables
from rqsys.daemon.gates import Gate
from rqsys.daemon.quetail import QueTail
from rqsys.daemon.scheduler import Schedule
from rqsys.daemon.unique import UniqueIndex
from rqsys.errors import InternalError, NotFound, RQError
from rqsys.life.moments import Moments
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


class QueView(Protocol):
    """The que in memory as everyone but the transitions sees it: read only."""

    @property
    def msgs(self) -> Mapping[str, Msg]: ...
    def __len__(self) -> int: ...
    def __contains__(self, msg_id: str) -> bool: ...
    def backlog(self) -> bool: ...
    def next_due(self) -> float | None: ...
    def find_same_params(self, msg: Msg) -> str | None: ...
    def ordered_ids(self, offset: int = 0, limit: int | None = None) -> list[str]: ...
    @property
    def room(self) -> RoomView: ...


class RoomView(Protocol):
    """The slots and needs in use, as readers see them (``rqsys.daemon.room``)."""

    def gpus_of(self, msg_id: str) -> list[str]: ...
    def has_free_slot(self) -> bool: ...
    def usage(self) -> dict[str, Any]: ...


class Ledger:
    """The que, the running, the counts and the busy: read by all through the
    properties and reading methods; changed only by Transitions and its
    collaborators (Retries; a bulk move's hold and release), through the
    methods under "writing" (``WRITERS``: a test holds everyone else to it).
    Its changes are the moments ``queued``, ``ended`` and ``removed`` of a
    message's life (``rqsys.life.moments``)."""

    def __init__(self, store: QueueStore, schedule: Schedule, log: EventLog,
                 moments: Moments, window: int = 0) -> None:
        self.store, self.log, self.moments = store, log, moments
        self._que = schedule
        self._running: dict[str, Msg] = {}  # run/: messages whose script runs
        self._riders: dict[str, Riders] = {}  # coalesced with a running one (still in que/)
        self._busy: dict[str, str] = {}  # id -> why: its msg is being rewritten
        self._after_busy: dict[str, list[Callable[[], None]]] = {}  # client requests waiting
        self._held: dict[str, list[tuple[str, Msg]]] = {}  # a resent primary's riders
        self._moving: dict[str, Msg] = {}  # queued ones a bulk move sends: out of the que
        self._tally = dict.fromkeys(COUNTED, 0)  # the counts of the states not in memory
        self._blank: set[str] = set()  # placed here, never run: its status file is blank
        self._unread: list[str] = []  # in que/, not read into the que yet (start-up): a heap
        self._tail = QueTail(store, window)  # plain ones past the window: on disk only
        self.unique = UniqueIndex(store.qdir)  # unique keys held (rqsys.daemon.unique)

    @property
    def schedule(self) -> QueView:
        """The que in memory, to read."""
        return self._que

    @property
    def running(self) -> Mapping[str, Msg]:
        """The messages whose script runs, to read."""
        return self._running

    # ------------------------------------------------------------ reading
    def count(self, state: str) -> int:
        if state == "que":
            return len(self._que) + len(self._unread) + len(self._tail)
        if state == "run":
            return len(self._running)
        return self._tally[state]

    @property
    def unread(self) -> int:
        """How many of que/'s messages a start has not read into the que yet."""
        return len(self._unread)

    def wants_reading(self) -> bool:
        """Whether a start's reading of que/ goes on now: while nothing runs, or
        when the plain messages in memory run low (``rqsys.daemon.queload``)."""
        return bool(self._unread) and (not self._running or
                                       self._que.plain < tunables.READ_AHEAD)

    @property
    def on_disk_only(self) -> int:
        """Queued messages not in the que in memory: not read yet, or in its tail."""
        return len(self._unread) + len(self._tail)

    def next_due(self) -> float | None:
        """The que's next due time, its tail read back first if it runs low."""
        self._tail.refill(self._que)
        return self._que.next_due()

    def counts(self) -> dict[str, int]:
        return {state: self.count(state) for state in STATES}

    def page(self, state: str, offset: int, limit: int) -> list[str]:
        """Ids in ``state``: que in run order, run by arrival, the others newest first."""
        if state == "que":
            return self.schedule.ordered_ids(offset, limit)
        if state == "run":
            return sorted(self._running, key=arrival)[offset:offset + limit]
        return self.store.newest(state, offset, limit)

    def has_free_slot(self) -> bool:
        """Whether a worker slot is free (ended runs still being stopped hold theirs)."""
        return self._que.room.has_free_slot()

    def gpus_of(self, msg_id: str) -> list[str]:
        """The GPU ids a running message holds."""
        return self._que.room.gpus_of(msg_id)

    def busy(self, msg_id: str) -> str:
        """Why no client may move the message now ("" when it may)."""
        if msg_id in self._running:
            return f"message {msg_id} is running: destroy it instead"
        for primary, (_url, riders) in self._riders.items():
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
            msg = self._que.remove(msg_id)
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
            self._que.add(msg_id, msg)
        for request in self._after_busy.pop(msg_id, []):
            request()

    def free(self, msg_id: str) -> None:
        """The rewrite is durable: the message may move again; run what waited."""
        del self._busy[msg_id]
        for rider_id, rider in self._held.pop(msg_id, []):
            self._que.add(rider_id, rider)
            self.free(rider_id)
        for request in self._after_busy.pop(msg_id, []):
            request()

    # ------------------------------------------------------------ the one rename
    def move(self, msg_id: str, src: str, dest: str) -> None:
        guard((src, dest) in MOVES, f"no transition {src} → {dest}")
        self.store.move(msg_id, src, dest)
        if dest in ENDED:
            for hook in self.moments.ended:
                hook(msg_id, dest)

    def moved(self, msg_id: str, src: str, dest: str) -> bool:
        """``move`` of a message the daemon moves on its own (a start, an end):
        False when its directory is gone, removed by hand.  It is dropped as a
        delete is, and the daemon goes on (it ended, the running scripts to
        be run again at the restart)."""
        try:
            self.move(msg_id, src, dest)
        except NotFound:
            self._que.remove(msg_id)
            self.removed(msg_id)
            self.log.event("deleted", f"gone from {src}/: its directory was removed, not by "
                           "rqsys", msg_id)
            return False
        return True

    # ------------------------------------------------------------ writing (the transitions)
    def removed(self, msg_id: str) -> None:
        """The message is gone (deleted, pruned, removed by hand): the moment ``removed``."""
        self._blank.discard(msg_id)
        for hook in self.moments.removed:
            hook(msg_id)

    def queued(self, msg_id: str, msg: Msg) -> None:
        """In the que (placed, committed, retried, read at start), or its tail:
        the moment ``queued``."""
        if self._tail.takes(self._que, msg):
            self._tail.append(self._que, msg_id)
        else:
            self._que.add(msg_id, msg)
        for hook in self.moments.queued:
            hook(msg_id, msg)

    def requeue(self, msg_id: str, msg: Msg) -> None:
        """Back in the que as it was (no moment: it was queued before)."""
        self._que.add(msg_id, msg)

    def unqueue(self, msg_id: str) -> Msg | None:
        """Out of the que in memory (its directory stays where it is)."""
        return self._que.remove(msg_id)

    def to_read(self, ids: list[str]) -> None:
        """At start: que/'s ids, to be read into the que oldest first (``next_unread``;
        a heap: made in a fifth of a sort's time, a million in 0.13 s)."""
        self._unread = list(ids)
        heapq.heapify(self._unread)

    def next_unread(self) -> str | None:
        return heapq.heappop(self._unread) if self._unread else None

    def pop_ready(self, now: float) -> tuple[str, Msg] | None:
        self._tail.refill(self._que)
        picked = self._que.pop_ready(now)
        if picked is None and self._que.tail_hit:  # what is left sorts after the tail's
            self._tail.refill(self._que)
            picked = self._que.pop_ready(now)
        return picked

    def read_in(self, msg_id: str, msg: Msg) -> None:
        """A queued message not in memory, read in ahead of its turn (a client's action)."""
        self._tail.take_out(msg_id)
        self._que.add(msg_id, msg)

    def deleted_unread(self) -> None:
        """A queued message not in memory was deleted (its count follows)."""
        self._tail.deleted()

    def dropped(self, queued: Msg) -> None:
        self._que.dropped(queued)

    def begin_run(self, msg_id: str, msg: Msg, now: float) -> None:
        """que → run in memory: its gate counts it, its share of the room is held."""
        self._running[msg_id] = msg
        self._que.started(msg_id, msg, now)

    def end_run(self, msg_id: str) -> Msg | None:
        """No longer running (None: it was not)."""
        msg = self._running.pop(msg_id, None)
        if msg is not None:
            self._que.ended(msg_id, msg)
        return msg

    def counted(self, state: str, delta: int) -> None:
        """A message more (or fewer) in ``state`` (one of ``COUNTED``)."""
        self._tally[state] += delta

    def recount(self, counts: dict[str, int]) -> None:
        self._tally.update(counts)

    def placed_blank(self, msg_id: str) -> None:
        """Placed by this daemon, never run: its status file is blank."""
        self._blank.add(msg_id)

    def take_blank(self, msg_id: str) -> bool:
        """Whether it had a blank status file (and it has no longer)."""
        blank = msg_id in self._blank
        self._blank.discard(msg_id)
        return blank

    def ride(self, msg_id: str, url: str, riders: list[tuple[str, Msg]]) -> None:
        self._riders[msg_id] = (url, riders)

    def take_riders(self, msg: Msg) -> list[tuple[str, Msg]]:
        return self._que.take_coalesced(msg)

    def riders_of(self, msg_id: str) -> Riders:
        return self._riders.pop(msg_id, ("", []))

    def hold_riders(self, primary: str, riders: list[tuple[str, Msg]]) -> None:
        self._held[primary] = riders

    def wait_for_others(self, msg_id: str, waiting: bool, wake: bool = True) -> None:
        """It waits for other messages (``after``), or no longer (``wake``: it
        competes again now; not when it leaves the que anyway)."""
        if waiting:
            self._que.after.add(msg_id)
        elif wake:
            self._que.unhold(msg_id)
        else:
            self._que.after.discard(msg_id)

    def reconfigure(self, gate: Gate, config: dict[str, Any]) -> None:
        """A reload: the que's new gate, coalesce params and room."""
        self._que.reconfigure(gate, config["coalesce_params"], self._running.values(), config)

    def outside(self, held: int) -> None:
        """Slots held by runs that ended but whose processes are not gone yet."""
        if held != self._que.room.outside:
            self._que.room.outside = held


WRITERS = frozenset({  # the ledger's writing methods: only transitions and retries call them
    "removed", "queued", "requeue", "unqueue", "to_read", "next_unread", "pop_ready", "dropped",
    "deleted_unread", "read_in",
    "begin_run", "end_run", "counted", "recount", "placed_blank", "take_blank", "ride",
    "take_riders", "riders_of", "hold_riders", "wait_for_others", "reconfigure", "move", "moved",
    "mark_busy", "free", "hold_moving", "release_moving"})


def guard(ok: bool, why: str) -> None:
    """A transition the daemon itself asked for must be possible: else a bug."""
    if not ok:
        raise InternalError(f"transition refused: {why}")


def batch_of(msg: Msg | None) -> dict[str, str]:
    """``RQ_BATCH`` for the end event of a batch's member (``rqsys.batches.ends``)."""
    batch = msg.get("batch") if msg else None
    return {"RQ_BATCH": batch} if batch else {}
