"""Dependencies (message ``after``) through real daemons: across two queues,
across a restart, err propagation, the ``wait`` policy, refusals."""

# ruff: noqa: F811  (the web_server fixture imported from web_support is a parameter)
from __future__ import annotations

import subprocess

import pytest
from conftest import need, wait_for
from daemon_util import RQ, send, settle
from netns import NetLab, Rqsys, netns_available
from web_support import web_server  # noqa: F401

from rqsys.errors import BadRequest

GATED = 'while [ ! -e "$GATE" ]; do sleep 0.02; done; echo "done gated" >&3'
# err for param1=bad until the file $FIXED exists
FLAKY = ('if [ "$RQ_PARAM1" = bad ] && [ ! -e "$FIXED" ]; then echo "err boom" >&3; '
         'else echo "done $RQ_PARAM1" >> "$RUNS"; echo done >&3; fi')


def _status(proc, msg_id):
    return proc.call("status", msg_id=msg_id)


def test_waits_for_a_message_of_another_queue_across_a_restart(tmp_path, make_queue, daemon):
    # Given queue a whose script waits for a gate, and queue b
    gate = tmp_path / "gate"
    make_queue("a", GATED, env_vars={"GATE": str(gate)})
    make_queue("b", "echo done >&3")
    a, b = daemon("a"), daemon("b")
    first = a.call("create", msg={})
    # When b gets a message after a's
    waiting = send(b, after=[first["url"]])
    # Then it waits in que, saying for how many, even across a restart of b
    wait_for(lambda: _status(b, waiting)["status"] == "waiting for 1", what="waiting for 1")
    b.stop()
    b = daemon("b")
    assert _status(b, waiting)["state"] == "que"
    assert _status(b, waiting)["status"] == "waiting for 1"
    # and runs once a's message is done (its end pushed by a's daemon)
    gate.write_text("")
    assert settle(a, first["msg_id"])["state"] == "done"
    assert settle(b, waiting)["state"] == "done"


def test_err_propagates_and_the_wait_policy_waits_for_a_retry(tmp_path, make_queue, daemon):
    # Given a paused queue: a message that fails, one after it, one after that,
    # and one after it that waits on err
    runs = tmp_path / "runs"
    make_queue("q", FLAKY, env_vars={"FIXED": str(tmp_path / "fixed"), "RUNS": str(runs)})
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    bad = send(proc, param1="bad")
    second = send(proc, param1="second", after=[bad])
    third = send(proc, param1="third", after=[second])
    patient = send(proc, param1="patient", after=[bad], after_policy="wait")
    # When the queue resumes and the first fails
    proc.call("adminoper", oper="resume")
    assert settle(proc, bad)["state"] == "err"
    # Then the ones after it fail with the reason, in turn; the patient one waits
    url = proc.call("get", msg_id=bad)["url"]
    got = settle(proc, second)
    assert got["state"] == "err" and got["status"] == f"dependency {url} ended in err: boom"
    assert settle(proc, third)["state"] == "err"
    assert "waiting for a retry" in wait_for(
        lambda: (s := _status(proc, patient)["status"]) != "waiting for 1" and s)
    # When the failed one is fixed and retried, the patient one runs after it
    (tmp_path / "fixed").write_text("")
    proc.call("retry", msg_id=bad)
    assert settle(proc, patient)["state"] == "done"
    assert runs.read_text().split() == ["done", "bad", "done", "patient"]


def test_unknown_and_bad_dependencies_are_refused_naming_the_field(make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    url = proc.call("create", msg={})["url"]
    # an id that does not exist (so no message can wait for itself: no cycle)
    with pytest.raises(BadRequest, match="after: no message .*20000101.0000.00.000"):
        send(proc, after=[url.rsplit("/", 1)[0] + "/20000101.0000.00.000"])
    for bad in ("x", [], [5], [url, url], ["http://h/q/x/notanid"], ["http://h/nope"]):
        with pytest.raises(BadRequest, match="after"):
            send(proc, after=bad)
    with pytest.raises(BadRequest, match="after_policy"):
        send(proc, after=[url], after_policy="sometimes")
    with pytest.raises(BadRequest, match="after_policy"):
        send(proc, after_policy="wait")
    # in a bulk create: this host's dependencies are taken, another host's refused alone
    got = proc.call("create_many", msgs=[{"after": [url]}, {
        "after": ["http://192.0.2.1:3333/q/x/20000101.0000.00.000"]}])["results"]
    assert "msg_id" in got[0] and "after: another host" in got[1]["error"]
    assert settle(proc, got[0]["msg_id"])["state"] == "done"


def test_after_over_http_and_rq(make_queue, daemon, web_server, layout):
    # Given a paused queue holding one message
    server = web_server()
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    first = proc.call("create", msg={})
    # the web form's mesg_after and mesg_after_policy: waiting, shown on its page
    status, answer = server.form("/q/q/new_message", {"mesg_after": first["url"],
                                                      "mesg_after_policy": "wait"})
    assert status == 200 and answer[0] == "ok", answer
    web_id = answer[1].rsplit("/", 1)[1]
    status, _h, page = server.request("GET", f"/q/q/{web_id}")
    assert status == 200 and b'id="msg-after"' in page and first["url"].encode() in page
    assert _status(proc, web_id)["status"] == "waiting for 1"
    status, answer = server.form("/q/q/new_message", {"mesg_after": "nothing-like-a-url"})
    assert status == 400 and "after" in answer[1], answer
    # rq sendmesg --after (an id of the same queue) and a refused --after-policy
    out = _rq(layout, "sendmesg", "--dest", "q", "--after", first["msg_id"])
    assert out.returncode == 0 and out.stdout.startswith("ok "), out
    out = _rq(layout, "sendmesg", "--dest", "q", "--after", first["msg_id"],
              "--after-policy", "sometimes")
    assert out.returncode == 2 and "argument --after-policy: invalid choice" in out.stderr
    out = _rq(layout, "sendmesg", "--dest", "q", "--after", "20000101.0000.00.000")
    assert out.returncode == 1 and out.stdout.startswith("fail after: no message"), out
    assert "rq: after: no message" in out.stderr
    proc.call("adminoper", oper="resume")
    assert settle(proc, web_id)["state"] == "done"


def _rq(layout, *args):
    return subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=30)


def test_waits_for_a_message_on_another_host(tmp_path):
    need(netns_available(), "network namespaces need root and iproute2")
    lab, hosts = NetLab(), []
    try:
        # Given two hosts: b's queue x waits for a gate, a's queue y runs at once
        for name in ("a", "b"):
            lab.host(name)
            hosts.append(Rqsys(lab, name, tmp_path / name))
        a, b = hosts
        gate = tmp_path / "gate"
        _add_queue(b, "x", '[ "$RQ_PARAM1" = bad ] && { echo "err far boom" >&3; exit 0; }\n'
                   + GATED.replace("$GATE", str(gate)))
        _add_queue(a, "y", "echo done >&3")
        for host, queue in ((a, "y"), (b, "x")):
            host.start(wait_queues=(queue,))
            wait_for(host.http_ok, 30, f"the web of {host.host}")
        far = b.call("x", "create", msg={})
        # Then a message unknown to b is refused at create, naming the field
        with pytest.raises(BadRequest, match="after: no message"):
            a.call("y", "create", msg={"after": [far["url"].rsplit("/", 1)[0]
                                                  + "/20000101.0000.00.000"]})
        # When a's message waits for b's
        waiting = a.call("y", "create", msg={"after": [far["url"]]})["msg_id"]
        assert a.call("y", "status", msg_id=waiting)["status"] == "waiting for 1"
        # Then it runs once b's is done (a's daemon polls b's state.json)
        gate.write_text("")
        wait_for(lambda: a.call("y", "status", msg_id=waiting)["state"] == "done", 60,
                 "a's message done after b's")
        assert b.call("x", "status", msg_id=far["msg_id"])["state"] == "done"
        # And one after b's failed message fails with b's reason
        bad = b.call("x", "create", msg={"param1": "bad"})["url"]
        failed = a.call("y", "create", msg={"after": [bad]})["msg_id"]
        got = wait_for(lambda: (st := a.call("y", "status", msg_id=failed))["state"] == "err"
                       and st, 30, "a's message failed after b's")
        assert got["status"].startswith(f"dependency {bad} ended in err: ")
        assert got["status"].endswith("far boom")  # as b's message page says it
    finally:
        for host in hosts:
            host.stop()
        lab.close()


def _add_queue(host, name, body):
    entry = host.scandir / name
    entry.mkdir()
    (entry / "run").write_text(f"#!/bin/bash\n{body}\n")
    (entry / "run").chmod(0o755)
