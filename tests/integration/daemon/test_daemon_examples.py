"""Each queue in scandir-examples/ runs once, through a real daemon, to done."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, wait_for
from daemon_util import job_file, settle

from rqsys import config
from rqsys.run import protocol
from rqsys.scan import scandir

EXAMPLES = REPO / "scandir-examples"
NAMES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "run").is_file())
FAST = {"progress": {"param2": "0.01"}, "retry": {"param2": "0"}}


def form_message(name: str) -> dict:
    """The message the web form would send with its default values."""
    form = config.validate("form", json.loads((EXAMPLES / name / "form.json").read_text()),
                           f"{name}/form.json")
    msg: dict = {}
    for key, field in form.items():
        if key.startswith("mesg_") and "value" in field:
            field_name = key[len("mesg_"):]
            msg[field_name] = int(field["value"]) if field_name == "max_count" else field["value"]
    msg.update(FAST.get(name, {}))
    return msg


def test_there_are_the_promised_examples():
    assert {"hello", "py-hello", "progress", "retry", "fanout"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_example_runs_to_done(layout, daemon, name):
    for each in NAMES:
        scandir.install_queue(layout, each, EXAMPLES / each)
    procs = {each: daemon(each) for each in ({name, "hello"})}
    msg_id = procs[name].call("create", msg=form_message(name))["msg_id"]
    reply = settle(procs[name], msg_id, timeout=20)
    assert reply["state"] == "done", reply
    check = CHECKS.get(name)
    if check:
        check(layout, procs, msg_id, reply["status"])


def _py_hello(layout, procs, msg_id, status):
    assert status == "3 words"
    result = json.loads(job_file(layout, "py-hello", msg_id, "result.json").read_text())
    assert result == {"msg_id": msg_id, "words": 3}


def _progress(layout, procs, msg_id, status):
    assert status == "5 steps"
    log = job_file(layout, "progress", msg_id, "stdio.log").read_text()
    assert log.count("working on step") == 5
    # and while it runs, its status is one the console draws as a bar (N/M)
    slow = procs["progress"].call("create", msg={"dest": "progress", "param1": "4",
                                                 "param2": "0.3"})["msg_id"]
    said = wait_for(lambda: procs["progress"].call("status", msg_id=slow)["status"] or None,
                    10, "a run line")
    assert said.endswith("/4 steps") and protocol.progress(said)["total"] == 4, said
    settle(procs["progress"], slow, timeout=20)


def _retry(layout, procs, msg_id, status):
    assert status == "succeeded on attempt 3"
    assert procs["retry"].call("get", msg_id=msg_id)["msg"]["count"] == 3


def _fanout(layout, procs, msg_id, status):
    copy_id = status.rsplit("/", 1)[1]
    assert status.startswith("copied to http") and "/q/hello/" in status
    assert settle(procs["hello"], copy_id)["state"] == "done"
    log = job_file(layout, "hello", copy_id, "stdio.log").read_text()
    assert "param1=from fanout" in log


CHECKS = {"py-hello": _py_hello, "progress": _progress, "retry": _retry, "fanout": _fanout}
