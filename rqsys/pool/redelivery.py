"""Whether a redelivered pool message runs: the pool's record is looked up
first, because another host may have ended it and lost only its ack.

The worker holds a redelivery meanwhile (a worker kept for it, its deadline
extended like any held message's), and this module decides:

* the record says it ended (``done``, ``err``) on some host: it is acked
  here, not run again;
* the record says a host took it (``run``): it is looked up once more after
  DEFER.  That host may be alive and have ended it while NATS did not
  answer (a stream leader's election can outlast ``ack_wait``); it records
  the end, then acks, trying again every RETRY (``rqsys.pool.acks``), so
  DEFER gives it the time to say so.  A host that is gone costs its
  messages DEFER more;
* the lookup failed (NATS not answering): looked up again after RETRY.  A
  redelivery never runs without knowing whether it has ended;
* otherwise (no record, or queued again): it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rqsys.events import EventLog
from rqsys.pool.acks import RETRY
from rqsys.pool.bridge import Bridge, why
from rqsys.pool.link import Link
from rqsys.store.layout import ENDED_STATES

DEFER = 2 * RETRY  # seconds: a host that ended it during an outage says so within RETRY

Run = Callable[[str, dict[str, Any]], None]  # run(msg_id, msg)
Skip = Callable[[str, dict[str, Any]], None]  # skip(msg_id, record that says it ended)


class Redeliveries:
    """Looks up held redeliveries in the pool's bucket, then runs or skips each."""

    def __init__(self, link: Link, bridge: Bridge, log: EventLog, run: Run, skip: Skip) -> None:
        self.link, self.bridge, self.log, self.run, self.skip = link, bridge, log, run, skip
        self.later: dict[str, tuple[float, dict[str, Any], bool]] = {}  # id: (at, msg, deferred)

    def add(self, msg_id: str, msg: dict[str, Any]) -> None:
        """A redelivery the worker holds: decided once its record is known."""
        self._look(msg_id, msg, deferred=False)

    def turn(self, now: float) -> None:
        """Look up again the redeliveries whose time has come."""
        for msg_id, (at, msg, deferred) in list(self.later.items()):
            if at <= now:
                del self.later[msg_id]
                self._look(msg_id, msg, deferred)

    def wait(self, now: float) -> float | None:
        """Seconds until a redelivery is looked up again (None: none waits)."""
        return max(0.0, min(at for at, _m, _d in self.later.values()) - now) if self.later \
            else None

    def _look(self, msg_id: str, msg: dict[str, Any], deferred: bool) -> None:
        self.bridge.submit(self.link.lookup(msg_id), self._looked_up(msg_id, msg, deferred))

    def _looked_up(self, msg_id: str, msg: dict[str, Any], deferred: bool) -> Any:
        def then(record: Any, error: BaseException | None) -> None:
            if error is not None:
                self.log.event("err", f"pool: redelivery not looked up ({why(error)}): "
                               f"looked up again in {RETRY:g}s", msg_id)
                self.later[msg_id] = (time.monotonic() + RETRY, msg, deferred)
                return
            state = (record or {}).get("state")
            if state in ENDED_STATES:
                self.skip(msg_id, record)
            elif state == "run" and not deferred:  # its host may yet say it ended
                self.later[msg_id] = (time.monotonic() + DEFER, msg, True)
            else:
                self.run(msg_id, msg)
        return then
