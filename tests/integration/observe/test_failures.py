"""Failure groups: err messages grouped by normalised reason, kept per event
by a real daemon, and retried or deleted a whole group at a time (socket,
``rq groups``/``rq retry`` and HTTP)."""

from __future__ import annotations

import errno
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import web_client
from daemon_util import drain, send, settle, store_of

from rqsys.background import Background
from rqsys.errors import BadRequest, NotFound, StoreError
from rqsys.observe import failures, timeline
from rqsys.observe.failures import FailureGroups, normalise

RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]
SCRIPT = """
[ -e "$RQ_MSG_DIR/../../../fixed" ] && { echo "done fixed" >&3; exit 0; }
case "$RQ_PARAM1" in
  db) echo "err connect to db01:$RQ_PARAM2 failed after ${RQ_PARAM2}ms" >&3 ;;
  file) echo "err cannot open /srv/in/$RQ_PARAM2.csv" >&3 ;;
  *) echo "done" >&3 ;;
esac
"""


def rq(layout, *args):
    return subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize(("text", "reason"), [
    ("connect to db01:5432 failed after 3.25s", "connect to dbN:N failed after Ns"),
    ("cannot open /srv/in/77.csv: no such file", "cannot open PATH: no such file"),
    ("relay to http://h:3333/q/a/20250101.0000.00.000.1 refused", "relay to URL refused"),
    ("job 20250101.0000.00.000.12 hash deadbeef99 x", "job ID hash HEX x"),
    ("x" * 100_000, "x" * 300),  # one long word: cut before it is masked (fast)
])
def test_reasons_mask_what_varies(text, reason):
    assert normalise(text) == reason


def _errs(proc, *params):
    ids = [send(proc, param1=p1, param2=p2) for p1, p2 in params]
    for msg_id in ids:
        assert settle(proc, msg_id)["state"] == "err"
    return ids


def test_groups_counted_then_retried_and_deleted_a_group_at_a_time(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    db = _errs(proc, ("db", "5432"), ("db", "6543"), ("db", "17"))
    files = _errs(proc, ("file", "1"), ("file", "22"))
    groups = proc.call("groups")["groups"]
    assert [(g["reason"], g["count"]) for g in groups] == [
        ("connect to dbN:N failed after Nms", 3), ("cannot open PATH", 2)]
    assert groups[0]["first_seen"] <= groups[0]["last_seen"]
    # a new failure after the groups were built is counted at once
    db += _errs(proc, ("db", "1"))
    assert proc.call("groups")["groups"][0]["count"] == 4
    # retry the db group once the cause is fixed: all of it runs again and is done
    (layout.queue_dir("q") / "fixed").write_text("")
    key = groups[0]["key"]
    assert proc.call("group", group=key, action="retry")["count"] == 4
    for msg_id in db:
        assert settle(proc, msg_id)["status"] == "fixed"
    events = timeline.read(store_of(layout, "q").msg_dir("done", db[0]))
    assert [e["ev"] for e in events][-5:] == ["retried", "started", "status", "exit", "done"]
    assert [g["count"] for g in proc.call("groups")["groups"]] == [2]
    # and delete the other
    other = proc.call("groups")["groups"][0]["key"]
    assert proc.call("group", group=other, action="delete")["count"] == 2
    assert proc.call("groups")["groups"] == [] and proc.call("counts")["counts"]["err"] == 0
    with pytest.raises(NotFound, match="no failure group"):
        proc.client().call("group", group=other, action="delete")
    with pytest.raises(BadRequest, match="invalid failure group"):
        proc.client().call("group", group="../x", action="retry")
    with pytest.raises(BadRequest, match="unknown group action 'move'"):
        proc.client().call("group", group=other, action="move")
    assert all(store_of(layout, "q").find(msg_id) == "done" for msg_id in db)
    assert not any(store_of(layout, "q").msg_dir("err", m).exists() for m in files)


def test_cli_groups_and_retry(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    one, two = _errs(proc, ("db", "1"), ("file", "2"))
    lines = rq(layout, "groups", "q").stdout.splitlines()
    assert len(lines) == 2 and all(line.split()[1] == "1" for line in lines)
    assert sorted(line.split(" ", 4)[4] for line in lines) == [
        "cannot open PATH", "connect to dbN:N failed after Nms"]
    done = proc.call("create", msg={})["msg_id"]
    settle(proc, done)
    refused = rq(layout, "retry", done)
    assert refused.returncode == 1 and refused.stderr == f"rq: message {done} is in done, " \
                                                          "not err\n"
    nogroup = rq(layout, "retry", "--group", "0123456789ab")
    assert nogroup.returncode == 1 and nogroup.stderr == "rq: --group needs --queue\n"
    (layout.queue_dir("q") / "fixed").write_text("")
    assert rq(layout, "retry", one).stdout == f"retried {one}\n"
    assert rq(layout, "retry", "--all-err", "q").stdout == "retried 1\n"
    for msg_id in (one, two):
        assert settle(proc, msg_id)["state"] == "done"


def test_http_groups_and_group_action(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    _errs(proc, ("db", "1"), ("db", "2"))
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    groups = client.simulate_get("/q/q/groups.json").json
    assert [g["count"] for g in groups] == [2]
    path = f"/q/q/groups/{groups[0]['key']}"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    bad = client.simulate_post(path, body="_method=move", headers=form)
    assert bad.status_code == 400 and bad.json == ["fail", "_method must be retry or delete"]
    badkey = client.simulate_post("/q/q/groups/zz", body="_method=delete", headers=form)
    assert badkey.status_code == 400 and "invalid failure group" in badkey.json[1]
    got = client.simulate_post(path, body="_method=delete", headers=form)
    assert got.status_code == 200 and got.json == ["ok", 2]
    assert client.simulate_get("/q/q/groups.json").json == []


PYTHON_SCRIPT = """
import os, sys
print("\\x1b[1mloading rows\\x1b[0m", flush=True)
if os.environ["RQ_PARAM1"] == "value":
    raise ValueError(f"bad row {os.environ['RQ_PARAM2']}")
{}["x"]
"""


def test_why_a_python_script_failed_is_its_exception_not_only_how_it_exited(
        layout, make_queue, daemon):
    # Given a Python script failing with ValueError twice (two rows) and KeyError once
    make_queue("q", PYTHON_SCRIPT, shebang=f"#!{sys.executable}")
    proc = daemon("q")
    rows = _errs(proc, ("value", "7"), ("value", "12"))
    key = _errs(proc, ("key", "1"))[0]
    # Then each keeps RQ's status text and the last lines it wrote
    got = proc.call("get", msg_id=rows[0])
    assert got["status"].startswith("PROCESS EXITED IMPROPERLY - MOVING TO ERR - Completion "
                                     "was  but exit status was pid ")
    assert got["last_lines"][0] == "loading rows"  # escapes dropped, as a terminal shows it
    assert got["last_lines"][1] == "Traceback (most recent call last):"
    assert got["last_lines"][-1] == "ValueError: bad row 7"
    # and the groups are the two exceptions, the row number folded
    first = proc.call("groups")["groups"]
    assert [(g["reason"].split(" — ")[0], g["count"]) for g in first] == [
        ("ValueError: bad row N", 2), ("KeyError: 'x'", 1)]
    # and after a restart, built again from err/, they are the same groups
    proc.stop()
    proc = daemon("q")
    again = proc.call("groups")["groups"]
    assert [(g["key"], g["count"], g["last_line"]) for g in again] == [
        (g["key"], g["count"], g["last_line"]) for g in first]
    page = proc.call("groups", group=first[0]["key"], offset=1, limit=1)
    assert page["total"] == 2 and page["ids"] == sorted(rows)[1:]
    with pytest.raises(NotFound, match="no failure group 0123456789ab"):
        proc.call("groups", group="0123456789ab")
    # and rq statusmesg --verbose shows them, the plain one stays RQ's one line
    plain = rq(layout, "statusmesg", "--msg_id", key)
    assert plain.returncode == 0 and plain.stdout.count("\n") == 1
    verbose = rq(layout, "statusmesg", "--msg_id", key, "--verbose").stdout.splitlines()
    assert verbose[0] == plain.stdout.strip() and verbose[1] == "last lines:"
    assert verbose[-1] == "  KeyError: 'x'"


def test_the_console_shows_why_it_failed_and_each_group_has_a_page(layout, make_queue,
                                                                     daemon):
    make_queue("q", PYTHON_SCRIPT, shebang=f"#!{sys.executable}")
    proc = daemon("q")
    rows = _errs(proc, ("value", "8"), ("value", "9"))
    hostile = _errs(proc, ("value", "<b>7</b>"))[0]
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333}))
    client = web_client(layout)
    shown = client.simulate_get(f"/q/q/{hostile}.json").json
    assert shown["last_lines"][-1] == "ValueError: bad row <b>7</b>"
    assert shown["progress"] is None
    html = client.simulate_get(f"/q/q/{hostile}").text
    why = html[html.index('id="why-failed"'):]
    assert "ValueError: bad row &lt;b&gt;7&lt;/b&gt;" in why and "<b>7" not in html
    assert f'href="/q/q/{hostile}/log/stdio.log"' in why
    groups = client.simulate_get("/q/q/groups.json").json
    queue_page = client.simulate_get("/q/q?state=done").text
    for group in groups:  # the queue page lists its groups, each linked to its page
        assert f'href="/q/q/groups/{group["key"]}"' in queue_page
    assert groups[0]["count"] == 2
    page = client.simulate_get(f"/q/q/groups/{groups[0]['key']}")
    assert page.status_code == 200 and "ValueError: bad row N —" in page.text
    assert all(f'href="/q/q/{msg_id}"' in page.text for msg_id in rows)
    assert client.simulate_get("/q/q/groups/0123456789ab").status_code == 404
    assert client.simulate_get("/q/q/groups/nothex").status_code == 400
    assert client.simulate_get("/q/nosuch/groups/0123456789ab").status_code == 404


# ---------------------------------------------------------------- built off the loop
def _err_on_disk(store, msg_id, status, msg='{"dest": "q"}'):
    """A message in err/ as a run leaves it (written here, not through a daemon)."""
    path = store.msg_dir("err", msg_id)
    path.mkdir(parents=True)
    (path / "msg").write_text(msg)
    (path / "status").write_text(status)
    return path


def _ids(n, second=0):
    return [f"20260101.0000.{second:02d}.{i:03d}.1" for i in range(n)]


@pytest.fixture
def groups_of(layout, monkeypatch):
    """FailureGroups over a real store and a real Background, with a gate that
    holds the walk of err/ until the test opens it."""
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    store = store_of(layout, "q")
    gate, walks = threading.Event(), []

    def held_walk(view):
        walks.append(view)
        assert gate.wait(10), "the test did not open the gate"
        return real_walk(view)
    real_walk = failures.walk
    monkeypatch.setattr(failures, "walk", held_walk)
    background = Background()
    yield store, FailureGroups(store, background), background, gate, walks
    background.close()


def _tell(groups, kind, msg_id, state, text=""):
    groups(kind, text, msg_id, {"RQ_STATE": state})


def test_events_during_the_walk_apply_on_top_of_it_once(groups_of):
    store, groups, background, gate, walks = groups_of
    a, b, c, d, e, f, g = _ids(7)
    for msg_id in (a, b, c):
        _err_on_disk(store, msg_id, f"connect to db01:54{msg_id[-5:-2]} failed")
    for msg_id in (d, e):
        _err_on_disk(store, msg_id, f"cannot open /srv/{msg_id}.csv")
    answers = []
    groups.when_built(answers.append)
    groups.when_built(answers.append)  # a second request waits for the same walk
    assert not groups.ready() and len(walks) in (0, 1)
    # while the walk is held: a retry, a delete, a new failure (which the walk sees too)
    os.rename(store.msg_dir("err", a), store.msg_dir("que", a))
    _tell(groups, "retried", a, "que", "err → que")
    shutil.rmtree(store.msg_dir("err", d))
    _tell(groups, "deleted", d, "", "deleted from err")
    _err_on_disk(store, f, "cannot open /srv/f.csv")
    _tell(groups, "err", f, "err", "cannot open /srv/f.csv")
    gate.set()
    assert select.select([background], [], [], 10)[0], "the walk did not end"
    # the walk has ended, its callback not run yet: b fails again, otherwise
    _tell(groups, "err", b, "err", "disk full on /dev/sda1")
    drain(background)
    assert answers == [None, None] and len(walks) == 1
    assert [(g["reason"], g["count"]) for g in groups.listing()] == [
        ("cannot open PATH", 2), ("connect to dbN:N failed", 1), ("disk full on PATH", 1)]
    # built: events apply at once, no walk
    _err_on_disk(store, g, "disk full on /dev/sdb1")
    _tell(groups, "err", g, "err", "disk full on /dev/sdb1")
    assert {r["reason"]: r["count"] for r in groups.listing()}["disk full on PATH"] == 2
    assert groups.members(failures.group_key("cannot open PATH")) == [e, f]
    groups.when_built(answers.append)  # built: answered without a walk
    drain(background)
    assert answers == [None] * 3 and len(walks) == 1


def test_a_prune_during_the_walk_walks_again(groups_of):
    store, groups, background, gate, walks = groups_of
    one, two = _ids(2)
    _err_on_disk(store, one, "boom 1")
    _err_on_disk(store, two, "boom 2")
    answers = []
    groups.when_built(answers.append)
    shutil.rmtree(store.msg_dir("err", two))  # the cleaner prunes it
    _tell(groups, "deleted", "", "", "pruned {'err': 1}")
    gate.set()
    drain(background)
    assert answers == [None] and len(walks) == 2  # answered after the second walk only
    assert [(g["reason"], g["count"]) for g in groups.listing()] == [("boom N", 1)]
    _tell(groups, "deleted", "", "", "pruned {'err': 1}")  # built: the next asks walk again
    assert not groups.ready()


def test_a_walk_that_fails_is_told_to_its_requests(groups_of, monkeypatch):
    store, groups, background, gate, _walks = groups_of

    def broken(view):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(failures, "walk", broken)
    answers = []
    groups.when_built(answers.append)
    drain(background)
    assert len(answers) == 1 and isinstance(answers[0], StoreError)
    assert "failure groups of q" in str(answers[0]) and not groups.ready()


def _fifo_status(store, msg_id):
    """An err message whose status is a FIFO: reading it waits for the test
    (its msg is unreadable, so the search index passes over it)."""
    path = _err_on_disk(store, msg_id, "", msg="{not json")
    (path / "status").unlink()
    os.mkfifo(path / "status")
    return path / "status"


def _write_when_read(fifo, text, timeout=10.0):
    """Write ``text`` into ``fifo`` once a reader has it open (ENXIO until then)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            assert exc.errno == errno.ENXIO and time.monotonic() < deadline, exc
            time.sleep(0.01)
    os.write(fd, text.encode())
    os.close(fd)


def test_the_queue_answers_while_the_first_listing_is_built(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    store = store_of(layout, "q")
    ids = _ids(300)
    for n, msg_id in enumerate(ids):
        _err_on_disk(store, msg_id, f"connect to db0{n % 3}:5432 failed after {n}ms")
    held = _ids(1, second=1)[0]
    fifo = _fifo_status(store, held)
    proc = daemon("q")
    # Given a walk of err/ that cannot end until the test writes one status
    asking = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    asking.connect(str(layout.socket_path("q")))
    asking.sendall(b'{"op": "groups"}\n')
    # Then the queue answers, ends and deletes messages meanwhile
    with proc.client() as client:
        for _ in range(20):
            started = time.monotonic()
            assert client.call("ping")["ok"]
            assert time.monotonic() - started < 0.1
            assert not select.select([asking], [], [], 0)[0], "answered before the walk ended"
    proc.call("delete", msg_id=ids[0])
    late = _errs(proc, ("file", "7"))
    # When the held status is written, the walk ends and the listing is answered
    _write_when_read(fifo, "connect to db07:5432 failed after 1ms")
    asking.settimeout(10)
    reply = json.loads(asking.makefile().readline())
    asking.close()
    assert reply["ok"] and [(g["reason"], g["count"]) for g in reply["groups"]] == [
        ("connect to dbN:N failed after Nms", 300), ("cannot open PATH", 1)]
    assert proc.call("groups")["groups"][1]["example"] == f"cannot open /srv/in/{7}.csv"
    assert late and proc.call("counts")["counts"]["err"] == 301


def test_a_group_action_first_after_a_start_waits_for_the_walk(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    store = store_of(layout, "q")
    for msg_id in _ids(3):
        _err_on_disk(store, msg_id, f"cannot open /srv/{msg_id}.csv")
    proc = daemon("q")
    key = failures.group_key("cannot open PATH")
    with pytest.raises(NotFound, match="no failure group 0123456789ab"):
        proc.client().call("group", group="0123456789ab", action="delete")
    assert proc.call("group", group=key, action="delete")["count"] == 3
    assert proc.call("counts")["counts"]["err"] == 0


def test_the_walk_reads_each_status_whole_and_a_missing_one_as_blank(layout):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    store = store_of(layout, "q")
    blank, long = _ids(2)
    (_err_on_disk(store, blank, "") / "status").unlink()
    _err_on_disk(store, long, "x" * 100_000 + " 42")
    (store.state_dir("err") / "not-a-message").mkdir()
    groups = failures.walk(store)
    assert sorted((g["reason"][:3], g["count"]) for g in groups.listing()) == [
        ("", 1), ("xxx", 1)]
    assert groups.members(failures.group_key("")) == [blank]
    assert len(groups.listing()[0]["example"]) + len(groups.listing()[1]["example"]) == 100_003
