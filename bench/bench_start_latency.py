"""Enqueue-to-start latency by how scripts start: auto, the fork server, in process (issue 35).

Clients (threads, each on its own socket) send ``create`` at a steady pace,
noting the wall-clock time before each; the queue's script (bash, 8
workers) notes ``$EPOCHREALTIME`` as its first act, on the same clock.  The
latency is the difference: durable intake, scheduling, the start and the
script's exec.  It is also split where the client got its create's answer:
intake (the durable create) and the rest (scheduling, the start, the exec).
1 client (one message every 20 ms) and 64 clients (each one every 250 ms,
staggered: 256 messages a second, under what 8 workers drain here), against
three daemons alternated in the same run: one as it runs by default
(``auto``: its fork server only while messages wait for a worker), one
always with its fork server (``RQ_FORK_SERVER=on``), and one starting
each script in process (``off``: the loop waits for each exec), the
baseline.  Prints p50, p99 and the worst, in ms.

    python bench/bench_start_latency.py [SECONDS]
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

from bench_queue import Daemon, make_queue, report
from scratch import scratch_layout

from rqsys.store import Layout
from rqsys.wire.client import QueueClient

SCRIPT = 'printf "%s %s\\n" "$RQ_MSG_ID" "$EPOCHREALTIME" >> "$LOG"\necho done >&3'
ROUNDS = 1  # rounds of each way leading (a way measured first fared worse, whichever)
SHAPES = ((1, 0.020), (64, 0.250))  # clients, seconds between one client's messages
WAYS = (("default", "", "default (auto)"), ("server", "on", "fork server (on)"),
        ("inprocess", "off", "in process (off, baseline)"))  # queue, RQ_FORK_SERVER, label


def run_clients(layout: Layout, name: str, clients: int, every: float,
                seconds: float) -> dict[str, tuple[float, float]]:
    """Each message's (time sent, time its create was answered), by msg_id."""
    sent: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()

    def client(offset: float) -> None:
        with QueueClient(layout, name) as conn:
            due = time.monotonic() + offset
            end = due + seconds
            while due < end:
                time.sleep(max(0.0, due - time.monotonic()))
                began = time.time()
                msg_id = conn.call("create", msg={})["msg_id"]
                answered = time.time()
                with lock:
                    sent[msg_id] = (began, answered)
                due += every

    threads = [threading.Thread(target=client, args=(every * i / clients,))
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sent


def latencies(log: Path, sent: dict[str, tuple[float, float]]
              ) -> tuple[list[float], list[float], list[float]]:
    """Milliseconds from sending to the script's first act, to the create's
    answer (intake), and from the answer to the first act."""
    deadline = time.monotonic() + 60
    while True:
        started = dict(line.split() for line in log.read_text().splitlines() if line)
        if all(msg_id in started for msg_id in sent) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    at = {m: float(started[m].replace(",", ".")) for m in sent if m in started}
    return ([(at[m] - sent[m][0]) * 1000 for m in at],
            [(answered - began) * 1000 for began, answered in sent.values()],
            [(at[m] - sent[m][1]) * 1000 for m in at])


def figures(waits: list[float]) -> str:
    p50, p99 = waits[len(waits) // 2], waits[min(len(waits) - 1, int(len(waits) * 0.99))]
    return f"p50 {p50:6.2f} ms, p99 {p99:6.2f} ms, worst {waits[-1]:6.1f} ms ({len(waits)})"


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    scratch, layout = scratch_layout("latency-")
    daemons: dict[str, Daemon] = {}
    try:
        for way, setting, _label in WAYS:
            log = scratch / f"{way}.log"
            log.touch()
            make_queue(layout, way, SCRIPT, num_workers=8,
                       env_vars={"LOG": str(log)})
            (layout.root / f"{way}.run").write_text(f"#!/bin/bash\n{SCRIPT}\n")
            os.environ.pop("RQ_FORK_SERVER", None)
            if setting:
                os.environ["RQ_FORK_SERVER"] = setting
            daemons[way] = Daemon(layout, way)
            os.environ.pop("RQ_FORK_SERVER", None)
        got: dict[tuple[str, int, int], list[float]] = {}  # (way, clients, part) -> ms
        ways = list(daemons)
        for turn in range(ROUNDS * len(ways)):  # each way first as often as the others
            order = ways[turn % len(ways):] + ways[:turn % len(ways)]
            for clients, every in SHAPES:
                for way in order:
                    sent = run_clients(layout, way, clients, every, seconds)
                    parts = latencies(scratch / f"{way}.log", sent)
                    for part, waits in enumerate(parts):
                        got.setdefault((way, clients, part), []).extend(waits)
        for clients, _every in SHAPES:
            for way, _setting, what in WAYS:
                report(f"enqueue -> start, {clients} client(s), {what}",
                       figures(sorted(got[(way, clients, 0)])))
                report("  of which intake (to the create's answer)",
                       figures(sorted(got[(way, clients, 1)])))
                report("  and from the answer to the start",
                       figures(sorted(got[(way, clients, 2)])))
    finally:
        for daemon in daemons.values():
            daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
