"""The web's defences over real HTTP (a real ``rqsys web`` and real queue daemons):
cross-site changes refused, passwords checked against argon2 hashes, no server
path in any answer, no traversal out of a message, 413 for an oversized field."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from conftest import wait_for
from daemon_util import job_file
from web_support import multipart, tree_snapshot, web_server  # noqa: F401

from rqsys.message import PARAM_MAX
from rqsys.web import auth

SCRIPT = 'echo "a line of output"\necho "done ok" >&3\n'
CROSS = [{"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
         {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"},
         {"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}]


@pytest.fixture
def server(web_server):
    return web_server()


@pytest.fixture
def q(make_queue, daemon, server):
    make_queue("q", SCRIPT)
    return daemon("q")


def _done_message(server, q) -> str:
    msg_id = q.call("create", msg={"param1": "p"})["msg_id"]
    wait_for(lambda: server.get_json(f"/q/q/{msg_id}/state.json")[1] == ["done"], 20, "done")
    return str(msg_id)


@pytest.mark.parametrize("headers", CROSS)
def test_a_cross_site_change_is_refused_and_changes_nothing(q, server, layout, headers):
    # Given a queue with a message
    msg_id = _done_message(server, q)
    before = tree_snapshot(layout.queue_dir("q"))
    # When a browser on another site posts a delete, a new message and an admin operation
    for path, fields in [(f"/q/q/{msg_id}", {"_method": "delete"}),
                         ("/q/q/new_message", {"mesg": '{"param1":"x"}'}),
                         ("/q/q/adminoper", {"down": "1"})]:
        status, answer = server.form(path, fields, headers=headers)
        # Then each is refused with 403, saying why
        assert status == 403 and answer[0] == "fail" and "cross-site" in answer[1], answer
    # and nothing changed: the message is there, the queue is up
    assert tree_snapshot(layout.queue_dir("q")) == before
    assert server.get_json("/q/q.json")[1]["admin_state"] == "UP"


def test_same_origin_and_non_browser_changes_pass(q, server):
    host = f"127.0.0.1:{server.port}"
    for headers in [{"Sec-Fetch-Site": "same-origin", "Origin": f"http://{host}"},
                    {"Sec-Fetch-Site": "none"}, {"Origin": f"http://{host}"}, {}]:
        status, answer = server.form("/q/q/new_message", {"mesg": '{"param1":"y"}'},
                                     headers=headers)
        assert status == 200 and answer[0] == "ok", (headers, answer)
    # reading is never refused, whatever the browser says
    status, _h, _d = server.request("GET", "/q/q.json", headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 200


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_basic_auth_checks_an_argon2_hash(web_server):
    server = web_server(basic_auth={"realm": "rq", "users": {
        "alice": auth.hash_password("right horse"), "bob": "plain"}})
    assert server.request("GET", "/q.json")[0] == 401
    assert server.request("GET", "/q.json", headers=_basic("alice", "wrong"))[0] == 401
    assert server.request("GET", "/q.json", headers=_basic("alice", "right horse"))[0] == 200
    assert server.request("GET", "/q.json", headers=_basic("bob", "plain"))[0] == 200
    assert server.request("GET", "/q.json", headers=_basic("carol", "plain"))[0] == 401


def _every_answer(server, msg_id: str) -> dict[str, bytes]:
    """Every page, JSON answer and error a client can get about the queue and message."""
    paths = ["/", "/q.json", "/q.txt", "/q/q", "/q/q.json", "/q/q.txt", "/q/q/config.json",
             "/q/q/done.json", "/q/q/new_message", f"/q/q/{msg_id}", f"/q/q/{msg_id}.json",
             f"/q/q/{msg_id}/state.json", f"/q/q/{msg_id}/tail.json", "/openapi.json",
             "/q/nosuch.json", "/q/q/20200101.0000.00.000.json", f"/q/q/{msg_id}/log/none",
             f"/q/q/{msg_id}/attach/none", "/q/down.json", "/q/down/config.json", "/q/down"]
    answers = {}
    for path in paths:
        for accept in ("application/json", "text/html"):
            status, _h, data = server.request("GET", path, headers={"Accept": accept})
            answers[f"GET {path} {accept} {status}"] = data
    for path, fields in [("/new_queue", {"name": "nq", "script": "no/such/script"}),
                         ("/q/q/new_message", {"mesg": '{"param1": 5}'}),
                         ("/q/down/new_message", {"mesg": '{"param1":"x"}'})]:
        status, _h, data = server.request(
            "POST", path, "&".join(f"{k}={v}" for k, v in fields.items()),
            {"Content-Type": "application/x-www-form-urlencoded"})
        answers[f"POST {path} {status}"] = data
    return answers


def test_no_answer_shows_a_server_path(make_queue, daemon, web_server, layout):
    # Given a queue that ran a message with an attachment, and a queue whose daemon is down
    server = web_server(allow_new_queue=True)
    make_queue("q", SCRIPT)
    make_queue("down", SCRIPT)
    q = daemon("q")
    prep = q.call("create", msg={"param1": "p"}, state="prep")["msg_id"]
    body, ctype = multipart("filedata", "a.txt", b"attached")
    assert server.request("POST", f"/q/q/{prep}/attach/new", body, {"Content-Type": ctype})[0] \
        == 200
    q.call("commit", msg_id=prep)
    wait_for(lambda: server.get_json(f"/q/q/{prep}/state.json")[1] == ["done"], 20, "done")
    # When every route is asked, as JSON and as HTML, errors included
    answers = _every_answer(server, prep)
    # Then none contains the root's absolute path (nor the socket directory's)
    for root in {str(layout.root), os.path.realpath(layout.root)}:
        leaks = [where for where, data in answers.items() if root.encode() in data]
        assert leaks == [], leaks
    # and the queue's script is still named, relative to the root
    status, cfg = server.get_json("/q/q/config.json")
    assert status == 200 and cfg["script"].endswith("q/run") and not cfg["script"].startswith("/")


TRAVERSALS = ["..", "%2e%2e", "..%2f..%2f..%2fetc%2fpasswd", "%2Fetc%2Fpasswd", "a%00b",
              ".%2e", "%2e%2e%2f%2e%2e%2fconfig%2fconfig.json", "stdio.log%00.txt"]


def test_names_that_leave_the_message_are_refused(q, server):
    msg_id = _done_message(server, q)
    for bad in TRAVERSALS:
        for path in (f"/q/q/{msg_id}/log/{bad}", f"/q/q/{msg_id}/attach/{bad}",
                     f"/q/{bad}/{msg_id}.json", f"/q/q/{bad}.json", f"/q/{bad}.json",
                     f"/q/{bad}/config.json"):
            status, _h, data = server.request("GET", path)
            assert status in (400, 404), (path, status, data[:200])
            assert b"root:" not in data and b"basic_auth" not in data


def test_links_planted_in_the_store_are_not_followed(q, server, layout, tmp_path: Path):
    # Given a done message whose stdio.log was replaced by a link to /etc/passwd,
    # an attachment that is a link, and a job/ directory of another message that is a link
    msg_id = _done_message(server, q)
    log = job_file(layout, "q", msg_id, "stdio.log")
    log.unlink()
    log.symlink_to("/etc/passwd")
    attach = log.parent.parent / "attach"
    attach.mkdir(exist_ok=True)
    (attach / "secret").symlink_to("/etc/passwd")
    other = _done_message(server, q)
    job = job_file(layout, "q", other, "stdio.log").parent
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "stdio.log").write_text("root:x:0:0 outside the store\n")
    os.rename(job, tmp_path / "moved-job")
    job.symlink_to(outside)
    # When they are asked for by name (and the tail API reads stdio.log)
    for path in (f"/q/q/{msg_id}/log/stdio.log", f"/q/q/{msg_id}/attach/secret",
                 f"/q/q/{other}/log/stdio.log", f"/q/q/{msg_id}/tail.json",
                 f"/q/q/{other}/tail.json"):
        status, _h, data = server.request("GET", path)
        # Then nothing outside the store is served
        assert b"root:" not in data, (path, status, data[:200])
        assert status in (200, 404), (path, status)
    # and the page listing the logs does not offer the link
    status, _h, page = server.request("GET", f"/q/q/{msg_id}", headers={"Accept": "text/html"})
    assert status == 200 and b"log/stdio.log" not in page


def test_an_oversized_field_is_413_naming_field_and_limit(q, server, layout):
    before = tree_snapshot(layout.queue_dir("q"))
    big = json.dumps({"param1": "x" * (PARAM_MAX + 1)})
    status, _h, data = server.request("POST", "/q/q/new_message", big,
                                      {"Content-Type": "application/json"})
    verdict, why = json.loads(data)
    assert status == 413 and verdict == "fail"
    assert "param1" in why and str(PARAM_MAX) in why, why
    assert tree_snapshot(layout.queue_dir("q")) == before


def test_pages_are_never_framed_and_logs_never_sniffed(q, server):
    # Given a message whose script printed what looks like a page
    msg_id = q.call("create", msg={"param1": "p"})["msg_id"]
    wait_for(lambda: server.get_json(f"/q/q/{msg_id}/state.json")[1] == ["done"], 20, "done")
    # Then every HTML page refuses to be framed by another site (clickjacking:
    # a click steered in a hidden frame is same-origin, csrf cannot see it)
    for path in ("/", "/q/q", f"/q/q/{msg_id}", "/no/such/page"):
        status, headers, _body = server.request("GET", path, headers={"Accept": "text/html"})
        assert headers["Content-Type"].startswith("text/html"), (path, status)
        assert headers["Content-Security-Policy"] == "frame-ancestors 'none'", path
        assert headers["X-Frame-Options"] == "DENY", path
        assert headers["X-Content-Type-Options"] == "nosniff", path
    # And a job log is text, never sniffed into a page
    status, headers, body = server.request("GET", f"/q/q/{msg_id}/log/stdio.log")
    assert status == 200 and body == b"a line of output\n"
    assert headers["Content-Type"].startswith("text/plain")
    assert headers["X-Content-Type-Options"] == "nosniff"
    # And JSON answers carry none of it (an enqueue stays as light)
    status, headers, _body = server.request("GET", "/q.json")
    assert status == 200 and headers["X-Frame-Options"] is None
