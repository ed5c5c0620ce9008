"""``GET /metrics`` (Prometheus, through prometheus-client) and ``GET /q/<q>/stats.json``.

Each scrape asks every queue's daemon for its ``stats`` (O(1) there, but
for the oldest queued message's age: O(que)) and renders them with a
collector of its own; nothing is kept in the web process.  The totals are
the daemon's, which keeps them across restarts (``rqsys.observe.statsfile``), so a
counter does not go backwards when a daemon or the web restarts, but for
the event loop's seconds, which count since the daemon started.  The
login counts (``rqsys.web.backoff``) are the web process's own, since it
started.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import falcon
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from rqsys.errors import Unavailable
from rqsys.store import ADMIN_STATES, STATES, room
from rqsys.timers.history import skip_counts
from rqsys.web.backoff import REASONS, SCOPES, Gate
from rqsys.web.context import Resource, Web
from rqsys.web.pools import PoolsCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ENDED = ("done", "err", "relayed")


class Metrics(Resource):
    """``/metrics``: every queue's numbers in Prometheus' text format, and
    the logins' (``logins``: the basic-auth middleware's gate) when given."""

    every_queue = True  # a user of some queues does not see them (rqsys.web.access)

    def __init__(self, web: Web, logins: Gate | None = None) -> None:
        super().__init__(web)
        self.logins = logins

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(QueuesCollector(self.web))
        registry.register(PoolsCollector(self.web))  # nothing without pool queues
        registry.register(TimersCollector(self.web))
        registry.register(StateFsCollector(self.web))
        if self.logins is not None:
            registry.register(LoginsCollector(self.logins))
        resp.content_type = CONTENT_TYPE
        resp.data = generate_latest(registry)


class QueueStatsJSON(Resource):
    """``/q/<q>/stats.json``: the queue daemon's ``stats`` answer."""

    def on_get(self, req: falcon.Request, resp: falcon.Response, name: str) -> None:
        self.web.existing(name)
        got = dict(self.web.call(name, "stats"))
        got.pop("ok", None)
        resp.media = got


class QueuesCollector:
    """A prometheus-client collector over the queue daemons' ``stats`` answers."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def collect(self) -> Iterator[Metric]:
        answers = {name: self._ask(name) for name in self.web.layout.queue_names()}
        up = GaugeMetricFamily("rqsys_queue_up", "1 when the queue daemon answered",
                               labels=["queue"])
        for name, got in answers.items():
            up.add_metric([name], 1.0 if got else 0.0)
        yield up
        reached = {name: got for name, got in answers.items() if got}
        yield from _now(reached)
        yield from _totals(reached)
        yield from _histograms(reached)
        yield from _health(reached)

    def _ask(self, name: str) -> dict[str, Any] | None:
        try:
            return self.web.call(name, "stats")
        except Unavailable:
            return None


class TimersCollector:
    """The timers' own counts, read from their records (rqsys.timers.history):
    the slots a timer with ``"overlap": "skip"`` skipped, kept across restarts."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def collect(self) -> Iterator[Metric]:
        skipped = CounterMetricFamily("rqsys_timer_slots_skipped",
                                      "slots a timer with overlap skip made no message for "
                                      "(its last message had not ended)",
                                      labels=["queue", "timer"])
        for timer, queue, count in skip_counts(self.web.layout.root):
            skipped.add_metric([queue, timer], count)
        yield skipped


class StateFsCollector:
    """The state file system's room, read at the scrape (``rqsys.store.room``):
    full is what the queue daemons go by (creates refused, starts held)."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def collect(self) -> Iterator[Metric]:
        try:
            now = room.read(str(self.web.layout.root))
        except OSError:
            return
        for name, value, what in (
                ("free_bytes", now.free_bytes, "bytes free to rqsys on the state file system"),
                ("size_bytes", now.total_bytes, "the state file system's size in bytes"),
                ("free_inodes", now.free_inodes, "inodes free on the state file system"),
                ("inodes", now.total_inodes, "the state file system's inodes (0: not counted)"),
                ("full", int(now.full), f"1 when fewer than {room.FLOOR_INODES} inodes or "
                 f"{room.size_text(room.FLOOR_BYTES)} are free: new messages are refused")):
            yield GaugeMetricFamily(f"rqsys_state_fs_{name}", what, value=value)


class LoginsCollector:
    """Failed logins and the backoff's refusals, counted by the web process
    (by reason and scope only: never by user or address)."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def collect(self) -> Iterator[Metric]:
        with self.gate.lock:
            counts = {what: dict(getattr(self.gate.counts, what))
                      for what in ("failures", "refused", "backoffs")}
        for what, label, names, text in LOGINS:
            family = CounterMetricFamily(f"rqsys_http_login_{what}", text, labels=[label])
            for name in names:
                family.add_metric([name], counts[what][name])
            yield family


LOGINS = [("failures", "reason", REASONS, "failed HTTP basic-auth logins: wrong password, "
           "no such user, undecodable credentials"),
          ("refused", "scope", SCOPES, "logins answered 429 without a check, by the backoff "
           "that applied: address, user at address, user"),
          ("backoffs", "scope", SCOPES, "failures that started or lengthened a backoff")]


def _now(answers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    depth = GaugeMetricFamily("rqsys_queue_messages", "messages in each state",
                              labels=["queue", "state"])
    flight = GaugeMetricFamily("rqsys_queue_in_flight", "scripts running now",
                               labels=["queue"])
    workers = GaugeMetricFamily("rqsys_queue_workers", "num_workers", labels=["queue"])
    admin = GaugeMetricFamily("rqsys_queue_admin_state", "1 for the admin state it is in",
                              labels=["queue", "admin_state"])
    oldest = GaugeMetricFamily("rqsys_queue_oldest_queued_age_seconds",
                               "age of the oldest queued message (0 when none)",
                               labels=["queue"])
    for name, got in answers.items():
        for state in STATES:
            depth.add_metric([name, state], got["counts"].get(state, 0))
        flight.add_metric([name], got["counts"].get("run", 0))
        workers.add_metric([name], got["num_workers"])
        for state in ADMIN_STATES:
            admin.add_metric([name, state], 1.0 if got["admin"] == state else 0.0)
        oldest.add_metric([name], got["oldest_queued_s"] or 0.0)
    yield from (depth, flight, workers, admin, oldest)


def _totals(answers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    created = CounterMetricFamily("rqsys_messages_created", "messages created",
                                  labels=["queue"])
    ended = CounterMetricFamily("rqsys_messages_ended", "messages ended, by state",
                                labels=["queue", "state"])
    resent = CounterMetricFamily("rqsys_messages_resent", "runs that ended in a resend",
                                 labels=["queue"])
    retried = CounterMetricFamily("rqsys_messages_retried", "failed runs retried "
                                  "automatically (the queue's retry)", labels=["queue"])
    for name, got in answers.items():
        created.add_metric([name], got["totals"]["created"])
        for state in ENDED:
            ended.add_metric([name, state], got["totals"][state])
        resent.add_metric([name], got["totals"]["resend"])
        retried.add_metric([name], got["totals"].get("retry", 0))
    yield from (created, ended, resent, retried)


def _histograms(answers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    for what, doc in (("wait", "seconds from created (or due) to the first start"),
                      ("run", "seconds each run took")):
        family = HistogramMetricFamily(f"rqsys_message_{what}_seconds", doc,
                                       labels=["queue"])
        for name, got in answers.items():
            family.add_metric([name], _buckets(got["bounds"], got["hist"][what]),
                              sum_value=got["sums"][what])
        yield family


def _buckets(bounds: list[float], counts: list[int]) -> list[tuple[str, float]]:
    """The daemon's per-bucket counts as Prometheus' cumulative ``le`` buckets."""
    out, seen = [], 0
    for bound, count in zip([*bounds, math.inf], counts, strict=True):
        seen += count
        out.append(("+Inf" if bound == math.inf else repr(bound), float(seen)))
    return out


def _health(answers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    starts = CounterMetricFamily("rqsys_queue_daemon_starts",
                                 "queue daemon starts (restarts are this minus one)",
                                 labels=["queue"])
    uptime = GaugeMetricFamily("rqsys_queue_daemon_uptime_seconds",
                               "seconds since the daemon started", labels=["queue"])
    fsync = GaugeMetricFamily("rqsys_queue_fsync_seconds",
                              "how long the last stats snapshot's write and fsyncs took",
                              labels=["queue"])
    for name, got in answers.items():
        starts.add_metric([name], got["starts"])
        uptime.add_metric([name], got["uptime_s"])
        if got.get("fsync_s") is not None:
            fsync.add_metric([name], got["fsync_s"])
    yield from (starts, uptime, fsync, *_loop(answers), *_copies(answers))


LOOP = {"idle_s": ("rqsys_queue_loop_idle_seconds",
                   "seconds the daemon's event loop waited for events, since it started"),
        "spawn_s": ("rqsys_queue_loop_spawn_seconds",
                    "seconds the event loop was blocked starting scripts (until each exec)"),
        "cpu_s": ("rqsys_queue_loop_cpu_seconds",
                  "CPU seconds of the event loop's thread, since the daemon started")}


def _loop(answers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    """The loop's time (``rqsys.daemon.loopclock``): counters since the
    daemon started, so a restart resets them, as process_cpu_seconds_total."""
    for key, (metric, text) in LOOP.items():
        family = CounterMetricFamily(metric, text, labels=["queue"])
        for name, got in answers.items():
            if key in got.get("loop", {}):  # an older daemon has none
                family.add_metric([name], got["loop"][key])
        yield family


def _copies(answers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    """The daemon's copies of its store (``rqsys.daemon.copyhealth``): their
    failed writes since the daemon started, and whether the index is behind."""
    failed = CounterMetricFamily("rqsys_queue_copy_write_failures",
                                 "writes to a copy of the store that failed since the daemon"
                                 " started (timelines: lines; index: batches)",
                                 labels=["queue", "copy"])
    behind = GaugeMetricFamily("rqsys_queue_search_index_behind",
                               "1 while the search index misses events (searches are partial)",
                               labels=["queue"])
    for name, got in answers.items():
        for copy in ("timelines", "index"):
            if copy in got:  # an older daemon has none
                failed.add_metric([name, copy], got[copy]["failed"])
        if "index" in got:
            behind.add_metric([name], int(got["index"]["behind"]))
    yield from (failed, behind)
