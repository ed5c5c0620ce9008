"""What the daemon tells about itself: the sinks of its events (timelines,
statistics, watchers) and the ``stats`` and ``watch`` socket operations.

``watch`` answers at once with the message's state and status, then pushes
one line per event of the message on the same connection (``{"event":
"started", "state": "run", ...}``) until it is in done, err or relayed, or
gone (``"state": "gone"``); then the connection is the client's to close.
Output is not pushed: the client follows ``job/stdio.log`` with inotify.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from rqsys.background import Background
from rqsys.daemon.context import QueueContext
from rqsys.daemon.copyhealth import CopyHealth
from rqsys.daemon.loopclock import LoopClock
from rqsys.daemon.searchops import SCHEMAS as SEARCH_SCHEMAS
from rqsys.daemon.searchops import SearchOps
from rqsys.daemon.server import Handler, Reply, Request
from rqsys.daemon.transitions import Transitions
from rqsys.errors import NotFound
from rqsys.fdclose import FdBatch
from rqsys.observe.events import EventLog
from rqsys.observe.failures import FailureGroups
from rqsys.observe.stats import QueueStats, id_time
from rqsys.observe.statseries import SPANS, series
from rqsys.observe.statsfile import StatsFile
from rqsys.observe.timeline import Timeline
from rqsys.store import QueueStore
from rqsys.wire.schema import MSG_ID, request

GROUP = {"title": "failure group", "type": "string", "pattern": "^[0-9a-f]{12}$"}
SCHEMAS: dict[str, dict[str, Any]] = {
    "stats": request(span={"title": "span", "enum": list(SPANS)}),
    "groups": request(group=GROUP, offset={"title": "offset", "type": "integer", "minimum": 0},
                      limit={"title": "limit", "type": "integer", "minimum": 1,
                             "maximum": 1000}),
    "watch": request(("msg_id",), msg_id=MSG_ID),
    "retry": request(("msg_id",), msg_id=MSG_ID),
    "group": request(("group", "action"), group=GROUP,
                     action={"title": "group action", "enum": ["retry", "delete"]}),
    **SEARCH_SCHEMAS,
}
FINAL = ("done", "err", "relayed", "gone")
Push = Callable[[Reply], bool]


class Observer:
    """The daemon's timelines and statistics, fed by its EventLog."""

    def __init__(self, ctx: QueueContext, store: QueueStore, transitions: Transitions,
                 background: Background, log: EventLog, clock: LoopClock,
                 closing: FdBatch) -> None:
        self.ctx, self.store = ctx, store
        self.transitions, self.ledger = transitions, transitions.ledger
        self.clock = clock
        self.watchers: dict[str, list[Push]] = {}  # msg id -> its watch connections
        self.stats = QueueStats()
        self.file = StatsFile(store.qdir, self.stats, background, store.room,
                              lambda line: log.event("warning", line))
        self.started = time.time()
        self.failures = FailureGroups(store, background)
        self.search = SearchOps(ctx, store, transitions, background)
        self.timeline = Timeline(store.msg_path, closing=closing)
        self.log = log  # _tell_watchers is a sink only while someone watches
        log.sinks += [self.timeline, self.file.sink, self.failures, self.search.index]
        log.flushing += [self.timeline, self.file, self.search.index]  # once a loop turn
        self.copies = CopyHealth(self.timeline, self.search.index, log, store.room)

    def ops(self) -> dict[str, Handler]:
        return {"stats": self.stats_op, "watch": self.watch_op, "groups": self.groups_op,
                "retry": self.retry_op, "group": self.group_op, **self.search.ops()}

    def groups_op(self, r: Request) -> Reply | None:
        """The err messages by normalised reason (``rqsys.observe.failures``); the
        first asks for a walk of err/ off the loop, and is answered after it.
        With ``group``: that group alone, and a page of its messages' ids."""
        if not self.failures.ready():
            self._when_built(r, self.groups_op)
            return None
        listing = self.failures.listing()
        if "group" not in r.args:
            return {"ok": True, "groups": listing}
        group = next((g for g in listing if g["key"] == r.args["group"]), None)
        if group is None:
            raise NotFound(f"no failure group {r.args['group']} in queue {self.ctx.name}")
        offset, limit = r.args.get("offset", 0), r.args.get("limit", 50)
        ids = self.failures.members(group["key"])
        return {"ok": True, "groups": [group], "ids": ids[offset:offset + limit],
                "total": len(ids)}

    def retry_op(self, r: Request) -> None:
        """err → que for one message, answered once durable."""
        self.transitions.retries.retry([r.args["msg_id"]], _answer(r, {"ok": True}),
                                       by=r.actor())

    def group_op(self, r: Request) -> Reply | None:
        """Retry or delete every message of a failure group; answered with how
        many once all of it is durable (NotFound: no such group now)."""
        if not self.failures.ready():
            self._when_built(r, self.group_op)
            return None
        ids = self.failures.members(r.args["group"])
        if not ids:
            raise NotFound(f"no failure group {r.args['group']} in queue {self.ctx.name}")

        def finish(done: int, _passed: int, error: BaseException | None) -> None:
            r.fail(error) if error is not None else r.answer({"ok": True, "count": done})
        self.search.batches.run(ids, r.args["action"], finish, "err",  # in steps: others are served
                                r.actor())
        return None

    def _when_built(self, r: Request, op: Handler) -> None:
        """Run ``op`` again once the failure groups are built, answering ``r``
        with what it returns or raises."""
        def built(error: BaseException | None) -> None:
            try:
                if error is not None:
                    raise error
                reply = op(r)
            except Exception as exc:  # answered: a bug as the internal error it is
                r.fail(exc)
                return
            if reply is not None:
                r.answer(reply)
        self.failures.when_built(built)

    def watch_op(self, r: Request) -> Reply:
        """The message's state now; its events follow on this connection."""
        msg_id = r.args["msg_id"]
        state = "run" if msg_id in self.ledger.running else self.store.find(msg_id)
        if state not in FINAL and r.push is not None:
            if not self.watchers:
                self.log.sinks.append(self._tell_watchers)
            self.watchers.setdefault(msg_id, []).append(r.push)
        return {"ok": True, "msg_id": msg_id, "state": state, "url": self.ctx.url(msg_id),
                "status": self.store.read_status(state, msg_id)}

    def _tell_watchers(self, kind: str, text: str, msg_id: str,
                       fields: dict[str, Any]) -> None:
        pushes = self.watchers.get(msg_id)
        if not pushes:
            return
        state = "gone" if kind == "deleted" else fields.get("RQ_STATE", "")
        line = {"ok": True, "event": kind, "state": state, "status": text}
        alive = [push for push in pushes if push(line)]
        if state in FINAL or not alive:
            del self.watchers[msg_id]
            if not self.watchers:  # the event path calls it no more: one call an event
                self.log.sinks.remove(self._tell_watchers)
        else:
            self.watchers[msg_id] = alive

    def load(self) -> None:
        """At start, before any event: the numbers kept by the daemons before."""
        self.file.load()

    def index_after_ready(self) -> None:
        """After READY=1: the search index's thread.  Its first reconcile reads
        every message; beside que/'s load it took the GIL and the disk from it
        (100,000 queued: ready after 7 s instead of 2.6); events wait for it."""
        self.search.index.start()

    def close(self) -> None:
        """At stop: the timelines' last lines, the stats' snapshot, the search
        index's last batch (its thread waited for briefly)."""
        self.timeline.close()
        self.file.close()
        self.search.index.close()

    def stats_op(self, r: Request) -> Reply:
        """The queue's numbers: now (depths, in flight, admin, oldest queued),
        since ever (totals, histograms, starts) and lately (windows, days, and
        the series: the sparklines', or with ``span`` that one in full)."""
        return {"ok": True, "queue": self.ctx.name, "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started, 3),
                "counts": self.ledger.counts(), "admin": self.ctx.refresh_admin(),
                "num_workers": self.ctx.config["num_workers"],
                "room": self.ledger.schedule.room.usage(),
                "oldest_queued_s": self._oldest_queued(),
                "fsync_s": self.file.fsync_s, "loop": self.clock.report(),
                **self.copies.report(),
                **self.stats.report(),
                "series": series(self.stats, span=r.args.get("span"))}

    def _oldest_queued(self) -> float | None:
        """Age of the oldest queued message (ids are creation times): O(que)."""
        msgs = self.ledger.schedule.msgs
        if not msgs:
            return None
        return round(max(0.0, time.time() - id_time(min(msgs))), 3)


def _answer(r: Request, reply: Reply) -> Callable[[BaseException | None], None]:
    def done(error: BaseException | None) -> None:
        r.fail(error) if error is not None else r.answer(reply)
    return done
