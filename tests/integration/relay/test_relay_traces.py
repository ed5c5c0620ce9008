"""A message's trace across a relay hop: two real rqsys hosts in network
namespaces, and an OTLP/HTTP endpoint in a third (tests/helpers/otlp.py).

Host a relays a message (created with its creator's ``traceparent``) to a
queue of host b.  Both export to the endpoint; a's create, queued and run
spans of its relay queue, and b's create, queued and run spans of the far
queue, are one trace: b's create is the child of a's relay run (the hop's
``traceparent`` header), and b's script has that trace in its
``TRACEPARENT``.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from netns import NetLab, Rqsys, netns_available, stop
from otlp import of_trace, read_spans

from rqsys.special import special_config

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
OTLP_PORT = 4318
ECHO = '#!/bin/sh\necho "done $TRACEPARENT" >&3\n'


class Hop:
    def __init__(self, a: Rqsys, b: Rqsys, spans: Path) -> None:
        self.a, self.b, self.spans = a, b, spans


@pytest.fixture(scope="module")
def hop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hop]:
    need(netns_available(), "network namespaces need root and iproute2")
    base = tmp_path_factory.mktemp("traces")
    lab, hosts, endpoint = NetLab(), [], None
    try:
        lab.host("otel")
        spans = base / "spans.jsonl"
        endpoint = lab.popen("otel", [sys.executable, str(HELPERS / "otlp.py"),
                                      str(OTLP_PORT), str(spans)])
        for name in ("a", "b"):
            lab.host(name)
            hosts.append(traced_host(lab, name, base / name))
        (hosts[1].scandir / "work").mkdir()
        (hosts[1].scandir / "work" / "run").write_text(ECHO)
        (hosts[1].scandir / "work" / "run").chmod(0o755)
        for host in hosts:
            host.start(wait_queues=("relay",))
        wait_for(lambda: hosts[1].pingable("work"), 30, "queue work on b")
        yield Hop(hosts[0], hosts[1], spans)
    finally:
        for host in hosts:
            host.stop()
        if endpoint is not None:
            stop(endpoint)
        lab.close()


def traced_host(lab: NetLab, name: str, base: Path) -> Rqsys:
    """A host whose daemons export to the endpoint (the system config's tracing)."""
    host = Rqsys(lab, name, base)
    cfg = json.loads(host.layout.config_file.read_text())
    cfg["tracing"] = {"endpoint": f"http://{lab.hosts['otel']}:{OTLP_PORT}"}
    host.layout.config_file.write_text(json.dumps(cfg))
    relay = special_config("relay")
    relay["env_vars"] = {"BACKOFF_UNIT": "0.2", "BACKOFF_MAX": "2", "RELAY_TIMEOUT": "10"}
    host.layout.create_queue_dir("relay", relay)
    return host


def far_done(b: Rqsys, url: str) -> dict[str, Any]:
    msg_id = url.rsplit("/", 1)[1]
    return wait_for(lambda: (got := b.call("work", "get", msg_id=msg_id))["state"] == "done"
                    and got, 60, f"{url} done on b")


def test_a_relayed_message_is_one_trace_on_both_hosts(hop: Hop) -> None:
    # Given a message for b's queue, created on a with its creator's traceparent
    trace, caller = secrets.token_hex(16), secrets.token_hex(8)
    msg = {"dest": f"{hop.b.url}q/work", "traceparent": f"00-{trace}-{caller}-01"}
    msg_id = hop.a.call("relay", "create", msg=msg)["msg_id"]
    # When a relays it and b runs it
    far_url = wait_for(lambda: (got := hop.a.call("relay", "get", msg_id=msg_id))["state"]
                       == "relayed" and got["status"], 60, "relayed by a")
    far = far_done(hop.b, far_url)
    # Then both hosts' spans are one trace: a's relay run is the parent of b's create
    names = {"create relay", "queued relay", "run relay", "create work", "queued work",
             "run work"}
    spans = of_trace(lambda: read_spans(hop.spans), trace, names, timeout=60)
    assert spans["create relay"]["parent"] == caller
    assert spans["run relay"]["parent"] == spans["create relay"]["id"]
    assert spans["create work"]["parent"] == spans["run relay"]["id"]
    assert spans["run work"]["parent"] == spans["create work"]["id"]
    assert spans["run relay"]["attrs"]["rq.verdict"] == "relayed"
    assert spans["run relay"]["resource"]["host.name"] == hop.a.addr
    assert spans["run work"]["resource"]["host.name"] == hop.b.addr
    # And b's script ran in that trace, its run span its parent
    assert far["status"] == f"00-{trace}-{spans['run work']['id']}-01"
