"""Unit tests of the special queues' building blocks (no network, no daemons)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from rqsys.errors import BadRequest
from rqsys.scripts.cleaner import parse_days
from rqsys.scripts.jobkit import Job
from rqsys.scripts.relay import (
    Relay,
    RelayLoop,
    relay,
    state_of,
    target_queue_url,
    url_parts,
)
from rqsys.scripts.rqhttp import Peer, PeerError, PeerRefused, PeerUnknown, Reply, rq_answer
from rqsys.special import SPECIAL_QUEUES, install_special_queues, webhook_message
from rqsys.store import Layout

HOST = "http://a.example:3333/"


def make_job(tmp_path: Path, msg: dict[str, Any], count: int = 1, **env: str) -> Job:
    job_dir = tmp_path / "queue" / "relay" / "run" / "20260101.0000.00.000.0" / "job"
    job_dir.mkdir(parents=True)
    (job_dir.parent / "msg").write_text(json.dumps(msg))
    return Job({"RQ_MSG_DIR": str(job_dir), "RQ_COUNT": str(count), "RQ_HOST": HOST,
                "RQ_FULL_MSG_ID": f"{HOST}q/relay/20260101.0000.00.000.0", **env})


@pytest.mark.parametrize("status, body, value", [
    (200, b'["ok", "http://b/q/x/1"]', "http://b/q/x/1"),
    (201, b'["ok", "abc-Attached successfully"]', "abc-Attached successfully"),
])
def test_rq_answer_ok(status: int, body: bytes, value: str) -> None:
    assert rq_answer(Reply(status, body), "u") == value


@pytest.mark.parametrize("status, body, error, text", [
    (400, b'["fail", "bad mesg"]', PeerRefused, "bad mesg"),
    (200, b'["fail", "no"]', PeerRefused, "no"),
    (403, b"<html>forbidden</html>", PeerRefused, "HTTP 403"),
    (400, b'{"x": 1}', PeerRefused, "HTTP 400"),
    (404, b'["fail", "no queue"]', PeerUnknown, "not found"),
    (503, b'["fail", "DOWN"]', PeerError, "HTTP 503"),
    (429, b"", PeerError, "HTTP 429"),
    (200, b"not json", PeerError, "not JSON"),
    (200, b'["ok"]', PeerError, "unexpected answer"),
    (200, b'{"ok": true}', PeerError, "unexpected answer"),
])
def test_rq_answer_errors(status: int, body: bytes, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        rq_answer(Reply(status, body), "u")


def test_peer_takes_credentials_from_the_url() -> None:
    peer = Peer("http://user:s3cret@b.example:3333/q/x")
    assert peer.auth == "Basic dXNlcjpzM2NyZXQ="
    assert (peer.host, peer.port) == ("b.example", 3333)
    for bad in ("ftp://b/q/x", "b.example/q/x", "http:///q/x"):
        with pytest.raises(PeerRefused):
            Peer(bad)


@pytest.mark.parametrize("dest, url", [
    ("http://b:3333/q/work", "http://b:3333/q/work"),
    ("http://b:3333/q/work/", "http://b:3333/q/work"),
    ("https://b/root/q/work", "https://b/root/q/work"),
    ("work", "http://a.example:3333/q/work"),  # force_remote to a local name
])
def test_target_queue_url(dest: str, url: str) -> None:
    assert target_queue_url(dest, HOST) == url


@pytest.mark.parametrize("dest", ["http://b:3333/work", "http://b/q/../etc", "http://b/q/",
                                  "../x", ""])
def test_target_queue_url_refuses_non_queue_urls(dest: str) -> None:
    with pytest.raises(PeerRefused):
        target_queue_url(dest, HOST)


def test_url_parts_checks_message_urls() -> None:
    assert url_parts("http://b/q/w/20260101.0000.00.000.1", 3)[1:] == ["w",
                                                                       "20260101.0000.00.000.1"]
    for bad in ("http://b/q/w", "http://b/q/w/../../x", "http://b/x/w/20260101.0000.00.000.1",
                "/q/w/20260101.0000.00.000.1"):
        with pytest.raises(BadRequest):
            url_parts(bad, 3)


@pytest.mark.parametrize("count, env, delay", [
    (1, {}, 10), (3, {}, 90), (30, {}, 3600),
    (4, {"BACKOFF_UNIT": "0.5"}, 8), (10, {"BACKOFF_UNIT": "1", "BACKOFF_MAX": "20"}, 20),
])
def test_backoff_is_count_squared_times_unit_capped(tmp_path: Path, count: int,
                                                    env: dict[str, str], delay: int) -> None:
    assert make_job(tmp_path, {"dest": "x"}, count, **env).backoff() == delay


def test_outgoing_message_keeps_fields_and_adds_this_hop(tmp_path: Path) -> None:
    job = make_job(tmp_path, {"dest": "http://b:3333/q/w", "param1": "p", "count": 4,
                              "due": 5, "force_remote": False, "msg_id": "x",
                              "relay_via": ["http://c:3333/"]})
    sent = Relay(job).outgoing()
    assert sent == {"dest": "http://b:3333/q/w", "param1": "p",
                    "orig_msg_id": f"{HOST}q/relay/20260101.0000.00.000.0",
                    "relay_via": ["http://c:3333/", HOST]}


@pytest.mark.parametrize("msg, why", [
    ({"dest": "http://b:3333/q/w", "relay_via": [HOST]}, "already relayed"),
    ({"dest": "http://b:3333/q/w", "relay_via": [f"http://h{n}/" for n in range(16)]},
     "16 hops"),
])
def test_loops_are_refused(tmp_path: Path, msg: dict[str, Any], why: str) -> None:
    with pytest.raises(RelayLoop, match=why):
        Relay(make_job(tmp_path, msg)).check_loop()


@pytest.mark.parametrize("msg", [{"dest": "w", "force_remote": True}, {"dest": f"{HOST}q/w"}])
def test_relay_to_this_host_is_not_a_loop(tmp_path: Path, msg: dict[str, Any]) -> None:
    # RQ relays every URL dest, its own host's too: the message comes in through the web
    Relay(make_job(tmp_path, msg)).check_loop()


@pytest.mark.parametrize("text, days", [("", 3.0), ("0", 0.0), ("1.5", 1.5), (" 7 ", 7.0)])
def test_parse_days(text: str, days: float) -> None:
    assert parse_days(text) == days


@pytest.mark.parametrize("text", ["x", "-1", "nan", "inf", "1e999"])
def test_parse_days_refuses(text: str) -> None:
    with pytest.raises(BadRequest):
        parse_days(text)


def test_webhook_message_carries_the_payload() -> None:
    note = webhook_message("http://a/q/w/1", "done", "ok", {"post_run_webhook": ["http://h/"]})
    assert note["dest"] == "webhook" and note["param1"] == "http://a/q/w/1"
    assert json.loads(note["param3"])["msg"]["post_run_webhook"] == ["http://h/"]
    assert "post_run_webhook" not in note  # no webhook about the webhook


def test_install_creates_missing_special_queues_only(layout: Layout, make_queue: Any) -> None:
    # Given an operator's own relay queue from the scandir
    make_queue("relay", 'echo "relayed http://x/q/y/20260101.0000.00.000.0" >&3')
    own = json.loads((layout.queue_dir("relay") / "config.json").read_text())
    # When the special queues are installed
    assert install_special_queues(layout) == ["webhook", "cleaner"]
    # Then ours fill the gaps and the operator's relay is kept
    assert json.loads((layout.queue_dir("relay") / "config.json").read_text()) == own
    for name in ("webhook", "cleaner"):
        cfg = json.loads((layout.queue_dir(name) / "config.json").read_text())
        assert cfg["script"].endswith(f"rqsys/scripts/{name}.py")
        assert Path(cfg["script"]).stat().st_mode & 0o111
        assert cfg["num_workers"] == SPECIAL_QUEUES[name]["num_workers"]
    assert install_special_queues(layout) == []


@pytest.mark.parametrize("answer, state", [
    ({"state": "prep"}, "prep"), (["ok", "done"], "done"), ("que", "que"),
    (["fail", "x"], None), ({"status": "x"}, None), (3, None), (["ok", 3], None),
])
def test_state_of_answers(answer: Any, state: str | None) -> None:
    assert state_of(answer) == state


def test_whole_note_is_read_back_only_whole(tmp_path: Path) -> None:
    job = make_job(tmp_path, {"dest": "http://b.example/q/x"})
    job.write_whole_note("relay_id", "http://b.example/q/x/20260101.0000.00.000.1")
    assert job.read_whole_note("relay_id") == "http://b.example/q/x/20260101.0000.00.000.1"
    # a crash in the middle of the write leaves it short: no note at all
    (job.job_dir / "relay_id").write_bytes(b"http://b.example/q/x/2026")
    assert job.read_whole_note("relay_id") == "" and job.read_whole_note("missing") == ""


def test_relay_id_holding_no_message_url_is_prepared_again(tmp_path: Path) -> None:
    # Given a relay_id note whose blocks came back as garbage after a power cut
    make_job(tmp_path, {"dest": "http://b.example/q/x"})
    job_dir = next(tmp_path.rglob("job"))
    (job_dir / "relay_id").write_bytes(b"\0\0\0garbage\n")
    read, write = os.pipe()
    try:
        job = Job({"RQ_MSG_DIR": str(job_dir), "RQ_HOST": HOST}, out=write, write=write)
        # When the relay resumes, Then it prepares again (nothing was committed from it)
        assert Relay(job).resume() == ("", False)
        assert b"job/relay_id holds no message URL" in os.read(read, 4096)
    finally:
        os.close(read)
        os.close(write)


def test_relay_id_naming_another_message_is_prepared_again(tmp_path: Path) -> None:
    # Given a relay_id note that is a whole URL, but another message's (a stale
    # block of a freed note, after a power cut without a journal)
    make_job(tmp_path, {"dest": "http://b.example/q/x"})
    job_dir = next(tmp_path.rglob("job"))
    other = "http://b.example/q/x/20260101.0000.00.000.9"
    (job_dir / "relay_id").write_bytes(other.encode() + b"\n")
    read, write = os.pipe()
    try:
        job = Job({"RQ_MSG_DIR": str(job_dir), "RQ_HOST": HOST}, out=write, write=write)
        relay = Relay(job)
        relay.far_state = lambda url: ("done", {"orig_msg_id": "http://c/q/y/1"})  # type: ignore
        # When the relay resumes, Then it prepares again: that one's end is not ours
        assert relay.resume() == ("", False)
        assert b"another message's" in os.read(read, 4096)
        # and a far message that is ours (or says nothing of its origin) is taken
        relay.far_state = lambda url: ("done", {"orig_msg_id": relay.orig_msg_id()})  # type: ignore
        assert relay.resume() == (other, True)
        relay.far_state = lambda url: ("done", {})  # type: ignore
        assert relay.resume() == (other, True)
    finally:
        os.close(read)
        os.close(write)


def test_an_error_not_foreseen_resends_with_its_reason(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a relay whose run raises what no branch expects (a far end's odd
    # answer, or a bug): it ended the relay worker's process, and every relay in it
    make_job(tmp_path, {"dest": "http://b.example/q/x"})
    job_dir = next(tmp_path.rglob("job"))

    def odd(self: Relay) -> int:
        raise AttributeError("'list' object has no attribute 'get'")
    monkeypatch.setattr(Relay, "run", odd)
    read, write = os.pipe()
    try:
        job = Job({"RQ_MSG_DIR": str(job_dir), "RQ_HOST": HOST, "RQ_COUNT": "2"},
                  out=write, write=write)
        # When it relays, Then it asks for a resend saying why, with the traceback logged
        assert relay(job) == 0
        said = os.read(read, 65536).decode()
        assert re.search(r"resend \d+-relay failed: AttributeError: 'list' object", said)
        assert "Traceback" in said
    finally:
        os.close(read)
        os.close(write)
