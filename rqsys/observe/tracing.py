"""Traces of messages in OpenTelemetry: off unless configured, the SDK an optional extra.

On when the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` is in the daemon's environment, or the
system config has ``tracing.endpoint`` (an OTLP/HTTP base URL; spans go to
``<it>/v1/traces``); the SDK and its OTLP/HTTP exporter come with
``pip install 'rqsys[otel]'``.  Configured without them, the daemon says so
once and runs untraced.  Off (``start`` returns None) nothing of
OpenTelemetry is imported and nothing is done per message.

A message's trace: a ``create`` span when it is stored (a child of the
W3C ``traceparent`` its creator gave, a relay hop's for instance), whose
context the message keeps in its ``traceparent`` field; when it starts,
a ``queued`` span (from its creation, first run only) and a ``run`` span
whose context the script gets in ``TRACEPARENT``, ended with the run's
verdict, exit, CPU time and peak memory as attributes.  Spans leave in
batches from the SDK's own thread; a stopping daemon flushes them.
"""

from __future__ import annotations

import calendar
import os
import re
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rqsys.store.layout import MSG_ID_RE

if TYPE_CHECKING:
    from rqsys.observe.events import EventLog

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACEPARENT_RE = re.compile(r"^00-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-[0-9a-f]{2}$")
FIELD = "traceparent"  # the message's, and the HTTP header's (W3C)
ENV = "TRACEPARENT"  # the script's


def endpoint(sysconfig: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """Where spans go ('' when tracing is off)."""
    given = (sysconfig.get("tracing") or {}).get("endpoint") or ""
    if given:
        return given.rstrip("/") + "/v1/traces"
    traces, base = (environ.get(name, "") for name in ENDPOINT_VARS)
    return traces or (base.rstrip("/") + "/v1/traces" if base else "")


def start(sysconfig: Mapping[str, Any], log: EventLog, queue: str,
          environ: Mapping[str, str] | None = None) -> Tracing | None:
    """The daemon's tracing, or None when it is off (or cannot be on: said once)."""
    url = endpoint(sysconfig, os.environ if environ is None else environ)
    if not url:
        return None
    try:
        return Tracing(url, queue, str(sysconfig.get("host") or socket.gethostname()))
    except ImportError as exc:
        log.event("err", f"tracing to {url} is configured, but OpenTelemetry is not installed "
                  f"({exc.name}; pip install 'rqsys[otel]'): no traces")
        return None


def trace_id(traceparent: str) -> str:
    """The trace id of a W3C traceparent ('' for none or a malformed one)."""
    found = TRACEPARENT_RE.match(traceparent or "")
    return found.group(1) if found else ""


def created_ns(msg_id: str) -> int | None:
    """When the message was made, from its id (ns since the epoch), or None."""
    if not MSG_ID_RE.match(msg_id):
        return None
    stamp = time.strptime(msg_id[:16], "%Y%m%d.%H%M.%S")
    return (calendar.timegm(stamp) * 1000 + int(msg_id[17:20])) * 1_000_000


class Tracing:
    """The SDK's tracer for one queue daemon, exporting over OTLP/HTTP."""

    def __init__(self, url: str, queue: str, host: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create({"service.name": "rqsys", "host.name": host,
                                    "rq.queue": queue})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
        self.tracer = self.provider.get_tracer("rqsys")
        self.queue, self.kinds, self.w3c = queue, SpanKind, TraceContextTextMapPropagator()

    def _parent(self, traceparent: str | None) -> Any:
        return self.w3c.extract({FIELD: traceparent}) if traceparent else None

    def _header(self, span: Any) -> str:
        carrier: dict[str, str] = {}
        from opentelemetry import trace

        self.w3c.inject(carrier, trace.set_span_in_context(span))
        return carrier[FIELD]

    def create(self, msg: dict[str, Any]) -> Any:
        """A new message's ``create`` span, begun (a child of its ``traceparent``,
        which now names this span); :meth:`created` ends it once it has an id."""
        span = self.tracer.start_span(f"create {self.queue}", self._parent(msg.get(FIELD)),
                                      self.kinds.PRODUCER, {"rq.queue": self.queue})
        msg[FIELD] = self._header(span)
        return span

    @staticmethod
    def created(span: Any, msg_id: str, by: str) -> None:
        span.set_attribute("rq.msg_id", msg_id)
        span.set_attribute("rq.by", by)
        span.end()

    def run(self, msg_id: str, msg: Mapping[str, Any]) -> tuple[Any, str]:
        """A run's span, begun (its ``queued`` span ended first, on a first run);
        (the span, the ``TRACEPARENT`` its script gets)."""
        parent, attrs = self._parent(msg.get(FIELD)), {"rq.queue": self.queue,
                                                         "rq.msg_id": msg_id}
        began = created_ns(msg_id)
        if not msg.get("count") and began is not None:
            queued = self.tracer.start_span(f"queued {self.queue}", parent,
                                            self.kinds.INTERNAL, attrs, start_time=began)
            queued.end()
        span = self.tracer.start_span(f"run {self.queue}", parent, self.kinds.CONSUMER,
                                      {**attrs, "rq.run": int(msg.get("count") or 0) + 1})
        return span, self._header(span)

    @staticmethod
    def ran(span: Any, outcome: Any, worker: Any) -> None:
        """End a run's span with what became of it: the ``Outcome`` and, when it
        ran, its ``Worker``'s exit and resource use."""
        span.set_attribute("rq.verdict", outcome.state)
        span.set_attribute("rq.status", outcome.text[:200])
        if outcome.kind:
            span.set_attribute("rq.failure", outcome.kind)  # err, exit, signal, timeout...
        status = getattr(worker, "wait_status", None)
        if status is not None and os.WIFSIGNALED(status):
            span.set_attribute("rq.signal", os.WTERMSIG(status))
        elif status is not None:
            span.set_attribute("rq.exit_code", os.waitstatus_to_exitcode(status))
        if (rusage := getattr(worker, "rusage", None)) is not None:
            span.set_attribute("rq.cpu_s", round(rusage.ru_utime + rusage.ru_stime, 6))
            span.set_attribute("rq.maxrss_kb", int(rusage.ru_maxrss))
        span.end()

    def shutdown(self) -> None:
        """Send what is left (the daemon stops)."""
        self.provider.shutdown()
