"""The tracing feature: a message's spans, begun and ended at the moments of its life.

Registered only when traces are on (``rqsys.observe.tracing.start`` gave a
``Tracing``): an untraced queue has none of these hooks on its path.  The
moments are ``rqsys.life.moments``'.
"""

from __future__ import annotations

from typing import Any

from rqsys.observe.tracing import ENV, FIELD, Tracing


class Traces:
    """The open spans of one queue daemon: each new message's ``create`` span
    until it has an id, each running message's ``run`` span."""

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self.creating: dict[str, Any] = {}  # its traceparent -> a new message's span
        self.spans: dict[str, Any] = {}  # msg id -> its run's span
        self.parents: dict[str, str] = {}  # msg id -> its run's traceparent

    def on_creating(self, msg: dict[str, Any]) -> None:
        """A client's new message: its ``create`` span begins, named in its ``traceparent``."""
        span = self.tracing.create(msg)
        self.creating[msg[FIELD]] = span

    def on_staged(self, msg_id: str, msg: dict[str, Any], origin: str) -> None:
        span = self.creating.pop(msg.get(FIELD) or "", None)
        if span is not None:
            self.tracing.created(span, msg_id, origin)

    def on_starting(self, msg_id: str, msg: dict[str, Any], run: dict[str, str]) -> None:
        """A run begins: its span, and its script's ``TRACEPARENT`` in ``run``."""
        self.spans[msg_id], run[ENV] = self.tracing.run(msg_id, msg)
        self.parents[msg_id] = run[ENV]

    def on_duplicating(self, src_id: str, copy: dict[str, Any]) -> None:
        """A run's dup is in the run's trace: its ``traceparent`` is the run's span."""
        parent = self.parents.get(src_id)
        if parent:
            copy[FIELD] = parent

    def on_run_over(self, msg_id: str, outcome: Any, worker: Any) -> None:
        """The run is over (or never began: ``worker`` None)."""
        span = self.spans.pop(msg_id, None)
        self.parents.pop(msg_id, None)
        if span is not None:
            self.tracing.ran(span, outcome, worker)

    def on_closing(self) -> None:
        """The daemon stops: the spans not sent yet are sent."""
        self.tracing.shutdown()
