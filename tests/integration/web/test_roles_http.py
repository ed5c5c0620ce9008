"""Roles over real HTTP (issue 33 item 1): basic_auth users as viewer,
operator (of some queues) and admin, each asking what it may and may not;
a refusal is a 403 naming the role needed, and the pages show a user only
the buttons it may use."""

from __future__ import annotations

import base64
import json

import pytest
from web_support import web_server  # noqa: F401

from rqsys.web import auth

USERS = {"vic": ("viewer", None), "olga": ("operator", ["etl-*"]), "ann": ("admin", None),
         "old": (None, None)}


def _auth(user: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:pw-{user}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.fixture
def server(layout, make_queue, daemon, web_server):  # noqa: F811
    for name in ("etl-1", "billing"):
        make_queue(name, "echo done >&3")
        daemon(name)
    users = {}
    for user, (role, queues) in USERS.items():
        hashed = auth.hash_password(f"pw-{user}")
        users[user] = hashed if role is None else {
            "password": hashed, "role": role, **({"queues": queues} if queues else {})}
    return web_server(basic_auth={"realm": "rq", "users": users})


def send(server, user: str, queue: str) -> tuple[int, list]:
    return server.form(f"/q/{queue}/new_message", {"mesg": '{"param1":"x"}'},
                       headers=_auth(user))


def test_a_viewer_reads_everything_and_changes_nothing(server):
    for path in ("/", "/q.json", "/q/billing", "/q/etl-1.json", "/timers", "/metrics"):
        assert server.request("GET", path, headers=_auth("vic"))[0] == 200, path
    status, answer = send(server, "vic", "billing")
    assert status == 403
    assert answer == ["fail", "this needs the operator role on queue billing (you have: "
                              "viewer)"]
    status, answer = server.form("/q/billing/adminoper", {"pause": "1"}, headers=_auth("vic"))
    assert status == 403 and "needs the admin role" in answer[1]
    # and its pages show no button it may not use
    page = server.request("GET", "/q/billing", headers=_auth("vic"))[2].decode()
    assert "New message" not in page and 'value="pause"' not in page and ">pause<" not in page
    dash = server.request("GET", "/", headers=_auth("vic"))[2].decode()
    assert "new message" not in dash and ">down<" not in dash


def test_an_operator_of_some_queues_sends_there_and_sees_nothing_else(server):
    status, answer = send(server, "olga", "etl-1")
    assert status == 200 and answer[0] == "ok", answer
    status, answer = send(server, "olga", "billing")
    assert status == 403 and "operator role on queue billing" in answer[1]
    assert server.request("GET", "/q/billing", headers=_auth("olga"))[0] == 403
    code, _h, data = server.request("GET", "/q.json", headers=_auth("olga"))
    assert code == 200 and json.loads(data) == ["etl-1"]
    code, _h, data = server.request("GET", "/timers.json", headers=_auth("olga"))
    assert code == 403 and b"needs a user of all queues (yours: etl-*)" in data
    status, answer = server.form("/q/etl-1/adminoper", {"pause": "1"}, headers=_auth("olga"))
    assert status == 403 and "needs the admin role on queue etl-1" in answer[1]
    page = server.request("GET", "/q/etl-1", headers=_auth("olga"))[2].decode()
    assert "New message" in page and ">pause<" not in page
    dash = server.request("GET", "/", headers=_auth("olga"))[2].decode()
    assert "etl-1" in dash and "billing" not in dash


def test_an_admin_and_a_user_of_an_old_config_may_do_all(server):
    for user in ("ann", "old"):
        assert send(server, user, "billing")[0] == 200
        status, answer = server.form("/q/billing/adminoper", {"pause": "1"},
                                     headers=_auth(user))
        assert status == 200 and answer == ["ok", "PAUSE"], answer
        server.form("/q/billing/adminoper", {"up": "1"}, headers=_auth(user))
        page = server.request("GET", "/q/billing", headers=_auth(user))[2].decode()
        assert "New message" in page and ">pause<" in page


def test_a_batch_needs_an_operator_of_each_queue_it_names(server):
    body = json.dumps({"messages": [{"dest": "etl-1"}], "on_done": {"dest": "billing"}})
    code, _h, data = server.request("POST", "/batches", body, {
        "Content-Type": "application/json", **_auth("olga")})
    assert code == 403 and b"operator role on queue billing" in data
    code, _h, data = server.request("POST", "/batches", body, {
        "Content-Type": "application/json", **_auth("vic")})
    assert code == 403 and b"(you have: viewer)" in data
