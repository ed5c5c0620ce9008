"""The audit page is reached from every page's header by those who may read it
(an admin of all queues), and its records' queues and messages are links
(issue 48 item 6); over real HTTP with basic_auth users."""

from __future__ import annotations

import base64

from web_support import web_server  # noqa: F401

from rqsys.web import auth


def _auth(user: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:pw-{user}".encode()).decode()
    return {"Authorization": f"Basic {token}", "Accept": "text/html"}


def test_the_header_links_the_audit_for_admins_and_its_ids_are_links(
        layout, make_queue, daemon, web_server):  # noqa: F811
    make_queue("q", "echo done >&3")
    daemon("q")
    users = {u: {"password": auth.hash_password(f"pw-{u}"), "role": r}
             for u, r in (("ann", "admin"), ("vic", "viewer"))}
    server = web_server(basic_auth={"realm": "rq", "users": users})
    status, answer = server.form("/q/q/new_message", {"mesg": '{"param1": "x"}'},
                                 headers=_auth("ann") | {"Accept": "application/json"})
    assert status == 200, answer
    msg_id = answer[1].rstrip("/").rsplit("/", 1)[1]
    admin_page = server.request("GET", "/", headers=_auth("ann"))[2].decode()
    viewer_page = server.request("GET", "/", headers=_auth("vic"))[2].decode()
    assert 'href="/audit">Audit</a>' in admin_page
    assert "/audit" not in viewer_page
    audit = server.request("GET", "/audit", headers=_auth("ann"))[2].decode()
    assert f'<a href="/q/q/{msg_id}">{msg_id}</a>' in audit
    assert '<a href="/q/q">q</a>' in audit
