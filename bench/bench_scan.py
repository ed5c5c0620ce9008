"""rq-scan figures, each beside a baseline measured in the same run.

* ``ln -s`` into the scandir -> first message accepted by the new queue, in
  embedded mode (``rqsys serve``): p50 / p90 over TRIALS links (target p50 <
  200 ms) and the part of it until the socket is bound, vs the same queue
  made by hand: ``install_queue`` + starting ``rqsys queue NAME`` directly,
  until it accepts a message;
* rq-scan's RSS with 1,000 queues in the scandir (vs with none), and the
  time it takes to reconcile them at start.

The client polls the new socket every millisecond: that is the measuring
instrument, not part of rqsys.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from procs import stop
from scratch import make_scratch

from rqsys.errors import RQError
from rqsys.scan.scandir import install_queue
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

TRIALS = 20
RSS_QUEUES = 1000
TARGET_P50 = 0.200
RESULTS: list[tuple[str, str]] = []
SCRUB = ("RQ_SUPERVISOR_PID", "INVOCATION_ID", "NOTIFY_SOCKET", "JOURNAL_STREAM",
         "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")


def report(name: str, value: str, verdict: str = "") -> None:
    line = f"{name:<52} {value}"
    print(f"{line}  {verdict}" if verdict else line, flush=True)
    RESULTS.append((name, verdict))


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SCRUB}


def make_entry(base: Path, name: str) -> Path:
    entry = base / name
    entry.mkdir(parents=True)
    (entry / "run").write_text('#!/bin/sh\necho "done" >&3\n')
    (entry / "run").chmod(0o755)
    return entry


def first_accept(layout: Layout, queue: str, timeout: float = 30.0) -> None:
    """Until queue accepts a message (polled every millisecond)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with QueueClient(layout, queue, timeout=timeout) as client:
                client.call("create", msg={})
            return
        except RQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


def wait_log(path: Path, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{text!r} not in {path}")
        time.sleep(0.01)



def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rqsys(layout: Layout, *args: str, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "rqsys", "--root", str(layout.root), *args]
    with log.open("ab") as out:
        return subprocess.Popen(argv, env=env(), stdout=out, stderr=out,
                                start_new_session=True)


def new_layout(scratch: Path, name: str) -> Layout:
    layout = Layout(scratch / name, scratch / name / "sock")
    layout.make_dirs()
    layout.socket_dir.mkdir()
    return layout


def wait_socket(layout: Layout, queue: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not layout.socket_path(queue).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no socket for {queue}")
        time.sleep(0.0005)


def bench_link_to_message(scratch: Path) -> tuple[list[float], list[float]]:
    layout = new_layout(scratch, "serve")
    scandir = scratch / "serve-scandir"
    scandir.mkdir()
    entries = [make_entry(scratch / "serve-scripts", f"l{i}") for i in range(TRIALS)]
    log = scratch / "serve.log"
    proc = rqsys(layout, "serve", "--scandir", str(scandir), "--port", str(free_port()), log=log)
    times, to_socket = [], []
    try:
        wait_log(log, "rq-scan ready")
        for entry in entries:
            started = time.perf_counter()
            os.symlink(entry, scandir / entry.name)
            wait_socket(layout, entry.name)
            to_socket.append(time.perf_counter() - started)
            first_accept(layout, entry.name)
            times.append(time.perf_counter() - started)
    finally:
        stop(proc)
    return times, to_socket


def bench_by_hand(scratch: Path) -> list[float]:
    layout = new_layout(scratch, "hand")
    entries = [make_entry(scratch / "hand-scripts", f"h{i}") for i in range(TRIALS)]
    times, procs = [], []
    try:
        for entry in entries:
            started = time.perf_counter()
            install_queue(layout, entry.name, entry)
            procs.append(rqsys(layout, "queue", entry.name, log=scratch / "hand.log"))
            first_accept(layout, entry.name)
            times.append(time.perf_counter() - started)
    finally:
        for proc in procs:
            stop(proc)
    return times


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def scan_rss(scratch: Path, queues: int) -> tuple[int, float]:
    """(rq-scan's RSS in KiB, seconds from start to ready) with ``queues`` links."""
    layout = new_layout(scratch, f"rss{queues}")
    scandir = scratch / f"rss{queues}-scandir"
    scandir.mkdir()
    for i in range(queues):
        os.symlink(make_entry(scratch / f"rss{queues}-scripts", f"r{i}"), scandir / f"r{i}")
    log = scratch / f"rss{queues}.log"
    started = time.perf_counter()
    proc = rqsys(layout, "scan", "--scandir", str(scandir), log=log)
    try:
        wait_log(log, "rq-scan ready", timeout=300)
        ready = time.perf_counter() - started
        return rss_kib(proc.pid), ready
    finally:
        stop(proc)


def pct(times: list[float], q: float) -> float:
    return statistics.quantiles(times, n=100)[int(q) - 1] if len(times) > 1 else times[0]


def main() -> int:
    scratch = make_scratch("scan-")
    try:
        linked, to_socket = bench_link_to_message(scratch)
        by_hand = bench_by_hand(scratch)
        p50, base50 = statistics.median(linked), statistics.median(by_hand)
        report("ln -s -> first message accepted (serve), p50",
               f"{p50 * 1000:.0f} ms", "ok" if p50 < TARGET_P50 else "MISS")
        report("ln -s -> first message accepted (serve), p90", f"{pct(linked, 90) * 1000:.0f} ms")
        sock50 = statistics.median(to_socket)
        report("  of which ln -s -> socket bound (rq-scan), p50", f"{sock50 * 1000:.0f} ms; "
               f"the rest is the daemon starting on the first connection")
        report("baseline: install_queue + rqsys queue, p50",
               f"{base50 * 1000:.0f} ms (scandir path = {p50 / base50:.2f}x)")
        rss0, _ = scan_rss(scratch, 0)
        rss, ready = scan_rss(scratch, RSS_QUEUES)
        report(f"rq-scan RSS with {RSS_QUEUES} queues", f"{rss / 1024:.1f} MiB "
               f"(with none: {rss0 / 1024:.1f} MiB)")
        report(f"rq-scan start-up reconcile of {RSS_QUEUES} new queues", f"{ready:.2f} s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    missed = [name for name, verdict in RESULTS if verdict == "MISS"]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
