"""What traces cost (issue 33): nothing when off, and how much when on.

Same run, same queue script (``echo done >&3``), 8 workers, gated drains of
N messages (bench_drain's), alternating between a daemon without tracing
and one exporting to a local OTLP/HTTP sink (a thread here that accepts
and drops each batch): the rate and the daemon's CPU per message (every
thread: the SDK's exporter thread counts).  Then the off path alone: what
the run's trace moments cost when tracing is off (no hook registered), per
message, beside the daemon's whole cost per message.
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
import timeit
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench_drain import rqsys_drain
from bench_queue import Daemon, make_queue, report
from scratch import scratch_layout

from rqsys.life.moments import Moments
from rqsys.run.verdict import Outcome

N = 800
ROUNDS = 3
SLOTS = 8


class Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def traced_daemon(layout: Any, name: str, url: str) -> Daemon:
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = url
    try:
        return Daemon(layout, name)
    finally:
        del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]


def off_hooks_ns() -> float:
    """ns a run spends on the trace moments with tracing off (starting,
    duplicating, run_over): no hook is registered, each is an empty loop."""
    moments, outcome = Moments(), Outcome("done", "")
    run: dict[str, str] = {}
    copy: dict[str, str] = {}

    def one() -> None:
        for hook in moments.starting:
            hook("m", {}, run)
        for dup in moments.duplicating:
            dup("m", copy)
        for over in moments.run_over:
            over("m", outcome, None)
    loops = 200_000
    return min(timeit.repeat(one, number=loops, repeat=5)) / loops * 1e9


def main() -> int:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{sink.server_address[1]}"
    scratch, layout = scratch_layout("tracing-")
    make_queue(layout, "off", "echo done >&3", num_workers=SLOTS)
    make_queue(layout, "on", "echo done >&3", num_workers=SLOTS)
    off, on = Daemon(layout, "off"), traced_daemon(layout, "on", url)
    try:
        rqsys_drain(off, layout, "off", N // 4)  # warm
        rqsys_drain(on, layout, "on", N // 4)
        offs, ons = [], []
        for _ in range(ROUNDS):
            offs.append(rqsys_drain(off, layout, "off", N))
            ons.append(rqsys_drain(on, layout, "on", N))
            time.sleep(0.5)  # the last spans leave before the next round
    finally:
        off.stop()
        on.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    got = {name: {k: statistics.median(r[k] for r in runs) for k in ("rate", "cpu_us")}
           for name, runs in (("off", offs), ("on", ons))}
    for name in ("off", "on"):
        report(f"drain, {SLOTS} workers, tracing {name}",
               f"{got[name]['rate']:7.0f} msg/s, daemon CPU {got[name]['cpu_us']:6.0f} us/msg")
    report("tracing on / off, daemon CPU per message",
           f"{got['on']['cpu_us'] / got['off']['cpu_us']:7.2f}x")
    hooks = off_hooks_ns()
    report("trace hooks of a run, tracing off",
           f"{hooks:7.0f} ns/msg ({hooks / (got['off']['cpu_us'] * 1000) * 100:.3f} % of the "
           "daemon's CPU per message)")
    sink.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
