"""A batch of 100,000 messages (issue 34): made, drained, called back.

Beside it, in the same run and on the same queue and script (``echo done
>&3``), the same 100,000 messages sent as plain ``create_many`` requests of
10,000 (what ``rq sendmesg --bulk`` does) and drained.  Both are made while
the queue is paused (the making alone is timed), then the queue is resumed
and timed until the last message has ended — for the batch, until its
callback is made.  ``bench_batch.py N`` for a quicker look.
"""

from __future__ import annotations

import shutil
import sys
import time

from bench_queue import Daemon, make_queue, report
from scratch import scratch_layout

from rqsys.batches import record
from rqsys.batches.create import create
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

N = 100_000
CHUNK = 10_000
TIMEOUT = 300.0


def call(layout: Layout):
    def calling(queue: str, op: str, **args):
        with QueueClient(layout, queue, timeout=TIMEOUT) as client:
            return client.call(op, **args)
    return calling


def plain(layout: Layout, daemon: Daemon, n: int) -> tuple[float, float]:
    """Seconds to make n plain messages, then to drain them."""
    daemon.call("adminoper", oper="pause")
    start = time.perf_counter()
    for at in range(0, n, CHUNK):
        msgs = [{"param1": str(i)} for i in range(at, min(at + CHUNK, n))]
        call(layout)("q", "create_many", msgs=msgs)
    made = time.perf_counter() - start
    done_before = daemon.call("counts")["counts"]["done"]
    daemon.call("adminoper", oper="up")
    start = time.perf_counter()
    while daemon.call("counts")["counts"]["done"] - done_before < n:
        time.sleep(0.05)
    return made, time.perf_counter() - start


def batched(layout: Layout, daemon: Daemon, n: int) -> tuple[float, float]:
    """Seconds to make a batch of n, then until its callback is made."""
    daemon.call("adminoper", oper="pause")
    body = {"messages": [{"dest": "q", "param1": str(i)} for i in range(n)],
            "on_done": {"dest": "cb"}}
    start = time.perf_counter()
    got = create(layout, body, call(layout), "bench")
    made = time.perf_counter() - start
    daemon.call("adminoper", oper="up")
    start = time.perf_counter()
    path = layout.batches / got["id"]
    while record.read_mark(path, "callback") is None:
        time.sleep(0.05)
    drained = time.perf_counter() - start
    assert record.progress(path).counts["done"] == n
    return made, drained


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else N
    scratch, layout = scratch_layout("batch-")
    make_queue(layout, "q", "echo done >&3", num_workers=8)
    make_queue(layout, "cb", "echo done >&3")
    daemons = [Daemon(layout, "q"), Daemon(layout, "cb")]
    try:
        base_made, base_drain = plain(layout, daemons[0], n)
        made, drain = batched(layout, daemons[0], n)
    finally:
        for daemon in daemons:
            daemon.proc.terminate()
            daemon.proc.wait(30)
        shutil.rmtree(scratch, ignore_errors=True)
    report(f"make {n:,} plain (create_many of {CHUNK:,})", f"{base_made:.1f} s, "
           f"{n / base_made:,.0f}/s")
    report(f"make a batch of {n:,}", f"{made:.1f} s, {n / made:,.0f}/s "
           f"({made / base_made:.2f}x the plain time)")
    report(f"drain {n:,} plain (8 workers)", f"{base_drain:.1f} s, {n / base_drain:,.0f}/s")
    report("drain the batch, until its callback", f"{drain:.1f} s, {n / drain:,.0f}/s "
           f"({drain / base_drain:.2f}x the plain time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
