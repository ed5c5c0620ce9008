"""Per-run limits under a real booted systemd (tests/helpers/nspawn.py), one container,
the queue daemons running as user ``rq``, as shipped.

A queue with ``message_limits`` gets ``Delegate=`` from rq-scan, and its
daemon runs each limited script in a sub-cgroup of its own (rqsys.run.cgroups).
The host mounts the cgroup v1 controllers, and the container sees them
read-only, beside a writable cgroup v2 hierarchy (hybrid) with no
controllers: so here the sub-cgroups hold no memory, CPU or task limit and
account only CPU time, but ``cgroup.kill`` and ``cgroup.events`` work, which
is what kills everything a run left behind.  memory_max is then held by
RLIMIT_AS, and said so; the OOM killer is tested where the kernel enforces
memory.max (tests/test_uml_limits.py).  A message's own ``limits`` on a queue
without ``message_limits`` get a transient scope over D-Bus, which user rq may
make only with an operator's polkit rule (docs/SYSTEMD.md), given here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need, wait_for
from nspawn import Container, booted_with_units, can_boot

from rqsys.observe import timeline
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
    """A container with rq-scan, the polkit rule, and queues lim, short and scoped."""
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service") as box:
        box.path("/etc/polkit-1/rules.d/50-rqsys-scopes.rules").write_text(POLKIT_RULE)
        _queue(box, "lim", {"num_workers": 4,
                            "message_limits": {"runtime_max": 600, "memory_max": "300M"}})
        _queue(box, "short", {"message_limits": {"runtime_max": 2}})
        _queue(box, "scoped", {})
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


def send(box: Container, queue: str, *params: str, limits: str = "") -> str:
    args = [a for n, p in enumerate(params, 1) for a in (f"--param{n}", p)]
    if limits:  # a message's own limits: one JSON line for --bulk
        line = json.dumps({"limits": json.loads(limits),
                           **{f"param{n}": p for n, p in enumerate(params, 1)}})
        args = ["--bulk", "-"]
    out = box.run(RQ, "sendmesg", "--dest", queue, *args,
                  input=line if limits else None).stdout.strip()
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
    assert "runs with limits get sub-cgroups of /sys/fs/cgroup/unified/system.slice/" \
        in journal(box, "rq@lim.service")
    # And its sub-cgroup accounted the run's CPU time, and is gone
    store = QueueStore(box.path("/var/lib/rq/queue/lim"))
    [usage] = [e for e in timeline.read(store.msg_dir("done", msg_id)) if e["ev"] == "usage"]
    assert usage["cpu_s"] > 0, usage
    unit = box.run("systemctl", "show", "-p", "ControlGroup", "--value", "rq@lim.service")
    left = box.run("ls", f"/sys/fs/cgroup/unified{unit.stdout.strip()}").stdout.split()
    assert "daemon" in left and not [d for d in left if d.startswith("msg-")], left


def test_memory_max_holds_without_a_memory_controller_and_peak_is_recorded(
        box: Container) -> None:
    # Given runs allocating past memory_max (300M) and within it (200 MB)
    big, small = send(box, "lim", "alloc", "600"), send(box, "lim", "alloc", "200")
    # Then the big one ends in err saying how the limit held; the queue goes on
    state, status = ended(box, "lim", big)
    assert state == "err" and "memory_max 300M is RLIMIT_AS here" in status, status
    assert ended(box, "lim", small) == ("done", "allocated")
    assert "no memory controller in the delegated cgroup" in journal(box, "rq@lim.service")
    store = QueueStore(box.path("/var/lib/rq/queue/lim"))
    [end] = [e for e in timeline.read(store.msg_dir("done", small)) if e["ev"] == "exit"]
    assert abs(end["maxrss_kb"] * 1024 - (200 << 20)) <= 0.1 * (200 << 20), end


def test_no_process_of_a_run_outlives_its_killed_daemon(box: Container) -> None:
    # Given a run that lingers, in its sub-cgroup
    send(box, "lim", "linger")
    first = wait_for(lambda: pids(box, "sleep 100[12]", 2), 30, "the run's two sleepers")
    # When the daemon is killed, and restarts (Restart=on-failure)
    box.run("systemctl", "kill", "-s", "KILL", "--kill-who=main", "rq@lim.service")
    # Then the run is recovered into que and run again, and none of the first
    # run's processes outlived it: its sub-cgroup was in the unit's (KillMode=
    # mixed KILLs the rest of a unit whose main process died; a sub-cgroup left
    # all the same is killed by the next daemon, before it runs anything)
    # (two sleepers only, never the first two beside new ones)
    def fresh() -> set[str]:
        now = pids(box, "sleep 100[12]", 2)
        return now if not now & first else set()

    wait_for(fresh, 60, "the re-run's own two sleepers")


def pids(box: Container, marker: str, count: int) -> set[str]:
    """The pids of the processes matching ``marker`` when there are ``count``."""
    found = {line.split()[0] for line in sleepers(box, marker).splitlines()}
    return found if len(found) == count else set()


def test_without_message_limits_a_message_of_its_own_gets_a_scope(box: Container) -> None:
    # Given a queue without message_limits (not delegated), and the polkit rule
    # When a message with limits of its own double-forks a sleeper
    msg_id = send(box, "scoped", "fork", limits='{"runtime_max": 60}')
    # Then it ran in a transient scope, whose stop killed the sleeper
    assert ended(box, "scoped", msg_id) == ("done", "forked")
    assert sleepers(box, "sleep 1003") == ""
    assert "runs with limits get transient scopes" in journal(box, "rq@scoped.service")
    assert f"rq-msg-scoped-{msg_id}.scope" in box.run("journalctl", "--no-pager").stdout
