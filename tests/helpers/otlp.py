"""An OTLP/HTTP trace endpoint for tests: every span it receives, decoded with opentelemetry-proto.

In the test's process (``Collector``), or as a program in a network
namespace (``python otlp.py PORT FILE``: one JSON line per span in FILE).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Span = dict[str, Any]


def handler(take: Callable[[list[Span]], None]) -> type[BaseHTTPRequestHandler]:
    """A request handler passing the spans of each POST /v1/traces to ``take``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            ours = self.path == "/v1/traces"
            if ours:
                take(flatten(ExportTraceServiceRequest.FromString(body)))
            self.send_response(200 if ours else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def flatten(request: Any) -> list[Span]:
    spans = []
    for resource in request.resource_spans:
        host = {a.key: a.value.string_value for a in resource.resource.attributes}
        for scope in resource.scope_spans:
            for span in scope.spans:
                spans.append({"name": span.name, "trace": span.trace_id.hex(),
                              "id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                              "resource": host, "start": span.start_time_unix_nano,
                              "end": span.end_time_unix_nano,
                              "attrs": {a.key: _value(a.value) for a in span.attributes}})
    return spans


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


def of_trace(spans: Callable[[], list[Span]], trace: str, names: set[str],
             timeout: float = 30) -> dict[str, Span]:
    """The spans of ``trace`` by name (``create relay``...), once all ``names`` came."""
    deadline = time.monotonic() + timeout
    while True:
        found = {s["name"]: s for s in spans() if s["trace"] == trace}
        if names <= set(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"spans of {trace}: {sorted(found)}, not all of {names}")
        time.sleep(0.1)


class Collector:
    """The endpoint in this process, on 127.0.0.1."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler(self.spans.extend))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace: str, names: set[str]) -> dict[str, Span]:
        return of_trace(lambda: list(self.spans), trace, names)


def read_spans(path: Path) -> list[Span]:
    """What ``main`` wrote so far."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def main(port: int, out: Path) -> None:
    lock = threading.Lock()

    def take(spans: list[Span]) -> None:
        with lock, out.open("a") as f:
            f.write("".join(json.dumps(s) + "\n" for s in spans))

    ThreadingHTTPServer(("0.0.0.0", port), handler(take)).serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))
