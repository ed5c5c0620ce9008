"""Unique messages: what a ``unique_key`` costs at create, and what a duplicate costs.

One client on the socket of a paused queue (nothing runs), in alternating
rounds: creates without a key, creates each with a new key (the index is
one dict look-up and insert), and creates of a key already held (answered
at once with the holder's URL: no message written, no fsync).
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time

from bench_queue import Daemon, make_queue
from scratch import scratch_layout

from rqsys.store import Layout
from rqsys.wire.client import QueueClient

N = 500
ROUNDS = 3


def rate(layout: Layout, msgs: list[dict]) -> float:
    with QueueClient(layout, "u") as client:
        start = time.perf_counter()
        for msg in msgs:
            client.call("create", msg=msg)
        return len(msgs) / (time.perf_counter() - start)


def main() -> int:
    scratch, layout = scratch_layout("unique-")
    make_queue(layout, "u", 'echo "done" >&3')
    daemon = Daemon(layout, "u")
    try:
        daemon.call("adminoper", oper="pause")
        figures: dict[str, list[float]] = {"plain": [], "new key": [], "duplicate": []}
        rate(layout, [{"unique_key": "held"}])
        for r in range(ROUNDS):
            figures["plain"].append(rate(layout, [{"param1": str(i)} for i in range(N)]))
            figures["new key"].append(rate(layout, [{"unique_key": f"k{r}.{i}"}
                                                    for i in range(N)]))
            figures["duplicate"].append(rate(layout, [{"unique_key": "held"}] * N))
        for name, samples in figures.items():
            print(f"{'create, ' + name + ' (1 client, msgs/s, median of 3)':<52} "
                  f"{statistics.median(samples):,.0f}", flush=True)
        counts = daemon.call("counts")["counts"]
        print(f"{'messages made (expected ' + str(2 * N * ROUNDS + 1) + ')':<52} {counts['que']}")
        return 0 if counts["que"] == 2 * N * ROUNDS + 1 else 1
    finally:
        daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
