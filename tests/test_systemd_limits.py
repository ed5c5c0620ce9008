"""Per-run scopes under a real booted systemd (tests/nspawn.py), one container.

The queue daemons run as user ``rq``; systemd lets them make and stop
transient units only with the polkit rule an operator adds to opt in
(docs/SYSTEMD.md), which this container gets.  The host mounts the cgroup v1
controllers, and the container sees them read-only: systemd moves each run
into its scope and stops the scope (which kills what the run left behind),
but it can neither hold nor account memory, CPU or tasks there.  So the
memory check here is the daemon noticing that and holding memory_max by
RLIMIT_AS; the OOM killer's ``oom-kill`` result cannot happen here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need, wait_for
from nspawn import Container, booted_with_units, can_boot

from rqsys import timeline
from rqsys.store import QueueStore

VENV_BIN = Path(sys.executable).parent
RQ = str(VENV_BIN / "rq")
POLKIT_RULE = """\
polkit.addRule(function(action, subject) {
    if (action.id == "org.freedesktop.systemd1.manage-units" && subject.user == "rq")
        return polkit.Result.YES;
});
"""
SCRIPT = """\
#!/bin/sh
case "$RQ_PARAM1" in
linger) setsid sleep 1001 & echo "run lingering" >&3; sleep 1002 ;;
fork) (setsid sleep 1003 &); echo "done forked" >&3 ;;
alloc) exec python3 -c 'import sys; d = b"x" * (int(sys.argv[1]) << 20)
open(3, "w").write("done allocated\\n")' "$RQ_PARAM2" ;;
esac
"""


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    """A container with rq-scan, the polkit rule, and queues lim and short."""
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service") as box:
        box.path("/etc/polkit-1/rules.d/50-rqsys-scopes.rules").write_text(POLKIT_RULE)
        _queue(box, "lim", {"num_workers": 4,
                            "message_limits": {"runtime_max": 600, "memory_max": "300M"}})
        _queue(box, "short", {"message_limits": {"runtime_max": 2}})
        yield box


def _queue(box: Container, name: str, cfg: dict[str, object]) -> None:
    entry = box.path(f"/opt/limtest/{name}")
    entry.mkdir(parents=True)
    (entry / "run").write_text(SCRIPT)
    (entry / "run").chmod(0o755)
    (entry / "config.json").write_text(json.dumps(cfg))
    box.run("ln", "-s", f"/opt/limtest/{name}", f"/var/lib/rq/scandir/{name}")
    wait_for(lambda: box.show(f"rq@{name}.socket", "ActiveState") == "active", 30,
             f"rq@{name}.socket active")


def send(box: Container, queue: str, *params: str) -> str:
    args = [a for n, p in enumerate(params, 1) for a in (f"--param{n}", p)]
    out = box.run(RQ, "sendmesg", "--dest", queue, *args).stdout.strip()
    assert out.startswith("ok http://"), out
    return out.rsplit("/", 1)[1]


def ended(box: Container, queue: str, msg_id: str, timeout: float = 60) -> tuple[str, str]:
    store = QueueStore(box.path(f"/var/lib/rq/queue/{queue}"))
    state = wait_for(lambda: store.find(msg_id) if store.find(msg_id) in
                     ("done", "err") else None, timeout, f"{msg_id} ended")
    return state, store.read_status(state, msg_id)


def sleepers(box: Container, marker: str) -> str:
    return box.run("pgrep", "-a", "-f", marker, check=False).stdout.strip()


def journal(box: Container, unit: str) -> str:
    return box.run("journalctl", "-u", unit, "--no-pager").stdout


def test_runtime_max_kills_the_script_and_its_setsid_grandchild(box: Container) -> None:
    msg_id = send(box, "short", "linger")
    assert ended(box, "short", msg_id) == ("err", "killed: runtime limit 2 s")
    assert sleepers(box, "sleep 100[12]") == ""


def test_a_double_forked_sleeper_is_gone_when_the_message_is_done(box: Container) -> None:
    msg_id = send(box, "lim", "fork")
    assert ended(box, "lim", msg_id) == ("done", "forked")
    assert sleepers(box, "sleep 1003") == ""
    assert f"rq-msg-lim-{msg_id}.scope" in box.run("journalctl", "--no-pager").stdout


def test_memory_max_holds_without_a_memory_controller_and_peak_is_recorded(
        box: Container) -> None:
    # Given runs allocating past memory_max (300M) and within it (200 MB)
    big, small = send(box, "lim", "alloc", "600"), send(box, "lim", "alloc", "200")
    # Then the big one ends in err saying how the limit held; the queue goes on
    state, status = ended(box, "lim", big)
    assert state == "err" and "memory_max 300M is RLIMIT_AS here" in status, status
    assert ended(box, "lim", small) == ("done", "allocated")
    assert "no memory controller here" in journal(box, "rq@lim.service")
    store = QueueStore(box.path("/var/lib/rq/queue/lim"))
    [end] = [e for e in timeline.read(store.msg_dir("done", small)) if e["ev"] == "exit"]
    assert abs(end["maxrss_kb"] * 1024 - (200 << 20)) <= 0.1 * (200 << 20), end


def test_a_restarted_daemon_stops_the_scope_of_a_recovered_run_first(box: Container) -> None:
    # Given a run that lingers, in its scope
    msg_id = send(box, "lim", "linger")
    scope = f"rq-msg-lim-{msg_id}.scope"
    first = wait_for(lambda: pids(box, "sleep 100[12]", 2), 30, "the run's two sleepers")
    assert box.show(scope, "ActiveState") == "active"
    # When the daemon is killed (the scope, another unit, lives on) and restarts
    box.run("systemctl", "kill", "-s", "KILL", "--kill-who=main", "rq@lim.service")
    # Then the new daemon stops the old scope before anything runs again
    wait_for(lambda: f"left by the last run: {scope}" in journal(box, "rq@lim.service"), 60,
             "the old scope stopped")
    # And the first run's processes died with its scope; the re-run has its own
    again = wait_for(lambda: pids(box, "sleep 100[12]", 2), 30, "the re-run's two sleepers")
    assert not first & again, (first, again)


def pids(box: Container, marker: str, count: int) -> set[str]:
    """The pids of the processes matching ``marker`` when there are ``count``."""
    found = {line.split()[0] for line in sleepers(box, marker).splitlines()}
    return found if len(found) == count else set()


def test_without_the_polkit_rule_runs_fall_back_to_rlimits(box: Container) -> None:
    # Given the operator's polkit rule gone (as shipped: systemd refuses user rq)
    box.path("/etc/polkit-1/rules.d/50-rqsys-scopes.rules").unlink()
    _queue(box, "plain", {"message_limits": {"memory_max": "300M"}})
    # When runs allocate past memory_max (the first behind the gate, then prlimit;
    # the next with RLIMIT_AS set by the spawn itself)
    for msg_id in (send(box, "plain", "alloc", "600"), send(box, "plain", "alloc", "600")):
        # Then the daemon says once that systemd refused, and RLIMIT_AS held it
        state, status = ended(box, "plain", msg_id)
        assert state == "err" and "memory_max 300M is RLIMIT_AS here" in status, status
    log = journal(box, "rq@plain.service")
    assert "no scope for runs" in log and "rlimits and the daemon's timer instead" in log
