"""RQ's HTTP dialect against a real ``rqsys web`` and real queue daemons: what RQ's
own clients, relay script, web form and ``check_rq`` monitoring send and read
(``code/main.rb`` and ``bin/check_rq`` of drudru/rq are the reference)."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import uuid

import pytest
from conftest import need, wait_for
from web_support import multipart, web_server  # noqa: F401

SCRIPT = 'echo "done ok $RQ_PARAM1" >&3\n'
RQ_QUEUE_KEYS = {"status", "uptime", "prep_size", "que_size", "run_size", "done_size",
                 "err_size", "relayed_size"}


@pytest.fixture
def server(web_server):
    return web_server(allow_new_queue=True)


@pytest.fixture
def work(make_queue, daemon, server):
    make_queue("work", SCRIPT)
    return daemon("work")


def _id(url: str) -> str:
    return url.rsplit("/", 1)[1]


def _create(server, mesg: dict[str, object]) -> tuple[int, list[str]]:
    """A post as RQ's relay script and Net::HTTP clients make it."""
    return server.form("/q/work/new_message", {"x_format": "json", "mesg": json.dumps(mesg)})


def test_method_inside_mesg_prep_then_commit(work, server):
    # Given RQ's relay dialect: _method inside the mesg JSON, string numbers
    status, answer = _create(server, {"dest": f"{server.base}/q/work", "src": "rq",
                                      "count": "2", "max_count": "5", "param1": "p",
                                      "_method": "prep"})
    # Then the message waits in prep, with the numbers converted as RQ converts them
    assert status == 200 and answer[0] == "ok", answer
    msg_id = _id(answer[1])
    msg = server.get_json(f"/q/work/{msg_id}.json")[1]
    assert msg["state"] == "prep" and msg["status"] == "prep"
    assert (msg["count"], msg["max_count"]) == (2, 5) and "_method" not in msg
    # When it is committed as RQ's relay commits, it runs to done
    assert server.form(f"/q/work/{msg_id}", {"x_format": "json", "_method": "commit",
                                             "msg_id": msg_id})[0] == 200
    wait_for(lambda: server.get_json(f"/q/work/{msg_id}.json")[1]["state"] == "done", 20,
             "the committed message to run")
    assert server.get_json(f"/q/work/{msg_id}.json")[1]["status"] == "done - ok p"


def test_method_inside_mesg_commit_single_que_and_refusals(work, server):
    work.call("adminoper", oper="pause")  # keep them queued
    first = _create(server, {"param1": "s", "_method": "single_que"})[1][1]
    assert _create(server, {"param1": "s", "_method": "single_que"})[1][1] == first
    plain = _create(server, {"param1": "c"})[1][1]  # no _method: commit, as RQ's default
    assert server.get_json(f"/q/work/{_id(plain)}/state.json") == (200, ["que"])
    status, answer = _create(server, {"_method": "sideways"})
    assert status == 400 and "_method" in answer[1]
    status, answer = _create(server, {"max_count": "none"})  # Ruby's to_i: 0, under the minimum
    assert status == 400 and "max_count" in answer[1]


def test_rq_web_form_fields(work, server):
    # RQ's own new-message page posts mesg[field] with x_format=html
    fields = {"x_format": "html", "mesg[dest]": "work", "mesg[param1]": "form",
              "mesg[max_count]": "3"}
    status, headers, _body = server.request(
        "POST", "/q/work/new_message", "&".join(f"{k}={v}" for k, v in fields.items()),
        {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303 and "/q/work/" in headers["Location"]
    msg = server.get_json(headers["Location"] + ".json")[1]
    assert (msg["param1"], msg["max_count"]) == ("form", 3)


def test_queue_json_and_txt_in_rqs_shape(work, server):
    url = _create(server, {"param1": "x"})[1][1]
    wait_for(lambda: server.get_json(f"/q/work/{_id(url)}.json")[1]["state"] == "done", 20,
             "a done message")
    summary = server.get_json("/q/work.json")[1]
    assert set(summary) >= RQ_QUEUE_KEYS and summary["status"] == "UP"
    assert isinstance(summary["uptime"], int) and summary["uptime"] >= 0
    assert (summary["done_size"], summary["que_size"], summary["err_size"]) == (1, 0, 0)
    text = server.request("GET", "/q/work.txt")[2].decode()
    assert re.match(r"status: UP\nuptime: \d+\nprep: 0\nque: 0\nrun: 0\ndone: 1\nerr: 0\n"
                    r"relayed: 0\n", text), text
    # a DOWN queue answers only its status among RQ's keys
    work.call("adminoper", oper="down")
    summary = server.get_json("/q/work.json")[1]
    assert set(summary) & RQ_QUEUE_KEYS == {"status"} and summary["status"] == "DOWN"
    assert server.request("GET", "/q/work.txt")[2].decode() == "status: DOWN\n"
    assert server.get_json("/q/nosuch.json")[0] == 404


def test_check_rq_reading_of_the_queue_list(work, server):
    # As bin/check_rq: /q.txt lists q/<name>.txt; each one parses as "key: value" lines
    listing = server.request("GET", "/q.txt")[2].decode().split("\n")
    assert listing == ["q/work.txt", ""]
    seen = {}
    for line in filter(None, listing):
        name = re.match(r"q/(\S+)\.txt", line).group(1)
        body = server.request("GET", "/" + line)[2].decode()
        seen[name] = dict(re.findall(r"(.*): (\S+)", body))
    assert seen["work"]["status"] == "UP" and seen["work"]["err"] == "0"


def test_home_page_says_operational(work, server):
    status, _h, page = server.request("GET", "/", headers={"Accept": "text/html"})
    assert status == 200 and b"QUEUE MGR is OPERATIONAL" in page


def test_message_json_status_and_attachments_without_paths(work, server):
    work.call("adminoper", oper="pause")
    url = _create(server, {"param1": "a", "_method": "prep"})[1][1]
    body, ctype = multipart("filedata", "f.txt", b"abc")
    status, _h, data = server.request("POST", f"/q/work/{_id(url)}/attach/new?x_format=json",
                                      body, {"Content-Type": ctype})
    assert (status, json.loads(data)) == (200, ["ok", "900150983cd24fb0d6963f7d28e17f72-"
                                                      "Attached successfully"])
    msg = server.get_json(f"/q/work/{_id(url)}.json")[1]
    assert msg["_attachments"] == {"f.txt": {"md5": "900150983cd24fb0d6963f7d28e17f72",
                                             "size": 3}}
    # x_format=html (a browser's upload form) is sent back to the message page
    body, ctype = multipart("filedata", "g.txt", b"g")
    status, headers, _d = server.request("POST", f"/q/work/{_id(url)}/attach/new?x_format=html",
                                         body, {"Content-Type": ctype})
    assert status == 303 and headers["Location"] == f"/q/work/{_id(url)}"


def _multipart_form(fields: list[tuple[str, str]]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
             for k, v in fields]
    return ("".join(parts) + f"--{boundary}--\r\n").encode(), \
        f"multipart/form-data; boundary={boundary}"


@pytest.mark.parametrize("name", ["bad que test", "bad.que.test", "bad/que/test"])
def test_new_queue_refuses_bad_names_with_rqs_text(server, layout, name):
    # As test_que_create_naming.sh: curl -F queue[name]=... (multipart)
    out = subprocess.run(["curl", "-0", "-sL", f"{server.base}/new_queue", "-F",
                          f"queue[name]={name}", "-F", "queue[script]=./s.sh", "-F",
                          "queue[num_workers]=1"], capture_output=True, text=True, timeout=30)
    assert "queue name has invalid characters" in out.stdout
    assert "queue created" not in out.stdout
    assert layout.queue_names() == []


def test_new_queue_takes_rqs_form(server, layout, tmp_path):
    script = layout.root / "scripts" / "s.sh"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho done >&3\n")
    script.chmod(0o755)
    body, ctype = _multipart_form([
        ("queue[name]", "made"), ("queue[script]", "./scripts/s.sh"),
        ("queue[num_workers]", "2"), ("queue[exec_prefix]", ""),
        ("queue[coalesce_params][]", "1"), ("queue[coalesce_params][]", "2"),
        ("queue[env_vars][RQTESTENV1]", "OWEN")])
    status, _h, data = server.request("POST", "/new_queue", body, {"Content-Type": ctype})
    assert status == 200 and json.loads(data)[1].endswith("/q/made"), data
    cfg = json.loads((layout.queue_dir("made") / "config.json").read_text())
    assert cfg["script"] == str(script) and cfg["num_workers"] == 2
    assert cfg["coalesce_params"] == [1, 2] and cfg["env_vars"] == {"RQTESTENV1": "OWEN"}
    status, _h, data = server.request("POST", "/new_queue", body, {"Content-Type": ctype})
    assert status == 400 and b"already created" in data


def test_new_queue_is_refused_when_not_allowed(web_server, layout):
    server = web_server()
    body, ctype = _multipart_form([("queue[name]", "x"), ("queue[script]", "/bin/true")])
    status, _h, data = server.request("POST", "/new_queue", body, {"Content-Type": ctype})
    assert status == 403 and b"allow_new_queue" in data


def test_a_small_answer_leaves_in_one_write(work, server, tmp_path):
    # RQ's mime_test.rb reads an answer with one sysread: head and body must leave
    # the server in one send, or a busy machine hands the client the head alone
    need(shutil.which("strace") is not None, "strace (Debian strace)")
    trace = tmp_path / "sends"
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-s", "512", "-e", "trace=sendto,sendmsg",
                               "-o", str(trace), "-p", str(server.proc.pid)],
                              stderr=subprocess.PIPE)
    try:
        wait_for(lambda: trace.exists() and _attached(server.proc.pid), 10, "strace attached")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /q/work.json HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            while sock.recv(65536):
                pass
    finally:
        tracer.terminate()
        tracer.wait(10)
    sends = [line for line in trace.read_text().splitlines() if "HTTP/1.0 200" in line]
    assert len(sends) == 1 and '{\\"status\\": \\"UP\\"' in sends[0], sends


def _attached(pid: int) -> bool:
    """True once a tracer is attached to every thread of ``pid``."""
    tasks = os.listdir(f"/proc/{pid}/task")
    return all("TracerPid:\t0" not in open(f"/proc/{pid}/task/{t}/status").read()
               for t in tasks)
