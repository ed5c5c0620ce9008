"""The special queues under a real booted systemd (tests/helpers/nspawn.py).

``rqsys install-units`` then rq-scan.service: rq-scan creates relay, webhook
and cleaner and enables their sockets; a cleaner message sent with ``rq``
runs through socket activation under the units' sandbox and ends done; a
message relayed to this host's own web goes through rq-relay-worker.service,
started by its socket.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need, wait_for
from nspawn import Container, booted_with_units, can_boot

from rqsys.store import QueueStore

VENV_BIN = Path(sys.executable).parent
SINK = "#!/bin/sh\necho \"done got $RQ_PARAM1\" >&3\n"


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service") as box:
        yield box


@pytest.mark.parametrize("name", ["relay", "webhook", "cleaner"])
def test_rq_scan_creates_and_enables_the_special_queues(box: Container, name: str) -> None:
    wait_for(lambda: box.show(f"rq@{name}.socket", "ActiveState") == "active", 30,
             f"rq@{name}.socket active")
    assert box.run("systemctl", "is-enabled", f"rq@{name}.socket").stdout.strip() == "enabled"


def test_cleaner_runs_under_systemd(box: Container) -> None:
    wait_for(lambda: box.show("rq@cleaner.socket", "ActiveState") == "active", 30,
             "rq@cleaner.socket active")
    out = box.run(str(VENV_BIN / "rq"), "sendmesg", "--dest", "cleaner", "--param1", "3",
                  "--param2", "cleaner").stdout.strip()
    assert out.startswith("ok http://"), out
    msg_id = out.rsplit("/", 1)[1]
    store = QueueStore(box.path("/var/lib/rq/queue/cleaner"))
    wait_for(lambda: _ended(store, msg_id), 30, "the cleaner message to end")
    state = store.find(msg_id)
    assert state == "done", store.read_status(state, msg_id)
    assert "removed 0 message(s)" in store.read_status("done", msg_id)


def test_relay_goes_through_the_relay_worker(box: Container) -> None:
    # Given the web on loopback (the far end: this host's own) and a queue sink
    box.run("systemctl", "enable", "--now", "rq-web.socket")
    entry = box.path("/opt/rqtest/sink")
    entry.mkdir(parents=True)
    (entry / "run").write_text(SINK)
    (entry / "run").chmod(0o755)
    box.run("ln", "-s", "/opt/rqtest/sink", "/var/lib/rq/scandir/sink")
    wait_for(lambda: box.show("rq@sink.socket", "ActiveState") == "active", 30, "sink live")
    assert box.show("rq-relay-worker.service", "ActiveState") == "inactive"
    # When a message for sink's URL is sent: it goes to the relay queue
    out = box.run(str(VENV_BIN / "rq"), "sendmesg", "--dest", "http://127.0.0.1:3333/q/sink",
                  "--param1", "over-relay").stdout.strip()
    assert "/q/relay/" in out, out
    msg_id = out.rsplit("/", 1)[1]
    relay = QueueStore(box.path("/var/lib/rq/queue/relay"))
    wait_for(lambda: _ended(relay, msg_id, "relayed", "err"), 60, "the relay to end")
    # Then the daemon handed it to the worker, which socket activation started
    state = relay.find(msg_id)
    log = (relay.msg_dir(state, msg_id) / "job" / "stdio.log").read_text()
    assert state == "relayed", f"{relay.read_status(state, msg_id)}\n{log}"
    assert "in the relay worker" in log, log
    assert box.show("rq-relay-worker.service", "ActiveState") == "active"
    assert box.show("rq-relay-worker.service", "NRestarts") == "0"
    # And the far message ran in sink
    far_id = relay.read_status("relayed", msg_id).rsplit("/", 1)[1]
    sink = QueueStore(box.path("/var/lib/rq/queue/sink"))
    wait_for(lambda: _ended(sink, far_id), 30, "the relayed message to run")
    assert sink.read_status("done", far_id).startswith("got over-relay")


def _ended(store: QueueStore, msg_id: str, *states: str) -> bool:
    try:
        return store.find(msg_id) in (states or ("done", "err"))
    except Exception:  # noqa: BLE001 - not there yet
        return False
