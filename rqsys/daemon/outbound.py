"""Everything that talks to another queue daemon: a script's dup to another
queue, and queueing a post_run_webhook call.  Never on the loop.

Each call runs on the background lane of the daemon it calls
(``rqsys.background.peer_lane``), so a peer that hangs holds up only the
calls to itself, never the loop, the hashing of attachments or the calls to
other peers; its answer comes back to the loop as a callback.  A call gives
up after its timeout (``rqsys.tunables``): a dup is then answered ``fail`` on the
script's fd 4, a webhook is logged as not queued.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rqsys import tunables
from rqsys.background import Background, peer_lane
from rqsys.daemon.context import QueueContext
from rqsys.errors import RQError
from rqsys.observe.events import EventLog
from rqsys.run.verdict import Outcome
from rqsys.special import WEBHOOK_QUEUE, webhook_message
from rqsys.store import QueueStore
from rqsys.wire.client import QueueClient

Then = Callable[[Any, BaseException | None], None]


class Outbound:
    """Calls to other queue daemons, off the loop."""

    def __init__(self, ctx: QueueContext, store: QueueStore, background: Background,
                 log: EventLog) -> None:
        self.ctx, self.store, self.background, self.log = ctx, store, background, log
        self.dup_timeout = tunables.seconds_from_env(tunables.DUP_TIMEOUT_ENV,
                                                     tunables.DUP_TIMEOUT)
        self.webhook_timeout = tunables.seconds_from_env(tunables.WEBHOOK_TIMEOUT_ENV,
                                                         tunables.WEBHOOK_TIMEOUT)

    def dup(self, target: str, msg: dict[str, Any], files: list[Path], then: Then) -> None:
        """Create ``msg`` in queue ``target`` with ``files`` attached (sent as
        open files: the far end hard-links them); ``then(url, error)`` on the loop."""
        fds = _open_all(files)  # now, while they are where the loop knows them to be
        specs = [{"name": p.name, "md5": self.store.attachment_md5(p)} for p in files]

        def work() -> str:
            try:
                with QueueClient(self.ctx.layout, target, timeout=self.dup_timeout) as client:
                    reply = client.call("create", fds=fds, msg=msg, attachments=specs,
                                        refuse_paused=True, by=f"dup {msg['orig_msg_id']}")
            finally:
                for fd in fds:
                    os.close(fd)
            return str(reply["url"])

        self.background.submit(work, then, peer_lane(target))

    def webhook(self, msg_id: str, msg: dict[str, Any], outcome: Outcome) -> None:
        """Queue the post_run_webhook call; a missing webhook queue is only logged."""
        if self.ctx.name == WEBHOOK_QUEUE:
            self.log.warn("post_run_webhook ignored on the webhook queue itself", msg_id)
            return
        note = webhook_message(self.ctx.url(msg_id), outcome.state, outcome.text, msg)

        def work() -> None:
            with QueueClient(self.ctx.layout, WEBHOOK_QUEUE,
                             timeout=self.webhook_timeout) as client:
                client.call("create", msg=note, by=f"webhook {self.ctx.url(msg_id)}")

        def then(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                self.log.event("err", f"webhook not queued: {self.describe(error)}", msg_id)

        self.background.submit(work, then, peer_lane(WEBHOOK_QUEUE))

    def describe(self, error: BaseException) -> str:
        """What went wrong in a call, for a log line or a script's ``fail``;
        anything but an RQError or a failing socket is a bug, logged here
        with its traceback."""
        if isinstance(error, RQError | OSError):
            return str(error)
        trace = "".join(traceback.format_exception(error))
        self.log.event("err", f"internal error in a call to another queue: {error!r}\n{trace}")
        return f"internal error: {type(error).__name__}"


def _open_all(files: list[Path]) -> list[int]:
    fds: list[int] = []
    try:
        for path in files:
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds
