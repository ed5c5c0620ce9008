"""exec_prefix as RQ defines it ("prepended to the script path before calling
exec()"): the program exec'd is the prefix's first word, the script its
argument, so a script run through an interpreter need not be executable (a
wheel installs the special queues' scripts 0644)."""

from __future__ import annotations

import sys

import pytest
from daemon_util import send, settle

from rqsys.errors import SpawnError
from rqsys.run.spawn import script_argv


def test_a_prefixed_script_need_only_be_readable(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("print('hi')\n")
    script.chmod(0o644)
    program, argv = script_argv(str(script), f"{sys.executable} -u")
    assert program == sys.executable and argv == [sys.executable, "-u", str(script)]
    with pytest.raises(SpawnError, match="missing or not executable"):
        script_argv(str(script), "")  # exec'd itself: the execute bit is needed
    with pytest.raises(SpawnError, match="missing or not readable"):
        script_argv(str(tmp_path / "gone.py"), "/bin/sh")


def test_a_0644_script_runs_through_its_interpreter(make_queue, daemon, layout):
    # Given a queue whose script is not executable but run by an exec_prefix interpreter
    entry = make_queue("plain", 'echo "done read by sh" >&3\n', exec_prefix="/bin/sh")
    (entry / "run").chmod(0o644)
    proc = daemon("plain")
    # When a message is sent, it runs to done (no SCRIPTERROR)
    msg_id = send(proc, param1="x")
    assert settle(proc, msg_id)["state"] == "done"
    assert proc.call("status", msg_id=msg_id)["status"] == "read by sh"
    assert not proc.call("counts")["status"].startswith("SCRIPTERROR")
