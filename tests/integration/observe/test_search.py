"""The search index: kept by a real daemon from its events, rebuilt from the
store when missing, searched by text, tag, state and time, and acted on in
bulk (``search`` and ``bulk`` socket ops, HTTP, ``rq ls --since``)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import web_client
from daemon_util import send, settle

from rqsys.errors import BadRequest
from rqsys.search import query

RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]
SCRIPT = """
[ -e "$RQ_MSG_DIR/../../../fixed" ] && { echo "done fixed" >&3; exit 0; }
case "$RQ_PARAM1" in
  db) echo "err database down on db0$RQ_PARAM2" >&3 ;;
  *) echo "done fine $RQ_PARAM1" >&3 ;;
esac
"""


def _search(proc, **args):
    deadline = time.monotonic() + 10
    while True:  # the index thread applies events a moment after they happen
        got = proc.call("search", **args)
        if not got["partial"] or time.monotonic() > deadline:
            return got


def _wait_for(proc, count, **args):
    deadline = time.monotonic() + 10
    while (got := proc.call("search", **args))["total"] != count:
        assert time.monotonic() < deadline, got
        time.sleep(0.05)  # polls the index thread's progress, bounded by the deadline
    return got


@pytest.fixture
def filled(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    errs = [send(proc, param1="db", param2=str(n), tags=["nightly"]) for n in range(3)]
    dones = [send(proc, param1=f"job{n}", tags=["adhoc"]) for n in range(2)]
    for msg_id in errs + dones:
        settle(proc, msg_id)
    _wait_for(proc, 3, state="err")
    _wait_for(proc, 2, state="done")
    return proc, errs, dones


def test_search_finds_by_text_tag_state_and_time(filled):
    proc, errs, dones = filled
    got = _search(proc, text="database db01")
    assert [r["id"] for r in got["rows"]] == [errs[1]]
    assert got["rows"][0]["state"] == "err" and got["rows"][0]["ended"]
    assert {r["id"] for r in proc.call("search", text="datab*")["rows"]} == set(errs)
    assert [r["id"] for r in proc.call("search", tag="adhoc")["rows"]] == dones[::-1]
    assert proc.call("search", state="done", text="database")["total"] == 0
    assert proc.call("search", since=time.time() + 60)["total"] == 0
    assert proc.call("search", since=time.time() - 600, when="ended")["total"] == 5
    got = proc.call("search", sort="created", desc=False, limit=2)
    assert [r["id"] for r in got["rows"]] == errs[:2] and got["total"] == 5
    with pytest.raises(BadRequest, match="sort"):
        proc.client().call("search", sort="colour")


def test_bulk_retry_moves_only_the_matches_and_index_is_rebuilt(layout, filled, daemon):
    proc, errs, dones = filled
    (layout.queue_dir("q") / "fixed").write_text("")
    got = proc.call("bulk", action="retry", text="db00 db02")
    assert got["count"] == 0  # words are ANDed: no message has both
    got = proc.call("bulk", action="retry", text="db02")
    assert (got["matched"], got["count"]) == (1, 1)
    assert settle(proc, errs[2])["status"] == "fixed"
    assert proc.call("status", msg_id=errs[0])["state"] == "err"
    assert proc.call("bulk", action="delete", state="err")["count"] == 2
    _wait_for(proc, 0, state="err")
    with pytest.raises(BadRequest, match="retry applies to err"):
        proc.client().call("bulk", action="retry", state="done")
    # the index is a copy: gone, it is made again from the store at the next start
    proc.stop()
    (layout.queue_dir("q") / "search.sqlite").unlink()
    proc = daemon("q")
    assert _search(proc, state="done")["total"] == 3


def test_an_index_removed_by_hand_is_made_again_whatever_sqlite_left(layout, filled, daemon):
    # Given a daemon killed (its index's -wal and -shm stay), and the index
    # file then removed by hand (the documented way to have it made again)
    proc, _errs, _dones = filled
    qdir = layout.queue_dir("q")
    proc.kill()
    proc.proc.wait(10)
    assert (qdir / "search.sqlite-wal").exists()
    (qdir / "search.sqlite").unlink()
    # When the daemon starts again, the index is made from the store, all of it
    proc = daemon("q")
    got = _search(proc)
    assert (got["partial"], got["total"]) == (False, 5)
    # And a clean stop leaves the file whole, without SQLite's side files
    proc.stop()
    assert sorted(p.name for p in qdir.glob("search.sqlite*")) == ["search.sqlite"]


def test_http_search_and_bulk_and_rq_ls_since(layout, filled):
    proc, errs, _dones = filled
    client = web_client(layout)
    got = client.simulate_get("/q/q/search.json", params={"text": "database", "since": "1h"})
    assert got.status_code == 200 and got.json["total"] == 3
    bad = client.simulate_get("/q/q/search.json", params={"since": "yesterdayish"})
    assert bad.status_code == 400 and "since: not a time" in bad.json[1]
    bad = client.simulate_get("/q/q/search.json", params={"sort": "x"})
    assert bad.status_code == 400 and "sort must be one of" in bad.json[1]
    bad = client.simulate_post("/q/q/bulk", params={"action": "explode"})
    assert bad.status_code == 400 and "action" in bad.json[1]
    for field, value in (("state", 5), ("since", 5), ("dest", ["q2"])):  # were a 500
        bad = client.simulate_post("/q/q/bulk", json={"mesg": 1, "action": "delete", field: value})
        assert bad.status_code == 400 and f"{field} must be text" in bad.json[1], bad.json
    assert proc.call("counts")["counts"]["err"] == 3  # nothing was deleted
    out = subprocess.run([*RQ, "--root", str(layout.root), "ls", "--queue", "q", "--state",
                          "err", "--since", "1h"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.split() == ["ok", "3", *errs[::-1]]
    out = subprocess.run([*RQ, "--root", str(layout.root), "ls", "--queue", "q",
                          "--since", "soon"], capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "--since: not a time" in out.stderr


def test_parse_when():
    assert query.parse_when("2h", "since", now=10_000) == 10_000 - 7200
    assert query.parse_when("2026-11-24T00:00Z", "since") == 1795478400
    with pytest.raises(BadRequest, match="until: not a time"):
        query.parse_when("tomorrow", "until")


def test_bulk_move_to_another_queue(make_queue, daemon, filled):
    proc, errs, dones = filled
    make_queue("q2", SCRIPT)
    other = daemon("q2")
    got = proc.call("bulk", action="move", dest="q2", state="done", tag="adhoc")
    assert (got["matched"], got["count"], got["passed_over"]) == (2, 2, 0)
    assert proc.call("counts")["counts"]["done"] == 0
    moved = _wait_for(other, 2, state="done")["rows"]
    assert sorted(r["params"] for r in moved) == ["job0 q2", "job1 q2"]
    for bad, why in (({}, "dest: name another queue"), ({"dest": "q"}, "dest: name another"),
                     ({"dest": "../x"}, "invalid dest")):
        with pytest.raises(BadRequest, match=why):
            proc.client().call("bulk", action="move", state="err", **bad)
    with pytest.raises(BadRequest, match="with action move only"):
        proc.client().call("bulk", action="delete", dest="q2")


def test_a_queued_create_is_indexed_from_memory_not_read_back(tmp_path):
    # Given an index whose loop hands it each queued message (the daemon's
    # Schedule), and a message whose directory is not on disk at all
    from rqsys.search.index import SearchIndex, connect
    from rqsys.search.rows import apply
    from rqsys.store import QueueView

    view = QueueView(tmp_path / "q")
    msg = {"param1": "alpha", "param2": "beta", "tags": ["night"], "dest": "q"}
    index = SearchIndex(view, {"20261124.0200.00.000.0": msg}.get)
    db = connect(tmp_path / "search.sqlite")
    # When the created event is told and applied
    index("created", "in que", "20261124.0200.00.000.0", {"RQ_STATE": "que"})
    (event,) = index._turn
    msg["param1"] = "changed later"  # the loop's copy moves on; the event keeps its own
    apply(db, view, event)
    # Then its row holds its params and tags, found by text and tag
    row = db.execute("SELECT state, params, tags, created FROM msgs").fetchone()
    assert row[:3] == ("que", "alpha beta q", "night") and row[3] == pytest.approx(
        event[5])
    assert db.execute("SELECT count(*) FROM fts WHERE fts MATCH 'alpha'").fetchone() == (1,)


def test_a_stream_of_turns_is_one_transaction_and_a_lone_event_waits_only_gather(tmp_path):
    # Given an index thread's queue fed a loop turn's events every 10 ms for 0.3 s
    import queue
    import threading

    from rqsys.search import index as searchindex
    from rqsys.store import QueueView

    index = searchindex.SearchIndex(QueueView(tmp_path / "q"))

    def turn(i: int) -> list:
        return [("created", "", f"m{i}", "que", None, 0.0, None)]

    def feed() -> None:
        for i in range(30):
            index.todo.put(turn(i))
            time.sleep(0.01)

    feeder = threading.Thread(target=feed)
    feeder.start()
    # When the thread takes its batches until it has all of them
    batches: list[list] = []
    while sum(map(len, batches)) < 30:
        batches.append(index._next_batch())
    feeder.join()
    # Then the burst went in at most a few transactions, not one every GATHER
    assert len(batches) <= 3, [len(b) for b in batches]
    # and a lone event is taken once GATHER has passed, not GATHER_BUSY
    index.todo.put(turn(99))
    began = time.monotonic()
    assert len(index._next_batch()) == 1
    assert time.monotonic() - began < searchindex.GATHER_BUSY
    # and a close while gathering ends the batch, then the thread
    index.todo.put(turn(100))
    index.todo.put(None)
    assert len(index._next_batch()) == 1 and index._next_batch() is None
    with pytest.raises(queue.Empty):
        index.todo.get_nowait()


def test_a_param_search_is_looked_up_in_an_index_an_older_rqsys_made(tmp_path):
    # Given a queue's index file as the previous version made it (no params' indexes)
    from rqsys.search import index as searchindex
    from rqsys.store import QueueView

    view = QueueView(tmp_path / "q")
    (tmp_path / "q").mkdir()
    old = searchindex.connect(view.qdir / searchindex.FILE)  # the schema it shares with it
    assert not old.execute("SELECT 1 FROM sqlite_master WHERE name LIKE 'msgs_p_'").fetchall()
    old.close()
    # When the daemon's index thread starts on it
    index = searchindex.SearchIndex(view)
    index.start()
    assert index.ready.wait(10)
    index.close()
    # Then a search by a param is a lookup in its own index, not a scan of every row
    db = searchindex.open_reader(view.qdir / searchindex.FILE)
    source, _order, where, values = query._plan({"params": {"2": {"op": "eq", "value": "x"}},
                                                  "state": "que"})
    plan = " ".join(str(row[-1]) for row in db.execute(
        f"EXPLAIN QUERY PLAN SELECT m.id FROM {source} WHERE {where}", values))
    assert "USING INDEX msgs_p2" in plan, plan
