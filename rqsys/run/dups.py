"""A running script's ``dup`` requests on fd 3: the message copied to a queue, answered on fd 4.

A copy to this queue is ``intake``'s, to another ``outbound``'s; both answer
later, and the answers are written on fd 4 in the order the script asked
(the runner's ``answer``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rqsys.daemon.context import QueueContext
from rqsys.daemon.intake import Intake, copy_fields
from rqsys.daemon.outbound import Outbound
from rqsys.errors import NotFound, RQError, Unavailable
from rqsys.life.moments import Moments
from rqsys.run.protocol import Command
from rqsys.run.verdict import Worker
from rqsys.store import QueueStore


class Dups:
    """Copies a running message where its script asks; the answer goes to fd 4."""

    def __init__(self, ctx: QueueContext, store: QueueStore, intake: Intake,
                 outbound: Outbound, moments: Moments,
                 answer: Callable[[Worker], None]) -> None:
        self.ctx, self.store, self.intake, self.outbound = ctx, store, intake, outbound
        self.moments, self._answer = moments, answer

    def request(self, worker: Worker, cmd: Command) -> None:
        """Copy the running message (attachments hard-linked) to ``cmd.dest``;
        the answer goes to fd 4 when it comes (``ok <url>`` or ``fail <why>``)."""
        slot = worker.expect_reply()
        target = ""

        def then(url: Any, error: BaseException | None) -> None:
            answer = f"ok {url}" if error is None else f"fail {self._failure(error, target)}"
            slot.append(answer + "\n")
            self._answer(worker)

        try:
            target = self.ctx.dup_target(cmd.dest)
            msg = copy_fields(worker.msg, cmd.dest, self.ctx.url(worker.msg_id),
                              due=time.time() + cmd.due if cmd.due else 0)
            for hook in self.moments.duplicating:  # tracing: the copy in the run's trace
                hook(worker.msg_id, msg)
            if target == self.ctx.name:
                self.intake.dup_here(msg, worker.msg_id, then)
            else:
                self.outbound.dup(target, msg, self.store.attachments("run", worker.msg_id),
                                  then)
        except (RQError, OSError) as exc:
            then(None, exc)

    def _failure(self, error: BaseException, target: str) -> str:
        """The text after ``fail`` on fd 4: RQ's ``couldn't connect to queue - X``
        when the target queue does not exist or does not run (not when it
        took too long to answer), else why."""
        not_running = isinstance(error, Unavailable) and isinstance(
            error.__cause__, FileNotFoundError | ConnectionRefusedError)
        if target and (isinstance(error, NotFound) or not_running):
            return f"couldn't connect to queue - {target}"
        why = self.outbound.describe(error)
        return why.splitlines()[0] if why else "error"
