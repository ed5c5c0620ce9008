"""The HTTP contract against a real ``rqsys web`` (waitress) and real queue daemons."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest
from conftest import need, wait_for
from web_support import multipart, tree_snapshot, web_server  # noqa: F401

COLOUR_SCRIPT = r"""
for i in 1 2 3; do printf '\033[32mline %s\033[0m plain\n' "$i"; done
echo "done printed" >&3
"""
IDLE_SCRIPT = 'echo "done ok" >&3\n'


@pytest.fixture
def server(web_server):
    """The web with the default config (written before any daemon reads it)."""
    return web_server()


@pytest.fixture
def echo(make_queue, daemon, server):
    make_queue("echo", COLOUR_SCRIPT)
    return daemon("echo")


def _id(url: str) -> str:
    return url.rsplit("/", 1)[1]


def _wait_state(server, queue: str, msg_id: str, state: str) -> None:
    wait_for(lambda: server.get_json(f"/q/{queue}/{msg_id}/state.json")[1] == [state],
             10, f"{msg_id} in {state}")


def test_new_message_rq_form_encoding_with_curl(echo, server):
    # Given a queue and the web; When an RQ client posts mesg=<JSON> with curl
    out = subprocess.run(
        ["curl", "-sS", "-i", "--max-time", "20", "-d", 'mesg={"param1":"hello world"}',
         f"{server.base}/q/echo/new_message"], capture_output=True, text=True, timeout=30)
    # Then the answer is RQ's ["ok", <full message url>] as application/json
    assert out.returncode == 0, out.stderr
    head, _sep, body = out.stdout.partition("\n\n")  # text mode: \r\n read as \n
    assert "200 OK" in head.splitlines()[0] and "application/json" in head
    verdict, url = json.loads(body)
    assert verdict == "ok" and url.startswith(f"http://127.0.0.1:{server.port}/q/echo/")
    _wait_state(server, "echo", _id(url), "done")
    status, msg = server.get_json(f"/q/echo/{_id(url)}.json")
    assert status == 200 and msg["param1"] == "hello world" and msg["state"] == "done"
    assert msg["status"] == "done - printed" and msg["_attachments"] == {}


def test_json_body_prep_commit_and_single_que(make_queue, daemon, server):
    make_queue("slow", IDLE_SCRIPT)
    daemon("slow").call("adminoper", oper="pause")  # keep messages in que
    # a JSON body is the message; _method=prep leaves it in prep
    status, headers, data = server.request(
        "POST", "/q/slow/new_message?_method=prep", json.dumps({"param1": "a"}),
        {"Content-Type": "application/json"})
    assert status == 200, data
    prep_id = _id(json.loads(data)[1])
    assert server.get_json(f"/q/slow/{prep_id}/state.json") == (200, ["prep"])
    assert server.form(f"/q/slow/{prep_id}", {"_method": "commit"})[0] == 200
    assert server.get_json(f"/q/slow/{prep_id}/state.json") == (200, ["que"])
    # single_que answers the queued twin instead of a new message
    first = server.form("/q/slow/new_message", {"mesg": '{"param1":"s"}', "_method": "single_que"})
    again = server.form("/q/slow/new_message", {"mesg": '{"param1":"s"}', "_method": "single_que"})
    assert first[0] == again[0] == 200 and first[1] == again[1]
    status, summary = server.get_json("/q/slow.json")
    assert summary["counts"]["que"] == 2 and summary["admin_state"] == "PAUSE"


def test_queue_routes_json_txt_config_done(echo, server):
    url = server.form("/q/echo/new_message", {"mesg": "{}"})[1][1]
    _wait_state(server, "echo", _id(url), "done")
    assert server.get_json("/q.json") == (200, ["echo"])
    assert server.request("GET", "/q.txt")[2] == b"q/echo.txt\n"
    status, summary = server.get_json("/q/echo.json")
    assert summary["counts"]["done"] == 1 and summary["admin_state"] == "UP"
    assert b"done: 1" in server.request("GET", "/q/echo.txt")[2]
    assert server.get_json("/q/echo/config.json")[1]["name"] == "echo"
    assert server.get_json("/q/echo/done.json?limit=5") == (200, [_id(url)])
    assert server.get_json("/q/echo/done.json?limit=x")[0] == 400


def test_form_post_with_back_redirects_303(echo, server):
    status, headers, _data = server.request(
        "POST", "/q/echo/new_message", "mesg=%7B%7D&back=/q/echo",
        {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303 and headers["Location"] == "/q/echo"
    status, headers, _data = server.request(
        "POST", "/q/echo/new_message", "mesg=%7B%7D&back=http://evil.example/",
        {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 400 and "Location" not in headers


def test_admin_down_answers_503_and_up_again(echo, server):
    assert server.form("/q/echo/adminoper", {"down": "1"}) == (200, ["ok", "DOWN"])
    status, answer = server.form("/q/echo/new_message", {"mesg": "{}"})
    assert status == 503 and answer[0] == "fail" and "DOWN" in answer[1]
    assert server.form("/q/echo/adminoper", {"oper": "up"}) == (200, ["ok", "UP"])
    assert server.form("/q/echo/new_message", {"mesg": "{}"})[0] == 200
    assert server.form("/q/echo/adminoper", {"sideways": "1"})[0] == 400


def test_unknown_queue_and_message_are_404(echo, server):
    assert server.get_json("/q/nosuch.json") == (404, ["fail", "no queue named nosuch"])
    status, answer = server.get_json("/q/echo/20200101.0000.00.000.0.json")
    assert status == 404 and answer[0] == "fail"
    assert server.form("/q/nosuch/new_message", {"mesg": "{}"})[0] == 404


def test_live_tail_and_log_range(echo, server):
    msg_id = _id(server.form("/q/echo/new_message", {"mesg": "{}"})[1][1])
    _wait_state(server, "echo", msg_id, "done")
    status, tail = server.get_json(f"/q/echo/{msg_id}/tail.json?offset=0")
    assert tail["ended"] and tail["state"] == "done"
    assert tail["data"] == "".join(f"\x1b[32mline {i}\x1b[0m plain\n" for i in (1, 2, 3))
    status, tail2 = server.get_json(f"/q/echo/{msg_id}/tail.json?offset={tail['offset']}")
    assert tail2["data"] == "" and tail2["offset"] == tail["offset"]
    far = server.request("GET", f"/q/echo/{msg_id}/tail.json?offset={10**23}")
    assert far[0] == 400 and b"offset" in far[2], far  # was a 500 at the seek
    assert server.get_json(f"/q/echo/{msg_id}/tail.json?offset={2**62}")[1]["data"] == ""
    status, headers, data = server.request("GET", f"/q/echo/{msg_id}/log/stdio.log",
                                           headers={"Range": "bytes=5-10"})
    assert status == 206 and data == b"line 1"
    assert headers["Content-Range"].startswith("bytes 5-10/")
    status, _h, data = server.request("GET", f"/q/echo/{msg_id}/log/stdio.log",
                                      headers={"Range": "items=0-1"})
    assert status == 200 and data.count(b"plain") == 3  # an unknown unit is ignored
    status, _h, data = server.request("GET", f"/q/echo/{msg_id}/log/stdio.log")
    assert status == 200 and data.count(b"plain") == 3
    assert server.request("GET", f"/q/echo/{msg_id}/log/nosuch.log")[0] == 404


def test_attach_upload_md5_download_and_clone_hardlinks(make_queue, daemon, server, layout):
    make_queue("files", IDLE_SCRIPT)
    daemon("files").call("adminoper", oper="pause")
    url = server.form("/q/files/new_message", {"mesg": "{}", "_method": "prep"})[1][1]
    msg_id = _id(url)
    payload = os.urandom(300_000)
    body, ctype = multipart("filedata", "data.bin", payload)
    status, _h, data = server.request("POST", f"/q/files/{msg_id}/attach/new", body,
                                      {"Content-Type": ctype})
    md5 = hashlib.md5(payload).hexdigest()
    assert status == 200 and json.loads(data) == ["ok", f"{md5}-Attached successfully"]
    info = server.get_json(f"/q/files/{msg_id}.json")[1]["_attachments"]["data.bin"]
    assert info["md5"] == md5 and info["size"] == len(payload)
    assert server.request("GET", f"/q/files/{msg_id}/attach/data.bin")[2] == payload
    # commit, then clone: the clone's attachment is the same inode (a hard link)
    assert server.form(f"/q/files/{msg_id}", {"_method": "commit"})[0] == 200
    clone_url = server.form(f"/q/files/{msg_id}/clone", {})[1][1]
    clone = server.get_json(f"/q/files/{_id(clone_url)}.json")[1]
    assert clone["orig_msg_id"] == url
    info = server.get_json(f"/q/files/{msg_id}.json")[1]["_attachments"]["data.bin"]
    assert "path" not in info  # no answer shows a server path
    qdir = layout.queue_dir("files")
    original = os.stat(next(qdir.rglob(f"{msg_id}/attach/data.bin")))
    copied = os.stat(next(qdir.rglob(f"{_id(clone_url)}/attach/data.bin")))
    assert (copied.st_ino, copied.st_dev) == (original.st_ino, original.st_dev)
    # attaching after commit is refused
    status, _h, data = server.request("POST", f"/q/files/{msg_id}/attach/new", body,
                                      {"Content-Type": ctype})
    assert status == 400 and b"not in prep" in data


def test_bad_inputs_get_4xx_with_reason_and_store_unchanged(make_queue, daemon, server, layout):
    make_queue("quiet", IDLE_SCRIPT)
    daemon("quiet").call("adminoper", oper="pause")
    prep_id = _id(server.form("/q/quiet/new_message", {"mesg": "{}", "_method": "prep"})[1][1])
    upload, ctype = multipart("filedata", "../evil", b"x" * 100)
    cut, cut_type = multipart("filedata", "whole.bin", b"y" * 100, boundary="XB")
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    jtype = {"Content-Type": "application/json"}
    cases = [
        ("POST", "/q/quiet/new_message", "mesg={bad json", form, 400, "not valid JSON"),
        ("POST", "/q/quiet/new_message", "mesg=[1,2]", form, 400, "JSON object"),
        ("POST", "/q/quiet/new_message", 'mesg={"param1":5}', form, 400, "param1"),
        ("POST", "/q/quiet/new_message", 'mesg={"max_count":"x"}', form, 400, "max_count"),
        ("POST", "/q/quiet/new_message", 'mesg={"bogus":1}', form, 400, "bogus"),
        ("POST", "/q/quiet/new_message", "mesg_due=soon", form, 400, "mesg_due"),
        ("POST", "/q/quiet/new_message", "mesg={}&_method=fly", form, 400, "_method"),
        ("POST", "/q/quiet/new_message", "", form, 400, "no message"),
        ("POST", "/q/quiet/new_message", '"just a string"', jtype, 400, "object"),
        ("POST", "/q/quiet/new_message", "mesg={}", {"Content-Type": "text/xml"}, 400,
         "content type"),
        ("POST", "/q/quiet/new_message", b"\xff\xfe=1", form, 400, "UTF-8"),
        ("POST", "/q/quiet/new_message", "[" + "1," * (25 << 20) + "1]", jtype, 413, "limit"),
        ("POST", "/q/nosuch/new_message", "mesg={}", form, 404, "no queue"),
        ("POST", "/q/bad..name/new_message", "mesg={}", form, 400, "queue name"),
        ("GET", "/q/quiet/../../etc/passwd", None, {}, 404, ""),
        ("GET", "/q/quiet/..%2F..%2Fetc.json", None, {}, 404, "Not Found"),
        ("GET", "/q/quiet/...json", None, {}, 400, "message id"),
        ("POST", "/q/quiet/..", "_method=delete", form, 400, "message id"),
        ("GET", f"/q/quiet/{prep_id}/log/..", None, {}, 400, "log file name"),
        ("GET", f"/q/quiet/{prep_id}/attach/..", None, {}, 400, "attachment name"),
        ("POST", f"/q/quiet/{prep_id}/attach/new", upload, {"Content-Type": ctype}, 400,
         "attachment name"),
        ("POST", f"/q/quiet/{prep_id}/attach/new", "x", form, 400, "multipart"),
        ("POST", f"/q/quiet/{prep_id}/attach/new", cut[:-len(b"\r\n--XB--\r\n")],  # no closing
         {"Content-Type": cut_type}, 400, "multipart"),  # boundary: it was attached as cut
        ("POST", f"/q/quiet/{prep_id}", "_method=explode", form, 400, "_method"),
        ("PUT", "/q/quiet/new_message", "mesg={}", form, 405, "Method Not Allowed"),
        ("DELETE", f"/q/quiet/{prep_id}", None, {}, 405, "Method Not Allowed"),
        ("POST", "/new_queue", "name=x&script=/bin/true", form, 403, "allow_new_queue"),
    ]
    before = tree_snapshot(layout.queues)
    for method, path, body, headers, want, reason in cases:
        status, got_headers, data = server.request(method, path, body, headers)
        assert status == want, (method, path, status, data[:300])
        answer = json.loads(data)
        assert answer[0] == "fail" and reason in answer[1], (path, answer)
    assert tree_snapshot(layout.queues) == before


def test_basic_auth_guards_every_route(make_queue, daemon, web_server, layout):
    server = web_server(basic_auth={"realm": "Test RQ", "users": {"foo user": "bar pass"}})
    make_queue("echo", COLOUR_SCRIPT)
    daemon("echo")
    before = tree_snapshot(layout.queues)
    import base64

    good = {"Authorization": "Basic " + base64.b64encode(b"foo user:bar pass").decode()}
    wrong = {"Authorization": "Basic " + base64.b64encode(b"foo user:nope").decode()}
    for method, path in [("GET", "/"), ("GET", "/q.json"), ("GET", "/q/echo.json"),
                         ("GET", "/openapi.json"), ("GET", "/static/rq.css"),
                         ("POST", "/q/echo/new_message"), ("GET", "/no/such/route")]:
        for headers in ({}, wrong, {"Authorization": "Basic !!!"}):
            status, got, data = server.request(method, path, "mesg={}", headers)
            assert status == 401, (method, path, headers)
            assert got["WWW-Authenticate"] == 'Basic realm="Test RQ"'
            assert json.loads(data)[0] == "fail"
    assert tree_snapshot(layout.queues) == before
    assert server.get_json("/q.json")[0] == 401
    status, _h, data = server.request("GET", "/q.json", headers=good)
    assert status == 200 and json.loads(data) == ["echo"]


def test_relative_root_prefixes_routes_links_and_urls(make_queue, daemon, web_server):
    server = web_server(relative_root="/therq")
    make_queue("echo", COLOUR_SCRIPT)
    daemon("echo")
    status, answer = server.form("/q/echo/new_message", {"mesg": "{}"})
    assert answer[1].startswith(f"http://127.0.0.1:{server.port}/therq/q/echo/")
    assert server.request("GET", "/q.json", prefixed=False)[0] == 404
    status, _h, page = server.request("GET", "/", headers={"Accept": "text/html"})
    assert status == 200
    hrefs = [h.split('"')[0] for h in page.decode().split('href="')[1:]]
    assert hrefs and all(h.startswith(("/therq/", "#")) for h in hrefs), hrefs


def test_new_queue_when_allowed(web_server, layout, tmp_path):
    need(os.access("/bin/true", os.X_OK), "/bin/true")
    server = web_server(allow_new_queue=True)
    status, answer = server.form("/new_queue", {"name": "fresh", "script": "/bin/true"})
    assert status == 200 and answer[1].endswith("/q/fresh")
    assert "fresh" in layout.queue_names()
    assert server.form("/new_queue", {"name": "fresh", "script": "/bin/true"})[0] == 400
    assert server.form("/new_queue", {"name": "x2", "script": "relative"})[0] == 400
