"""The relay script against a small RQ peer in another network namespace.

Host ``a`` runs ``rqsys serve`` (its relay queue runs our relay.py); host
``b`` runs ``relay_peer.py``, which speaks RQ's prep / attach / commit HTTP
contract, keeps what arrives on disk and misbehaves on request (503s, a lying
MD5 echo, a commit whose answer is lost).  The far end's disk is the proof of
"exactly once".  End-to-end relaying between two rqsys instances is in
test_relay_e2e.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import HELPERS, need, wait_for
from netns import NetLab, Rqsys, netns_available

from rqsys.scripts.relay import RUN_MARK
from rqsys.special import special_config

PEER = HELPERS / "relay_peer.py"
PEER_PORT = 8080


class World:
    def __init__(self, lab: NetLab, a: Rqsys, peer_dir: Path) -> None:
        self.lab, self.a, self.peer_dir = lab, a, peer_dir
        self.peer_url = f"http://{lab.hosts['b']}:{PEER_PORT}/"

    def faults(self, **faults: Any) -> None:
        """The peer's faults from now on (a new file: its counts start again)."""
        new = self.peer_dir / "faults.new"
        new.write_text(json.dumps(faults))
        new.replace(self.peer_dir / "faults.json")

    def fault_left(self, name: str) -> int:
        """How many more times a counted fault will strike."""
        path = self.peer_dir / "faults.json"
        stat, faults = path.stat(), json.loads(path.read_text())
        version = f"{stat.st_ino}:{stat.st_mtime_ns}"
        try:
            used = json.loads((self.peer_dir / "faults.used.json").read_text())
        except FileNotFoundError:
            used = {}
        spent = used.get(name, 0) if used.get("version") == version else 0
        return int(faults.get(name, 0)) - spent

    def send(self, dest: str, files: dict[str, bytes] | None = None, **fields: Any) -> str:
        """Put a message for ``dest`` in a's relay queue; its id."""
        fds, specs = [], []
        for name, data in (files or {}).items():
            path = self.peer_dir.parent / f"upload-{name}"
            path.write_bytes(data)
            fds.append(os.open(path, os.O_RDONLY))
            specs.append({"name": name, "md5": hashlib.md5(data).hexdigest()})
        try:
            reply = self.a.call("relay", "create", fds=fds, msg={"dest": dest, **fields},
                                attachments=specs)
        finally:
            for fd in fds:
                os.close(fd)
        return str(reply["msg_id"])

    def state(self, msg_id: str) -> dict[str, Any]:
        return self.a.call("relay", "get", msg_id=msg_id)

    def wait_state(self, msg_id: str, state: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(lambda: (got := self.state(msg_id))["state"] == state and got,
                        timeout, f"relay message {msg_id} in {state}")

    def arrived(self, queue: str = "work") -> list[Path]:
        qdir = self.peer_dir / "q" / queue
        return sorted(qdir.iterdir()) if qdir.is_dir() else []

    def far_state(self, mdir: Path) -> str:
        return (mdir / "state").read_text()

    def runs(self, msg_id: str) -> int:
        """How many times the relay script ran for the message (its log says)."""
        (log,) = self.a.layout.queue_dir("relay").rglob(f"{msg_id}/job/stdio.log")
        return log.read_text().count(RUN_MARK)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    need(netns_available(), "network namespaces need root and iproute2")
    base = tmp_path_factory.mktemp("relay")
    lab = NetLab()
    try:
        lab.host("a")
        addr_b = lab.host("b")
        a = Rqsys(lab, "a", base / "a")
        relay_cfg = special_config("relay")
        relay_cfg["env_vars"] = {"BACKOFF_UNIT": "0.2", "BACKOFF_MAX": "2", "RELAY_TIMEOUT": "2"}
        a.layout.create_queue_dir("relay", relay_cfg)
        peer_dir = base / "peer"
        peer_dir.mkdir()
        lab.popen("b", [sys.executable, str(PEER), str(peer_dir), addr_b, str(PEER_PORT)])
        wait_for(lambda: (peer_dir / "ready").exists(), 15, "the RQ peer")
        a.start()
        yield World(lab, a, peer_dir)
        a.stop()
    finally:
        lab.close()


@pytest.fixture
def w(world: World) -> World:
    world.faults()
    shutil.rmtree(world.peer_dir / "q", ignore_errors=True)
    return world


def test_plain_relay_with_attachments(w: World) -> None:
    # Given a message for b's queue "work" with two attachments
    files = {"a.txt": b"alpha\n", "b.bin": os.urandom(300_000)}
    msg_id = w.send(f"{w.peer_url}q/work", files, param1="p1")
    # When the relay has run
    got = w.wait_state(msg_id, "relayed")
    # Then b holds exactly one committed copy, with the same fields and bytes
    (far,) = w.arrived()
    assert w.far_state(far) == "que"
    assert got["status"] == f"{w.peer_url}q/work/{far.name}"
    sent = json.loads((far / "msg.json").read_text())
    assert sent["param1"] == "p1" and sent["dest"] == f"{w.peer_url}q/work"
    assert sent["orig_msg_id"] == got["url"]
    assert sent["relay_via"] == [w.a.url]
    for name, data in files.items():
        assert (far / "attach" / name).read_bytes() == data


def test_far_end_unreachable_then_back_arrives_once(w: World) -> None:
    # Given b cut off the network
    w.lab.set_link("b", False)
    try:
        msg_id = w.send(f"{w.peer_url}q/work")
        # Then the relay resends (the message is back in que with a reason)
        wait_for(lambda: int(w.state(msg_id)["msg"].get("count", 0)) >= 2, 30,
                 "two failed attempts")
        assert w.arrived() == []
    finally:
        w.lab.set_link("b", True)
    # When b is back, the message arrives exactly once
    w.wait_state(msg_id, "relayed", timeout=40)
    assert len(w.arrived()) == 1


def test_503_resends_with_reason(w: World) -> None:
    w.faults(fail_503=2)
    msg_id = w.send(f"{w.peer_url}q/work")
    w.wait_state(msg_id, "relayed")
    assert w.runs(msg_id) == 3
    assert len(w.arrived()) == 1


def test_md5_mismatch_is_retried_and_never_committed(w: World) -> None:
    # Given a far end where every upload arrives damaged
    w.faults(corrupt=True)
    msg_id = w.send(f"{w.peer_url}q/work", {"data.bin": b"x" * 1000})
    wait_for(lambda: int((got := w.state(msg_id))["msg"].get("count", 0)) >= 3
             and "MD5 mismatch" in got["status"], 30, "three attempts, failed on the MD5")
    # Then it was never committed
    (far,) = w.arrived()
    assert w.far_state(far) == "prep"
    # When the far end behaves again, the same prepared message is committed once
    w.faults()
    got = w.wait_state(msg_id, "relayed", timeout=40)
    (far,) = w.arrived()
    assert w.far_state(far) == "que" and got["status"].endswith(far.name)


def test_commit_answer_lost_gives_one_copy(w: World) -> None:
    # Given a far end that commits but whose answer never comes back
    w.faults(drop_commit=1)
    msg_id = w.send(f"{w.peer_url}q/work", {"f": b"123"})
    got = w.wait_state(msg_id, "relayed")
    # Then the retry found it committed (relay_id) and did not send a second copy
    (far,) = w.arrived()
    assert w.runs(msg_id) == 2
    assert got["status"].endswith(far.name) and w.far_state(far) == "que"


def test_resume_asks_state_json_when_the_message_json_has_no_state(w: World) -> None:
    w.faults(drop_commit=1, no_state=True)
    msg_id = w.send(f"{w.peer_url}q/work")
    got = w.wait_state(msg_id, "relayed")
    (far,) = w.arrived()
    assert w.runs(msg_id) == 2 and got["status"].endswith(far.name)


def test_far_end_forgot_prepared_message_prepares_again(w: World) -> None:
    # Given a prepared message whose upload the far end has refused, and keeps refusing...
    w.faults(attach_503=1000)
    msg_id = w.send(f"{w.peer_url}q/work", {"f": b"data"})
    wait_for(lambda: w.fault_left("attach_503") < 1000, 20, "the first refused upload")
    # ...and that the far end then forgets it, and takes uploads again (the relay may be
    # between its check and its upload then: test_far_end_losing_it_at_the_upload_...)
    first = w.arrived()[0].name
    shutil.rmtree(w.arrived()[0])  # refused uploads write nothing there
    w.faults()
    got = w.wait_state(msg_id, "relayed")
    (far,) = w.arrived()
    assert far.name != first and w.far_state(far) == "que"
    assert (far / "attach" / "f").read_bytes() == b"data"
    assert got["status"].endswith(far.name)


@pytest.mark.parametrize("fault", ["vanish_at_attach", "vanish_at_attach_404"])
def test_far_end_losing_it_at_the_upload_prepares_again(w: World, fault: str) -> None:
    # Given a far end that loses the prepared message when its upload comes, once, and
    # says so as RQ does (200 "cannot find message") or as rqsys does (404): a CI run
    # hit the first as a race, and it ended in err
    w.faults(**{fault: 1})
    msg_id = w.send(f"{w.peer_url}q/work", {"f": b"data"})
    # Then the relay prepares it again, and relays it whole
    got = w.wait_state(msg_id, "relayed")
    (far,) = w.arrived()
    assert w.far_state(far) == "que" and (far / "attach" / "f").read_bytes() == b"data"
    assert got["status"].endswith(far.name) and w.runs(msg_id) == 2
    assert "vanished during its upload" in _log(w, msg_id)


def test_prepared_message_lost_at_its_commit_is_prepared_again(w: World) -> None:
    # Given a far end that loses the prepared message when it is committed, once
    w.faults(vanish_at_commit=1)
    msg_id = w.send(f"{w.peer_url}q/work")
    # Then the relay prepares it again (it ended in err: a review found it)
    got = w.wait_state(msg_id, "relayed")
    (far,) = w.arrived()
    assert w.far_state(far) == "que" and got["status"].endswith(far.name)
    assert w.runs(msg_id) == 2


def test_far_end_answering_malformed_attachments_is_asked_again(w: World) -> None:
    # Given a far end whose message JSON once has _attachments as a list
    w.faults(attachments_list=1)
    msg_id = w.send(f"{w.peer_url}q/work", {"f": b"data"})
    # Then the relay resends, asks again, and relays (it crashed the script)
    got = w.wait_state(msg_id, "relayed")
    (far,) = w.arrived()
    assert w.runs(msg_id) == 2 and got["status"].endswith(far.name)
    assert "_attachments is not an object" in _log(w, msg_id)


def test_prep_answered_with_a_url_not_ascii_is_prepared_again(w: World) -> None:
    # Given a far end whose prep answers a URL HTTP cannot carry, once
    w.faults(unicode_prep=1)
    msg_id = w.send(f"{w.peer_url}q/work")
    # Then that URL is never used (it was kept, and every rerun crashed on it)
    got = w.wait_state(msg_id, "relayed")
    queued = [far for far in w.arrived() if w.far_state(far) == "que"]
    assert len(queued) == 1 and got["status"].endswith(queued[0].name)
    assert "not a message URL" in _log(w, msg_id)


def _log(w: World, msg_id: str) -> str:
    (log,) = w.a.layout.queue_dir("relay").rglob(f"{msg_id}/job/stdio.log")
    return log.read_text()


def test_a_dest_password_is_not_shown_in_status_or_log(w: World) -> None:
    # Given a dest whose URL carries a user and password, at a far end refusing
    w.faults(fail_503=1)
    secret_dest = f"{w.peer_url}q/work".replace("http://", "http://ops:s3cretpw@")
    msg_id = w.send(secret_dest)
    # Then its resend status names the user, not the password (a review found it
    # in both), and it is relayed with it
    w.wait_state(msg_id, "relayed")
    assert "s3cretpw" not in _log(w, msg_id) and "ops:***@" in _log(w, msg_id)


def test_loop_back_to_origin_is_err(w: World) -> None:
    # A message that this host's relay already sent once has come round again
    msg_id = w.send(f"{w.peer_url}q/work", relay_via=["http://10.213.1.9:3333/", w.a.url])
    got = w.wait_state(msg_id, "err")
    assert "relay loop" in got["status"] and w.a.url in got["status"]
    assert w.arrived() == []


def test_relay_to_this_hosts_relay_queue_ends_the_copy_in_a_loop_err(w: World) -> None:
    # Given a message whose dest is this very host's relay queue: RQ relays it (every
    # URL goes through the relay), and the copy that arrives here names this host
    msg_id = w.send(f"{w.a.url}q/relay")
    got = w.wait_state(msg_id, "relayed")
    copy_id = got["status"].rsplit("/", 1)[1]
    # Then the copy, about to go round again, ends in err as a loop
    copy = w.wait_state(copy_id, "err")
    assert "relay loop" in copy["status"] and w.a.url in copy["status"]


def test_posts_speak_rqs_dialect(w: World) -> None:
    # Given the peer, strict as RQ: _method read inside mesg, HTML without x_format=json
    msg_id = w.send(f"{w.peer_url}q/work", {"f.txt": b"abc"}, param2="two")
    got = w.wait_state(msg_id, "relayed")
    # Then the message was prepared (attachment arrived before the commit) and committed
    (far,) = w.arrived()
    assert w.far_state(far) == "que" and (far / "attach" / "f.txt").read_bytes() == b"abc"
    sent = json.loads((far / "msg.json").read_text())
    assert "_method" not in sent and sent["param2"] == "two"
    assert got["status"] == f"{w.peer_url}q/work/{far.name}"


def test_far_end_that_queues_at_once_is_err_not_relayed(w: World) -> None:
    # Given a far end that ignores _method=prep (it queues and runs the message at once)
    w.faults(ignore_prep=True)
    msg_id = w.send(f"{w.peer_url}q/work", {"data.bin": b"x" * 5000})
    # Then the relay never says relayed: the far message runs without its attachment
    got = w.wait_state(msg_id, "err")
    assert "at once" in got["status"] and "without its attachments" in got["status"]
    (far,) = w.arrived()
    assert w.far_state(far) == "que" and not list((far / "attach").iterdir())


def test_plain_message_to_a_far_end_that_queues_at_once_is_relayed(w: World) -> None:
    # Without attachments the far end holds the message whole: the refused commit
    # ("cannot find message") is checked against the far state, and it is relayed
    w.faults(ignore_prep=True)
    msg_id = w.send(f"{w.peer_url}q/work", param1="p")
    got = w.wait_state(msg_id, "relayed")
    (far,) = w.arrived()
    assert got["status"].endswith(far.name) and w.far_state(far) == "que"


def test_far_end_that_loses_attachments_at_commit_is_err(w: World) -> None:
    # Given a far end that takes the upload, commits, but then holds no attachment
    w.faults(lose_attachments=True)
    msg_id = w.send(f"{w.peer_url}q/work", {"data.bin": b"y" * 5000})
    # Then the check after the commit finds it missing: err with the reason
    got = w.wait_state(msg_id, "err")
    assert "without attachment data.bin" in got["status"] and "not relayed" in got["status"]


@pytest.mark.parametrize("dest, why", [
    ("http://10.213.1.3:8080/nowhere", "not a queue URL"),
    ("http://10.213.1.3:8080/q/missing", "not found"),
])
def test_bad_destinations_are_err(w: World, dest: str, why: str) -> None:
    msg_id = w.send(dest.replace("10.213.1.3:8080/", w.peer_url[7:]))
    got = w.wait_state(msg_id, "err")
    assert why in got["status"]
