"""``rq sendmesg`` in process on a fake queue client: the message each option
makes, the queue a dest goes to, the two-phase send of ``--attach`` (and
its withdrawal when an attachment fails), and the exit codes of the
answers (0 ok, 1 fail, 3 no daemon)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from rqsys.cli import send
from rqsys.cli.common import RET_FAIL, RET_OK, RET_UNAVAILABLE
from rqsys.cli.rq import rq_main, rq_parser
from rqsys.errors import BadRequest, QueueDown, Unavailable
from rqsys.store import Layout

MID = "20260101.1200.00.001"
URL = f"http://h.example:3333/q/etl-1/{MID}"


class FakeClient:
    """Stands in for QueueClient: answers from ``answers`` (op -> dict or an
    exception), and records (queue, op, args) in ``calls``."""

    calls: list[tuple[str, str, dict[str, Any]]] = []
    answers: dict[str, Any] = {}

    def __init__(self, layout: Layout, queue: str, timeout: float = 30.0) -> None:
        self.queue = queue

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def call(self, op: str, fds: Any = (), **args: Any) -> dict[str, Any]:
        self.calls.append((self.queue, op, args))
        answer = self.answers.get(op, {})
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)


@pytest.fixture
def client(monkeypatch) -> type[FakeClient]:
    FakeClient.calls = []
    FakeClient.answers = {"create": {"msg_id": MID, "url": URL}, "commit": {"url": URL},
                          "attach": {"md5": "x"}}
    monkeypatch.setattr(send, "QueueClient", FakeClient)
    return FakeClient


@pytest.fixture
def root(layout) -> list[str]:
    return ["--root", str(layout.root)]


def message(*argv: str) -> dict[str, Any]:
    return send.message_from(rq_parser().parse_args(["sendmesg", "--dest", "etl-1", *argv]))


# ---------------------------------------------------------------- options -> message
def test_each_option_is_its_message_field():
    assert message("--src", "cron", "--param1", "a", "--param4", "d", "--orig_msg_id", MID,
                   "--due", "12.5", "--count", "3", "--max_count", "4", "--timeout", "60",
                   "--retry_max", "2", "--priority", "-5", "--tag", "x", "--tag", "y",
                   "--slots", "2", "--unique-key", "k", "--unique-for", "60") == {
        "dest": "etl-1", "src": "cron", "param1": "a", "param4": "d", "orig_msg_id": MID,
        "due": 12.5, "count": 3, "max_count": 4, "timeout": 60.0, "retry_max": 2,
        "priority": -5, "tags": ["x", "y"], "slots": 2, "unique_key": "k", "unique_for": 60.0}


def test_options_not_given_are_no_fields_and_relay_ok_is_none():
    assert message() == {"dest": "etl-1"}
    assert message("--relay-ok") == {"dest": "etl-1"}
    assert message("--force_remote") == {"dest": "etl-1", "force_remote": True}


def test_needs_and_after_are_gathered():
    assert message("--need", "memory=12G", "--need", "cpus=0.5", "--need", "gpus=1",
                   "--after", f"http://h/q/a/{MID}", "--after", MID,
                   "--after-policy", "wait") == {
        "dest": "etl-1", "needs": {"memory": "12G", "cpus": 0.5, "gpus": 1},
        "after": [f"http://h/q/a/{MID}", MID], "after_policy": "wait"}


@pytest.mark.parametrize(("word", "why"), [
    ("disk=1", "--need disk=1: say memory=SIZE, cpus=N or gpus=N"),
    ("cpus", "--need cpus: say memory=SIZE, cpus=N or gpus=N"),
    ("gpus=1.5", "--need gpus=1.5: '1.5' is not a number"),
    ("cpus=many", "--need cpus=many: 'many' is not a number"),
])
def test_a_need_it_cannot_read_is_refused_naming_it(word, why):
    with pytest.raises(BadRequest) as refused:
        message("--need", word)
    assert str(refused.value) == why


# ---------------------------------------------------------------- the send
@pytest.mark.parametrize(("verb", "how"), [
    ("sendmesg", {"state": "que", "single": False}), ("prepmesg", {"state": "prep",
                                                                   "single": False}),
    ("single_que", {"state": "que", "single": True})])
def test_each_send_verb_creates_the_message_and_prints_its_url(client, root, capsys, verb, how):
    assert rq_main([*root, verb, "--dest", "etl-1", "--param1", "a"]) == RET_OK
    assert capsys.readouterr().out == f"ok {URL}\n"
    assert client.calls == [("etl-1", "create", {"msg": {"dest": "etl-1", "param1": "a"},
                                                 **how})]


@pytest.mark.parametrize(("dest", "force", "queue"), [
    ("etl-1", [], "etl-1"), ("etl-1", ["--force_remote"], "relay"),
    ("http://other.example:3333/q/etl-1", [], "relay")])
def test_a_url_dest_or_a_forced_remote_goes_to_the_relay_queue(client, root, dest, force,
                                                               queue):
    assert rq_main([*root, "sendmesg", "--dest", dest, *force]) == RET_OK
    assert client.calls[0][:2] == (queue, "create")


def test_attachments_go_in_prep_then_the_message_is_committed(client, root, tmp_path, capsys):
    data = tmp_path / "data.csv"
    data.write_text("a,b\n")
    assert rq_main([*root, "sendmesg", "--dest", "etl-1", "--attach", str(data)]) == RET_OK
    assert capsys.readouterr().out == f"ok {URL}\n"
    assert [(op, args.get("state"), args.get("name")) for _q, op, args in client.calls] == [
        ("create", "prep", None), ("attach", None, "data.csv"), ("commit", None, None)]
    assert client.calls[1][2]["md5"] == hashlib.md5(b"a,b\n").hexdigest()


def test_a_failed_attachment_withdraws_the_message(client, root, tmp_path, capsys):
    missing = tmp_path / "missing.csv"
    assert rq_main([*root, "sendmesg", "--dest", "etl-1", "--attach", str(missing)]) == RET_FAIL
    why = f"cannot read {missing}: No such file or directory; nothing was sent"
    assert capsys.readouterr().out == f"fail {why}\n"
    assert [op for _q, op, _a in client.calls] == ["create", "delete"]
    assert client.calls[1][2] == {"msg_id": MID}


def test_a_duplicate_is_said_on_stderr_and_nothing_is_attached(client, root, tmp_path, capsys):
    client.answers["create"] = {"msg_id": MID, "url": URL, "duplicate": True}
    (tmp_path / "f").write_text("x")
    argv = [*root, "sendmesg", "--dest", "etl-1", "--unique-key", "k", "--attach",
            str(tmp_path / "f")]
    assert rq_main(argv) == RET_OK
    assert capsys.readouterr() == (
        f"ok {URL}\n", f"rq: duplicate: {URL} holds this unique key; no new message\n")
    assert [op for _q, op, _a in client.calls] == ["create"]


@pytest.mark.parametrize(("exc", "code"), [
    (Unavailable("queue etl-1 is not running"), RET_UNAVAILABLE),
    (QueueDown("queue etl-1 is DOWN"), RET_FAIL), (BadRequest("bad due"), RET_FAIL)])
def test_a_refused_send_is_rqs_fail_line_and_its_exit_code(client, root, capsys, exc, code):
    client.answers["create"] = exc
    assert rq_main([*root, "sendmesg", "--dest", "etl-1"]) == code
    assert capsys.readouterr() == (f"fail {exc}\n", f"rq: {exc}\n")
