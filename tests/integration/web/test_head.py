"""``HEAD`` on every GET route (issue 48 item 9: ``curl -I`` and uptime
monitors got 405): over real HTTP, each path the OpenAPI document lists for
GET answers HEAD with GET's status and headers and no body."""

from __future__ import annotations

import hashlib
import os

from web_support import web_server  # noqa: F401

from rqsys.web import openapi

SKIP_HEADERS = ("date", "content-length", "etag")  # a page or /metrics may change between


def test_every_get_route_answers_head_alike(layout, make_queue, daemon, web_server,  # noqa: F811
                                            tmp_path):
    make_queue("q", "echo hello; exit 1")
    proc = daemon("q")
    server = web_server()
    body = b"attached\n"
    (tmp_path / "a.txt").write_bytes(body)
    msg_id = proc.call("create", msg={"dest": "q"}, state="prep")["msg_id"]
    fd = os.open(tmp_path / "a.txt", os.O_RDONLY)
    try:
        proc.call("attach", fds=[fd], msg_id=msg_id, name="a.txt",
                  md5=hashlib.md5(body).hexdigest())
    finally:
        os.close(fd)
    proc.call("commit", msg_id=msg_id)
    filled = {"{name}": "q", "{mid}": msg_id, "{file}": "stdio.log", "{aname}": "a.txt",
              "{key}": "0" * 12, "{bid}": "nope"}
    paths = [p for p, ops in openapi.document("")["paths"].items() if "get" in ops]
    assert "/" in paths and len(paths) > 20
    for path in paths:
        for key, value in filled.items():
            path = path.replace(key, value)
        got = server.request("GET", path)
        head = server.request("HEAD", path)
        assert head[0] == got[0] and head[0] != 405, (path, head[0], got[0])
        assert head[2] == b"", path
        assert {k: v for k, v in head[1].items() if k.lower() not in SKIP_HEADERS} == \
            {k: v for k, v in got[1].items() if k.lower() not in SKIP_HEADERS}, path
