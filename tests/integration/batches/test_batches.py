"""Batches through real daemons, the rq command and real HTTP: members in
two queues, a daemon killed midway, the callback made exactly once, and bad
batches refused whole."""

from __future__ import annotations

import base64
import json
import time

import pytest
from conftest import wait_for
from daemon_util import rq
from web_support import web_server  # noqa: F401

MEMBER = 'sleep 0.005; [ "$RQ_PARAM1" = fail ] && { echo "err asked to" >&3; exit 0; }; ' \
         'echo "done ok" >&3'
CALLBACK = 'q="$RQ_MSG_DIR/../../../.."; cat "$RQ_MSG_DIR/../msg" > "$q/.part.$RQ_MSG_ID" && ' \
           'mv "$q/.part.$RQ_MSG_ID" "$q/called.$RQ_MSG_ID"; echo done >&3'  # seen whole


def callbacks(layout):
    """The callback messages made, from the callback script's copies of them."""
    return [json.loads(p.read_text()) for p in sorted(layout.root.glob("queue/called.*"))]


def batch_file(tmp_path, body):
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(body))
    return str(path)


def test_a_batch_of_1000_over_a_killed_daemon_calls_back_exactly_once(
        layout, make_queue, daemon, tmp_path):
    # Given two member queues and a callback queue
    for name in ("a", "b"):
        make_queue(name, MEMBER, num_workers=4)
    make_queue("cb", CALLBACK)
    procs = {name: daemon(name) for name in ("a", "b", "cb")}
    body = {"messages": [{"dest": "ab"[n % 2], "param1": str(n)} for n in range(1000)],
            "on_done": {"dest": "cb", "param1": "all done"},
            "on_err": {"dest": "cb", "param1": "some failed"}}
    # When the batch is made with rq, and queue a's daemon is killed midway and restarted
    url = rq(layout, "batch", "--file", batch_file(tmp_path, body))
    assert url.startswith("ok http://") and "/batches/b" in url
    bid = url.rsplit("/", 1)[1]
    wait_for(lambda: int(rq(layout, "batchstatus", "--batch", bid).split()[1].split("/")[0])
             > 100, 60, "a tenth of the batch to end")
    procs["a"].kill()
    procs["a"] = daemon("a")
    # Then every member ends, and the callback is made once, on_done, with the counts
    status = wait_for(lambda: (s := rq(layout, "batchstatus", "--batch", bid)) and
                      "callback http" in s and s, 120, "the batch's callback")
    assert status.startswith("ok 1000/1000 done 1000 err 0 relayed 0 gone 0 callback http")
    made = wait_for(lambda: callbacks(layout), 30, "the callback to run")
    assert len(made) == 1 and made[0]["param1"] == "all done"
    assert made[0]["batch_of"] == {"id": bid, "total": 1000, "done": 1000, "err": 0,
                                   "relayed": 0, "gone": 0}
    # and restarting every daemon makes no second one
    for name in ("a", "b", "cb"):
        procs[name].stop()
        procs[name] = daemon(name)
    time.sleep(1.5)
    assert len(callbacks(layout)) == 1
    assert procs["cb"].call("counts")["counts"]["done"] == 1


def test_a_member_in_err_makes_on_err_with_the_counts(layout, make_queue, daemon, tmp_path):
    make_queue("a", MEMBER, num_workers=2)
    make_queue("cb", CALLBACK)
    daemon("a"), daemon("cb")
    body = {"messages": [{"dest": "a", "param1": p} for p in ("1", "fail", "3")],
            "on_done": {"dest": "cb", "param1": "all done"},
            "on_err": {"dest": "cb", "param1": "some failed"}}
    bid = rq(layout, "batch", "--file", batch_file(tmp_path, body)).rsplit("/", 1)[1]
    made = wait_for(lambda: callbacks(layout), 30, "the callback to run")
    assert [m["param1"] for m in made] == ["some failed"]
    assert made[0]["batch_of"] == {"id": bid, "total": 3, "done": 2, "err": 1, "relayed": 0,
                                   "gone": 0}


def test_over_http_its_progress_and_page(layout, make_queue, daemon, web_server):  # noqa: F811
    make_queue("a", 'while [ ! -e "$RQ_MSG_DIR/../../../go" ]; do sleep 0.05; done; '
               'echo done >&3', num_workers=2)
    daemon("a")
    server = web_server(basic_auth={"realm": "rq", "users": {"dana": "pw"}})
    auth = {"Authorization": "Basic " + base64.b64encode(b"dana:pw").decode(),
            "Content-Type": "application/json"}
    body = {"messages": [{"dest": "a"}, {"dest": "a", "param1": "x"}]}
    code, headers, data = server.request("POST", "/batches", json.dumps(body), auth)
    made = json.loads(data)
    assert code == 201 and made["total"] == 2 and made["sealed"] is True
    assert headers["Location"].endswith(f"/batches/{made['id']}")
    code, _h, data = server.request("GET", f"/batches/{made['id']}.json", headers=auth)
    got = json.loads(data)
    assert (code, got["ended"], got["pending"], got["complete"]) == (200, 0, 2, False)
    page = server.request("GET", f"/batches/{made['id']}", headers=auth)[2].decode()
    assert '<progress id="batch-progress" max="1" value="0.0000"' in page
    (layout.queue_dir("a") / "go").write_text("")
    done = wait_for(lambda: (g := json.loads(server.request(
        "GET", f"/batches/{made['id']}.json", headers=auth)[2])) and g["callback"] and g, 30)
    assert done["complete"] and done["counts"]["done"] == 2 and done["callback"] == "none"
    assert server.request("GET", "/batches/b20260101.000000.00000000.json",
                          headers=auth)[0] == 404


@pytest.mark.parametrize(("body", "words"), [
    ({"messages": []}, "messages: a list of at least one message"),
    ({"messages": [{"dest": "a"}, {"dest": "nope"}]}, "messages[1].dest: no queue 'nope'"),
    ({"messages": [{"dest": "a", "priority": "high"}]}, "messages[0]: "),
    ({"messages": [{"dest": "a", "unique_key": "k"}]}, "messages[0].unique_key: set by"),
    ({"messages": [{"dest": "a"}], "on_done": {"param1": "x"}}, "on_done: a message with a dest"),
    ({"messages": [{"dest": "a"}], "extra": 1}, "a batch is an object"),
    ([{"dest": "a"}], "a batch is an object"),
])
def test_a_bad_batch_is_refused_and_nothing_is_made(layout, make_queue, daemon, web_server,  # noqa: F811
                                                     body, words):
    make_queue("a", "echo done >&3")
    proc = daemon("a")
    server = web_server()
    code, _h, data = server.request("POST", "/batches", json.dumps(body),
                                    {"Content-Type": "application/json"})
    assert code == 400 and words in json.loads(data)[1]
    assert not list(layout.batches.glob("*")) if layout.batches.exists() else True
    assert sum(proc.call("counts")["counts"].values()) == 0


def test_a_callback_to_a_pool_queue_is_refused(layout, make_queue, daemon, tmp_path):
    # Given a pool queue here (its daemon not needed: the batch is refused first)
    make_queue("a", "echo done >&3")
    make_queue("p", "echo done >&3", pool={"name": "p"})
    proc = daemon("a")
    body = {"messages": [{"dest": "a"}], "on_done": {"dest": "p"}}
    out = rq(layout, "batch", "--file", batch_file(tmp_path, body), code=1)
    assert "on_done.dest: p is a pool queue: a callback's queue is one of this host's own" \
        in out
    assert sum(proc.call("counts")["counts"].values()) == 0


def test_a_member_its_queue_refuses_fails_the_batch_whole(layout, make_queue, daemon,
                                                          tmp_path):
    # Given a member whose slots its queue could never give (the daemon refuses it)
    make_queue("a", 'sleep 5; echo done >&3', num_workers=2)
    proc = daemon("a")
    body = {"messages": [{"dest": "a"}, {"dest": "a"}, {"dest": "a", "slots": 3}]}
    out = rq(layout, "batch", "--file", batch_file(tmp_path, body), code=1)
    assert "queue a refused its member 2: slots: 3 is more than" in out
    # Then the members made were deleted, and the batch says why it is not made
    wait_for(lambda: sum(proc.call("counts")["counts"].values()) == 0, 15, "members gone")
    [path] = list(layout.batches.iterdir())
    status = rq(layout, "batchstatus", "--batch", path.name)
    assert "failed: messages: queue a refused its member 2" in status


def test_ends_the_batch_missed_are_found_at_start_and_the_callback_is_not_made_twice(
        layout, make_queue, daemon, tmp_path):
    # Given a finished batch whose callback was made
    make_queue("a", MEMBER, num_workers=2)
    make_queue("cb", CALLBACK)
    proc = daemon("a")
    daemon("cb")
    body = {"messages": [{"dest": "a", "param1": str(n)} for n in range(4)],
            "on_done": {"dest": "cb", "param1": "all done"}}
    bid = rq(layout, "batch", "--file", batch_file(tmp_path, body)).rsplit("/", 1)[1]
    wait_for(lambda: callbacks(layout), 30, "the callback to run")
    path = layout.batches / bid
    url = (path / "callback").read_text().strip()
    # When a crash had lost its last ends and its callback mark (the store kept the ends)
    proc.stop()
    ended = (path / "ended.a").read_bytes()
    (path / "ended.a").write_bytes(ended[:64 * 2])
    (path / "callback").unlink()
    # Then the daemon's start writes them again, and the callback stays the one made
    daemon("a")
    wait_for(lambda: (path / "callback").exists(), 15, "the batch settled again")
    assert (path / "callback").read_text().strip() == url
    assert rq(layout, "batchstatus", "--batch", bid).startswith("ok 4/4 done 4 ")
    time.sleep(0.5)
    assert len(callbacks(layout)) == 1
