"""Bulk enqueue through every door: the socket's create_many, HTTP
new_messages (a JSON array, NDJSON) and ``rq sendmesg --bulk``, against
real daemons; a bulk send cut by SIGKILL loses no answered message."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from conftest import wait_for, web_client
from daemon_util import RQ, rq, store_of
from web_support import web_server  # noqa: F401

from rqsys.errors import BadRequest, Unavailable


@pytest.fixture
def paused(make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    proc.call("adminoper", oper="pause")  # they stay in que: the test reads them there
    return proc


def test_a_bulk_send_runs_in_the_order_sent(layout, make_queue, daemon, tmp_path):
    # Given a queue with one worker whose script notes each param1, paused while
    # 25 messages arrive in one create_many (their ids made in one millisecond)
    order = tmp_path / "order"
    make_queue("fifo", f'echo "$RQ_PARAM1" >> {order}; echo done >&3', num_workers=1)
    proc = daemon("fifo")
    proc.call("adminoper", oper="pause")
    results = proc.call("create_many", msgs=[{"param1": str(n)} for n in range(25)])["results"]
    assert all("msg_id" in r for r in results)
    # The que lists them in run order, and they run in the order sent
    que = proc.call("list", state="que", limit=50)["ids"]
    assert que == [r["msg_id"] for r in results]
    proc.call("adminoper", oper="up")
    wait_for(lambda: order.exists() and len(order.read_text().split()) == 25, 30, "25 runs")
    assert order.read_text().split() == [str(n) for n in range(25)]


def test_create_many_fails_a_bad_message_alone(layout, paused):
    msgs = [{"param1": "a"}, {"param1": "b", "priority": "high"}, {"param1": "c"},
            {"dest": "other"}, {"param1": "e", "tags": ["x"]}]
    results = paused.call("create_many", msgs=msgs)["results"]
    assert [r.get("index") for r in results] == [None, 1, None, 3, None]
    assert "priority" in results[1]["error"] and results[1]["kind"] == "BadRequest"
    assert "dest 'other'" in results[3]["error"]
    store = store_of(layout, "q")
    made = [r["msg_id"] for r in results if "msg_id" in r]
    assert [store.read_msg("que", i)["param1"] for i in made] == ["a", "c", "e"]
    assert made == sorted(made) and all(r["url"].endswith(r["msg_id"]) for r in results[::2])
    for bad in ([], "x", [{}] * 10001):
        with pytest.raises(BadRequest, match="messages"):
            paused.call("create_many", msgs=bad)


def test_new_messages_over_http(layout, paused, web_server):
    server = web_server()
    body = json.dumps([{"param1": "1"}, {"param1": 2}, {"param1": "3"}])
    status, _h, data = server.request("POST", "/q/q/new_messages", body,
                                      {"Content-Type": "application/json"})
    got = json.loads(data)
    assert status == 200 and (got["created"], got["failed"]) == (2, 1), got
    assert got["results"][1]["index"] == 1 and "param1" in got["results"][1]["error"]
    lines = "\n".join([json.dumps({"param1": "n1"}), "not json", json.dumps({"param1": "n3"})])
    status, _h, data = server.request("POST", "/q/q/new_messages", lines,
                                      {"Content-Type": "application/x-ndjson"})
    got = json.loads(data)
    assert status == 200 and [r.get("index") for r in got["results"]] == [None, 1, None]
    assert store_of(layout, "q").read_msg("que", got["results"][2]["msg_id"])["param1"] == "n3"
    for ctype, bad in (("application/json", "{}"), ("application/json", "[1,"),
                       ("text/csv", "a,b")):
        status, _h, data = server.request("POST", "/q/q/new_messages", bad,
                                          {"Content-Type": ctype})
        assert status == 400 and json.loads(data)[0] == "fail", data


def test_new_messages_larger_than_a_socket_line_are_all_created(layout, paused, web_server):
    # Given 1,000 messages of 9 KB each: one create_many of them is over the
    # socket's 8 MiB line (it was a 502, and nothing was created)
    server = web_server()
    body = json.dumps([{"param1": f"{n:04d}" + "x" * 9000} for n in range(1000)])
    status, _h, data = server.request("POST", "/q/q/new_messages", body,
                                      {"Content-Type": "application/json"})
    got = json.loads(data)
    # Then all are created, in order (the batch went in halves)
    assert status == 200 and (got["created"], got["failed"]) == (1000, 0), data[:300]
    store = store_of(layout, "q")
    assert [store.read_msg("que", r["msg_id"])["param1"][:4] for r in got["results"][::250]] == [
        "0000", "0250", "0500", "0750"]


def test_an_ndjson_line_too_long_fails_alone(layout, paused, web_server):
    # Given NDJSON with one line over 2 MiB among good ones (it was a 413 for the
    # whole request, after the lines before it were created)
    server = web_server()
    lines = [json.dumps({"param1": "a"}), json.dumps({"param1": "b" * (3 << 20)}),
             json.dumps({"param1": "c"})]
    status, _h, data = server.request("POST", "/q/q/new_messages", "\n".join(lines),
                                      {"Content-Type": "application/x-ndjson"})
    got = json.loads(data)
    assert status == 200 and (got["created"], got["failed"]) == (2, 1), data[:300]
    assert got["results"][1]["index"] == 1 and "over 2097152 bytes" in got["results"][1]["error"]
    assert store_of(layout, "q").read_msg("que", got["results"][2]["msg_id"])["param1"] == "c"


def test_a_daemon_failing_after_a_batch_answers_what_was_created(layout, paused, monkeypatch):
    # Given a web whose second create_many fails (the daemon went away)
    from rqsys.web.context import Web
    from rqsys.wire import bulk as bulkinput
    monkeypatch.setattr(bulkinput, "BATCH", 2)
    real, calls = Web.call, []

    def failing_second(self, queue, op, **args):
        calls.append(op)
        if op == "create_many" and calls.count("create_many") == 2:
            raise Unavailable("queue q: [Errno 32] Broken pipe")
        return real(self, queue, op, **args)
    monkeypatch.setattr(Web, "call", failing_second)
    client = web_client(layout)
    # When five messages are sent
    got = client.simulate_post("/q/q/new_messages", json=[{"param1": str(n)} for n in range(5)])
    # Then the answer says which were created and where it stopped (a 503 had a
    # client send the created ones again)
    assert got.status_code == 200, got.text
    assert (got.json["created"], len(got.json["results"])) == (2, 2)
    assert got.json["stopped"] == {"index": 2, "error": "queue q: [Errno 32] Broken pipe",
                                   "kind": "Unavailable"}
    assert paused.call("counts")["counts"]["que"] == 2


def test_rq_sendmesg_bulk(layout, paused, tmp_path):
    src = tmp_path / "msgs.ndjson"
    src.write_text('{"param1": "x"}\n\n{"param1": 5}\n{"param2": "y"}\n')
    proc = subprocess.run([*RQ, "--root", str(layout.root), "sendmesg", "--dest", "q",
                           "--param3", "default", "--bulk", str(src)],
                          capture_output=True, text=True, timeout=30)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1 and len(lines) == 3, (proc.stdout, proc.stderr)
    assert lines[0].startswith("ok http") and lines[1].startswith("fail 1: ")
    msg = store_of(layout, "q").read_msg("que", lines[2].rsplit("/", 1)[1])
    assert (msg["param2"], msg["param3"]) == ("y", "default")
    out = rq(layout, "sendmesg", "--dest", "q", "--bulk", str(tmp_path / "missing"), code=1)
    assert out.startswith("fail --bulk ") and "No such file" in out


def test_bulk_killed_halfway_loses_no_answered_message(layout, paused, daemon, tmp_path):
    # Given 10,000 messages sent with rq sendmesg --bulk (batches of 1000)
    src = tmp_path / "many.ndjson"
    src.write_text("".join(json.dumps({"param1": str(n)}) + "\n" for n in range(10000)))
    sender = subprocess.Popen([*RQ, "--root", str(layout.root), "sendmesg", "--dest", "q",
                               "--bulk", str(src)], stdout=subprocess.PIPE, text=True)
    answered = []
    try:
        # When the daemon is killed once 3000 have been answered
        while len(answered) < 3000:
            line = sender.stdout.readline()
            assert line, "the sender ended early"
            answered.append(line)
        paused.kill(signal.SIGKILL)
        answered += sender.stdout.readlines()
    finally:
        sender.stdout.close()
        code = sender.wait(30)
    # Then every URL answered ok exists after a restart, and the sender said it failed
    assert code in (0, 3)
    urls = [line.split()[1] for line in answered if line.startswith("ok ")]
    assert len(urls) >= 3000
    proc = daemon("q")
    store = store_of(layout, "q")
    assert all(store.find(url.rsplit("/", 1)[1]) == "que" for url in urls)
    wait_for(lambda: proc.call("counts")["counts"]["que"] >= len(urls), what="que count")


def test_a_halved_batch_whose_second_half_fails_keeps_the_first_halfs_answers():
    # Given a batch over the socket's line, sent in halves, whose second half fails
    from rqsys.wire import bulk as bulkinput
    from rqsys.wire.framing import LineTooLong

    def create_many(msgs):
        if len(msgs) == 4:
            raise LineTooLong("too long")
        if msgs[0]["param1"] == "2":
            raise Unavailable("queue q: [Errno 32] Broken pipe")
        return [{"msg_id": f"id{m['param1']}", "url": "u"} for m in msgs]
    got = []
    # When it is sent, Then the first half's answers come out before the failure
    # (they were lost, and the answer's "stopped" index had the client resend them)
    with pytest.raises(Unavailable):
        for result in bulkinput.send([{"param1": str(n)} for n in range(4)], create_many):
            got.append(result)
    assert [r["msg_id"] for r in got] == ["id0", "id1"]
