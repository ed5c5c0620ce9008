"""The special queues under a real booted systemd (tests/nspawn.py).

``rqsys install-units`` then rq-scan.service: rq-scan creates relay, webhook
and cleaner and enables their sockets; a cleaner message sent with ``rq``
runs through socket activation under the units' sandbox and ends done.
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


def _ended(store: QueueStore, msg_id: str) -> bool:
    try:
        return store.find(msg_id) in ("done", "err")
    except Exception:  # noqa: BLE001 - not there yet
        return False
