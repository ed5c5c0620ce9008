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
from collections.abc import Iterator
from typing import Any

import pytest
from daemon_util import settle
from otlp import Collector
from web_support import web_server  # noqa: F401

from rqsys.observe import tracing

ECHO = 'echo "done ${TRACEPARENT-unset}" >&3'
FAIL = 'echo "failing on purpose"; exit 3'


@pytest.fixture
def collector() -> Iterator[Collector]:
    got = Collector()
    yield got
    got.server.shutdown()


def spans_of(collector: Collector, trace: str, queue: str) -> dict[str, dict[str, Any]]:
    """The create, queued and run spans of ``trace`` in ``queue``, by their first word."""
    names = {f"{word} {queue}" for word in ("create", "queued", "run")}
    found = collector.of_trace(trace, names)
    return {name.split()[0]: span for name, span in found.items() if name in names}


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
    spans = spans_of(collector, trace, "tq")
    create, queued, run = spans["create"], spans["queued"], spans["run"]
    assert create["parent"] == caller and queued["parent"] == run["parent"] == create["id"]
    assert create["attrs"]["rq.msg_id"] == msg_id == run["attrs"]["rq.msg_id"]
    assert queued["end"] <= run["start"] <= run["end"]
    assert (run["attrs"]["rq.verdict"], run["attrs"]["rq.run"], run["attrs"]["rq.exit_code"]) == (
        "done", 1, 0)
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
    spans = spans_of(collector, trace, "tf")
    assert spans["create"]["parent"] == ""  # a root
    attrs = spans["run"]["attrs"]
    assert (attrs["rq.verdict"], attrs["rq.failure"], attrs["rq.exit_code"]) == ("err", "exit", 3)


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
    # Then its create span is the header's child, its JSON and page name its trace
    assert spans_of(collector, trace, "th")["create"]["parent"] == caller
    assert web.get_json(f"/q/th/{msg_id}.json")[1]["trace_id"] == trace
    _s, _h, page = web.request("GET", f"/q/th/{msg_id}")
    assert f'<a class="mono" href="http://jaeger.example/trace/{trace}">{trace}</a>' in (
        page.decode())


DUPPER = """
echo "dup 0-x-tq" >&3
read -r -u 4 answer
echo "done $answer" >&3
"""


def test_a_dup_is_in_its_run_s_trace(make_queue, daemon, collector) -> None:
    # Given two traced queues, the first's script copying its message to the second
    make_queue("ts", DUPPER)
    make_queue("tq", ECHO)
    source, copies = traced(daemon, collector, "ts"), traced(daemon, collector, "tq")
    # When a message of the first runs
    msg_id = source.call("create", msg={"dest": "ts"})["msg_id"]
    answer = settle(source, msg_id)["status"]
    assert answer.startswith("ok ")
    copy_id = answer.rsplit("/", 1)[1]
    # Then its copy is created in the same trace, the child of the run that made it
    trace = tracing.trace_id(source.call("get", msg_id=msg_id)["msg"]["traceparent"])
    settle(copies, copy_id)
    mine, theirs = spans_of(collector, trace, "ts"), spans_of(collector, trace, "tq")
    assert theirs["create"]["parent"] == mine["run"]["id"]
    assert theirs["create"]["attrs"]["rq.msg_id"] == copy_id
