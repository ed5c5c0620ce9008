"""The spawn helper starting a script as another user (a queue's ``user``, the daemon root).

The child changes its ids by raw system calls: the daemon's own threads keep
theirs (glibc's setuid would have changed every thread of the process the
child shares memory with).  It hands its job/ directory to the user first,
and sets its parent-death signal after the change (a change of ids clears
it): a script whose daemon dies is still stopped.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import wait_for

from rqsys.fdclose import close_fds
from rqsys.run.identity import lookup
from rqsys.run.spawn import spawn

NOBODY = pwd.getpwnam("nobody")
STATUS = "grep -E '^(Uid|Gid|Groups|CapEff):' /proc/self/status | tr -s '\\t ' ' '"


@pytest.fixture
def base(passable_tmp: Path) -> Path:
    return passable_tmp


def ids(uid: int, gid: int, groups: list[int]) -> str:
    return (f"Uid: {uid} {uid} {uid} {uid}\nGid: {gid} {gid} {gid} {gid}\n"
            f"Groups: {' '.join(map(str, sorted(groups)))} \nCapEff: 0000000000000000\n")


def test_the_script_runs_as_the_user_and_the_daemons_threads_stay_root(base: Path) -> None:
    # Given a thread of the daemon's, and a job directory root made
    stop, seen = threading.Event(), []
    thread = threading.Thread(target=lambda: (seen.append(os.getuid()), stop.wait(10)))
    thread.start()
    job = base / "job"
    job.mkdir()
    user = lookup("nobody")
    # When a script starts as nobody
    child = spawn(["/bin/sh", "-c", f"{STATUS}; touch mine; echo done >&3"], "/bin/sh", {},
                  job, None, user=user)
    _pid, status = os.waitpid(child.pid, 0)
    os.set_blocking(child.status_r, True)
    assert os.read(child.status_r, 100) == b"done\n"
    close_fds(child.release())
    # Then it had nobody's ids, groups and no capability, and owned its job/ directory
    assert status == 0, (job / "stdio.log").read_text()
    assert (job / "stdio.log").read_text() == ids(NOBODY.pw_uid, NOBODY.pw_gid,
                                                  list(user.groups))
    assert (job / "mine").stat().st_uid == job.stat().st_uid == NOBODY.pw_uid
    # And every thread of this process is still root
    tasks = os.listdir("/proc/self/task")
    assert len(tasks) >= 2
    for tid in tasks:
        text = Path(f"/proc/self/task/{tid}/status").read_text()
        assert "\nUid:\t0\t0\t0\t0\n" in text, tid
    stop.set()
    thread.join()
    assert os.getuid() == 0 and seen == [0]


STARTER = """
import os, sys
from rqsys.run.identity import lookup
from rqsys.run.spawn import spawn
child = spawn(["/bin/sleep", "60"], "/bin/sleep", {}, sys.argv[1], None, user=lookup("nobody"))
print(child.pid, flush=True)
sys.stdin.read()
"""


def test_a_script_of_another_user_still_dies_with_its_daemon(base: Path) -> None:
    # Given a process that started a script as nobody
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(base / "job")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    pid = int(starter.stdout.readline())
    assert os.stat(f"/proc/{pid}").st_uid == NOBODY.pw_uid
    # When that process is killed
    starter.kill()
    starter.wait(10)
    # Then the script gets its parent-death signal and ends (it is no zombie of ours)
    began = time.monotonic()
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10, f"script {pid} to end")
    assert time.monotonic() - began < 10
