"""rq-scan under a real booted systemd (tests/helpers/nspawn.py): enable, reload, remove.

The units are installed in the container with ``rqsys install-units`` and
rq-scan.service is started; the tests change /var/lib/rq/scandir inside and
watch the units with systemctl and the queue directories from outside.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need, wait_for
from nspawn import Container, booted_with_units, can_boot

from rqsys.store import QueueStore

VENV_BIN = Path(sys.executable).parent
RQ = str(VENV_BIN / "rq")
SCRIPT = """\
#!/bin/sh
case "$RQ_PARAM1" in
slow) echo "run sleeping" >&3; sleep 60 ;;
esac
echo "done $RQ_PARAM1" >&3
"""


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    """A booted container with the units installed and rq-scan running."""
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service") as box:
        wait_for(lambda: active(box, "rq-scan.service") == "active", 20, "rq-scan active")
        yield box


def active(box: Container, unit: str) -> str:
    return box.show(unit, "ActiveState")


def entry(box: Container, name: str, **cfg: int) -> str:
    """A script directory inside the container; its path there."""
    inside = f"/opt/scantest/{name}"
    path = box.path(inside)
    path.mkdir(parents=True, exist_ok=True)
    (path / "run").write_text(SCRIPT)
    (path / "run").chmod(0o755)
    if cfg:
        (path / "config.json").write_text(json.dumps(cfg))
    return inside


def send(box: Container, queue: str, param1: str) -> str:
    out = box.run(RQ, "sendmesg", "--dest", queue, "--param1", param1).stdout.strip()
    assert out.startswith("ok http://"), out
    return out.rsplit("/", 1)[1]


def queue_store(box: Container, name: str) -> QueueStore:
    return QueueStore(box.path(f"/var/lib/rq/queue/{name}"))


def test_link_enables_the_socket_and_an_edit_reloads_the_service(box: Container) -> None:
    # Given a script directory linked into the scandir
    box.run("ln", "-s", entry(box, "sd1"), "/var/lib/rq/scandir/sd1")
    # Then rq@sd1.socket is enabled and a message runs
    wait_for(lambda: active(box, "rq@sd1.socket") == "active", 20, "rq@sd1.socket active")
    assert box.run("systemctl", "is-enabled", "rq@sd1.socket").stdout.strip() == "enabled"
    msg_id = send(box, "sd1", "first")
    wait_for(lambda: queue_store(box, "sd1").find(msg_id) == "done", 20, "first message done")
    # When its config.json is edited, the running service reloads
    (box.path("/opt/scantest/sd1") / "config.json").write_text('{"num_workers": 3}')
    def reloaded() -> bool:
        log = box.run("journalctl", "-u", "rq@sd1.service", "--no-pager").stdout
        return "configuration reloaded" in log

    wait_for(reloaded, 20, "rq@sd1.service to reload")
    cfg = json.loads(box.path("/var/lib/rq/queue/sd1/config.json").read_text())
    assert cfg["num_workers"] == 3


def test_removed_link_disables_units_requeues_and_trashes(box: Container) -> None:
    # Given a queue whose script is running a message
    box.run("ln", "-s", entry(box, "sd2"), "/var/lib/rq/scandir/sd2")
    wait_for(lambda: active(box, "rq@sd2.socket") == "active", 20, "rq@sd2.socket active")
    msg_id = send(box, "sd2", "slow")
    wait_for(lambda: queue_store(box, "sd2").find(msg_id) == "run", 20, "the script running")
    # When the link is removed
    box.run("rm", "/var/lib/rq/scandir/sd2")
    # Then the units are disabled and stopped, and the queue is in trash/ with its message
    trash = box.path("/var/lib/rq/trash")
    wait_for(lambda: list(trash.glob("sd2.*")), 60, "sd2 in trash/")
    [trashed] = trash.glob("sd2.*")
    assert QueueStore(trashed).find(msg_id) == "que"
    assert not box.path("/var/lib/rq/queue/sd2").exists()
    journal = box.run("journalctl", "-u", "rq@sd2.service", "--no-pager").stdout
    assert active(box, "rq@sd2.service") == "inactive", journal
    assert active(box, "rq@sd2.socket") == "inactive"
    enabled = box.run("systemctl", "is-enabled", "rq@sd2.socket", check=False).stdout.strip()
    assert enabled == "disabled"


def test_queue_limits_become_a_drop_in_and_go_with_the_setting(box: Container) -> None:
    # Given a queue whose config.json has limits
    box.run("ln", "-s", entry(box, "sd3"), "/var/lib/rq/scandir/sd3")
    config = box.path("/opt/scantest/sd3/config.json")
    config.write_text(json.dumps({"limits": {"memory_max": "2G", "tasks_max": 256,
                                             "cpu_quota": "150%", "io_weight": 50}}))
    # Then systemd shows them on rq@sd3.service
    wait_for(lambda: box.show("rq@sd3.service", "MemoryMax") == str(2 << 30), 30,
             "MemoryMax=2G on rq@sd3.service")
    assert box.show("rq@sd3.service", "TasksMax") == "256"
    assert box.show("rq@sd3.service", "CPUQuotaPerSecUSec") == "1.500000s"
    assert box.show("rq@sd3.service", "IOWeight") == "50"
    # When the limits are removed, they go
    config.write_text(json.dumps({"num_workers": 2}))
    wait_for(lambda: box.show("rq@sd3.service", "MemoryMax") == "infinity", 30,
             "MemoryMax back to infinity")
    assert not box.path("/etc/systemd/system/rq@sd3.service.d/50-rqsys-limits.conf").exists()


def test_a_calendar_timer_is_a_systemd_timer_that_fires_and_goes_with_its_file(
        box: Container) -> None:
    # Given a queue, and a calendar timer file every 10 s
    box.run("ln", "-s", entry(box, "sd4"), "/var/lib/rq/scandir/sd4")
    wait_for(lambda: active(box, "rq@sd4.socket") == "active", 20, "rq@sd4.socket active")
    timer = box.path("/var/lib/rq/timers/tick.json")
    timer.write_text(json.dumps({"calendar": "*:*:0/10", "timezone": "UTC",
                                 "msg": {"dest": "sd4", "param1": "tick"}}))
    # Then rq-timer@tick.timer is active and listed by systemctl list-timers
    wait_for(lambda: active(box, "rq-timer@tick.timer") == "active", 30, "the timer active")
    listed = box.run("systemctl", "list-timers", "--all", "--no-pager").stdout
    assert "rq-timer@tick.timer" in listed and "rq-timer@tick.service" in listed
    # And a slot's message reaches done, with its timer and slot
    store = queue_store(box, "sd4")
    wait_for(lambda: store.count("done") >= 1, 40, "a slot's message done")
    [msg_id] = store.newest("done", 0, 1)
    msg = store.read_msg("done", msg_id)
    assert msg["timer"] == "tick" and msg["slot"] % 10 == 0 and msg["param1"] == "tick"
    # And rq timers shows it, with the last message the service noted
    listed_by_rq = box.run(RQ, "timers").stdout
    assert "\ntick\tcalendar *:*:0/10 (UTC)\t" in listed_by_rq
    last = json.loads(box.path("/var/lib/rq/timer-last/tick.json").read_text())
    assert store.find(last["msg_id"]) in ("que", "run", "done")
    # When the file is removed, the units go
    timer.unlink()
    unit = box.path("/etc/systemd/system/rq-timer@tick.timer")
    wait_for(lambda: not unit.exists(), 30, "the timer unit removed")
    wait_for(lambda: "rq-timer@tick" not in box.run("systemctl", "list-timers", "--all",
                                                    "--no-pager").stdout, 30, "not listed")
