"""Tags through every door: the socket, HTTP (JSON listings, the HTML page,
the form) and ``rq``, against real daemons and a real web server."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import json

import pytest
from conftest import wait_for
from daemon_util import rq, send, settle
from web_support import web_server  # noqa: F401

from rqsys import config
from rqsys.errors import BadRequest
from rqsys.message import TAG_PATTERN


def test_message_schema_and_list_op_share_the_tag_pattern():
    assert config.schema("message")["properties"]["tags"]["items"]["pattern"] == TAG_PATTERN


def test_tags_listed_and_filtered_over_the_socket(make_queue, daemon):
    # Given a paused queue holding tagged messages, and one done
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    finished = send(proc, tags=["nightly", "db"])
    settle(proc, finished)
    proc.call("adminoper", oper="pause")
    a = send(proc, tags=["nightly"])
    b = send(proc, tags=["db", "v2.1"])
    send(proc)
    # Then each state lists by tag
    assert proc.call("list", state="que", tag="db") == {"ok": True, "ids": [b], "total": 1}
    assert proc.call("list", state="que", tag="nightly")["ids"] == [a]
    assert proc.call("list", state="done", tag="db")["ids"] == [finished]
    assert proc.call("list", state="done", tag="nightly", offset=1)["ids"] == []
    assert proc.call("get", msg_id=b)["msg"]["tags"] == ["db", "v2.1"]


def test_bad_tags_are_refused_naming_the_field(make_queue, daemon):
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    for bad in ("db", ["has space"], [""], ["x" * 65], [f"t{n}" for n in range(17)],
                ["dup", "dup"], [5]):
        with pytest.raises(BadRequest, match="tags"):
            send(proc, tags=bad)
    with pytest.raises(BadRequest, match="invalid tag"):
        proc.call("list", state="que", tag="no way")


def test_tags_over_http_and_rq(make_queue, daemon, web_server, layout):
    server = web_server()
    make_queue("q", "echo done >&3")
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    # the web form's mesg_tags (commas or spaces) and a JSON mesg
    status, answer = server.form("/q/q/new_message", {"mesg_param1": "x",
                                                      "mesg_tags": "web, urgent"})
    assert status == 200 and answer[0] == "ok", answer
    status, answer = server.form("/q/q/new_message", {"mesg": json.dumps({"tags": ["api"]})})
    assert status == 200 and answer[0] == "ok", answer
    api_id = answer[1].rsplit("/", 1)[1]
    status, got = server.get_json("/q/q/messages.json?tag=urgent")
    assert status == 200 and got["total"] == 1
    assert server.get_json("/q/q/messages.json?state=que&tag=api")[1]["ids"] == [api_id]
    assert server.get_json("/q/q/messages.json")[1]["total"] == 2
    status, got = server.get_json("/q/q/messages.json?tag=bad%20tag")
    assert status == 400 and "invalid tag" in json.dumps(got)
    # the page lists from the search index, which its thread brings up to date
    page = wait_for(lambda: _page_with(server, "/q/q?state=que&tag=api", api_id), 10,
                    "the queue page listing the tagged message")
    assert b">api</a>" in page
    # rq sendmesg --tag and rq ls --tag
    url = rq(layout, "sendmesg", "--dest", "q", "--tag", "cli", "--tag", "urgent")
    cli_id = url.rsplit("/", 1)[1]
    assert rq(layout, "ls", "--queue", "q", "--tag", "cli").split("\n") == ["ok 1", cli_id]
    assert rq(layout, "ls", "--queue", "q", "--tag", "urgent").startswith("ok 2\n")
    out = rq(layout, "ls", "--queue", "q", "--tag", "no way", code=1)
    assert out.startswith("fail invalid tag")
    proc.call("adminoper", oper="resume")
    settle(proc, cli_id)
    assert server.get_json("/q/q/done.json?tag=cli")[1] == [cli_id]


def _page_with(server, path, msg_id):
    """The page at ``path`` if it is there and lists ``msg_id``, else None."""
    status, _h, page = server.request("GET", path)
    return page if status == 200 and msg_id.encode() in page else None
