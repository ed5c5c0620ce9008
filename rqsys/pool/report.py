"""``rq pools``: each pool queue of this host, with its pool's figures (no NATS here:
the queue daemons answer)."""

from __future__ import annotations

import argparse
from typing import Any

from rqsys import config
from rqsys.errors import RQError
from rqsys.store import Layout
from rqsys.wire.client import QueueClient


def pool_queues(layout: Layout) -> list[tuple[str, str]]:
    """(queue, pool) of every queue of this host that names a pool."""
    found = []
    for name in layout.queue_names():
        try:
            pool = config.load_queue_config(layout, name).get("pool")
        except RQError:
            continue  # a queue with a broken config is not a pool queue's business
        if pool:
            found.append((name, str(pool["name"])))
    return found


def line(queue: str, pool: str, got: dict[str, Any] | RQError) -> str:
    if isinstance(got, RQError):
        return f"{pool} (queue {queue}): unavailable: {got}"
    return (f"{pool} (queue {queue}, host {got['host_number']} {got['host']}): "
            f"depth {got['depth']}, not yet delivered {got['pending']}, "
            f"in flight {got['in_flight']} (here {got['in_flight_here']}), "
            f"redelivered {got['redelivered']}, waiting pulls {got['waiting_pulls']}"
            f"{per_host(got.get('hosts') or {})}")


def per_host(hosts: dict[str, dict[str, Any]]) -> str:
    """``; in flight per host: a 2, b 0 (silent)`` (silent: nothing heard within
    ack_wait; stopped: its daemon said so as it stopped)."""
    if not hosts:
        return ""
    shown = [f"{name} {h['in_flight']}" + ("" if h["alive"] else
                                            " (stopped)" if h.get("stopped") else " (silent)")
             for name, h in hosts.items()]
    return "; in flight per host: " + ", ".join(shown)


def cmd_pools(layout: Layout, _args: argparse.Namespace) -> str:
    """``ok N pool queue(s)`` then one line per pool queue."""
    lines = []
    for queue, pool in pool_queues(layout):
        try:
            with QueueClient(layout, queue, timeout=10) as client:
                got: dict[str, Any] | RQError = client.call("pool")
        except RQError as exc:
            got = exc
        lines.append(line(queue, pool, got))
    return "\n".join([f"{len(lines)} pool queue(s)", *lines])
