"""Resource logic through falcon's TestClient (WSGI in-process), with real daemons
where a route talks to one."""

from __future__ import annotations

import base64
import json
import re
import socket

import falcon
import falcon.testing
import pytest
from conftest import wait_for, web_client

from rqsys.errors import (
    BadRequest,
    ConfigError,
    NotFound,
    ProtocolError,
    QueueDown,
    RQError,
    StoreError,
    TooLarge,
    Unavailable,
)
from rqsys.web import answers, body, logs
from rqsys.web.connections import Connections

FORM_HDR = {"Content-Type": "application/x-www-form-urlencoded"}


def _client(layout, **cfg) -> falcon.testing.TestClient:
    layout.config_file.write_text(json.dumps({"host": "h.example", "port": 3333, **cfg}))
    return web_client(layout)


@pytest.mark.parametrize(("exc", "status"), [
    (NotFound("x"), 404), (BadRequest("x"), 400), (ConfigError("x"), 400),
    (TooLarge("x"), 413), (answers.Forbidden("x"), 403), (QueueDown("x"), 503),
    (Unavailable("x"), 503), (ProtocolError("x"), 502), (StoreError("x"), 500),
    (RQError("x"), 500)])
def test_every_rq_error_maps_to_one_status(exc, status):
    assert answers.status_for(exc) == falcon.code_to_http_status(status)


def test_message_from_form_fields_is_typed_and_mesg_wins():
    msg = body.message_from({"mesg_param1": "a", "mesg_due": "12.5", "mesg_max_count": "3",
                             "mesg_force_remote": "on", "mesg_src": ""})
    assert msg == {"param1": "a", "due": 12.5, "max_count": 3, "force_remote": True}
    assert body.message_from({"mesg": '{"param2":"b"}', "mesg_param1": "a"}) == {"param2": "b"}
    assert body.message_from({"mesg": {"param3": "c"}}) == {"param3": "c"}
    for bad, why in [({"mesg": "{"}, "not valid JSON"), ({"mesg": "[]"}, "JSON object"),
                     ({"mesg_max_count": "lots"}, "mesg_max_count"), ({}, "no message")]:
        with pytest.raises(BadRequest, match=why):
            body.message_from(bad)


def test_back_must_stay_on_this_site():
    assert answers.safe_back("/q/x?state=done") == "/q/x?state=done"
    for bad in ("http://evil/", "//evil/", "q/x", "/\\evil", "/x\r\nSet-Cookie: a=b"):
        with pytest.raises(BadRequest):
            answers.safe_back(bad)


def test_tail_chunks_never_split_a_utf8_character():
    text = "ab€".encode()  # € is three bytes
    assert logs._whole_utf8(text) == text
    assert logs._whole_utf8(text[:-1]) == b"ab"
    assert logs._whole_utf8(text[:-2]) == b"ab"
    assert logs._whole_utf8("é".encode()) == "é".encode()


def test_basic_auth_and_relative_root_in_process(layout):
    client = _client(layout, relative_root="/rq", basic_auth={"realm": "R", "users": {"u": "p"}})
    assert client.simulate_get("/rq/openapi.json").status_code == 401
    good = {"Authorization": "Basic " + base64.b64encode(b"u:p").decode()}
    got = client.simulate_get("/rq/openapi.json", headers=good)
    assert got.status_code == 200 and got.json["servers"] == [{"url": "/rq"}]
    assert client.simulate_get("/openapi.json", headers=good).status_code == 404
    assert client.simulate_get("/rq", headers=good).status_code == 200


def test_new_message_form_honours_form_json(layout, make_queue, tmp_path):
    entry = make_queue("formq", 'echo "done ok" >&3\n')
    (entry / "form.json").write_text(json.dumps({
        "default": "hidden",
        "mesg_param1": {"label": "Frequency <of> run", "help": "Tell the script"},
        "mesg_param2": {"hidden": True, "value": "secret\"value"},
        "mesg_src": {"value": "web form"}}))
    make_queue("formq", 'echo "done ok" >&3\n')  # re-install links form.json
    page = _client(layout).simulate_get("/q/formq/new_message", headers={"Accept": "text/html"})
    assert page.status_code == 200
    html = page.text
    assert "Frequency &lt;of&gt; run" in html and "Tell the script" in html
    assert '<input type="hidden" name="mesg_param2" value="secret&#34;value">' in html
    assert 'name="mesg_src" value="web form"' in html
    assert 'name="mesg_dest"' not in html and 'name="mesg_param3"' not in html


def test_broken_form_json_falls_back_with_a_warning(layout, make_queue):
    entry = make_queue("formbad", 'echo "done ok" >&3\n')
    (entry / "form.json").write_text('{"mesg_param1": {"colour": "red"}}')
    make_queue("formbad", 'echo "done ok" >&3\n')
    html = _client(layout).simulate_get("/q/formbad/new_message").text
    assert "form.json ignored" in html and 'name="mesg_param1"' in html


def test_message_page_escapes_user_data(layout, make_queue, daemon):
    make_queue("esc", 'echo "done ok" >&3\n')
    queue = daemon("esc")
    queue.call("adminoper", oper="pause")
    client = _client(layout)
    got = client.simulate_post("/q/esc/new_message", headers=FORM_HDR,
                               body="mesg=" + json.dumps({"param1": "<script>x()</script>"}))
    msg_id = got.json[1].rsplit("/", 1)[1]
    assert got.json[1] == f"http://h.example:3333/q/esc/{msg_id}"
    page = client.simulate_get(f"/q/esc/{msg_id}", headers={"Accept": "text/html"}).text
    assert "<script>x()" not in page and "&lt;script&gt;x()&lt;/script&gt;" in page
    listing = client.simulate_get("/q/esc", params={"state": "que"}).text
    assert "<script>x()" not in listing and msg_id in listing
    filtered = client.simulate_get("/q/esc", params={"state": "que", "filter": "nomatch"}).text
    assert msg_id not in filtered


def _pool_with_a_connection(layout, make_queue, daemon, name):
    """A pool on a fake clock (``now[0]``) holding one idle connection to ``name``."""
    make_queue(name, 'echo "done ok" >&3\n')
    daemon(name)
    now = [100.0]
    pool = Connections(layout, clock=lambda: now[0])
    pool.call(name, "ping")
    return pool, now, pool._free[name][0][0]


def test_pool_reuses_then_closes_idle_connections(layout, make_queue, daemon):
    pool, now, first = _pool_with_a_connection(layout, make_queue, daemon, "pooled")
    pool.call("pooled", "ping")
    assert pool._free["pooled"][0][0] is first  # the same connection again
    now[0] += 10
    pool.sweep()
    assert pool._free["pooled"] == [] and first._sock is None
    with pytest.raises(NotFound):
        pool.call("pooled", "get", msg_id="20200101.0000.00.000.0")
    assert len(pool._free["pooled"]) == 1  # a refusal keeps the connection


def test_pool_never_reuses_a_connection_idle_too_long_between_sweeps(layout, make_queue,
                                                                     daemon):
    pool, now, first = _pool_with_a_connection(layout, make_queue, daemon, "between")
    now[0] = 101.9  # a call elsewhere sweeps: the connection is not yet idle too long
    with pytest.raises(NotFound):
        pool.call("no-such-queue", "ping")
    now[0] = 102.2  # too long now, and no sweep is due
    pool.call("between", "ping")
    assert first._sock is None and pool._free["between"][0][0] is not first


def test_pool_retries_what_was_not_sent_after_a_daemon_restart(layout, make_queue, daemon):
    make_queue("restarts", 'echo "done ok" >&3\n')
    first = daemon("restarts")
    pool = Connections(layout)
    pool.call("restarts", "ping")
    first.stop()
    proc = daemon("restarts")
    proc.call("adminoper", oper="pause")
    # a create on the stale pooled connection could not be sent: it is sent on a
    # fresh one (the first create after a restart was a 503), and made once
    assert pool.call("restarts", "create", msg={"param1": "once"})["msg_id"]
    assert pool.call("restarts", "counts")["counts"]["que"] == 1
    # a read on a stale connection is retried too
    pool.call("restarts", "ping")  # leaves a pooled connection
    pool._free["restarts"][0][0]._sock.shutdown(socket.SHUT_RD)
    assert pool.call("restarts", "counts")["admin"] == "PAUSE"
    # a create that was sent, whose answer is lost, is not repeated: the client
    # hears 503, and the message is not made twice
    pool.call("restarts", "ping")
    pool._free["restarts"][0][0]._sock.shutdown(socket.SHUT_RD)
    with pytest.raises(Unavailable):
        pool.call("restarts", "create", msg={"param1": "sent"})
    wait_for(lambda: pool.call("restarts", "counts")["counts"]["que"] == 2, 5, "it made once")
    assert pool.call("restarts", "counts")["counts"]["que"] == 2


def test_admin_buttons_follow_the_queue_state(layout, make_queue, daemon):
    # Given a queue on a real daemon: each state offers what changes it, nothing else
    # (a paused queue offered "pause" again; resume was "up")
    make_queue("adm", 'echo "done ok" >&3\n')
    queue = daemon("adm")
    client = _client(layout)

    def buttons(path):
        html = client.simulate_get(path, headers={"Accept": "text/html"}).text
        return re.findall(r'action="/q/adm/adminoper"[^>]*>.*?<button[^>]*>(\w+)</button>', html)

    for oper, offered in (("up", ["pause", "down"]), ("pause", ["resume", "down"]),
                          ("down", ["up"]), ("resume", ["pause", "down"])):
        queue.call("adminoper", oper=oper)
        assert buttons("/q/adm") == offered and buttons("/") == offered, oper
