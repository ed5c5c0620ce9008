"""rqsys under a real booted systemd: units, socket activation, notify, watchdog, journald.

One container is booted for the whole module (tests/helpers/nspawn.py); the units are
installed in it with ``rqsys install-units`` and queue ``t`` is made live with
``systemctl enable --now rq@t.socket``.  A drop-in gives rq@t.service a short
watchdog and idle time so those paths can be seen within seconds.  Messages
are sent with the ``rq`` CLI inside the container, through /run/rq/t.sock.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, need, wait_for
from nspawn import Container, can_boot

from rqsys.observe.events import MESSAGE_IDS
from rqsys.store import QueueStore

VENV_BIN = Path(sys.executable).parent
RQ = str(VENV_BIN / "rq")
RQSYS = str(VENV_BIN / "rqsys")
UNIT = "rq@t.service"
SOCKET = "rq@t.socket"
WATCHDOG_SEC = 3
IDLE_SEC = 3

SCRIPT = """\
#!/bin/sh
# rqsys test queue: param1 says what to do, param2 is its argument.
echo "hello from $RQ_MSG_ID count $RQ_COUNT"
echo "to stderr $RQ_MSG_ID" >&2
case "$RQ_PARAM1" in
block)
    echo "run waiting for $RQ_PARAM2" >&3
    while [ ! -e "/var/lib/rq/release/$RQ_PARAM2" ]; do sleep 0.05; done ;;
flood)
    yes "$(head -c 999 /dev/zero | tr '\\0' x)" | head -n "$RQ_PARAM2" ;;
esac
echo "done count $RQ_COUNT" >&3
"""

DROP_IN = f"""\
[Service]
WatchdogSec={WATCHDOG_SEC}
Environment=RQ_IDLE_TIMEOUT={IDLE_SEC}
"""


@pytest.fixture(scope="module")
def box() -> Iterator[Container]:
    """A booted container with the units installed and queue t enabled."""
    reason = can_boot()
    need(not reason, reason)
    box = Container()
    try:
        box.boot()
        _install(box)
        yield box
    finally:
        box.shutdown()


def _install(box: Container) -> None:
    box.expose_python(VENV_BIN.parent, sys.base_prefix)
    box.run(RQSYS, "install-units")
    entry = box.path("/opt/rqtest/t")
    entry.mkdir(parents=True)
    (entry / "run").write_text(SCRIPT)
    (entry / "run").chmod(0o755)
    (entry / "config.json").write_text(json.dumps({"num_workers": 4}))
    _make_queue(box, "t")
    box.run("ln", "-s", "/opt/rqtest/t", "/var/lib/rq/scandir/t")  # so rq-scan keeps it
    box.run("mkdir", "-p", "/var/lib/rq/release")
    drop_in = box.path(f"/etc/systemd/system/{UNIT}.d/test.conf")
    drop_in.parent.mkdir(parents=True)
    drop_in.write_text(DROP_IN)
    box.run("systemctl", "daemon-reload")
    box.run("systemctl", "enable", "--now", SOCKET)


def _make_queue(box: Container, name: str) -> None:
    """Queue ``name`` running /opt/rqtest/t/run, owned by rq."""
    box.run(str(VENV_BIN / "python"), "-c", "from pathlib import Path; "
            "from rqsys.scan import scandir; from rqsys.store import Layout; "
            "scandir.install_queue(Layout.from_root(), "
            f"{name!r}, Path('/opt/rqtest/t'))")
    box.run("chown", "-R", "rq:rq", f"/var/lib/rq/queue/{name}")


# ---------------------------------------------------------------- helpers
def store(box: Container) -> QueueStore:
    return QueueStore(box.path("/var/lib/rq/queue/t"))


def send(box: Container, *options: str) -> str:
    """Send a message to t with the rq CLI inside; its id."""
    out = box.run(RQ, "sendmesg", "--dest", "t", *options).stdout.strip()
    assert out.startswith("ok http://"), out
    return out.rsplit("/", 1)[1]


def state_of(box: Container, msg_id: str) -> str:
    return store(box).find(msg_id)


def wait_state(box: Container, msg_id: str, state: str, timeout: float = 20.0) -> None:
    wait_for(lambda: state_of(box, msg_id) == state, timeout, f"{msg_id} in {state}")


def wait_blocked(box: Container, msg_id: str) -> None:
    """Until the script of ``msg_id`` runs and waits for its release file."""
    def blocked() -> bool:
        status = store(box).msg_dir("run", msg_id) / "status"
        return status.is_file() and status.read_text().startswith("waiting for")
    wait_for(blocked, 20, f"{msg_id} running and blocked")


def release(box: Container, token: str) -> None:
    box.run("touch", f"/var/lib/rq/release/{token}")


@contextlib.contextmanager
def blocking(box: Container, token: str) -> Iterator[str]:
    """A message whose script runs until ``token`` is released (always, at the end)."""
    msg_id = send(box, "--param1", "block", "--param2", token)
    try:
        wait_blocked(box, msg_id)
        yield msg_id
    finally:
        release(box, token)


def runs(box: Container, msg_id: str) -> int:
    """How many times the script has started for ``msg_id`` (its stdio.log lines)."""
    log = store(box).msg_dir(state_of(box, msg_id), msg_id) / "job" / "stdio.log"
    return log.read_text().count(f"hello from {msg_id} ") if log.is_file() else 0


def count_of(box: Container, msg_id: str) -> int:
    return int(store(box).read_msg(state_of(box, msg_id), msg_id)["count"])


def journal(box: Container, *matches: str) -> list[dict[str, Any]]:
    out = box.run("journalctl", "--no-pager", "-o", "json", *matches).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def values(entry: dict[str, Any], field: str) -> list[str]:
    """A journal field's values (journalctl gives a list when it repeats)."""
    value = entry.get(field)
    return value if isinstance(value, list) else [value]


def restarts(box: Container) -> int:
    return int(box.show(UNIT, "NRestarts") or 0)


def main_pid(box: Container) -> int:
    return int(box.show(UNIT, "MainPID") or 0)


def active(box: Container, unit: str = UNIT) -> str:
    return box.show(unit, "ActiveState")


# ---------------------------------------------------------------- tests
def test_units_verify_inside_systemd(box: Container) -> None:
    # Given the installed units, when systemd-analyze verifies them (templates by instance)
    result = box.run("systemd-analyze", "verify", "--man=no", "rq@example.service",
                     "rq@example.socket", "rq-web.socket", "rq-web.service",
                     "rq-scan.service", "rq.target", check=False)
    # Then it has nothing to say
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    assert box.run("id", "-u", "rq").stdout.strip() != "0"


def test_enabling_a_queue_service_enables_its_socket(box: Container) -> None:
    # When an operator enables the service of queue u (not the socket)
    box.run("systemctl", "enable", "rq@u.service")
    # Then its socket is enabled with it (Also=), so the queue is live after a boot
    try:
        assert box.run("systemctl", "is-enabled", "rq@u.socket").stdout.strip() == "enabled"
    finally:
        box.run("systemctl", "disable", "rq@u.service")
    assert box.run("systemctl", "is-enabled", "rq@u.socket", check=False).stdout.strip() == \
        "disabled"


def test_message_runs_by_socket_activation_and_reaches_journal(box: Container) -> None:
    # Given the socket enabled and the service not running
    wait_for(lambda: active(box) == "inactive", IDLE_SEC + 20, f"{UNIT} idle-stopped")
    assert active(box, SOCKET) == "active"
    # When a message is sent through /run/rq/t.sock
    msg_id = send(box, "--param1", "hello")
    # Then the connection starts the service, the script runs, the message is done
    wait_state(box, msg_id, "done")
    assert count_of(box, msg_id) == 0  # RQ's count: resends, 0 on the first run
    # And journalctl RQ_MSG_ID=<id> has the script's stdout and stderr lines with the fields
    def lines() -> list[dict[str, Any]]:
        return [e for e in journal(box, f"RQ_MSG_ID={msg_id}") if "MESSAGE_ID" not in e]
    entries = wait_for(lambda: len(lines()) >= 2 and lines(), 10, "script lines in journal")
    assert [e["MESSAGE"] for e in entries] == [f"hello from {msg_id} count 0",
                                               f"to stderr {msg_id}"]
    for entry in entries:
        assert set(values(entry, "RQ_QUEUE")) == {"t"}
        assert entry["RQ_COUNT"] == "0"
        assert entry["_SYSTEMD_UNIT"] == UNIT
    # And the daemon's own events are structured entries with MESSAGE_IDs
    events = {e.get("MESSAGE_ID") for e in journal(box, f"RQ_MSG_ID={msg_id}")}
    assert {MESSAGE_IDS["created"], MESSAGE_IDS["started"], MESSAGE_IDS["done"]} <= events
    # And job/stdio.log keeps its own copy
    log = store(box).msg_dir("done", msg_id) / "job" / "stdio.log"
    assert log.read_text() == f"hello from {msg_id} count 0\nto stderr {msg_id}\n"


def test_status_shows_live_counts(box: Container) -> None:
    # Given a running message
    with blocking(box, "status") as msg_id:
        # Then systemctl tells the operator what is going on
        wait_for(lambda: re.fullmatch(r"que 0, run 1/4, done \d+, err 0",
                                      box.show(UNIT, "StatusText")), 10, "STATUS with run 1/4")
        status = box.run("systemctl", "status", "--no-pager", UNIT, check=False).stdout
        assert re.search(r'Status: "que 0, run 1/4, done \d+, err 0"', status), status
    wait_state(box, msg_id, "done")


def test_sigkill_mid_run_restarts_and_runs_again(box: Container) -> None:
    # Given a message whose script is running
    with blocking(box, "sigkill") as msg_id:
        before, pid = restarts(box), main_pid(box)
        # When the daemon is SIGKILLed
        box.run("systemctl", "kill", "--kill-who=main", "-s", "KILL", UNIT)
        # Then systemd restarts it, it recovers the message and runs it again
        wait_for(lambda: restarts(box) > before and main_pid(box) not in (0, pid), 20,
                 "the restarted daemon")
        wait_for(lambda: runs(box, msg_id) == 2, 20, "the second run")
    wait_state(box, msg_id, "done")
    assert runs(box, msg_id) == 2
    recovered = journal(box, f"RQ_MSG_ID={msg_id}", f"MESSAGE_ID={MESSAGE_IDS['recovered']}")
    assert recovered, "no 'recovered' event in the journal"


def test_hung_event_loop_is_restarted_by_watchdog(box: Container) -> None:
    # Given a running daemon (a running script keeps it from idling out)
    with blocking(box, "watchdog") as msg_id:
        before, pid = restarts(box), main_pid(box)
        # When its event loop hangs
        box.run("kill", "-STOP", str(pid))
        # Then the watchdog fires and systemd restarts it
        wait_for(lambda: restarts(box) > before and main_pid(box) not in (0, pid),
                 WATCHDOG_SEC + 30, "restart by the watchdog")
        log = box.run("journalctl", "--no-pager", "-u", UNIT, "-g", "Watchdog timeout").stdout
        assert "Watchdog timeout" in log
        # And the message is run again
        wait_for(lambda: runs(box, msg_id) == 2, 20, "the second run")
    wait_state(box, msg_id, "done")


def test_idle_exit_and_reactivation(box: Container) -> None:
    # Given a running daemon with nothing to do
    first = send(box, "--param1", "idle1")
    wait_state(box, first, "done")
    # Then it exits after its idle time; the socket stays, with /run/rq/t.sock
    wait_for(lambda: active(box) == "inactive", IDLE_SEC + 20, "idle exit")
    assert box.show(UNIT, "Result") == "success"
    assert active(box, SOCKET) == "active"
    assert box.run("test", "-S", "/run/rq/t.sock", check=False).returncode == 0
    # When the next request comes, it is started again and serves it
    second = send(box, "--param1", "idle2")
    wait_state(box, second, "done")


def test_stop_requeues_running_scripts_then_done_after_start(box: Container) -> None:
    # Given a running script
    with blocking(box, "stop") as msg_id:
        # When the service is stopped
        box.run("systemctl", "stop", UNIT, timeout=60)
        # Then the message is back in que, and the socket directory survives
        assert state_of(box, msg_id) == "que"
        assert active(box, SOCKET) == "active"
        assert box.run("test", "-S", "/run/rq/t.sock", check=False).returncode == 0
    # And after a start it runs again and reaches done
    box.run("systemctl", "start", UNIT)
    wait_state(box, msg_id, "done")
    assert runs(box, msg_id) == 2


def test_reload_keeps_running_scripts(box: Container) -> None:
    # Given a running script
    with blocking(box, "reload") as msg_id:
        pid = main_pid(box)
        # When the service is reloaded
        box.run("systemctl", "reload", UNIT)
        # Then the daemon and its script carry on: same pid, same run, finished once
        assert main_pid(box) == pid and active(box) == "active"
        assert state_of(box, msg_id) == "run"
    wait_state(box, msg_id, "done")
    assert runs(box, msg_id) == 1 and count_of(box, msg_id) == 0
    reloaded = box.run("journalctl", "--no-pager", "-u", UNIT, "-g", "configuration reloaded")
    assert "configuration reloaded" in reloaded.stdout


def test_100_mb_of_output_is_kept_and_the_daemon_stays_live(box: Container) -> None:
    # Given a script that writes 100 MB (100,000 lines of 1,000 bytes)
    msg_id = send(box, "--param1", "flood", "--param2", "100000")
    # Then it finishes and stdio.log holds every byte
    wait_state(box, msg_id, "done", timeout=120)
    log = store(box).msg_dir("done", msg_id) / "job" / "stdio.log"
    head = f"hello from {msg_id} count 0\nto stderr {msg_id}\n"
    assert log.stat().st_size == len(head) + 100_000 * 1000
    with log.open("rb") as f:
        assert f.read(len(head)).decode() == head
        assert f.read(1000) == b"x" * 999 + b"\n"
    # And the journal got lines of it (journald may rate-limit the rest)
    assert any(e.get("MESSAGE") == "x" * 999
               for e in journal(box, f"RQ_MSG_ID={msg_id}", "-n", "20"))
    # And the daemon still answers
    after = send(box, "--param1", "after-flood")
    wait_state(box, after, "done")


def test_idle_timeout_env_bad_value_fails_clearly(box: Container) -> None:
    # Given a queue unit with a bad RQ_IDLE_TIMEOUT
    drop_in = box.path("/etc/systemd/system/rq@bad.service.d/bad.conf")
    drop_in.parent.mkdir(parents=True)
    drop_in.write_text("[Service]\nEnvironment=RQ_IDLE_TIMEOUT=soon\nRestart=no\n")
    _make_queue(box, "bad")
    box.run("systemctl", "daemon-reload")
    # When it is started, it fails with a clear line in its journal
    result = box.run("systemctl", "start", "rq@bad.service", check=False)
    assert result.returncode != 0
    wait_for(lambda: "RQ_IDLE_TIMEOUT='soon'" in box.run(
        "journalctl", "--no-pager", "-u", "rq@bad.service").stdout, 10, "the error line")
    box.run("systemctl", "stop", "rq@bad.socket", check=False)


WEB_APP = REPO / "rqsys" / "web" / "app.py"


def test_web_socket_activation_and_curl(box: Container) -> None:
    need(WEB_APP.is_file(), "rqsys/web/app.py is not there yet")
    # Given the web socket enabled
    box.run("systemctl", "enable", "--now", "rq-web.socket")
    # When curl posts a message to the web front end
    mesg = json.dumps({"dest": "t", "param1": "via-web"})
    out = box.run("curl", "-sS", "--max-time", "30", "http://127.0.0.1:3333/q/t/new_message",
                  "--data-urlencode", f"mesg={mesg}").stdout
    answer = json.loads(out)
    # Then the web was started by activation, and the message reached done
    assert answer[0] == "ok", answer
    msg_id = answer[1].rsplit("/", 1)[1]
    wait_state(box, msg_id, "done")
    assert active(box, "rq-web.service") == "active"


def test_scandir_link_makes_a_queue_live(box: Container) -> None:
    # Given rq-scan running under systemd
    box.run("systemctl", "enable", "--now", "rq-scan.service")
    wait_for(lambda: active(box, "rq-scan.service") == "active", 20, "rq-scan active")
    # When a script directory is linked into the scandir
    box.run("ln", "-s", "/opt/rqtest/t", "/var/lib/rq/scandir/s")
    # Then rq@s.socket is enabled and live, and a message to s runs as user rq
    wait_for(lambda: active(box, "rq@s.socket") == "active", 20, "rq@s.socket active")
    assert box.run("systemctl", "is-enabled", "rq@s.socket").stdout.strip() == "enabled"
    out = box.run(RQ, "sendmesg", "--dest", "s", "--param1", "scan").stdout.strip()
    assert out.startswith("ok http://"), out
    msg_id = out.rsplit("/", 1)[1]
    queue = QueueStore(box.path("/var/lib/rq/queue/s"))
    wait_for(lambda: queue.find(msg_id) == "done", 20, f"{msg_id} done in s")
    assert box.show("rq@s.service", "User") == "rq"


def _fork_server(box: Container) -> list[str]:
    """The rqspawnd processes the queue daemon has as children now."""
    out = box.run("ps", "-o", "comm=", "--ppid", str(main_pid(box)), check=False).stdout
    return [word for word in out.split() if word == "rqspawnd"]


def test_a_backlog_starts_through_the_fork_server_under_the_unit(box: Container) -> None:
    # Given the queue's 4 workers busy, and 8 more messages waiting for a worker
    tokens = [f"fs{n}" for n in range(4)]
    busy = [send(box, "--param1", "block", "--param2", token) for token in tokens]
    for msg_id in busy:
        wait_blocked(box, msg_id)
    waiting = [send(box, "--param1", "block", "--param2", "fs-go") for _ in range(8)]
    try:
        # When the workers come free, with more messages due than workers free
        for token in tokens:
            release(box, token)
        # Then the default (RQ_FORK_SERVER=auto) starts them through rqspawnd,
        # the daemon's child, under the unit's user and system call filter
        wait_for(lambda: _fork_server(box), 20, "rqspawnd beside the daemon")
        wait_for(lambda: sum(state_of(box, m) == "run" for m in waiting) == 4, 20,
                 "4 of the waiting ones running")
    finally:
        for token in [*tokens, "fs-go"]:
            release(box, token)
    # and each message ends done, its script run once
    for msg_id in busy + waiting:
        wait_state(box, msg_id, "done")
    assert [runs(box, msg_id) for msg_id in busy + waiting] == [1] * 12
    said = box.run("journalctl", "--no-pager", "-u", UNIT, "-o", "cat").stdout
    assert "fork server" not in said, said
