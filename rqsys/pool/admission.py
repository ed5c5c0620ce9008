"""Whether a pool message taken here goes on to run, by the limits the pool
holds across its hosts (``rqsys.pool.limits``): its places are asked for
once it is staged, before it is placed in ``que/``.

* All taken: it is placed and starts as any message (the daemon's own gate,
  counting only this host's runs, never holds it then).
* A limit without ``by`` full (the whole queue's): it waits here, a worker
  kept for it, asked again every POLL (or when the rate window frees, or at
  once when this host gives a place of it back): no other message of the
  queue could run instead.
* A limit of its ``by`` params full for HOLD_BY (or a rate window of them
  that frees later than that): it goes back to the pool, naked with a delay,
  so that this worker may take a message of other params.
* NATS not answering: it goes back to the pool (the safe side: nothing
  starts without its places).
* Its places taken but not started within START_SLACK (the queue paused,
  its room full): it goes back to the pool, its places given back.

At its end (or resend) its places are given back, its rate place staying as
its start time; a give-back that fails is tried again until NATS answers
(``insist``).  A start is turned into its start time in the rate window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rqsys.pool.acks import RETRY, SEND_TIMEOUT
from rqsys.pool.bridge import Bridge, why
from rqsys.pool.insist import Insist
from rqsys.pool.limits import START_SLACK, Place, Places, Refused, places_of, rules_of

if TYPE_CHECKING:  # the daemon imports the pool: only the types from there
    from rqsys.daemon.context import QueueContext
    from rqsys.observe.events import EventLog

POLL = 0.5  # seconds between asks while a whole-queue limit is full
HOLD_BY = 2.0  # seconds a message waits here for a full limit of its params
BACK_DELAY = 1.0  # seconds before the pool gives a message sent back so out again
LONGEST_POLL = 5.0  # seconds: a rate window that frees later is asked again meanwhile
SOONEST = 0.1  # seconds: a window said to free now (another host's clock ahead) is not polled hot

Go = Callable[[], None]
Back = Callable[[float, str], None]  # (delay, why): back to the pool


@dataclass
class Asking:
    """A staged message waiting for its places."""

    places: list[Place]
    go: Go  # places it in que/
    back: Back  # hands it back to the pool
    since: float  # monotonic
    at: float = 0.0  # asked again from then (monotonic)
    out: bool = False  # a take under way
    told: bool = False  # its wait logged


@dataclass
class Holding:
    """A message holding its places."""

    places: list[Place]
    taken_at: float  # wall time
    started: bool = False


class Admission:
    """Asks for, holds and gives back the places of this host's pool messages."""

    def __init__(self, ctx: QueueContext, places: Places, bridge: Bridge, insist: Insist,
                 log: EventLog, late: Callable[[str, str], bool]) -> None:
        self.ctx, self.bridge, self.insist, self.log, self.late = ctx, bridge, insist, log, late
        self.places = places
        self.asking: dict[str, Asking] = {}
        self.holding: dict[str, Holding] = {}

    # ------------------------------------------------------------ asking
    def ask(self, msg_id: str, msg: dict[str, Any], go: Go, back: Back) -> None:
        """``go()`` once ``msg`` has its places (at once when the queue has no
        limit), or ``back(delay, why)``."""
        places = places_of(rules_of(self.ctx.config), msg)
        if not places:
            go()
            return
        self.asking[msg_id] = Asking(places, go, back, time.monotonic())
        self._ask(msg_id, self.asking[msg_id])

    def _ask(self, msg_id: str, asking: Asking) -> None:
        asking.out = True
        self.bridge.submit(self.places.take(msg_id, asking.places), self._answered(msg_id, asking))

    def _answered(self, msg_id: str, asking: Asking) -> Any:
        def then(result: Any, error: BaseException | None) -> None:
            asking.out = False
            if self.asking.get(msg_id) is not asking:  # let go meanwhile
                if not isinstance(result, Refused):  # taken, or some may be
                    self._give_back(msg_id, asking.places, started=False)
                return
            if isinstance(result, Refused):
                self._refused(msg_id, asking, result)
                return
            del self.asking[msg_id]
            if error is not None:
                self._give_back(msg_id, asking.places, started=False)  # some may be taken
                asking.back(RETRY, f"the pool's limits did not answer ({why(error)})")
                return
            self.holding[msg_id] = Holding(asking.places, float(result))
            try:
                asking.go()
            except Exception as exc:  # noqa: BLE001 - this host's trouble (a full disk)
                self.done(msg_id, started=False)
                asking.back(RETRY, f"cannot take a message here: {why(exc)}")
        return then

    def _refused(self, msg_id: str, asking: Asking, refused: Refused) -> None:
        now, place = time.monotonic(), refused.place
        frees = None if refused.at is None else refused.at - time.time()
        if place is not None and place.rule.by and (
                now - asking.since >= HOLD_BY or (frees or 0) > HOLD_BY):
            del self.asking[msg_id]
            asking.back(max(BACK_DELAY, frees or 0),
                        f"{place.rule.what} of its params full across the pool")
            return
        if place is not None and not asking.told:
            asking.told = True
            self.log.event("pool", f"waits for a place: {place.rule.what} full across "
                           "the pool", msg_id)
        asking.at = now + (POLL if frees is None else min(max(frees, SOONEST), LONGEST_POLL))

    # ------------------------------------------------------------ each turn
    def turn(self, now: float, queued: Callable[[str], bool], running: Mapping[str, Any]) -> None:
        """Ask again for the places whose time has come; count the starts; send
        back a message that holds its places and has not started in time."""
        for msg_id, asking in list(self.asking.items()):
            if not asking.out and asking.at <= now:
                self._ask(msg_id, asking)
        wall = time.time()
        for msg_id, held in list(self.holding.items()):
            if held.started:
                continue
            worker = running.get(msg_id)
            if worker is not None:
                self._started(msg_id, held, float(worker.started))
            elif (queued(msg_id) and wall > held.taken_at + START_SLACK
                  and self.late(msg_id, f"not started within {START_SLACK:g}s of its places "
                                "in the pool's limits")):
                self.done(msg_id, started=False)

    def wait(self, now: float) -> float | None:
        """Seconds until a message is asked for again or may be late (None: none)."""
        waits = [a.at - now for a in self.asking.values() if not a.out]
        wall = time.time()
        waits += [h.taken_at + START_SLACK - wall for h in self.holding.values()
                  if not h.started and h.taken_at + START_SLACK > wall]
        return max(0.0, min(waits)) if waits else None

    def _started(self, msg_id: str, held: Holding, at: float) -> None:
        held.started = True
        for place in held.places:
            if place.rule.rate:
                self._count_start(msg_id, place, at)

    def _count_start(self, msg_id: str, place: Place, at: float) -> None:
        self.insist.submit(lambda: self.places.started(msg_id, place, at),
                           "start not counted in the pool's rate_limit", msg_id)

    # ------------------------------------------------------------ giving back
    def done(self, msg_id: str, started: bool = True) -> None:
        """``msg_id`` ended here (``started``) or goes back to the pool unstarted:
        its places are given back."""
        self.asking.pop(msg_id, None)
        held = self.holding.pop(msg_id, None)
        if held is None:
            return
        if started and not held.started:  # it started and ended between two turns
            self._started(msg_id, held, time.time())
        self._give_back(msg_id, held.places, held.started or started)

    def _give_back(self, msg_id: str, places: list[Place], started: bool) -> None:
        keys = {p.key for p in places}

        def then(_result: Any, error: BaseException | None) -> None:
            if error is None:  # a message here waiting for one of them asks at once
                for asking in self.asking.values():
                    if not keys.isdisjoint(p.key for p in asking.places):
                        asking.at = 0.0
                return
            self.insist.submit(lambda: self.places.give_back(msg_id, places, started),
                               "places in the pool's limits not given back", msg_id)
        self.bridge.submit(self.places.give_back(msg_id, places, started), then)

    async def final(self) -> None:
        """On the bridge, at stop: the places still held given back, tried
        once (those that fail are dropped by the other hosts: this host's
        load says it stopped).  Rate places stay: counted, the safe side."""
        held, self.holding = self.holding, {}
        results = await asyncio.gather(
            *(asyncio.wait_for(self.places.give_back(i, h.places, True), SEND_TIMEOUT)
              for i, h in held.items()), return_exceptions=True)
        for msg_id, error in zip(held, results, strict=True):
            if isinstance(error, BaseException):
                self.log.event("err", f"pool: places in the pool's limits not given back "
                               f"at stop ({why(error)})", msg_id)
