"""The optional features a queue's config asks for, built before their users and on their moments.

A feature the config does not ask for is neither built nor registered: its
hooks are not on the queue's path (``rqsys.life.moments``).

* tracing (``tracing.endpoint`` or ``OTEL_EXPORTER_OTLP_*``): each message's
  spans (``rqsys.observe.traces``), its scripts' ``TRACEPARENT``;
* a pool (``pool``): ids that name their host, made before the store that
  makes them, and the member that joins the pool once the daemon is built
  (``rqsys.pool``).

The features every queue has (its dependencies, its unique keys) register in
``rqsys.daemon.loop``, where they are built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rqsys.daemon.context import QueueContext
from rqsys.life.moments import Moments
from rqsys.observe import tracing
from rqsys.observe.events import EventLog
from rqsys.observe.traces import Traces
from rqsys.pool import member_for
from rqsys.store.layout import IdMaker

if TYPE_CHECKING:
    from rqsys.batches.ends import BatchEnds
    from rqsys.daemon.intake import Intake
    from rqsys.daemon.transitions import Transitions
    from rqsys.pool.ids import PoolIds
    from rqsys.run.runner import Runner
    from rqsys.store import QueueStore


class Features:
    """The moments of one queue daemon, and the optional features on them."""

    def __init__(self, ctx: QueueContext, log: EventLog) -> None:
        self.ctx, self.log = ctx, log
        self.moments = Moments()
        self.tracing = tracing.start(ctx.sysconfig, log, ctx.name)  # None: traces are off
        self.pool_ids: PoolIds | None = None
        if ctx.config.get("pool"):  # a plain queue imports nothing of the pool's but this
            from rqsys.pool.ids import PoolIds

            self.pool_ids = PoolIds()
        self.ids: IdMaker = self.pool_ids or IdMaker()  # the queue store's
        if self.tracing is not None:
            self.moments.register(Traces(self.tracing), "tracing")

    @property
    def run_keys(self) -> frozenset[str]:
        """The environment variables the features give each run its own value of."""
        return frozenset({tracing.ENV}) if self.tracing is not None else frozenset()

    def register_late(self, store: QueueStore, transitions: Transitions, intake: Intake,
                  runner: Runner, batch_ends: BatchEnds) -> None:
        """The features built once the intake and the runner are: a pool
        queue's member (it pulls into the one and runs through the other)."""
        if self.pool_ids is None:
            return
        member = member_for(self.ctx, store, transitions, intake, runner, self.log,
                            batch_ends, self.pool_ids)
        self.moments.register(member, "pool")
