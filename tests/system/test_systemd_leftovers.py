"""Nothing outlives its message under a real booted systemd (tests/helpers/nspawn.py),
on a queue without ``message_limits``: no sub-cgroup, no scope, the daemon (user
``rq``, sandboxed as shipped) ends what the run left behind itself
(rqsys.run.leftovers), as in embedded mode."""

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
QUEUE = "left"
# in the run's job/ (its cwd): the pids of what it leaves, out of its process group
SCRIPT = """\
#!/bin/sh
setsid sleep 1011 &
echo $! > left.setsid
( (sleep 1012 & echo $! > left.double) & )
setsid -f sh -c 'echo $$ > left.setsidf; exec sleep 1013'
while [ ! -s left.double ] || [ ! -s left.setsidf ]; do sleep 0.01; done
# sleep runs once setsid has left the group (else the group's TERM ends it, unnamed)
until [ "$(cat /proc/$(cat left.setsid)/comm 2>/dev/null)" = sleep ]; do sleep 0.01; done
echo "done left three behind" >&3
"""
NAMES = ("setsid", "double", "setsidf")


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    """A container with rq-scan and queue ``left`` (no message_limits)."""
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service") as box:
        entry = box.path(f"/opt/lefttest/{QUEUE}")
        entry.mkdir(parents=True)
        (entry / "run").write_text(SCRIPT)
        (entry / "run").chmod(0o755)
        (entry / "config.json").write_text(json.dumps({"num_workers": 2}))
        box.run("ln", "-s", f"/opt/lefttest/{QUEUE}", f"/var/lib/rq/scandir/{QUEUE}")
        wait_for(lambda: box.show(f"rq@{QUEUE}.socket", "ActiveState") == "active", 30,
                 f"rq@{QUEUE}.socket active")
        yield box


def in_proc(box: Container, pid: str) -> bool:
    """Whether /proc/<pid> is there in the container (alive, or a zombie)."""
    return box.run("test", "-e", f"/proc/{pid}", check=False).returncode == 0


def test_a_setsid_grandchild_is_gone_when_its_message_is_done(box: Container) -> None:
    # Given a script that leaves three sleepers, two of them in sessions of their own
    out = box.run(RQ, "sendmesg", "--dest", QUEUE).stdout.strip()
    assert out.startswith("ok http://"), out
    msg_id = out.rsplit("/", 1)[1]
    # When its message is done
    store = QueueStore(box.path(f"/var/lib/rq/queue/{QUEUE}"))
    wait_for(lambda: store.find(msg_id) in ("done", "err"), 60, f"{msg_id} ended")
    assert (store.find(msg_id), store.read_status("done", msg_id)) == ("done", "left three behind")
    # Then none of them is left in the container, not even a zombie
    job = store.msg_dir("done", msg_id) / "job"
    pids = {name: (job / f"left.{name}").read_text().strip() for name in NAMES}
    wait_for(lambda: not [p for p in pids.values() if in_proc(box, p)], 20,
             f"the run's leftovers gone: {pids}")
    assert box.run("pgrep", "-f", "sleep 101[123]", check=False).stdout == ""
    # And the daemon, not a cgroup's stop, ended them: its journal says so
    journal = box.run("journalctl", "-u", f"rq@{QUEUE}.service", "--no-pager").stdout
    assert f"{msg_id}: script: ended " in journal
    assert f"pid {pids['setsid']} (sleep)" in journal
    assert box.show(f"rq@{QUEUE}.service", "Delegate") == "no"
