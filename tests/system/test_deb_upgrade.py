"""An upgrade of the Debian package under load, in a booted systemd.

The package of commit 07518e9 (0.1.0, the last before the root's on-disk
format version) is built with its own ``make deb`` from ``git archive``, and
installed with apt in a container booted on an overlay of this machine
(tests/helpers/nspawn.py), as test_deb.py installs this checkout's.  A
queue made through the scandir gets messages: some done, some err, one in
prep, some due in an hour, and the rest running or queued when ``apt-get
install`` of this checkout's package (0.2.0) replaces it.  The package's
postinst restarts the queue daemons that are running (debian/rqsys.postinst);
a stopping daemon TERMs its scripts and puts their messages back in que, so
a message running then runs again under the new code: at least once, as
docs/OPERATING.md says.  Then every message sent is in exactly one state,
none lost, the running and queued ones done, each run counted in the
scripts' own append-only log; the root says format 1; the units are back
and their journal has no traceback.  Last, a root in a newer format stops
the queue daemon once, with one line, and no restart loop.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import need, wait_for
from nspawn import PROJECT, Container, can_boot
from test_deb import (
    APT_TIMEOUT,
    BUILD_TIMEOUT,
    INBOX,
    SCRIPTS,
    Installed,
    apt_install,
    deb,  # noqa: F401 (a fixture: this checkout's .deb, built by make deb)
    debian_box,
    journal,
    queue,
    send_with_rq,
    upper_entries,
)

from rqsys.store.layout import STATES

OLD_COMMIT = "07518e9"  # the last commit before rqsys.store.formats
OLD_VERSION, NEW_VERSION = "0.1.0", "0.2.0"
Q = "upg"
WORKERS = 4
RUNS_DIR = "/var/lib/rq/upgrade-test"  # the scripts' log: in the units' ReadWritePaths=
RUNS_LOG = f"{RUNS_DIR}/runs.log"
SCRIPT = f"""\
#!/bin/sh
echo "start $RQ_MSG_ID $RQ_VER $$" >> {RUNS_LOG}
if [ "$RQ_PARAM1" = fail ]; then echo "failing on purpose"; exit 1; fi
sleep 4
echo "end $RQ_MSG_ID $RQ_VER $$" >> {RUNS_LOG}
echo "done $RQ_PARAM1" >&3
"""
SETTLE_TIMEOUT = 180.0
BACK_TIMEOUT = 30.0
# Active before the upgrade (rq-web.socket enabled as an operator does), so after it
WATCHED = (f"rq@{Q}.service", f"rq@{Q}.socket", "rq-scan.service", "rq-web.socket")
NEWER = (f"rqsys: the state root /var/lib/rq is in on-disk format 99, newer than this rqsys "
         f"({NEW_VERSION}) knows (format 1): run the rqsys that wrote it, or a newer one")


@pytest.fixture(scope="module")
def old_deb() -> Iterator[Path]:
    """The .deb of commit 07518e9, built by that tree's own ``make deb`` in a temp dir."""
    need(os.geteuid() == 0 and shutil.which("apt-get") is not None,
         "building and installing the .deb needs root on Debian")
    tmp = Path(tempfile.mkdtemp(prefix="rq-old-deb-"))
    try:
        tree = tmp / "old"
        tree.mkdir()
        archive = subprocess.Popen(["git", "-C", str(PROJECT), "archive", OLD_COMMIT],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True,
                       timeout=BUILD_TIMEOUT)
        assert archive.wait(BUILD_TIMEOUT) == 0, f"git archive {OLD_COMMIT} failed"
        built = subprocess.run(["make", "-s", "deb"], cwd=tree, capture_output=True, text=True,
                               timeout=BUILD_TIMEOUT)
        assert built.returncode == 0, built.stdout + built.stderr
        path = tree / built.stdout.strip().splitlines()[-1]
        assert path.name == f"rqsys_{OLD_VERSION}_{path.name.rsplit('_', 1)[1]}", path
        fetched = subprocess.run(  # its dependencies into the host's apt cache
            ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=300", "install",
             "--download-only", "--no-install-recommends", str(path)],
            capture_output=True, text=True, timeout=APT_TIMEOUT,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        assert fetched.returncode == 0, fetched.stdout + fetched.stderr
        yield path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Upgrade:
    inst: Installed
    sent: dict[str, str]  # msg id -> what it is: ok, fail, due, prep
    running: set[str]  # in run/ when apt-get install began
    apt_output: str
    seconds: float  # apt-get install of the new package
    after_apt: dict[str, str]  # the units' ActiveState as apt-get install returned


@pytest.fixture(scope="module")
def upgraded(old_deb: Path, deb: Path) -> Iterator[Upgrade]:  # noqa: F811 (deb: a fixture)
    reason = can_boot()
    need(not reason, reason)
    box = Container()
    try:
        debian_box(box, old_deb, deb)
        old = Installed(box, old_deb, upper_entries(box))
        apt_install(old)
        assert version_installed(old) == OLD_VERSION
        assert not box.path("/var/lib/rq/format.json").exists()  # 0.1.0 knows no formats
        yield load_and_upgrade(old, deb)
    finally:
        box.shutdown()


def load_and_upgrade(inst: Installed, new_deb: Path) -> Upgrade:
    make_busy_queue(inst)
    inst.run("systemctl", "enable", "--now", "rq-web.socket")  # as an operator turns it on
    sent: dict[str, str] = {}
    # Some messages end before the upgrade: done, and err (the script exits 1)
    for kind in ("ok", "fail") * 3:
        sent[send_with_rq(inst, Q, kind)] = kind
    early = set(sent)
    wait_for(lambda: all(state(inst, m) in ("done", "err") for m in early), 60,
             "the first messages to end under 0.1.0")
    # One waits in prep, some are due in an hour, the rest queued for the workers
    sent[prep_with_rq(inst)] = "prep"
    later = str(int(time.time()) + 3600)
    for _ in range(4):
        sent[send_with_rq(inst, Q, "due", "--due", later)] = "due"
    for _ in range(24):  # 24 s of work for 4 workers: still busy when apt restarts them
        sent[send_with_rq(inst, Q, "ok")] = "ok"
    running = wait_for(lambda: runs_if_busy(inst), 30, f"{WORKERS} messages running")
    assert version_installed(inst) == OLD_VERSION
    # When this checkout's package is installed over it, the old one still busy
    began = time.monotonic()
    new = Installed(inst.box, new_deb, inst.before)
    out = new.run("apt-get", "-q", "-y", "--no-install-recommends", "install",
                  f"{INBOX}/{new_deb.name}", timeout=APT_TIMEOUT)
    upgrade = Upgrade(new, sent, running, out.stdout + out.stderr,
                      time.monotonic() - began, after_apt=units_state(new))
    assert version_installed(new) == NEW_VERSION
    # Then the queue's daemon is back and works its way through what was
    # queued and running (if it is not back, the tests say so: no wait here)
    if comes_back(new, f"rq@{Q}.service"):
        settle(upgrade)
    return upgrade


def units_state(inst: Installed) -> dict[str, str]:
    return {unit: inst.active(unit) for unit in WATCHED}


def comes_back(inst: Installed, unit: str) -> bool:
    deadline = time.monotonic() + BACK_TIMEOUT
    while inst.active(unit) != "active":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def make_busy_queue(inst: Installed) -> None:
    """A scandir queue of WORKERS workers whose script logs each run's start and end."""
    inst.run("install", "-d", "-o", "rq", "-g", "rq", "-m", "0750", RUNS_DIR)
    entry = inst.box.path(f"{SCRIPTS}/{Q}")
    entry.mkdir(parents=True)
    (entry / "run").write_text(SCRIPT)
    (entry / "run").chmod(0o755)
    (entry / "config.json").write_text(json.dumps({"num_workers": WORKERS}) + "\n")
    inst.run("ln", "-sfn", f"{SCRIPTS}/{Q}", f"/var/lib/rq/scandir/{Q}")
    wait_for(lambda: inst.active(f"rq@{Q}.socket") == "active", 30, f"rq@{Q}.socket")


def prep_with_rq(inst: Installed) -> str:
    out = inst.run("rq", "prepmesg", "--dest", Q, "--param1", "prep").stdout.strip()
    assert out.startswith("ok http://"), out
    return out.rsplit("/", 1)[1]


def runs_if_busy(inst: Installed) -> set[str]:
    """The ids in run/ once every worker is busy (empty until then)."""
    running = set(queue(inst, Q).ids("run"))
    return running if len(running) >= WORKERS else set()


def settle(upgrade: Upgrade) -> None:
    """Until nothing sent is queued to run now or running (the due ones wait an hour)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    to_end = [m for m, kind in upgrade.sent.items() if kind in ("ok", "fail")]
    while any(state(upgrade.inst, m) not in ("done", "err") for m in to_end):
        if time.monotonic() > deadline:
            left = {m: state(upgrade.inst, m) for m in to_end}
            pytest.fail(f"not ended {SETTLE_TIMEOUT}s after the upgrade: "
                        f"{ {m: s for m, s in left.items() if s not in ('done', 'err')} }\n"
                        + journal(upgrade.inst, f"rq@{Q}.service"))
        time.sleep(0.2)


def state(inst: Installed, msg_id: str) -> str | None:
    """The one state the message is in; None if in none; fails if in several.
    The states are looked at one after the other, so a message renamed from
    one to the next meanwhile is seen in both: looked at again, it is not."""
    for _ in range(5):
        found = [s for s in STATES if queue(inst, Q).msg_dir(s, msg_id).is_dir()]
        if len(found) <= 1:
            return found[0] if found else None
        time.sleep(0.05)
    raise AssertionError(f"{msg_id} in {found}")


def version_installed(inst: Installed) -> str:
    return inst.run("dpkg-query", "-W", "-f=${Version}", "rqsys").stdout.strip()


def runs(inst: Installed) -> list[tuple[str, str, str]]:
    """The scripts' log: (start|end, message id, rqsys version) a line, in order."""
    text = inst.box.path(RUNS_LOG).read_text()
    return [(w[0], w[1], w[2]) for w in (line.split() for line in text.splitlines())]


def unit_journal(inst: Installed, *units: str) -> str:
    argv = ["journalctl", "--no-pager", "-o", "cat"]
    for unit in units:
        argv += ["-u", unit]
    return inst.run(*argv).stdout


# ------------------------------------------------------------------ the tests


def test_every_message_is_in_one_state_and_none_is_lost(upgraded: Upgrade) -> None:
    inst = upgraded.inst
    on_disk = Counter(m for s in STATES for m in queue(inst, Q).ids(s))
    assert sorted(m for m, n in on_disk.items() if n > 1) == []  # none in two states
    assert sorted(set(upgraded.sent) - set(on_disk)) == []  # none lost
    assert sorted(set(on_disk) - set(upgraded.sent)) == []  # none made up
    want = {"ok": "done", "fail": "err", "due": "que", "prep": "prep"}
    wrong = {m: (kind, state(inst, m)) for m, kind in upgraded.sent.items()
             if state(inst, m) != want[kind]}
    assert wrong == {}, journal(inst, f"rq@{Q}.service")


def test_the_runs_cut_by_the_upgrade_ran_again_under_the_new_version(
        upgraded: Upgrade) -> None:
    log = runs(upgraded.inst)
    started = Counter(m for what, m, _ in log if what == "start")
    ended = {m: v for what, m, v in log if what == "end"}
    ok = {m for m, kind in upgraded.sent.items() if kind == "ok"}
    # Every message that was to run ran to its end at least once; none ran
    # that was not to (prep, due in an hour); the err ones ran once, before
    assert sorted(ok - set(ended)) == []
    assert sorted(set(started) - ok - {m for m, k in upgraded.sent.items() if k == "fail"}) == []
    assert all(started[m] == 1 for m, kind in upgraded.sent.items()
               if kind == "fail"), started
    # The ones running when apt began ended; both versions ran scripts
    assert upgraded.running and upgraded.running <= ok
    assert all(m in ended for m in upgraded.running)
    versions = {v for what, _, v in log if what == "start"}
    assert versions == {OLD_VERSION, NEW_VERSION}, log
    # A run cut short by the daemon's stop (its messages go back to que) was
    # started again under the new version and ended: at least once, never zero
    cut = [m for m in started if started[m] > 1]
    assert cut, (f"no run was cut by the upgrade's restart (apt-get install took "
                 f"{upgraded.seconds:.1f} s): {log}")
    for msg_id in cut:
        its = [(what, v) for what, m, v in log if m == msg_id]
        assert its[0] == ("start", OLD_VERSION) and its[-1] == ("end", NEW_VERSION), its


def test_the_units_running_before_run_after_and_the_root_says_format_1(
        upgraded: Upgrade) -> None:
    inst = upgraded.inst
    now = units_state(inst)
    que = len(list(queue(inst, Q).ids("que")))
    assert now == dict.fromkeys(WATCHED, "active"), (
        f"after apt-get install: {upgraded.after_apt}; now: {now}; {que} message(s) in "
        f"{Q}'s que\n" + unit_journal(inst, f"rq@{Q}.service", "rq-web.socket")[-3000:])
    stamp = json.loads(inst.box.path("/var/lib/rq/format.json").read_text())
    assert stamp["format"] == 1, stamp
    # the queue's daemon is a new one, of the new code, and it runs what comes
    msg_id = send_with_rq(inst, Q, "ok")
    wait_for(lambda: state(inst, msg_id) == "done", 60, "a message after the upgrade")
    assert ("end", msg_id, NEW_VERSION) in runs(inst)


def test_the_units_journal_has_no_traceback(upgraded: Upgrade) -> None:
    inst = upgraded.inst
    text = unit_journal(inst, "rq*")
    assert "failing on purpose" in text  # the pattern takes in the queue's unit
    assert "Traceback" not in text, text[-6000:]
    assert "Traceback" not in upgraded.apt_output, upgraded.apt_output


def test_a_newer_format_stops_the_queue_once_and_format_1_starts_it(
        upgraded: Upgrade) -> None:
    inst = upgraded.inst
    unit = f"rq@{Q}.service"
    stamp = inst.box.path("/var/lib/rq/format.json")
    kept = stamp.read_bytes()
    # Given a root written by a newer rqsys
    stamp.write_text(json.dumps({"format": 99, "by": "rqsys 9.0"}) + "\n")
    try:
        # When the queue's daemon is restarted
        inst.run("systemctl", "restart", unit, check=False)
        # Then it fails with EX_CONFIG, says why once, and is not restarted
        wait_for(lambda: inst.active(unit) == "failed", 30, f"{unit} failed")
        time.sleep(4)  # RestartSec=1: a loop would have restarted it by now
        assert inst.active(unit) == "failed"
        assert inst.box.show(unit, "ExecMainStatus") == "78"
        assert inst.box.show(unit, "NRestarts") == "0"
        said = unit_journal(inst, unit).splitlines()
        assert said.count(NEWER) == 1, "\n".join(said[-30:])
    finally:
        # When format 1 is put back, it starts again and runs messages
        stamp.write_bytes(kept)
    inst.run("systemctl", "start", unit)
    assert inst.active(unit) == "active"
    msg_id = send_with_rq(inst, Q, "ok")
    wait_for(lambda: state(inst, msg_id) == "done", 60, "a message after format 1 is back")
