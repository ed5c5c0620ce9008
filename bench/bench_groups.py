"""The first failure-group listing of a queue with many err messages, and the
queue meanwhile.

What it builds, in its own scratch directory (removed at the end): a paused
queue ``s`` with ``N`` (default 100,000) real err messages in 10 reasons
(directories with msg, status and count, written before the daemon starts),
its daemon, and its search index reconciled (waited for: its thread reads
every message once at start, which is not what is measured).  Then one
client asks ``groups`` (the first since the start: the daemon walks err/)
while another sends ``ping`` every 10 ms until that answer has come.

Printed: how long the listing took, and the pings' latency meanwhile (p50,
p99, max).  The listing's walk runs off the loop (``rqsys.observe.failures``), so a
ping waits for a loop turn, not for the walk; a walk on the loop would hold
every ping for the whole listing.  Checked: the groups count every message.

    BENCH_DIR=/mnt/abj python bench/bench_groups.py [N]
    python bench/ab.py --bench bench_groups.py BEFORE_DIR AFTER_DIR 20000
"""

from __future__ import annotations

import shutil
import statistics
import sys
import threading
import time

from bench_queue import Daemon, make_queue, report
from bench_search import wait_indexed, write_errs
from scratch import scratch_layout

from rqsys.store import IdMaker, Layout
from rqsys.wire.client import QueueClient

N = 100_000
REASONS = ("database", "disk", "network", "parser", "upload", "mailer", "cache", "auth",
           "render", "export")  # words: numbers are masked out of a reason
LISTING_TIMEOUT = 600.0
PACE = 0.01  # seconds between two pings


def build(layout: Layout, n: int) -> None:
    """``n`` err messages of queue ``s`` on disk, in ``REASONS``."""
    ids = IdMaker()
    for i, word in enumerate(REASONS):
        count = n // len(REASONS) + (1 if i < n % len(REASONS) else 0)
        write_errs(layout, count, f"{word} failed on host{{n}} after 3 s", ids)


def first_listing(layout: Layout, daemon: Daemon) -> tuple[float, list[float], list]:
    """(seconds the first ``groups`` took, ping latencies in ms meanwhile, the groups)."""
    got: list = []

    def ask() -> None:
        with QueueClient(layout, "s", timeout=LISTING_TIMEOUT) as client:
            got.append(client.call("groups")["groups"])
    asking = threading.Thread(target=ask)
    start = time.perf_counter()
    asking.start()
    pings = []
    with QueueClient(layout, "s") as client:
        while asking.is_alive():
            sent = time.perf_counter()
            client.call("ping")
            pings.append((time.perf_counter() - sent) * 1000)
            time.sleep(PACE)  # a client's pace: a flood would measure the GIL, not the loop
    took = time.perf_counter() - start
    asking.join()
    return took, pings, got[0] if got else []


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else N
    scratch, layout = scratch_layout("groups-")
    try:
        make_queue(layout, "s", "echo done >&3")
        started = time.perf_counter()
        build(layout, n)
        report(f"build: {n:,} err messages", f"{time.perf_counter() - started:8.1f} s")
        daemon = Daemon(layout, "s")
        try:
            report("search index reconciled after", f"{wait_indexed(daemon):8.1f} s")
            took, pings, groups = first_listing(layout, daemon)
        finally:
            daemon.stop()
        pings.sort()
        report(f"first groups listing, {n:,} err", f"{took:8.2f} s")
        report(f"ping meanwhile ({len(pings)})", f"p50 {statistics.median(pings):.2f} ms, "
               f"p99 {pings[int(len(pings) * 0.99)]:.2f} ms")
        report("ping meanwhile, max", f"{pings[-1]:8.1f} ms")
        counted = sum(g["count"] for g in groups)
        report("groups / messages counted", f"{len(groups)} / {counted:,}",
               "PASS" if counted == n and len(groups) == len(REASONS) else "WRONG")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
