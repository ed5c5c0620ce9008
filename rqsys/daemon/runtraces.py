"""The spans of a queue's runs: begun at a start, ended with the run (``rqsys.observe.tracing``).

With tracing off (``ctx.tracing`` None) each call returns at once: a run
pays one attribute test.
"""

from __future__ import annotations

from typing import Any

from rqsys.daemon.context import QueueContext
from rqsys.observe.tracing import ENV, FIELD
from rqsys.run.verdict import Outcome, Worker


class RunTraces:
    """The open span of each running message."""

    def __init__(self, ctx: QueueContext) -> None:
        self.ctx = ctx
        self.spans: dict[str, Any] = {}
        self.parents: dict[str, str] = {}  # msg id -> its run's traceparent

    def started(self, msg_id: str, msg: dict[str, Any], run: dict[str, str]) -> None:
        """A run begins: its span, and its script's ``TRACEPARENT`` in ``run``."""
        if self.ctx.tracing is None:
            return
        self.spans[msg_id], run[ENV] = self.ctx.tracing.run(msg_id, msg)
        self.parents[msg_id] = run[ENV]

    def carried(self, msg_id: str) -> dict[str, str]:
        """What a copy the run makes (a dup) carries to be in its trace: its
        ``traceparent``, the run's span ({} untraced)."""
        parent = self.parents.get(msg_id)
        return {FIELD: parent} if parent else {}

    def ended(self, msg_id: str, outcome: Outcome, worker: Worker | None) -> None:
        """The run is over (or never began: ``worker`` None)."""
        span = self.spans.pop(msg_id, None)
        self.parents.pop(msg_id, None)
        if span is None:
            return
        self.ctx.tracing.ran(span, outcome, worker)
