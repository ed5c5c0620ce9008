"""The console's one search box across queues (issue 48): the filter language
(``rqsys.search.filters``) answered by real queue daemons' indexes over HTTP,
a filtered search as a URL, the bulk actions on all it matches in every
queue, and an index made by the previous rqsys (no param or priority
columns) made again at start."""

from __future__ import annotations

import sqlite3
import time
from urllib.parse import parse_qs, urlsplit

from conftest import web_client
from daemon_util import send, settle

SCRIPT = """
[ -e "$RQ_MSG_DIR/../../../fixed" ] && { echo "done fixed" >&3; exit 0; }
case "$RQ_PARAM1" in
  db) echo "err database down on db0$RQ_PARAM2" >&3 ;;
  *) echo "done fine $RQ_PARAM1" >&3 ;;
esac
"""


def _found(client, q):
    got = client.simulate_get("/search.json", params={"q": q})
    assert got.status_code == 200, got.text
    return {name: {s: n for s, n in counts.items() if n}
            for name, counts in got.json["queues"].items()}


def _settled(client, q, want, deadline=10.0):
    end = time.monotonic() + deadline
    while (got := _found(client, q)) != want:  # the index threads apply events a moment after
        assert time.monotonic() < end, got
        time.sleep(0.05)
    return got


def _queues(make_queue, daemon):
    procs = {}
    for name in ("etl-a", "etl-b", "billing"):
        make_queue(name, SCRIPT)
        procs[name] = daemon(name)
    sent = {
        "etl-a": [send(procs["etl-a"], param1="db", param2="1", priority=7),
                  send(procs["etl-a"], param1="db", param2="2", priority=1),
                  send(procs["etl-a"], param1="ok", param2="2026-11-03")],
        "etl-b": [send(procs["etl-b"], param1="db", param2="3", priority=9, tags=["nightly"])],
        "billing": [send(procs["billing"], param1="db", param2="4")],
    }
    for name, ids in sent.items():
        for msg_id in ids:
            settle(procs[name], msg_id)
    return procs, sent


def test_the_filter_language_across_queues(layout, make_queue, daemon):
    procs, _sent = _queues(make_queue, daemon)
    client = web_client(layout)
    _settled(client, "state:err", {"etl-a": {"err": 2}, "etl-b": {"err": 1},
                                   "billing": {"err": 1}})
    assert _found(client, "state:err queue:etl-*") == {"etl-a": {"err": 2}, "etl-b": {"err": 1}}
    assert _found(client, "queue:billing queue:etl-b") == {"etl-b": {"err": 1},
                                                           "billing": {"err": 1}}
    assert _found(client, "param2:3") == {"etl-b": {"err": 1}}
    assert _found(client, "param2:~2026-11") == {"etl-a": {"done": 1}}
    assert _found(client, "param2:2026") == {}  # equal, not holding
    assert _found(client, "priority:>5 state:err") == {"etl-a": {"err": 1}, "etl-b": {"err": 1}}
    assert _found(client, "priority:<=1 queue:etl-a") == {"etl-a": {"err": 1, "done": 1}}
    assert _found(client, "tag:nightly") == {"etl-b": {"err": 1}}
    assert _found(client, '"database" db04') == {"billing": {"err": 1}}
    assert _found(client, "since:1h state:done") == {"etl-a": {"done": 1}}
    assert _found(client, "until:1h") == {}
    # what is wrong is said, whole
    bad = client.simulate_get("/search.json", params={"q": "stat:err"})
    assert bad.status_code == 400 and "no key 'stat'" in bad.json[1]
    # the page: counts linked to the queue's tab when words are all it says, else to
    # the search narrowed to a queue and state (a URL); the bulk actions' counts in
    # their buttons; the keys offered as one types
    page = client.simulate_get("/search", params={"q": "state:err queue:etl-*"}).text
    assert 'href="/q/etl-a?state=err"' in page
    assert "Retry all 3 matching" in page and "Delete all 3 matching" in page
    page = client.simulate_get("/search", params={"q": "priority:>5 queue:etl-*"}).text
    assert "/search?q=priority%3A%3E5+queue%3Aetl-%2A+queue%3Aetl-a+state%3Aerr" in page
    page = client.simulate_get("/search", params={"q": "database"}).text
    assert 'href="/q/etl-b?state=err&amp;text=database"' in page
    assert '<option value="queue:billing">' in page and '<option value="priority:">' in page


def test_bulk_actions_on_all_that_match_in_every_queue(layout, make_queue, daemon):
    procs, sent = _queues(make_queue, daemon)
    client = web_client(layout)
    _settled(client, "state:err", {"etl-a": {"err": 2}, "etl-b": {"err": 1},
                                   "billing": {"err": 1}})
    for name in ("etl-a", "etl-b"):
        (layout.queue_dir(name) / "fixed").write_text("")
    # retry: the err ones of priority over 5, in the etl queues only
    got = client.simulate_post("/search", params={"action": "retry",
                                                   "q": "queue:etl-* priority:>5"})
    assert got.status_code == 303, got.text
    back = parse_qs(urlsplit(got.headers["location"]).query)
    assert back["q"] == ["queue:etl-* priority:>5"]
    assert back["done"] == ["retry: 2 of 2 matching, in 2 queue(s)"]
    assert settle(procs["etl-a"], sent["etl-a"][0])["status"] == "fixed"
    assert settle(procs["etl-b"], sent["etl-b"][0])["status"] == "fixed"
    assert procs["etl-a"].call("status", msg_id=sent["etl-a"][1])["state"] == "err"
    assert procs["billing"].call("counts")["counts"]["err"] == 1
    # delete: all that match in billing
    got = client.simulate_post("/search", params={"action": "delete", "q": "queue:billing"})
    assert got.status_code == 303
    assert parse_qs(urlsplit(got.headers["location"]).query)["done"] == [
        "delete: 1 of 1 matching, in 1 queue(s)"]
    assert procs["billing"].call("counts")["counts"]["err"] == 0
    # a bad action or filter acts on nothing
    for params in ({"action": "explode", "q": "state:err"}, {"action": "delete", "q": "x:y"},
                   {"action": "delete"}):
        assert client.simulate_post("/search", params=params).status_code == 400
    assert procs["etl-a"].call("counts")["counts"]["err"] == 1


def test_an_index_from_the_previous_rqsys_is_made_again(layout, make_queue, daemon):
    # Given a queue whose index an older rqsys made (no param or priority columns)
    make_queue("q", SCRIPT)
    proc = daemon("q")
    msg_id = send(proc, param1="db", param2="7", priority=3)
    settle(proc, msg_id)
    proc.stop()
    path = layout.queue_dir("q") / "search.sqlite"
    path.unlink()
    old = sqlite3.connect(path)
    old.executescript("""CREATE TABLE msgs(id TEXT UNIQUE NOT NULL, state TEXT NOT NULL,
      created REAL, started REAL, ended REAL, run_s REAL, status TEXT DEFAULT '',
      params TEXT DEFAULT '', tags TEXT DEFAULT '', text TEXT DEFAULT '');""")
    old.close()
    # When the daemon starts, the index is made again with them, from the store
    proc = daemon("q")
    client = web_client(layout)
    _settled(client, "param2:7 priority:3", {"q": {"err": 1}})
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2
