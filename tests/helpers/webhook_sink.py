"""A webhook receiver for tests: ``python webhook_sink.py DIR ADDR PORT``.

Every POST is saved as ``DIR/<path name>.<n>.json``.  ``/ok`` answers 204,
``/flaky`` answers 500 twice then 200, ``/down`` always 503.
"""

from __future__ import annotations

import itertools
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LOCK = threading.Lock()
SEEN: dict[str, itertools.count[int]] = {}


class Sink(BaseHTTPRequestHandler):
    base: Path

    def log_message(self, fmt: str, *args: object) -> None:
        print(fmt % args, file=sys.stderr, flush=True)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        name = self.path.strip("/").replace("/", "_") or "root"
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with LOCK:
            n = next(SEEN.setdefault(name, itertools.count(1)))
            (self.base / f"{name}.{n}.json").write_bytes(body)
        status = {"ok": 204, "down": 503}.get(name, 500 if n <= 2 else 200)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main() -> None:
    Sink.base = Path(sys.argv[1])
    server = ThreadingHTTPServer((sys.argv[2], int(sys.argv[3])), Sink)
    (Sink.base / "ready").write_text("1")
    server.serve_forever()


if __name__ == "__main__":
    main()
