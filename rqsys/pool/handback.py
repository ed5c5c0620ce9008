"""At a pool queue's start: the messages queued in this host's own store
(pulled and not acked by the last run, or queued before the queue became a
pool queue) are published to the pool under their own ids, then removed
here.  A pulled one is still in the stream: JetStream drops the copy as a
duplicate of its id (within its DUPLICATE_WINDOW).  One whose publish fails
stays and runs here.
"""

from __future__ import annotations

from typing import Any

from rqsys.pool.bridge import Bridge
from rqsys.pool.files import PoolFiles, local_files


class HandBack:
    """Hands the locally queued messages to the pool; ``pending`` until all are."""

    def __init__(self, daemon: Any, bridge: Bridge, files: PoolFiles) -> None:
        self.ctx, self.store, self.ledger, self.log = (daemon.ctx, daemon.store, daemon.ledger,
                                                      daemon.log)
        self.bridge, self.files = bridge, files
        self.pending = 0  # publishes not answered yet: the host pulls nothing till then

    def start(self) -> None:
        schedule = self.ledger.schedule
        for msg_id in schedule.ordered_ids():
            msg = schedule.remove(msg_id)
            if msg is not None:
                record = {"state": "que", "host": "", "status": "",
                          "url": self.ctx.url(msg_id), "msg": msg}
                self.pending += 1
                files = local_files(self.store, "que", msg_id)
                self.bridge.submit(self.files.publish(msg_id, dict(msg, msg_id=msg_id), record,
                                                      files), self._handed_back(msg_id, msg))

    def _handed_back(self, msg_id: str, msg: dict[str, Any]) -> Any:
        def then(_result: Any, error: BaseException | None) -> None:
            self.pending -= 1
            if error is None:
                self.ledger.delete(msg_id, lambda _error: None)
                self.log.event("pool", "queued here at start: handed to the pool", msg_id)
            else:
                self.ledger.schedule.add(msg_id, msg)
                self.log.event("err", f"pool: not handed to the pool ({error}); runs here",
                               msg_id)
        return then
