"""What the daemon tells about itself: the sinks of its events (timelines,
statistics) and the ``stats`` socket operation."""

from __future__ import annotations

import os
import time
from typing import Any

from rqsys.background import Background
from rqsys.daemon.context import QueueContext
from rqsys.daemon.schema import request
from rqsys.daemon.server import Handler, Reply, Request
from rqsys.daemon.transitions import Transitions
from rqsys.events import EventLog
from rqsys.stats import QueueStats, id_time
from rqsys.statsfile import StatsFile
from rqsys.store import QueueStore
from rqsys.timeline import Timeline

SCHEMAS: dict[str, dict[str, Any]] = {"stats": request()}


class Observer:
    """The daemon's timelines and statistics, fed by its EventLog."""

    def __init__(self, ctx: QueueContext, store: QueueStore, ledger: Transitions,
                 background: Background, log: EventLog) -> None:
        self.ctx, self.ledger = ctx, ledger
        self.stats = QueueStats()
        self.file = StatsFile(store.qdir, self.stats, background)
        self.started = time.time()
        log.sinks += [Timeline(store.msg_dir), self.file.sink]

    def ops(self) -> dict[str, Handler]:
        return {"stats": self.stats_op}

    def load(self) -> None:
        """At start, before any event: the numbers kept by the daemons before."""
        self.file.load()

    def stats_op(self, r: Request) -> Reply:
        """The queue's numbers: now (depths, in flight, admin, oldest queued),
        since ever (totals, histograms, starts) and lately (windows, days)."""
        return {"ok": True, "queue": self.ctx.name, "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 3),
                "counts": self.ledger.counts(), "admin": self.ctx.refresh_admin(),
                "num_workers": self.ctx.config["num_workers"],
                "oldest_queued_s": self._oldest_queued(),
                "fsync_s": self.file.fsync_s, **self.stats.report()}

    def _oldest_queued(self) -> float | None:
        """Age of the oldest queued message (ids are creation times): O(que)."""
        msgs = self.ledger.schedule.msgs
        if not msgs:
            return None
        return round(max(0.0, time.time() - id_time(min(msgs))), 3)
