"""The enablers rq-scan chooses between: which one, and what each one does.

The supervisor enabler is checked with real signals to a real process; the
systemd enabler's calls with a recording ``systemctl`` stand-in (the real
systemd path runs in tests/test_scan_systemd.py, in a booted container).
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import textwrap

import pytest
from conftest import wait_for
from scan_util import DEADLINE

from rqsys import enabler
from rqsys.events import EventLog

LOG = EventLog("test", journal=False)


def test_choose_follows_how_rq_scan_was_started(layout):
    supervised = enabler.choose(layout, LOG, {"RQ_SUPERVISOR_PID": "4242"})
    assert isinstance(supervised, enabler.SupervisorEnabler) and supervised.pid == 4242
    assert isinstance(enabler.choose(layout, LOG, {"INVOCATION_ID": "ab12"}),
                      enabler.SystemdEnabler)
    alone = enabler.choose(layout, LOG, {"RQ_SUPERVISOR_PID": "not-a-pid"})
    expected = enabler.SystemdEnabler if enabler.systemd_booted() else enabler.NullEnabler
    assert isinstance(alone, expected)


@pytest.fixture
def hup_counter(tmp_path):
    """A real process that appends a line to a file on every SIGHUP."""
    out = tmp_path / "hups"
    code = textwrap.dedent(f"""
        import signal, sys
        def hup(*_):
            with open({str(out)!r}, "a") as f:
                f.write("hup\\n")
        signal.signal(signal.SIGHUP, hup)
        print("ready", flush=True)
        while True:
            signal.pause()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    yield proc, out
    proc.kill()
    proc.wait()


def test_supervisor_enabler_signals_the_supervisor(layout, hup_counter):
    proc, out = hup_counter
    sup = enabler.SupervisorEnabler(layout, proc.pid, LOG)
    sup.enable(["a", "b"])
    wait_for(lambda: out.exists() and out.read_text().count("hup") == 1, 5, "one SIGHUP")
    assert sup.disable("a") is None
    wait_for(lambda: out.read_text().count("hup") == 2, 5, "a second SIGHUP")
    # stopped() means: the supervisor has removed the queue's socket file
    sock = layout.socket_path("a")
    sock.write_text("")
    assert not sup.stopped("a")
    sock.unlink()
    assert sup.stopped("a")


def test_supervisor_enabler_says_so_when_the_supervisor_is_gone(layout, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    enabler.SupervisorEnabler(layout, int(dead.stdout), LOG).enable(["a"])
    assert "is gone; cannot start or stop queues" in capsys.readouterr().err


@pytest.fixture
def systemctl(tmp_path):
    """A stand-in systemctl: records its arguments; 'fail' in them makes it fail."""
    calls = tmp_path / "calls"
    path = tmp_path / "systemctl"
    path.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n'
                    'case "$*" in *fail*) echo "Unit rq@fail.socket not found." >&2; exit 5;; '
                    "esac\n")
    path.chmod(0o755)
    return str(path), calls


def test_systemd_enabler_enables_reloads_and_disables_units(systemctl):
    path, calls = systemctl
    sd = enabler.SystemdEnabler(LOG, path)
    sd.enable(["a", "b"])
    sd.reload("a")
    pidfd = sd.disable("b")
    assert pidfd is not None
    select.select([pidfd], [], [], DEADLINE)  # readable once systemctl has exited
    wait_for(lambda: sd.stopped("b"), DEADLINE, "systemctl disable to finish")
    os.close(pidfd)
    assert calls.read_text().splitlines() == [
        "enable --now rq@a.socket rq@b.socket",
        "try-reload-or-restart rq@a.service",
        "disable --now rq@b.socket rq@b.service",
    ]


def test_systemd_enabler_logs_a_failing_systemctl(systemctl, capsys):
    path, _calls = systemctl
    enabler.SystemdEnabler(LOG, path).enable(["fail"])
    err = capsys.readouterr().err
    assert "enable --now rq@fail.socket failed (5): Unit rq@fail.socket not found." in err
    enabler.SystemdEnabler(LOG, "/nonexistent/systemctl").enable(["x"])
    assert "No such file" in capsys.readouterr().err


def test_null_enabler_says_nothing_will_start_the_daemon(layout, capsys):
    null = enabler.NullEnabler(layout, LOG)
    null.enable(["a"])
    assert "queue a installed; no supervisor or systemd" in capsys.readouterr().err
    assert null.disable("a") is None and null.stopped("a")
