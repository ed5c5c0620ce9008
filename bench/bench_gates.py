"""Rate limits and dependencies: how closely starts follow the limit, and
what one dependency link costs.

Rate: 200 messages into a paused queue of 8 workers limited to 20 starts a
second; each script records when it started.  Printed: the achieved rate
(the limit is 20/s), the shortest span of 21 consecutive starts (at least
1 s when the limit holds, less a script's start-up jitter).

Dependencies: a chain of 40 messages, each ``after`` the one before, in
one queue and alternating between two queues, against the same 40 run one
after another without ``after`` (one worker): the extra time per link is
what a dependency costs (the end seen through the event log, or pushed by
the other queue's ``watch``).
"""

from __future__ import annotations

import shutil
import sys
import time

from bench_queue import Daemon, make_queue
from scratch import scratch_layout

from rqsys.store import Layout

RATE_N, RATE, WINDOW = 200, 20, 1.0
CHAIN = 40
RECORD = 'date +%s.%N >> "$OUT"; echo done >&3'


def starts(path) -> list[float]:
    return sorted(float(x) for x in path.read_text().split()) if path.exists() else []


def wait_lines(path, count: int, timeout: float = 300) -> list[float]:
    deadline = time.monotonic() + timeout
    while len(got := starts(path)) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(got)} of {count} runs in {timeout} s")
        time.sleep(0.1)
    return got


def rate_figures(layout: Layout) -> None:
    out = layout.root / "rate.out"
    make_queue(layout, "r", RECORD.replace("$OUT", str(out)), num_workers=8,
               rate_limit={"limit": RATE, "per": WINDOW})
    daemon = Daemon(layout, "r")
    try:
        daemon.call("adminoper", oper="pause")
        daemon.call("create_many", msgs=[{"param1": str(n)} for n in range(RATE_N)])
        daemon.call("adminoper", oper="resume")
        t = wait_lines(out, RATE_N)
    finally:
        daemon.stop()
    span = min(t[n + RATE] - t[n] for n in range(RATE_N - RATE))
    sustained = (RATE_N - RATE) / (t[-1] - t[0])  # the first RATE start at once
    print(f"{'rate limit 20/s: sustained starts/s (after the first 20)':<58} {sustained:.2f}")
    print(f"{'rate limit 20/s: shortest span of 21 starts (s, >= 1)':<58} {span:.3f}")


def chain(layout: Layout, queues: list[str], after: bool) -> float:
    """Seconds per message of a chain of CHAIN messages over ``queues``."""
    out = layout.root / f"chain-{'-'.join(queues)}-{after}.out"
    daemons = {q: Daemon(layout, q) for q in queues}
    try:
        for d in daemons.values():
            d.call("adminoper", oper="pause")
        before: str | None = None
        for n in range(CHAIN):
            msg = {"param1": str(out)} | ({"after": [before]} if after and before else {})
            before = daemons[queues[n % len(queues)]].call("create", msg=msg)["url"]
        for d in daemons.values():
            d.call("adminoper", oper="resume")
        t = wait_lines(out, CHAIN)
    finally:
        for d in daemons.values():
            d.stop()
    return (t[-1] - t[0]) / (CHAIN - 1)


def main() -> int:
    scratch, layout = scratch_layout("gates-")
    try:
        rate_figures(layout)
        for name in ("c1", "c2", "plain"):
            make_queue(layout, name, 'date +%s.%N >> "$RQ_PARAM1"; echo done >&3')
        plain = chain(layout, ["plain"], after=False)
        one = chain(layout, ["c1"], after=True)
        two = chain(layout, ["c1", "c2"], after=True)
        print(f"{'40 runs one after another, no after (ms per run)':<58} {plain * 1000:.1f}")
        print(f"{'chain of 40, after, one queue (ms per link)':<58} {one * 1000:.1f}")
        print(f"{'chain of 40, after, across two queues (ms per link)':<58} {two * 1000:.1f}")
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
