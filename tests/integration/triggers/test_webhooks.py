"""Webhook triggers over real HTTP (issue 49): a real ``rqsys web`` and real queue
daemons; signatures made as GitHub, GitLab, Stripe and a plain HMAC sender
make them; wrong, missing and stale ones refused with nothing made; a
replayed delivery makes one message; a 10 MB body is 413; params from the
JSON body and headers; basic auth on every route but the hook's; a missing
queue and a bad trigger file refused alone; the creator ``trigger <name>``
in the message's timeline and the daemon's audit file."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from web_support import web_server  # noqa: F401

from rqsys.store import Layout
from rqsys.web import auth

SECRET = b"It's a Secret to Everybody"
PAYLOAD = json.dumps({"repository": {"full_name": "octo/hello", "tags": ["v1", "v2"]},
                      "id": "evt_1", "n": 7}).encode()


def _hmac(secret: bytes, data: bytes) -> str:
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def github(body: bytes, delivery: str, secret: bytes = SECRET) -> dict[str, str]:
    """As GitHub signs: X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>."""
    return {"Content-Type": "application/json", "X-GitHub-Event": "push",
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": "sha256=" + _hmac(secret, body)}


def stripe(body: bytes, at: int, secret: bytes = SECRET) -> dict[str, str]:
    """As Stripe signs: t=<time>,v1=<hex HMAC-SHA256 of "<t>.<body>">."""
    signed = _hmac(secret, f"{at}.".encode() + body)
    return {"Content-Type": "application/json", "Stripe-Signature": f"t={at},v1={signed}"}


def write_trigger(layout: Layout, name: str, data: dict[str, Any] | str) -> Path:
    tdir = layout.root / "triggers"
    tdir.mkdir(exist_ok=True)
    path = tdir / f"{name}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def secret_file(tmp_path: Path, secret: bytes = SECRET) -> str:
    path = tmp_path / "hook-secret"
    path.write_bytes(secret + b"\n")  # as `echo` leaves it: the newline is not the secret
    path.chmod(0o600)
    return str(path)


def hook(signature: str, secret: str, **more: Any) -> dict[str, Any]:
    return {"webhook": {"secret": {"file": secret}, "signature": signature, **more},
            "msg": {"dest": "inbox"}}


def post(server, name: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any, Any]:
    status, head, data = server.request("POST", f"/hooks/{name}", body, headers)
    return status, head, json.loads(data) if data else None


def messages(layout: Layout, queue: str = "inbox") -> list[Path]:
    qdir = layout.queue_dir(queue)
    return [d for state in ("prep", "que", "run", "done", "err") if (qdir / state).is_dir()
            for d in (qdir / state).rglob("msg")]


def record(layout: Layout, name: str) -> dict[str, Any]:
    return json.loads((layout.root / "triggers" / ".state" / f"{name}.json").read_text())


def msg_id_of(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[1]


@pytest.fixture
def inbox(make_queue, daemon):
    make_queue("inbox", "echo done >&3")
    return daemon("inbox")


def test_github_delivery_makes_one_message_with_body_params_and_its_creator(
        layout, inbox, web_server, tmp_path):  # noqa: F811
    # Given a GitHub trigger with params from the body and a header
    write_trigger(layout, "gh", {**hook("github", secret_file(tmp_path),
                                        delivery_header="X-GitHub-Delivery"),
                                 "params": {"param1": "$.repository.full_name",
                                            "param2": "header:X-GitHub-Event",
                                            "param3": "$.repository.tags[1]",
                                            "param4": "$.n"}})
    server = web_server()
    # When GitHub delivers
    status, head, answer = post(server, "gh", PAYLOAD, github(PAYLOAD, "d-1"))
    # Then one message, its params, its body attached as body.json
    assert status == 200 and answer[0] == "ok", answer
    assert head.get("RQ-Duplicate") is None
    got = inbox.call("get", msg_id=msg_id_of(answer[1]))
    msg = got["msg"]
    assert (msg["param1"], msg["param2"], msg["param3"], msg["param4"]) == (
        "octo/hello", "push", "v2", "7")
    assert msg["unique_key"] == "hook:gh:d-1"
    body = json.loads(server.request("GET", f"/q/inbox/{msg_id_of(answer[1])}/attach/"
                                            "body.json")[2])
    assert body["repository"]["full_name"] == "octo/hello"
    # and its creator is the trigger, in its timeline and in the daemon's audit file
    created = got["timeline"][0]
    assert "trigger gh" in json.dumps(created), got["timeline"]
    audit = [json.loads(line) for line in
             (layout.root / "audit" / "inbox.jsonl").read_text().splitlines()]
    made = [r for r in audit if r["action"] == "create"]
    assert made and made[-1]["actor"] == "trigger gh", made
    assert record(layout, "gh")["made"] == 1


def test_a_replayed_delivery_makes_one_message_and_says_duplicate(
        layout, inbox, web_server, tmp_path):  # noqa: F811
    write_trigger(layout, "gh", hook("github", secret_file(tmp_path),
                                     delivery_header="X-GitHub-Delivery"))
    server = web_server()
    first = post(server, "gh", PAYLOAD, github(PAYLOAD, "same-id"))
    second = post(server, "gh", PAYLOAD, github(PAYLOAD, "same-id"))
    assert first[0] == second[0] == 200
    assert second[2] == first[2]  # ["ok", the first message's URL]
    assert second[1].get("RQ-Duplicate") == "true" and first[1].get("RQ-Duplicate") is None
    assert len(messages(layout)) == 1
    # after it has ended the delivery is still known (unique_for)
    wait_for(lambda: inbox.call("state", msg_id=msg_id_of(first[2][1]))["state"] == "done",
             what="the message done")
    third = post(server, "gh", PAYLOAD, github(PAYLOAD, "same-id"))
    assert third[1].get("RQ-Duplicate") == "true" and len(messages(layout)) == 1
    rec = record(layout, "gh")
    assert (rec["made"], rec["duplicate"], rec["refused"]) == (1, 2, 0)
    # a new delivery id is a new message
    assert post(server, "gh", PAYLOAD, github(PAYLOAD, "other-id"))[0] == 200
    assert len(messages(layout)) == 2


@pytest.mark.parametrize("headers", [
    {"X-Hub-Signature-256": "sha256=" + "0" * 64},  # wrong
    {"X-Hub-Signature-256": "sha256=" + _hmac(b"another secret", PAYLOAD)},  # other secret
    {"X-Hub-Signature-256": _hmac(SECRET, PAYLOAD)},  # no sha256=
    {},  # missing
], ids=["wrong", "other-secret", "no-prefix", "missing"])
def test_a_bad_or_missing_github_signature_is_401_and_makes_nothing(
        layout, inbox, web_server, tmp_path, headers):  # noqa: F811
    write_trigger(layout, "gh", hook("github", secret_file(tmp_path)))
    server = web_server()
    status, _h, answer = post(server, "gh", PAYLOAD, {"Content-Type": "application/json",
                                                      **headers})
    assert status == 401 and answer[0] == "fail", answer
    assert messages(layout) == []
    rec = record(layout, "gh")
    assert rec["refused"] == 1 and rec["made"] == 0 and "signature" in rec["last_error"]


def test_gitlab_token(layout, inbox, web_server, tmp_path):  # noqa: F811
    write_trigger(layout, "gl", hook("gitlab", secret_file(tmp_path),
                                     delivery_header="X-Gitlab-Event-UUID"))
    server = web_server()
    good = {"Content-Type": "application/json", "X-Gitlab-Token": SECRET.decode(),
            "X-Gitlab-Event-UUID": "u-1"}
    assert post(server, "gl", PAYLOAD, good)[0] == 200
    assert post(server, "gl", PAYLOAD, {**good, "X-Gitlab-Token": "guess"})[0] == 401
    assert post(server, "gl", PAYLOAD, {"Content-Type": "application/json"})[0] == 401
    assert len(messages(layout)) == 1


def test_stripe_signature_inside_and_outside_its_tolerance(
        layout, inbox, web_server, tmp_path):  # noqa: F811
    write_trigger(layout, "st", hook("stripe", secret_file(tmp_path), tolerance=300,
                                     delivery_path="$.id"))
    server = web_server()
    now = int(time.time())
    status, _h, answer = post(server, "st", PAYLOAD, stripe(PAYLOAD, now - 60))
    assert status == 200, answer
    assert inbox.call("get", msg_id=msg_id_of(answer[1]))["msg"]["unique_key"] == "hook:st:evt_1"
    for stale in (now - 301 - 60, now + 400):  # too old, too far ahead
        status, _h, answer = post(server, "st", PAYLOAD, stripe(PAYLOAD, stale))
        assert status == 401 and "from now" in answer[1], answer
    tampered = stripe(PAYLOAD, now)
    assert post(server, "st", PAYLOAD + b" ", tampered)[0] == 401
    assert len(messages(layout)) == 1


def test_plain_hmac_in_a_named_header_and_a_body_that_is_not_json(
        layout, inbox, web_server, tmp_path):  # noqa: F811
    write_trigger(layout, "plain", {**hook("hmac-sha256", secret_file(tmp_path),
                                           header="X-Body-Signature"),
                                    "params": {"param1": "$.a", "param2": "header:X-Kind"}})
    server = web_server()
    body = b"just some bytes\x00\xff"
    status, _h, answer = post(server, "plain", body, {
        "Content-Type": "application/octet-stream", "X-Kind": "raw",
        "X-Body-Signature": _hmac(SECRET, body)})
    assert status == 200, answer
    mid = msg_id_of(answer[1])
    msg = inbox.call("get", msg_id=mid)["msg"]
    assert msg["param2"] == "raw" and not msg.get("param1")  # no JSON: no $.a
    assert server.request("GET", f"/q/inbox/{mid}/attach/body")[2] == body
    assert post(server, "plain", body, {"X-Signature": _hmac(SECRET, body)})[0] == 401


def test_a_body_over_max_body_is_413(layout, inbox, web_server, tmp_path):  # noqa: F811
    write_trigger(layout, "gh", hook("github", secret_file(tmp_path)))
    server = web_server()
    big = b"x" * (10 << 20)
    status, _h, answer = post(server, "gh", big, github(big, "big"))
    assert status == 413 and "max_body" in answer[1], answer
    assert messages(layout) == []
    assert record(layout, "gh")["refused"] == 1


def test_basic_auth_guards_every_route_but_the_signed_hook(
        layout, inbox, web_server, tmp_path):  # noqa: F811
    write_trigger(layout, "gh", hook("github", secret_file(tmp_path)))
    server = web_server(basic_auth={"realm": "rq", "users": {
        "ops": auth.hash_password("pw")}})
    # the hook needs no credentials, even from a browser-looking request of another site
    headers = {**github(PAYLOAD, "a"), "Origin": "https://github.example",
               "Sec-Fetch-Site": "cross-site", "Host": "hooks.example.org"}
    status, _h, answer = post(server, "gh", PAYLOAD, headers)
    assert status == 200, answer
    # a wrong signature is still 401, and makes nothing
    assert post(server, "gh", PAYLOAD, {**headers, "X-Hub-Signature-256": "sha256=00"})[0] == 401
    assert len(messages(layout)) == 1
    # other routes still need them: new_message, the listing, a GET of the hook path
    assert server.form("/q/inbox/new_message", {"mesg": "{}"})[0] == 401
    assert server.request("GET", "/triggers.json")[0] == 401
    assert server.request("GET", "/hooks/gh")[0] == 401
    assert server.request("POST", "/hooks/gh/x", PAYLOAD, github(PAYLOAD, "b"))[0] == 401
    token = base64.b64encode(b"ops:pw").decode()
    status, _h, data = server.request("GET", "/triggers.json",
                                      headers={"Authorization": f"Basic {token}"})
    assert status == 200 and json.loads(data)[0]["made"] == 1


def test_a_missing_queue_is_refused_and_recorded(layout, inbox, web_server, tmp_path):  # noqa: F811
    write_trigger(layout, "lost", {**hook("github", secret_file(tmp_path)),
                                   "msg": {"dest": "nosuchqueue"}})
    server = web_server()
    status, _h, answer = post(server, "lost", PAYLOAD, github(PAYLOAD, "x"))
    assert status == 503 and "no queue named nosuchqueue" in answer[1], answer
    assert record(layout, "lost")["last_error"] == "no queue named nosuchqueue"
    status, listed = server.get_json("/triggers.json")
    entry = next(e for e in listed if e["name"] == "lost")
    assert entry["error"] == "no queue named nosuchqueue" and entry["refused"] == 1
    assert "trigger lost: refused: no queue named nosuchqueue" in _stderr_soon(server)


def _stderr_soon(server) -> str:
    server.stop()  # the web's stderr, whole
    return server.proc.stderr.read() if server.proc.stderr else ""


def test_a_bad_trigger_file_beside_a_good_one(layout, inbox, web_server, tmp_path):  # noqa: F811
    write_trigger(layout, "broken", "{not json")
    write_trigger(layout, "both", {**hook("github", secret_file(tmp_path)),
                                   "journal": {"match": {"_SYSTEMD_UNIT": "x.service"}}})
    write_trigger(layout, "gh", hook("github", secret_file(tmp_path)))
    os.symlink(layout.root / "triggers" / "gh.json", layout.root / "triggers" / "linked.json")
    server = web_server()
    assert post(server, "broken", PAYLOAD, github(PAYLOAD, "1"))[0] == 503
    assert post(server, "both", PAYLOAD, github(PAYLOAD, "1"))[0] == 503
    assert post(server, "nothere", PAYLOAD, github(PAYLOAD, "1"))[0] == 404
    assert post(server, "gh", PAYLOAD, github(PAYLOAD, "1"))[0] == 200
    assert post(server, "linked", PAYLOAD, github(PAYLOAD, "2"))[0] == 200
    status, listed = server.get_json("/triggers.json")
    by_name = {e["name"]: e for e in listed}
    assert sorted(by_name) == ["both", "broken", "gh", "linked"]
    assert "exactly one" in by_name["both"]["error"]
    assert str(layout.root) not in json.dumps(listed)  # no server path shown
    assert by_name["gh"]["made"] == 1 and by_name["gh"]["path"] == "/hooks/gh"
    assert by_name["gh"]["kind"] == "webhook" and by_name["gh"]["dest"] == "inbox"
    assert len(messages(layout)) == 2


def test_a_secret_file_others_may_read_is_refused(layout, inbox, web_server, tmp_path):  # noqa: F811
    path = secret_file(tmp_path)
    os.chmod(path, 0o644)
    write_trigger(layout, "gh", hook("github", path))
    server = web_server()
    status, _h, answer = post(server, "gh", PAYLOAD, github(PAYLOAD, "1"))
    assert status == 503 and SECRET.decode() not in json.dumps(answer)
    assert "others may read" in record(layout, "gh")["last_error"]
    os.chmod(path, 0o640)  # read at each request: fixed without a restart
    assert post(server, "gh", PAYLOAD, github(PAYLOAD, "1"))[0] == 200


def test_a_credential_of_the_web_process(layout, inbox, web_server,  # noqa: F811
                                         tmp_path, monkeypatch):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "gh-secret").write_bytes(SECRET)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))  # as systemd's LoadCredential=
    write_trigger(layout, "gh", {"webhook": {"secret": {"credential": "gh-secret"},
                                             "signature": "github"}, "msg": {"dest": "inbox"}})
    server = web_server()
    assert post(server, "gh", PAYLOAD, github(PAYLOAD, "1"))[0] == 200
    assert post(server, "gh", PAYLOAD, github(PAYLOAD, "1", b"wrong"))[0] == 401


def test_rq_triggers_prints_what_triggers_json_shows(layout, inbox, web_server, tmp_path):  # noqa: F811
    import subprocess
    import sys

    write_trigger(layout, "gh", hook("github", secret_file(tmp_path)))
    write_trigger(layout, "broken", "[]")
    server = web_server()
    assert post(server, "gh", PAYLOAD, github(PAYLOAD, "1"))[0] == 200
    assert post(server, "gh", PAYLOAD, github(PAYLOAD, "1", b"bad"))[0] == 401
    rq = Path(sys.executable).with_name("rq")
    out = subprocess.run([str(rq), "--root", str(layout.root), "triggers"],
                         capture_output=True, text=True, check=False)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0] == "ok 2", out
    broken, gh = (line.split("\t") for line in lines[1:])
    assert broken[0] == "broken" and "(top level)" in broken[-1]
    assert gh[:6] == ["gh", "webhook", "inbox", "made=1", "duplicate=0", "refused=1"]
    assert gh[6] != "-" and "signature" in gh[7]
