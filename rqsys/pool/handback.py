"""At a pool queue's start: the messages queued in this host's own store
are handed to the pool, then removed here.  One the pool's bucket has a
record of was pulled by the last run and not acked: the stream still has it
and delivers it again, so it is only removed (republished, it was a second
message once JetStream's DUPLICATE_WINDOW of 10 minutes had passed, and ran
twice).  One without a record (queued before the queue became a pool
queue) is published under its own id.  One whose lookup or publish fails
stays and runs here.
"""

from __future__ import annotations

from typing import Any

from rqsys.pool.bridge import Bridge
from rqsys.pool.files import PoolFiles, local_files
from rqsys.pool.parts import QueueParts


class HandBack:
    """Hands the locally queued messages to the pool; ``pending`` until all are."""

    def __init__(self, parts: QueueParts, bridge: Bridge, files: PoolFiles) -> None:
        self.ctx, self.store, self.log = parts.ctx, parts.store, parts.log
        self.transitions, self.ledger = parts.transitions, parts.transitions.ledger
        self.bridge, self.files = bridge, files
        self.pending = 0  # publishes not answered yet: the host pulls nothing till then

    def start(self) -> None:
        for msg_id in self.ledger.schedule.ordered_ids():
            msg = self.transitions.take_from_que(msg_id)
            if msg is not None:
                record = {"state": "que", "host": "", "status": "",
                          "url": self.ctx.url(msg_id), "msg": msg}
                self.pending += 1
                self.bridge.submit(self._hand_back(msg_id, msg, record),
                                   self._handed_back(msg_id, msg))

    async def _hand_back(self, msg_id: str, msg: dict[str, Any], record: dict[str, Any]
                         ) -> str:
        """How it went to the pool: "in the pool already", or "published"."""
        if await self.files.link.lookup(msg_id) is not None:
            return "in the pool already (the stream delivers it again)"
        files = local_files(self.store, "que", msg_id)
        await self.files.publish(msg_id, dict(msg, msg_id=msg_id), record, files)
        return "published"

    def _handed_back(self, msg_id: str, msg: dict[str, Any]) -> Any:
        def then(how: Any, error: BaseException | None) -> None:
            self.pending -= 1
            if error is None:
                self.transitions.delete(msg_id, lambda _error: None)
                self.log.event("pool", f"queued here at start: handed to the pool, {how}",
                               msg_id)
            else:
                self.transitions.return_to_que(msg_id, msg)
                self.log.event("err", f"pool: not handed to the pool ({error}); runs here",
                               msg_id)
        return then
