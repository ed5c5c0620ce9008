"""rqsys.observe.tracing: when traces are on, the W3C field, a message's birth from its id."""

from __future__ import annotations

import calendar
import sys

import pytest

from rqsys.observe import tracing


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def event(self, kind: str, text: str, *args: object, **fields: object) -> None:
        self.lines.append((kind, text))


@pytest.mark.parametrize(("sysconfig", "environ", "url"), [
    ({}, {}, ""),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces"),
    ({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
          "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9/x"}, "http://t:9/x"),
    ({"tracing": {"endpoint": "http://cfg:4318"}},
     {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "http://cfg:4318/v1/traces"),
    ({"tracing": {"link": "http://j/{trace_id}"}}, {}, ""),
])
def test_the_endpoint_comes_from_the_config_then_the_standard_variables(
        sysconfig: dict, environ: dict, url: str) -> None:
    assert tracing.endpoint(sysconfig, environ) == url


def test_off_is_none_and_loads_nothing_of_opentelemetry() -> None:
    log = Log()
    assert tracing.start({}, log, "q", {}) is None  # type: ignore[arg-type]
    assert log.lines == []


def test_configured_without_the_sdk_says_so_once_and_runs_untraced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        None)  # an import of it raises ImportError, as when not installed
    log = Log()
    got = tracing.start({}, log, "q", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})  # type: ignore[arg-type]
    assert got is None and len(log.lines) == 1 and log.lines[0][0] == "err"
    assert "pip install 'rqsys[otel]'" in log.lines[0][1]


@pytest.mark.parametrize(("header", "trace"), [
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     "4bf92f3577b34da6a3ce929d0e0e4736"),
    ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""),  # W3C: invalid ids
    ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", ""),
    ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""),
    ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""),
    ("", ""),
])
def test_trace_id_takes_only_a_valid_traceparent(header: str, trace: str) -> None:
    assert tracing.trace_id(header) == trace


def test_a_message_was_made_when_its_id_says() -> None:
    want = (calendar.timegm((2026, 11, 28, 14, 17, 8, 0, 0, 0)) * 1000 + 206) * 1_000_000
    assert tracing.created_ns("20261128.1417.08.206.3") == want
    assert tracing.created_ns("not-an-id") is None
