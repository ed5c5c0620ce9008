"""Bulk enqueue: 10,000 messages in one ``create_many`` request vs one client
sending ``create`` one message at a time (what ``rq sendmesg`` does, without
the process start), same daemon, same run, alternating rounds.

Both are durable before their answer (one group commit per request); the
queue is paused so no script runs meanwhile.  Target: bulk >= 5x the
per-message rate.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time

from bench_queue import Daemon, judge, make_queue, report
from scratch import scratch_layout

from rqsys.store import Layout
from rqsys.wire.client import QueueClient

BULK_N = 10_000
SINGLE_N = 2_000
ROUNDS = 3
TARGET = 5.0
CALL_TIMEOUT = 300.0  # one request of 10,000 takes seconds on a slow disk


def single_rate(layout: Layout, count: int) -> float:
    with QueueClient(layout, "bulk") as client:
        start = time.perf_counter()
        for n in range(count):
            client.call("create", msg={"param1": str(n)})
        return count / (time.perf_counter() - start)


def bulk_rate(layout: Layout, count: int) -> float:
    msgs = [{"param1": str(n)} for n in range(count)]
    with QueueClient(layout, "bulk", timeout=CALL_TIMEOUT) as client:
        start = time.perf_counter()
        results = client.call("create_many", msgs=msgs)["results"]
        elapsed = time.perf_counter() - start
    assert len(results) == count and all("url" in r for r in results)
    return count / elapsed


def main() -> int:
    """``bench_bulk.py [BULK_N SINGLE_N ROUNDS]`` (smaller counts for a quick look)."""
    bulk_n, single_n, rounds = (int(a) for a in sys.argv[1:4]) if len(sys.argv) > 3 else (
        BULK_N, SINGLE_N, ROUNDS)
    scratch, layout = scratch_layout("bulk-")
    make_queue(layout, "bulk", "echo done >&3")
    daemon = Daemon(layout, "bulk")
    try:
        daemon.call("adminoper", oper="pause")
        singles, bulks = [], []
        for _ in range(rounds):
            singles.append(single_rate(layout, single_n))
            bulks.append(bulk_rate(layout, bulk_n))
    finally:
        daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    single, bulk = statistics.median(singles), statistics.median(bulks)
    report(f"enqueue, 1 client, create one at a time ({single_n:,})", f"{single:,.0f} msg/s")
    report(f"enqueue, one create_many of {bulk_n:,}", f"{bulk:,.0f} msg/s")
    ratio = bulk / single
    report("bulk vs one at a time", f"{ratio:.1f}x (target >= {TARGET:g}x)",
           judge(ratio, TARGET))
    return 0


if __name__ == "__main__":
    sys.exit(main())
