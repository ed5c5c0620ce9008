"""Triggers under a real booted systemd (issue 49, tests/helpers/nspawn.py): the
shipped units installed with ``rqsys install-units``; rq-scan.service with the
drop-in docs/TRIGGERS.md gives it (the watched directories, CAP_LEASE) takes
a file written in a directory inside the container as one message, done,
created by ``trigger <name>``; rq-web.socket serves a signed ``POST
/hooks/<name>`` sent from inside the container with curl: one message."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from nspawn import Container, booted_with_units, can_boot

from rqsys.observe import timeline as timeline_events
from rqsys.store import QueueStore

VENV_BIN = Path(sys.executable).parent
ROOT = "/var/lib/rq"
QUEUE = "ingest"
SECRET = b"a secret of the container"
DROP_IN = """[Service]
ReadWritePaths=/srv/incoming /srv/processed
CapabilityBoundingSet=CAP_LEASE
AmbientCapabilities=CAP_LEASE
"""
DEADLINE = 30.0


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    """Booted: the ingest queue from the scandir, rq-scan with its drop-in, rq-web.socket,
    /var/lib/rq/triggers made as timers/ is (rq:rq 0750)."""
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service", "rq-web.socket") as box:
        entry = box.path(f"/opt/trigtest/{QUEUE}")
        entry.mkdir(parents=True)
        (entry / "run").write_text('#!/bin/sh\necho "done took $RQ_PARAM1" >&3\n')
        (entry / "run").chmod(0o755)
        box.run("ln", "-s", f"/opt/trigtest/{QUEUE}", f"{ROOT}/scandir/{QUEUE}")
        wait_for(lambda: box.show(f"rq@{QUEUE}.socket", "ActiveState") == "active", DEADLINE,
                 f"rq@{QUEUE}.socket active")
        box.run("mkdir", "-p", "/srv/plain", "/srv/incoming", "/srv/processed")
        box.run("install", "-d", "-o", "rq", "-g", "rq", "-m", "0750", f"{ROOT}/triggers")
        yield box


def with_drop_in(box: Container) -> None:
    """rq-scan given the drop-in docs/TRIGGERS.md shows, and restarted."""
    path = box.path("/etc/systemd/system/rq-scan.service.d/triggers.conf")
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(DROP_IN)
    box.run("systemctl", "daemon-reload")
    box.run("systemctl", "restart", "rq-scan.service")
    wait_for(lambda: box.show("rq-scan.service", "ActiveState") == "active", DEADLINE,
             "rq-scan active again")


def write_trigger(box: Container, name: str, data: dict[str, Any]) -> None:
    """As an admin would: written beside, then renamed in (rq-scan watches triggers/)."""
    tmp = box.path(f"{ROOT}/triggers/.{name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.chmod(0o644)
    tmp.rename(box.path(f"{ROOT}/triggers/{name}.json"))


def record(box: Container, name: str) -> dict[str, Any]:
    path = box.path(f"{ROOT}/triggers/.state/{name}.json")
    return json.loads(path.read_text()) if path.exists() else {}


def journal(box: Container, unit: str) -> str:
    return box.run("journalctl", "-q", "-o", "cat", "-u", unit).stdout


def state(box: Container, msg_id: str) -> str:
    return QueueStore(box.path(f"{ROOT}/queue/{QUEUE}")).find(msg_id)


def timeline(box: Container, msg_id: str) -> str:
    """Its timeline's events as rqsys reads them (the first says who made it)."""
    found = [p for p in box.path(f"{ROOT}/queue/{QUEUE}").rglob(msg_id) if p.is_dir()]
    return "".join(json.dumps(timeline_events.read(p)) for p in found)


def messages(box: Container) -> int:
    """The queue's messages, in any state (their directories hold a ``msg`` file)."""
    qdir = box.path(f"{ROOT}/queue/{QUEUE}")
    found = set()
    for state in ("prep", "que", "run", "done", "err"):
        for where, dirs, names in os.walk(qdir / state):
            dirs[:] = [d for d in dirs if d not in ("job", "attach")]
            if "msg" in names:
                found.add(Path(where).name)
    return len(found)


def test_the_shipped_unit_alone_takes_a_file_and_keeps_it(box: Container):
    # Given a files trigger that keeps its files, and rq-scan as shipped (no drop-in)
    write_trigger(box, "kept", {"files": {"path": "/srv/plain"}, "msg": {"dest": QUEUE}})
    wait_for(lambda: "trigger kept added" in journal(box, "rq-scan.service"), DEADLINE,
             "rq-scan to take the trigger")
    # When a file is written there
    box.run("sh", "-c", "echo kept > /srv/plain/one.txt")
    # Then one message, done; the file left where it was
    wait_for(lambda: record(box, "kept").get("made") == 1, DEADLINE, "the trigger's message")
    msg_id = record(box, "kept")["last_msg_id"]
    wait_for(lambda: state(box, msg_id) == "done", DEADLINE, "its message done")
    assert box.path("/srv/plain/one.txt").exists()


def test_a_file_written_in_a_watched_directory_is_one_message(box: Container):
    # Given rq-scan with the drop-in, a files trigger moving its files once done
    with_drop_in(box)
    write_trigger(box, "drop", {"files": {"path": "/srv/incoming", "glob": "*.csv"},
                                "msg": {"dest": QUEUE}, "then": {"move": "/srv/processed"}})
    wait_for(lambda: "trigger drop added" in journal(box, "rq-scan.service"), DEADLINE,
             "rq-scan to take the trigger")
    before = messages(box)
    # When a process inside the container writes a file there
    box.run("sh", "-c", "printf 'a,b\\n1,2\\n' > /srv/incoming/one.csv")
    # Then one message, done, made by the trigger; the file moved after it
    wait_for(lambda: record(box, "drop").get("made") == 1, DEADLINE, "the trigger's message")
    msg_id = record(box, "drop")["last_msg_id"]
    wait_for(lambda: state(box, msg_id) == "done", DEADLINE, "its message done")
    wait_for(lambda: "trigger drop" in timeline(box, msg_id), DEADLINE, "its timeline")
    wait_for(lambda: box.path("/srv/processed/one.csv").exists(), DEADLINE, "then move")
    assert not box.path("/srv/incoming/one.csv").exists()
    assert messages(box) == before + 1
    assert record(box, "drop")["refused"] == 0, record(box, "drop")


def test_a_signed_post_to_the_hook_is_one_message(box: Container):
    # Given a webhook trigger whose secret only root and group rq may read
    box.path("/etc/rqsys").mkdir(exist_ok=True)
    box.path("/etc/rqsys/hook.secret").write_bytes(SECRET + b"\n")
    box.run("chown", "root:rq", "/etc/rqsys/hook.secret")
    box.run("chmod", "0640", "/etc/rqsys/hook.secret")
    write_trigger(box, "hook", {"webhook": {"secret": {"file": "/etc/rqsys/hook.secret"},
                                            "signature": "github",
                                            "delivery_header": "X-GitHub-Delivery"},
                                "msg": {"dest": QUEUE},
                                "params": {"param1": "$.repository.full_name"}})
    before = messages(box)
    # When curl inside the container delivers it, signed as GitHub signs
    body = json.dumps({"repository": {"full_name": "octo/hello"}})
    mac = hmac.new(SECRET, body.encode(), hashlib.sha256).hexdigest()
    done = box.run("curl", "-sS", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
                   "-H", "X-GitHub-Delivery: d-1", "-H", f"X-Hub-Signature-256: sha256={mac}",
                   "--data-binary", body, "http://127.0.0.1:3333/hooks/hook")
    answer, status = done.stdout.rsplit("\n", 1)
    # Then 200 and one message, done, made by the trigger, its param from the body
    assert status == "200", done.stdout + journal(box, "rq-web.service")
    ok, url = json.loads(answer)
    assert ok == "ok", answer
    msg_id = url.rstrip("/").rsplit("/", 1)[1]
    wait_for(lambda: state(box, msg_id) == "done", DEADLINE, "the hook's message done")
    wait_for(lambda: "trigger hook" in timeline(box, msg_id), DEADLINE, "its timeline")
    assert messages(box) == before + 1
    status_text = QueueStore(box.path(f"{ROOT}/queue/{QUEUE}")).read_status("done", msg_id)
    assert status_text == "took octo/hello", status_text


def test_the_webhooks_record_is_written_after_rq_scan_made_the_state_directory(
        box: Container):
    # Given the records' directory as the package makes it (tmpfiles: rq's, setgid,
    # group-writable), where rq-scan (root) has written the files trigger's record
    state_dir = box.path(f"{ROOT}/triggers/.state")
    assert state_dir.stat().st_mode & 0o2070 == 0o2070, oct(state_dir.stat().st_mode)
    # When the hook has made its message (the test before)
    wait_for(lambda: "trigger hook" in journal(box, "rq-web.service") or
             record(box, "hook"), DEADLINE, "the hook's delivery")
    # Then its record counts it (written by rq-web, user rq)
    assert record(box, "hook").get("made") == 1, journal(box, "rq-web.service")
