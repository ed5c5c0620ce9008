"""Message timelines through a real daemon: what each run leaves in the
message's ``timeline`` file, and the times in ``get``, the web JSON and pages."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import time

import pytest
from conftest import web_client
from daemon_util import send, settle, store_of

from rqsys import config
from rqsys.errors import BadRequest
from rqsys.message import message_url
from rqsys.observe import timeline
from rqsys.observe.events import EventLog

FORM_HDR = {"Content-Type": "application/x-www-form-urlencoded"}


def _events(layout, msg_id, state):
    return timeline.read(store_of(layout, "q").msg_dir(state, msg_id))


def test_done_run_leaves_created_start_status_exit_and_end(layout, make_queue, daemon):
    # Given a script that reports progress, uses 40 MB and ends done
    make_queue("q", """
        echo "run step 1" >&3
        python3 -c 'x = bytearray(40 * 1024 * 1024); sum(range(200000))'
        echo "done all good" >&3
    """)
    proc = daemon("q")
    # When a message runs
    msg_id = send(proc)
    settle(proc, msg_id)
    # Then its timeline tells each event, in order, with who and what
    events = _events(layout, msg_id, "done")
    assert [e["ev"] for e in events] == ["created", "started", "status", "status", "exit",
                                         "done"]
    created, started, step, last, ended, done = events
    assert created["by"] == f"socket pid {os.getpid()} uid {os.getuid()}"
    assert created["state"] == "que"
    assert started["run"] == 1 and started["host"] == socket.gethostname()
    assert started["pid"] > 0 and step["text"] == "step 1" and last["text"] == "all good"
    assert ended["exit_status"] == 0 and ended["maxrss_kb"] >= 40 * 1024
    assert ended["utime_s"] + ended["stime_s"] > 0 and ended["run_s"] > 0
    assert done["text"] == "all good" and done["count"] == 0
    # and get gives its times, consistent with the timeline
    got = proc.call("get", msg_id=msg_id)
    assert got["created_at"] == created["t"] <= got["started_at"] == started["t"]
    assert got["ended_at"] == done["t"] >= got["started_at"]
    assert got["wait_s"] == pytest.approx(started["t"] - created["t"], abs=0.002)
    assert got["run_s"] == ended["run_s"] and got["timeline"] == timeline.shown(events, 200)


def test_err_by_signal_and_resend_runs_are_told(layout, make_queue, daemon):
    # Given a script that resends on its first run and is killed on its second
    make_queue("q", """
        if [ "$RQ_COUNT" = 0 ]; then echo "resend 0-try again" >&3; exit 0; fi
        kill -KILL $$
    """)
    proc = daemon("q")
    msg_id = send(proc)
    assert settle(proc, msg_id)["state"] == "err"
    # Then the timeline has both runs, the resend and the signal that ended the second
    events = _events(layout, msg_id, "err")
    kinds = [e["ev"] for e in events]
    assert kinds == ["created", "started", "status", "exit", "resend", "started", "exit",
                     "err"]
    assert [e["run"] for e in events if e["ev"] == "started"] == [1, 2]
    assert events[4]["text"] == "try again" and events[4]["count"] == 1
    assert events[6]["signal"] == "SIGKILL" and "exit_status" not in events[6]
    assert events[7]["count"] == 1
    got = proc.call("get", msg_id=msg_id)
    assert got["started_at"] == events[5]["t"] and got["run_s"] == events[6]["run_s"]


def test_clone_commit_and_queued_message_times(layout, make_queue, daemon):
    # Given a paused queue (nothing runs)
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    prep = proc.call("create", msg={}, state="prep")["msg_id"]
    proc.call("commit", msg_id=prep)
    clone = proc.call("clone", msg_id=prep)["msg_id"]
    # Then a committed message says so, a clone names its source, and times not yet
    # known are null
    assert [e["ev"] for e in _events(layout, prep, "que")] == ["created", "committed"]
    source = message_url(config.load_system_config(layout), "q", prep)
    assert _events(layout, clone, "que")[0]["by"] == f"clone {source}"
    got = proc.call("get", msg_id=clone)
    assert got["created_at"] > 0
    assert (got["started_at"], got["ended_at"], got["wait_s"], got["run_s"]) == (None,) * 4


def test_a_bad_creator_is_refused_naming_the_field(layout, make_queue, daemon):
    make_queue("q", 'echo "done" >&3\n')
    proc = daemon("q")
    with pytest.raises(BadRequest, match=r"invalid creator \(by\)"):
        proc.client().call("create", msg={}, by="x" * 201)
    with pytest.raises(BadRequest, match=r"invalid creator \(by\)"):
        proc.client().call("create", msg={}, by=7)


def test_web_json_page_and_listing_show_times(layout, make_queue, daemon):
    make_queue("q", 'echo "done fine" >&3\n')
    proc = daemon("q")
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    got = client.simulate_post("/q/q/new_message", headers=FORM_HDR, body="mesg={}",
                               remote_addr="192.0.2.7")
    msg_id = got.json[1].rsplit("/", 1)[1]
    settle(proc, msg_id)
    shown = client.simulate_get(f"/q/q/{msg_id}.json").json
    assert shown["_timeline"][0]["by"] == "http 192.0.2.7"
    assert shown["created_at"] <= shown["started_at"] <= shown["ended_at"]
    assert shown["run_s"] >= 0 and shown["wait_s"] >= 0
    page = client.simulate_get(f"/q/q/{msg_id}", headers={"Accept": "text/html"}).text
    assert 'id="timeline"' in page and "http 192.0.2.7" in page
    stamp = re.escape(timeline_when(shown["ended_at"]))
    assert re.search(stamp, page)
    # The listing comes from the search index, which the daemon's thread
    # brings up to date a moment after the end
    deadline = time.monotonic() + 10
    while True:
        listing = client.simulate_get("/q/q", params={"state": "done"}).text
        if msg_id in listing or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert 'class="sort">Created' in listing and re.search(stamp, listing)


def timeline_when(at):
    from rqsys.web.timeshtml import when
    return when(at)


def test_plain_log_lines_carry_a_utc_time(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    EventLog("q", journal=False).event("done", "fine", "20250101.0000.00.000.0")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ q: 20250101.0000.00.000.0: done: "
                        r"fine\n", out.getvalue())
