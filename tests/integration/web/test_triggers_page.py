"""The console's Triggers page over real HTTP (issue 49): ``GET /triggers`` lists a
webhook trigger and a files trigger with their kind, queue and counts; a viewer
reads it; a user of some queues only is refused (it names every queue)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from pathlib import Path

import pytest
from web_support import web_server  # noqa: F401

from rqsys.store import Layout
from rqsys.triggers import record
from rqsys.web import auth

SECRET = b"page-secret"
BODY = b'{"n": 1}'
USERS = {"vic": ("viewer", None), "olga": ("operator", ["inbox"])}


def _auth(user: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:pw-{user}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _signed(delivery: str, secret: bytes = SECRET) -> dict[str, str]:
    mac = hmac.new(secret, BODY, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": f"sha256={mac}"}


def _write(layout: Layout, name: str, data: dict) -> None:
    tdir = layout.root / "triggers"
    tdir.mkdir(exist_ok=True)
    (tdir / f"{name}.json").write_text(json.dumps(data))


@pytest.fixture
def server(layout, make_queue, daemon, web_server, tmp_path: Path):  # noqa: F811
    make_queue("inbox", "echo done >&3")
    daemon("inbox")
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    _write(layout, "gh", {"webhook": {"secret": {"file": str(secret)}, "signature": "github",
                                      "delivery_header": "X-GitHub-Delivery"},
                          "msg": {"dest": "inbox"}})
    _write(layout, "drop", {"files": {"path": str(tmp_path / "in")}, "msg": {"dest": "inbox"}})
    # rq-scan's record of the files trigger, as it writes it (rqsys.triggers.record)
    for _ in range(3):
        record.note(layout.root / "triggers", "drop", "made", last_msg_id="x", last_queue="inbox")
    record.note(layout.root / "triggers", "drop", "refused", error="queue daemon did not answer")
    users = {user: {"password": auth.hash_password(f"pw-{user}"), "role": role,
                    **({"queues": queues} if queues else {})}
             for user, (role, queues) in USERS.items()}
    srv = web_server(basic_auth={"realm": "rq", "users": users})
    # the webhook fired for real: made once, the same delivery again, a bad signature
    for headers in (_signed("d-1"), _signed("d-1"), _signed("d-2", b"wrong")):
        srv.request("POST", "/hooks/gh", BODY, headers)
    return srv


def _cells(html: str, name: str) -> dict[str, str]:
    """The row of trigger ``name``: its cells by their data-label, tags taken out."""
    row = re.search(rf'<tr><td data-label="Trigger">{name}</td>(.*?)</tr>', html, re.S)
    assert row, html
    return {label: re.sub(r"<[^>]+>", "", text).strip()
            for label, text in re.findall(r'<td data-label="([^"]+)">(.*?)</td>', row.group(1),
                                          re.S)}


def test_the_page_lists_each_trigger_its_kind_queue_and_counts(server):
    # When a viewer asks for the page
    status, _h, data = server.request("GET", "/triggers", headers=_auth("vic"))
    # Then both triggers, their kinds, queue and counts
    assert status == 200, data
    html = data.decode()
    gh, drop = _cells(html, "gh"), _cells(html, "drop")
    assert (gh["Kind"], gh["Queue"], gh["Made"], gh["Duplicate"], gh["Refused"]) == (
        "webhook", "inbox", "1", "1", "1"), gh
    assert gh["Last fire"] != "-" and gh["Last message"] != "-"
    assert "signature" in gh["Last error"], gh
    assert (drop["Kind"], drop["Queue"], drop["Made"], drop["Duplicate"], drop["Refused"]) == (
        "files", "inbox", "3", "0", "1"), drop
    assert drop["Last error"] == "queue daemon did not answer"
    # and the navigation links it beside the timers
    assert f'href="{server.path("/triggers")}">Triggers</a>' in html


def test_a_user_of_some_queues_only_is_refused(server):
    status, _h, data = server.request("GET", "/triggers", headers=_auth("olga"))
    assert status == 403 and b"needs a user of all queues" in data, data
    assert server.request("GET", "/triggers")[0] == 401
