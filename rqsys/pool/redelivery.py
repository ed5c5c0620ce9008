"""Whether a redelivered pool message runs: the pool's record is looked up
first, because another host may have ended it and lost only its ack.

The worker holds a redelivery meanwhile (a worker kept for it, its deadline
extended like any held message's), and this module decides:

* the record says it ended (``done``, ``err``) on some host: it is acked
  here, not run again;
* the record says another host took this delivery or a later one (its
  ``count``): that host has it now; this delivery is let go, neither run
  nor acked (a lookup that failed for longer than ``ack_wait`` lets
  JetStream give the message out again meanwhile);
* the record says a host took an earlier delivery (``run``): it is looked
  up once more after DEFER.  That host may be alive and have ended it
  while NATS did not answer (a stream leader's election can outlast
  ``ack_wait``); it records the end, then acks, trying again every RETRY
  (``rqsys.pool.acks``), so DEFER gives it the time to say so.  A host
  that is gone costs its messages DEFER more;
* the lookup failed (NATS not answering): looked up again after RETRY.  A
  redelivery never runs without knowing whether it has ended;
* otherwise (no record, or queued again): it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rqsys.observe.events import EventLog
from rqsys.pool.acks import RETRY, SEND_TIMEOUT
from rqsys.pool.bridge import Bridge, why
from rqsys.pool.link import Link
from rqsys.store.layout import ENDED_STATES

# seconds: a host that ended it while NATS was away has recorded the end by
# then: its try under way when NATS came back times out, it waits RETRY, and
# tries again (the record, then the ack)
DEFER = SEND_TIMEOUT + 2 * RETRY

Decided = Callable[[str, dict[str, Any]], None]  # (msg_id, msg or the record)


@dataclass
class Waiting:
    """A redelivery held until its record is known."""

    msg: dict[str, Any]
    count: int  # deliveries before this one (its RQ_COUNT)
    at: float = 0.0  # looked up again from then
    deferred: bool = False  # looked up once more after DEFER already
    failed: bool = False  # a lookup failed (logged once)


class Redeliveries:
    """Looks up held redeliveries in the pool's bucket; runs, skips or lets go of each."""

    def __init__(self, link: Link, bridge: Bridge, log: EventLog, run: Decided, skip: Decided,
                 let_go: Callable[[str], None]) -> None:
        self.link, self.bridge, self.log = link, bridge, log
        self.run, self.skip, self.let_go = run, skip, let_go
        self.undecided: dict[str, Waiting] = {}  # being looked up, or waiting to be again
        self.later: dict[str, Waiting] = {}  # waiting to be looked up again

    def add(self, msg_id: str, msg: dict[str, Any], count: int) -> None:
        """A redelivery the worker holds: decided once its record is known."""
        waiting = self.undecided[msg_id] = Waiting(msg, count)
        self._look(msg_id, waiting)

    def newer(self, msg_id: str, count: int) -> None:
        """The message came again while undecided: the newest delivery is held."""
        if msg_id in self.undecided:
            self.undecided[msg_id].count = count

    def turn(self, now: float) -> None:
        """Look up again the redeliveries whose time has come."""
        for msg_id, waiting in list(self.later.items()):
            if waiting.at <= now:
                del self.later[msg_id]
                self._look(msg_id, waiting)

    def wait(self, now: float) -> float | None:
        """Seconds until a redelivery is looked up again (None: none waits)."""
        if not self.later:
            return None
        return max(0.0, min(w.at for w in self.later.values()) - now)

    def _look(self, msg_id: str, waiting: Waiting) -> None:
        self.bridge.submit(self.link.lookup(msg_id), self._looked_up(msg_id, waiting))

    def _looked_up(self, msg_id: str, waiting: Waiting) -> Any:
        def then(record: Any, error: BaseException | None) -> None:
            if error is not None:
                if not waiting.failed:  # once: an outage would log a line a second
                    self.log.event("err", f"pool: redelivery not looked up ({why(error)}): "
                                   f"asked again every {RETRY:g}s", msg_id)
                waiting.failed, waiting.at = True, time.monotonic() + RETRY
                self.later[msg_id] = waiting
                return
            self._decide(msg_id, waiting, record or {})
        return then

    def _decide(self, msg_id: str, waiting: Waiting, record: dict[str, Any]) -> None:
        state, taken = record.get("state"), int(record.get("count", -1))
        if state == "run" and taken < waiting.count and not waiting.deferred:
            waiting.deferred, waiting.at = True, time.monotonic() + DEFER  # it may yet end
            self.later[msg_id] = waiting
            return
        del self.undecided[msg_id]
        if state in ENDED_STATES:
            self.skip(msg_id, record)
        elif state == "run" and taken >= waiting.count:
            self.log.event("pool", f"delivered again while {record.get('host')} has a "
                           "later delivery: let go here", msg_id)
            self.let_go(msg_id)
        else:
            self.run(msg_id, waiting.msg)
