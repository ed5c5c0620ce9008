"""The enablers rq-scan chooses between: which one, and what each one does.

The supervisor enabler is checked with real signals to a real process; the
systemd enabler's calls with a recording ``systemctl`` stand-in (the real
systemd path runs in tests/system/test_scan_systemd.py, in a booted container).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import wait_for
from scan_util import DEADLINE, LoggedProcess, clean_env, make_entry

from rqsys.observe.events import EventLog
from rqsys.scan import enabler

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
    """A stand-in systemctl: records its arguments; 'fail' in them makes it fail;
    'hang' makes it wait until the file ``release`` exists (a minute at most)."""
    calls, release = tmp_path / "calls", tmp_path / "release"
    path = tmp_path / "bin" / "systemctl"
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n'
                    'case "$*" in *fail*) echo "Unit rq@fail.socket not found." >&2; exit 5;; '
                    f"*hang*) i=0; while [ ! -e {release} ] && [ $i -lt 1200 ]; do "
                    "sleep 0.05; i=$((i+1)); done;; esac\n")
    path.chmod(0o755)
    return str(path), calls


def finished(sd: enabler.SystemdEnabler, pidfd: int | None) -> None:
    """Wait, as rq-scan's selector does, for a systemctl run to exit; then reap it."""
    assert pidfd is not None
    assert select.select([pidfd], [], [], DEADLINE)[0] == [pidfd]
    os.close(pidfd)
    sd.reap()


def test_systemd_enabler_enables_reloads_and_disables_units(systemctl):
    path, calls = systemctl
    sd = enabler.SystemdEnabler(LOG, path)
    finished(sd, sd.enable(["a", "b"]))
    finished(sd, sd.reload("a"))
    pidfd = sd.disable("b")
    finished(sd, pidfd)
    assert sd.stopped("b")
    assert calls.read_text().splitlines() == [
        "enable --now rq@a.socket rq@b.socket",
        "try-reload-or-restart rq@a.service",
        "disable --now rq@b.socket rq@b.service",
    ]
    assert sd.enable([]) is None and not sd.running


def test_a_queue_gaining_or_losing_message_limits_is_restarted(systemctl, layout, tmp_path):
    # Delegate= takes effect at a unit's start: a reload would keep the old cgroup
    path, calls = systemctl
    layout.create_queue_dir("a", {"name": "a", "script": "/bin/true"})
    sd = enabler.SystemdEnabler(LOG, path, layout, tmp_path / "units")
    config_file = layout.queue_dir("a") / "config.json"
    for limits in ({"memory_max": "1G"}, {"memory_max": "2G"}, None):
        cfg = {"name": "a", "script": "/bin/true"}
        config_file.write_text(json.dumps({**cfg, "message_limits": limits} if limits else cfg))
        finished(sd, sd.reload("a"))
    jobs = [line for line in calls.read_text().splitlines() if line != "daemon-reload"]
    assert [line.split() for line in jobs] == [
        ["try-restart", "rq@a.service"], ["try-reload-or-restart", "rq@a.service"],
        ["try-restart", "rq@a.service"]]


def test_systemd_enabler_logs_a_failing_systemctl(systemctl, capsys):
    path, _calls = systemctl
    sd = enabler.SystemdEnabler(LOG, path)
    finished(sd, sd.enable(["fail"]))
    err = capsys.readouterr().err
    assert "enable --now rq@fail.socket failed (5): Unit rq@fail.socket not found." in err
    assert enabler.SystemdEnabler(LOG, "/nonexistent/systemctl").enable(["x"]) is None
    assert "No such file" in capsys.readouterr().err


def test_a_hung_systemctl_does_not_hold_the_caller(systemctl, tmp_path):
    # Given a systemctl that hangs on a unit
    path, calls = systemctl
    sd = enabler.SystemdEnabler(LOG, path)
    # When it is asked to disable it, the call returns while systemctl still runs
    pidfd = sd.disable("hang")
    wait_for(lambda: calls.exists() and "hang" in calls.read_text(), DEADLINE, "systemctl")
    assert pidfd is not None and select.select([pidfd], [], [], 0)[0] == []
    assert not sd.stopped("hang")
    # Then once it ends, the queue counts as stopped
    (tmp_path / "release").touch()
    finished(sd, pidfd)
    assert sd.stopped("hang")


def test_rq_scan_goes_on_while_systemctl_hangs(layout, tmp_path, systemctl):
    # Given rq-scan under systemd, whose systemctl hangs on enabling queue 'hang'
    path, calls = systemctl
    scandir, scripts = tmp_path / "scandir", tmp_path / "scripts"
    scandir.mkdir()
    env = clean_env(INVOCATION_ID="test", PATH=f"{Path(path).parent}:{os.environ['PATH']}",
                    RQ_SOCKET_DIR=str(layout.socket_dir))
    argv = [sys.executable, "-m", "rqsys", "--root", str(layout.root), "scan",
            "--scandir", str(scandir)]
    proc = LoggedProcess(argv, tmp_path / "scan.log", env)
    try:
        proc.wait_log("rq-scan ready")
        # When 'hang' is linked in, and its systemctl enable hangs
        (scandir / "hang").symlink_to(make_entry(scripts, "hang", 'echo "done" >&3'))
        wait_for(lambda: "rq@hang.socket" in calls.read_text(), DEADLINE, "enable of hang")
        # Then rq-scan still serves the scandir: 'next' is installed and enabled meanwhile
        (scandir / "next").symlink_to(make_entry(scripts, "next", 'echo "done" >&3'))
        wait_for(lambda: "rq@next.socket" in calls.read_text(), DEADLINE, "enable of next")
        assert "enable --now rq@hang.socket" in calls.read_text()
    finally:
        (tmp_path / "release").touch()
        assert proc.stop() == 0, proc.log()


def test_null_enabler_says_nothing_will_start_the_daemon(layout, capsys):
    null = enabler.NullEnabler(layout, LOG)
    null.enable(["a"])
    assert "queue a installed; no supervisor or systemd" in capsys.readouterr().err
    assert null.disable("a") is None and null.stopped("a")
