"""Traces of messages, received by a real OTLP/HTTP endpoint in the test.

A real queue daemon (and the web, over HTTP) exports its spans with the
OpenTelemetry SDK; the endpoint here decodes each request with
``opentelemetry-proto``.  A message's create, queued and run spans share
its trace, continuing the ``traceparent`` its creator gave (the HTTP
header too); its script reads its run's span in ``TRACEPARENT``; a failed
run's span says why; the message page links the trace.  Off (no
endpoint), nothing is traced and the script has no ``TRACEPARENT``.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import wait_for
from daemon_util import settle
from web_support import web_server  # noqa: F401

from rqsys.observe import tracing

ECHO = 'echo "done ${TRACEPARENT-unset}" >&3'
FAIL = 'echo "failing on purpose"; exit 3'


class Collector:
    """An OTLP/HTTP trace endpoint: every span received, decoded."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[dict[str, Any]] = []
        spans, decode = self.spans, ExportTraceServiceRequest.FromString

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                spans.extend(flatten(decode(body)) if self.path == "/v1/traces" else [])
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace: str, count: int) -> dict[str, dict[str, Any]]:
        """The spans of ``trace`` by name, once ``count`` have come."""
        def got() -> dict[str, dict[str, Any]] | None:
            found = {s["name"].split()[0]: s for s in self.spans if s["trace"] == trace}
            return found if len(found) >= count else None
        return wait_for(got, 20, f"{count} spans of trace {trace}")


def flatten(request: Any) -> list[dict[str, Any]]:
    spans = []
    for resource in request.resource_spans:
        host = {a.key: a.value.string_value for a in resource.resource.attributes}
        for scope in resource.scope_spans:
            for span in scope.spans:
                spans.append({"name": span.name, "trace": span.trace_id.hex(),
                              "id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                              "resource": host, "start": span.start_time_unix_nano,
                              "end": span.end_time_unix_nano,
                              "attrs": {a.key: attr_value(a.value) for a in span.attributes}})
    return spans


def attr_value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


@pytest.fixture
def collector() -> Iterator[Collector]:
    got = Collector()
    yield got
    got.server.shutdown()


def traced(daemon, collector: Collector, name: str):
    return daemon(name, env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
                             "OTEL_BSP_SCHEDULE_DELAY": "100"})


def caller_parent() -> tuple[str, str, str]:
    trace, span = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace}-{span}-01", trace, span


def test_a_message_s_spans_continue_its_creator_s_trace(make_queue, daemon, collector) -> None:
    # Given a traced queue whose script reports its TRACEPARENT
    make_queue("tq", ECHO)
    proc = traced(daemon, collector, "tq")
    # When a message is created with its creator's traceparent, and runs
    given, trace, caller = caller_parent()
    msg_id = proc.call("create", msg={"dest": "tq", "traceparent": given})["msg_id"]
    status = settle(proc, msg_id)["status"]
    # Then create, queued and run spans arrive in the creator's trace
    spans = collector.of_trace(trace, 3)
    create, queued, run = spans["create"], spans["queued"], spans["run"]
    assert create["parent"] == caller and queued["parent"] == run["parent"] == create["id"]
    assert create["attrs"]["rq.msg_id"] == msg_id == run["attrs"]["rq.msg_id"]
    assert queued["end"] <= run["start"] <= run["end"]
    assert (run["attrs"]["rq.verdict"], run["attrs"]["rq.run"]) == ("done", 1)
    assert run["attrs"]["rq.cpu_s"] >= 0 and run["attrs"]["rq.maxrss_kb"] > 0
    assert run["resource"]["service.name"] == "rqsys"
    # And the script saw its run's span, the message keeps its create span
    assert status == f"00-{trace}-{run['id']}-01"
    assert proc.call("get", msg_id=msg_id)["msg"]["traceparent"] == (
        f"00-{trace}-{create['id']}-01")


def test_a_message_without_a_parent_starts_a_trace_and_a_failure_says_why(
        make_queue, daemon, collector) -> None:
    make_queue("tf", FAIL)
    proc = traced(daemon, collector, "tf")
    msg_id = proc.call("create", msg={"dest": "tf"})["msg_id"]
    assert settle(proc, msg_id)["state"] == "err"
    trace = tracing.trace_id(proc.call("get", msg_id=msg_id)["msg"]["traceparent"])
    spans = collector.of_trace(trace, 3)
    assert spans["create"]["parent"] == ""  # a root
    assert (spans["run"]["attrs"]["rq.verdict"], spans["run"]["attrs"]["rq.failure"]) == (
        "err", "exit")


def test_untraced_daemons_trace_nothing(make_queue, daemon, collector) -> None:
    make_queue("tu", ECHO)
    proc = daemon("tu")
    msg_id = proc.call("create", msg={"dest": "tu"})["msg_id"]
    assert settle(proc, msg_id)["status"] == "unset"
    assert "traceparent" not in proc.call("get", msg_id=msg_id)["msg"]
    proc.stop()
    assert collector.spans == []


def test_the_http_header_continues_a_trace_and_the_page_links_it(
        make_queue, daemon, collector, web_server) -> None:  # noqa: F811
    # Given the web and a daemon traced through the system config
    link = "http://jaeger.example/trace/{trace_id}"
    web = web_server(tracing={"endpoint": collector.url, "link": link})
    make_queue("th", ECHO)
    proc = daemon("th", env={"OTEL_BSP_SCHEDULE_DELAY": "100"})
    # When a message is posted with a traceparent header
    given, trace, caller = caller_parent()
    status, got = web.form("/q/th/new_message", {"mesg_dest": "th"},
                           headers={"traceparent": given, "Accept": "application/json"})
    assert status == 200, got
    msg_id = got[1].rsplit("/", 1)[1]
    settle(proc, msg_id)
    # Then its create span is the header's child, and the page links its trace
    assert collector.of_trace(trace, 3)["create"]["parent"] == caller
    _s, _h, page = web.request("GET", f"/q/th/{msg_id}")
    assert f'<a class="mono" href="http://jaeger.example/trace/{trace}">{trace}</a>' in (
        page.decode())
