"""Pool queues in the web: their figures in ``/metrics`` and the dashboard's pool section.

Each pool queue's daemon answers ``pool`` with JetStream's figures of its
pool (depth, not yet delivered, in flight, redelivered, waiting pulls) and
each host's messages in flight, as ``rq pools`` prints them.  Nothing here
imports NATS; a host without pool queues gets no pool metrics and no section.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from rqsys.errors import RQError
from rqsys.pool.report import pool_queues
from rqsys.web.context import Web

FIGURES = (  # the pool answer's field, metric name, help, table heading
    ("depth", "rqsys_pool_messages", "messages in the pool's stream", "Depth"),
    ("pending", "rqsys_pool_consumer_lag", "messages not yet delivered to any host "
     "(the shared consumer's lag)", "Not yet delivered"),
    ("in_flight", "rqsys_pool_in_flight", "messages delivered to a host and not yet acked",
     "In flight"),
    ("redelivered", "rqsys_pool_redelivered", "messages in flight delivered more than once",
     "Redelivered"),
    ("waiting_pulls", "rqsys_pool_waiting_pulls", "pulls waiting for messages (idle hosts)",
     "Waiting pulls"),
)


def ask(web: Web) -> list[tuple[str, str, dict[str, Any] | RQError]]:
    """(queue, pool, the daemon's ``pool`` answer or why not) of each pool queue."""
    found: list[tuple[str, str, dict[str, Any] | RQError]] = []
    for queue, pool in pool_queues(web.layout):
        try:
            found.append((queue, pool, web.call(queue, "pool")))
        except RQError as exc:
            found.append((queue, pool, exc))
    return found


class PoolsCollector:
    """A prometheus-client collector over the pool queues' ``pool`` answers."""

    def __init__(self, web: Web) -> None:
        self.web = web

    def collect(self) -> Iterator[Metric]:
        answers = ask(self.web)
        if not answers:
            return
        up = GaugeMetricFamily("rqsys_pool_up", "1 when the pool queue's daemon had the "
                               "pool's figures from JetStream", labels=["pool", "queue"])
        families = [GaugeMetricFamily(name, doc, labels=["pool"])
                    for _f, name, doc, _h in FIGURES]
        per_host = GaugeMetricFamily("rqsys_pool_host_in_flight", "messages in flight on "
                                     "each host of the pool", labels=["pool", "host"])
        alive = GaugeMetricFamily("rqsys_pool_host_alive", "1 when the host told the pool "
                                  "within ack_wait that it is working", labels=["pool", "host"])
        seen: set[str] = set()
        for queue, pool, got in answers:
            up.add_metric([pool, queue], 0.0 if isinstance(got, RQError) else 1.0)
            if isinstance(got, RQError) or pool in seen:
                continue
            seen.add(pool)
            for (field, *_rest), family in zip(FIGURES, families, strict=True):
                family.add_metric([pool], float(got[field]))
            for host, load in (got.get("hosts") or {}).items():
                per_host.add_metric([pool, host], float(load["in_flight"]))
                alive.add_metric([pool, host], 1.0 if load["alive"] else 0.0)
        yield from (up, *families, per_host, alive)


def section(web: Web) -> dict[str, Any] | None:
    """The dashboard's pool section (``pools.html``; None without pool queues)."""
    answers = ask(web)
    if not answers:
        return None
    return {"heads": [h for *_x, h in FIGURES], "metrics": web.path("metrics"),
            "rows": [_row(queue, pool, got) for queue, pool, got in answers]}


def _row(queue: str, pool: str, got: dict[str, Any] | RQError) -> dict[str, Any]:
    if isinstance(got, RQError):
        return {"pool": pool, "queue": queue, "error": str(got)}
    hosts = ", ".join(f"{h} {load['in_flight']}" + _quiet(load)
                      for h, load in (got.get("hosts") or {}).items())
    return {"pool": pool, "queue": queue, "error": "", "hosts": hosts,
            "figures": [got[field] for field, *_r in FIGURES]}


def _quiet(load: dict[str, Any]) -> str:
    """Why a host counts for nothing: stopped cleanly, or silent (not heard from)."""
    return "" if load["alive"] else " (stopped)" if load.get("stopped") else " (silent)"
