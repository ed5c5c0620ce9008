"""post_run_webhook, for real: a message ends on host a, the webhook queue POSTs to host c.

Host ``a`` runs ``rqsys serve`` with a queue ``job`` and the built-in
``webhook`` queue (our webhook.py); host ``c``, another network namespace,
runs ``webhook_sink.py``, which records each POST and answers 2xx, 5xx, or
5xx-then-2xx depending on the path.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS, need, wait_for
from netns import NetLab, Rqsys, netns_available
from scan_util import DEADLINE

from rqsys.errors import BadRequest
from rqsys.special import special_config

SINK = HELPERS / "webhook_sink.py"
SINK_PORT = 8081
JOB_SCRIPT = """#!/bin/bash
if [ "$RQ_PARAM1" = fail ]; then echo "err it failed" >&3; else echo "done all good" >&3; fi
"""


class World:
    def __init__(self, a: Rqsys, sink_dir: Path, sink_url: str) -> None:
        self.a, self.sink_dir, self.sink_url = a, sink_dir, sink_url

    def posts(self, name: str) -> list[dict[str, Any]]:
        files = sorted(self.sink_dir.glob(f"{name}.*.json"),
                       key=lambda p: int(p.name.split(".")[1]))
        return [json.loads(p.read_text()) for p in files]

    def send(self, hooks: list[str], **fields: Any) -> str:
        msg = {"dest": "job", "post_run_webhook": [self.sink_url + h for h in hooks], **fields}
        return str(self.a.call("job", "create", msg=msg)["msg_id"])

    def webhook_msgs(self, state: str) -> list[dict[str, Any]]:
        ids = self.a.call("webhook", "list", state=state)["ids"]
        return [self.a.call("webhook", "get", msg_id=i) for i in ids]

    def webhook_for(self, url: str, state: str) -> dict[str, Any]:
        return wait_for(lambda: next((m for m in self.webhook_msgs(state)
                                      if m["msg"].get("param1") == url), None),
                        40, f"the webhook message for {url} in {state}")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    need(netns_available(), "network namespaces need root and iproute2")
    base = tmp_path_factory.mktemp("webhook")
    lab = NetLab()
    try:
        lab.host("a")
        addr_c = lab.host("c")
        a = Rqsys(lab, "a", base / "a")
        entry = a.scandir / "job"
        entry.mkdir()
        (entry / "run").write_text(JOB_SCRIPT)
        (entry / "run").chmod(0o755)
        cfg = special_config("webhook")
        cfg["env_vars"] = {"BACKOFF_UNIT": "0.1", "BACKOFF_MAX": "1", "WEBHOOK_TIMEOUT": "3"}
        a.layout.create_queue_dir("webhook", cfg)
        sink_dir = base / "sink"
        sink_dir.mkdir()
        lab.popen("c", [sys.executable, str(SINK), str(sink_dir), addr_c, str(SINK_PORT)])
        wait_for(lambda: (sink_dir / "ready").exists(), DEADLINE, "the webhook sink")
        a.start(wait_queues=("job", "webhook"))
        yield World(a, sink_dir, f"http://{addr_c}:{SINK_PORT}/")
        a.stop()
    finally:
        lab.close()


def test_done_message_notifies_each_url_once(world: World) -> None:
    # Given a message with two webhooks, one of which fails twice before answering 200
    msg_id = world.send(["ok", "flaky"], param2="x")
    url = world.a.call("job", "get", msg_id=msg_id)["url"]
    # When it is done, the webhook message ends in done
    hook = world.webhook_for(url, "done")
    assert hook["status"] == "notified 2 URL(s)"
    # Then /ok got exactly one POST (not repeated on the resends), /flaky three
    ok, flaky = world.posts("ok"), world.posts("flaky")
    assert len(ok) == 1 and len(flaky) == 3
    doc = ok[0]
    assert doc["msg_id"] == url and doc["state"] == "done" and doc["status"] == "all good"
    assert doc["msg"]["param2"] == "x" and flaky[-1] == doc


def test_err_message_notifies_with_its_state(world: World) -> None:
    msg_id = world.send(["ok"], param1="fail")
    url = world.a.call("job", "get", msg_id=msg_id)["url"]
    world.webhook_for(url, "done")
    doc = next(d for d in world.posts("ok") if d["msg_id"] == url)
    assert doc["state"] == "err" and doc["status"] == "it failed"


def test_failing_url_resends_then_err(world: World) -> None:
    # Given a webhook URL that always answers 503
    msg_id = world.send(["down"])
    url = world.a.call("job", "get", msg_id=msg_id)["url"]
    # Then the webhook message resends with back-off and finally ends in err saying why
    hook = world.webhook_for(url, "err")
    assert hook["status"].startswith("HIT MAX RESEND COUNT") and "HTTP 503" in hook["status"]
    assert len(world.posts("down")) == hook["msg"]["count"] == 15
    # And the message itself stayed done
    assert world.a.call("job", "get", msg_id=msg_id)["state"] == "done"


def test_bad_webhook_urls_are_refused(world: World) -> None:
    # (a string is RQ's form, its space-separated URLs: checked as those URLs)
    for hooks in (["ftp://x/"], "http://x/ ftp://y/", [1]):
        with pytest.raises(BadRequest, match="post_run_webhook"):
            world.a.call("job", "create", msg={"dest": "job", "post_run_webhook": hooks})


def test_missing_webhook_queue_is_logged_not_fatal(layout: Any, make_queue: Any,
                                                   daemon: Any) -> None:
    # Given a host with no webhook queue at all
    make_queue("job", JOB_SCRIPT.split("\n", 1)[1])
    job = daemon("job")
    msg_id = job.call("create", msg={"dest": "job",
                                     "post_run_webhook": ["http://127.0.0.1:9/"]})["msg_id"]
    wait_for(lambda: job.call("state", msg_id=msg_id)["state"] == "done", DEADLINE, "done")
    # Then the daemon carries on and says why nobody was notified
    again = job.call("create", msg={"dest": "job"})["msg_id"]
    wait_for(lambda: job.call("state", msg_id=again)["state"] == "done", DEADLINE, "done")
    assert job.stop() == 0
    assert "webhook not queued: no queue named webhook" in job.stderr_text()
