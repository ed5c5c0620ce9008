"""The Debian package, installed the way a Debian operator installs it.

``make deb`` builds the .deb (debhelper, pybuild, lintian); a container
booted on an overlay of this machine (tests/helpers/nspawn.py) installs it with
``apt-get install ./rqsys_*.deb``.  The container has no network: the
package's dependencies are installed already or come from the host's apt
cache, where ``apt-get install --download-only`` puts them first.  Then
everything runs from the package alone (/usr/bin, Debian's python3,
/lib/systemd/system, /usr/share/man), every command with a PATH that holds
no venv; last, ``apt-get purge`` must leave no unit, no process and no file
but what Debian policy keeps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import need, wait_for
from nspawn import PROJECT, Container, can_boot

from rqsys.errors import NotFound
from rqsys.store import QueueStore

BUILD_TIMEOUT = 600.0
APT_TIMEOUT = 300.0
END_TIMEOUT = 60.0
CLEAN_ENV = ("env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
INBOX = "/opt/rqsys-deb"
SCRIPTS = "/opt/debtest"
SCRIPT = """\
#!/bin/sh
echo "deb-test script says $RQ_PARAM1"
echo "done $RQ_PARAM1" >&3
"""
# A file or directory name of rqsys's: rq, rq@x.socket, rq-scan.service,
# rq.target, rqsys, rqsys.conf, rqsys.json.5.gz ...
# The journal keeps what the daemons logged, as for any package; man-db's
# cache of formatted pages is man-db's, pruned by its own daily job.
NOT_OURS = ("/var/log/", "/var/cache/man/")
RQ_NAME = re.compile(r"^rq([@.-]|sys|$)")


@dataclass
class Installed:
    box: Container
    deb: Path
    before: set[str] = field(repr=False)  # the overlay's upper layer before the install

    def run(self, *argv: str, check: bool = True, timeout: float = 60.0
            ) -> subprocess.CompletedProcess[str]:
        """``argv`` inside, with nothing of this process's environment (no venv)."""
        return self.box.run(*CLEAN_ENV, *argv, check=check, timeout=timeout)

    def active(self, unit: str) -> str:
        return self.box.show(unit, "ActiveState")


@pytest.fixture(scope="module")
def deb() -> Path:
    """The .deb of this checkout, built (or found up to date) by ``make deb``."""
    need(os.geteuid() == 0 and shutil.which("apt-get") is not None,
         "building and installing the .deb needs root on Debian")
    built = subprocess.run(["make", "-s", "deb"], cwd=PROJECT, capture_output=True, text=True,
                           timeout=BUILD_TIMEOUT)
    assert built.returncode == 0, built.stdout + built.stderr
    path = PROJECT / built.stdout.strip().splitlines()[-1]
    fetched = subprocess.run(
        ["apt-get", "-q", "-y", "-o", "DPkg::Lock::Timeout=300", "install", "--download-only",
         "--no-install-recommends", str(path)],
        capture_output=True, text=True, timeout=APT_TIMEOUT,
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    return path


@pytest.fixture(scope="module")
def installed(deb: Path) -> Iterator[Installed]:
    reason = can_boot()
    need(not reason, reason)
    box = Container()
    try:
        debian_box(box, deb)
        inst = Installed(box, deb, upper_entries(box))
        apt_install(inst)
        yield inst
    finally:
        box.shutdown()


def debian_box(box: Container, *debs: Path) -> None:
    """``box`` booted as a fresh Debian, with ``debs`` where apt's _apt user may read them."""
    box.boot()
    as_fresh_debian(box)
    inbox = box.path(INBOX)
    inbox.mkdir(mode=0o755)
    for deb in debs:
        shutil.copy(deb, inbox / deb.name)


def apt_install(inst: Installed) -> None:
    # no --no-download: apt 2.6 then refuses a local .deb ("Pathname to
    # install is not absolute"); offline all the same (--private-network)
    inst.run("apt-get", "-q", "-y", "--no-install-recommends", "install",
             f"{INBOX}/{inst.deb.name}", timeout=APT_TIMEOUT)


def as_fresh_debian(box: Container) -> None:
    """The container as a fresh Debian 12 host: no Docker policy-rc.d (which
    stops packages from starting their services), and nothing of rqsys that
    an earlier install on this machine (or nspawn.py's checkout drop-ins) left."""
    box.run("sh", "-c", "rm -rf /usr/sbin/policy-rc.d /etc/systemd/system/rq[@.-]* "
            "/etc/sysusers.d/rqsys.conf /etc/tmpfiles.d/rqsys.conf /etc/rqsys /var/lib/rq")
    box.run("systemctl", "daemon-reload")


def upper_entries(box: Container) -> set[str]:
    """Paths the container has created or changed (its overlay's upper layer)."""
    upper = box.base / "upper"
    found = set()
    for dirpath, dirnames, filenames in os.walk(upper):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            info = os.lstat(path)
            if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                continue  # an overlay whiteout: deleted, not left
            found.add("/" + os.path.relpath(path, upper))
    return found


def make_queue(inst: Installed, name: str) -> None:
    """A script directory, linked into the scandir; waits for its socket."""
    entry = inst.box.path(f"{SCRIPTS}/{name}")
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "run").write_text(SCRIPT)
    (entry / "run").chmod(0o755)
    inst.run("ln", "-sfn", f"{SCRIPTS}/{name}", f"/var/lib/rq/scandir/{name}")
    wait_for(lambda: inst.active(f"rq@{name}.socket") == "active", 30, f"rq@{name}.socket")


def queue(inst: Installed, name: str) -> QueueStore:
    return QueueStore(inst.box.path(f"/var/lib/rq/queue/{name}"))


def state(inst: Installed, name: str, msg_id: str) -> str | None:
    try:
        return queue(inst, name).find(msg_id)
    except NotFound:
        return None


def wait_ended(inst: Installed, name: str, msg_id: str, want: str) -> None:
    """Until the message has ended; fails with the queue's journal if not in time."""
    deadline = time.monotonic() + END_TIMEOUT
    while (got := state(inst, name, msg_id)) not in ("done", "err", "relayed"):
        if time.monotonic() > deadline:
            pytest.fail(f"{name}/{msg_id} still {got} after {END_TIMEOUT}s:\n"
                        + journal(inst, f"rq@{name}.service"))
        time.sleep(0.05)
    assert got == want, queue(inst, name).read_status(got, msg_id)


def journal(inst: Installed, unit: str) -> str:
    return inst.run("journalctl", "--no-pager", "-n", "30", "-u", unit, check=False).stdout


def send_with_rq(inst: Installed, dest: str, param1: str, *flags: str) -> str:
    out = inst.run("rq", "sendmesg", "--dest", dest, "--param1", param1, *flags).stdout.strip()
    assert out.startswith("ok http://"), out
    return out.rsplit("/", 1)[1]


def start_web(inst: Installed) -> None:
    inst.run("systemctl", "start", "rq-web.socket")


def test_the_package_version_is_the_projects() -> None:
    changelog = (PROJECT / "debian" / "changelog").read_text().splitlines()[0]
    pyproject = (PROJECT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M)
    assert version and changelog.startswith(f"rqsys ({version.group(1)})"), changelog


def test_rq_scan_runs_from_the_package(installed: Installed) -> None:
    assert installed.run("systemctl", "is-active", "rq-scan").stdout.strip() == "active"
    assert installed.run("systemctl", "is-enabled", "rq-scan").stdout.strip() == "enabled"
    where = installed.run("sh", "-c", "for c in rq rqsys; do command -v $c; done").stdout.split()
    assert where == ["/usr/bin/rq", "/usr/bin/rqsys"]
    # the daemon is Debian's python3 running /usr/bin/rqsys, not a venv's
    pid = installed.box.show("rq-scan.service", "MainPID")
    argv = installed.run("cat", f"/proc/{pid}/cmdline").stdout.split("\0")
    assert argv[0].startswith("/usr/bin/python3") and argv[1] == "/usr/bin/rqsys", argv


def test_a_scandir_queue_runs_messages_from_rq_and_curl(installed: Installed) -> None:
    # Given a queue made by a scandir symlink, and the web socket started
    make_queue(installed, "echo")
    start_web(installed)
    # When a message is sent with rq, and another with curl
    by_rq = send_with_rq(installed, "echo", "from-rq")
    mesg = json.dumps({"dest": "echo", "param1": "from-curl"})
    out = installed.run("curl", "-sS", "--max-time", "30", "--data-urlencode", f"mesg={mesg}",
                        "http://127.0.0.1:3333/q/echo/new_message").stdout
    answer = json.loads(out)
    assert answer[0] == "ok", f"{answer}\n{journal(installed, 'rq@echo.service')}"
    # Then both end done
    wait_ended(installed, "echo", by_rq, "done")
    wait_ended(installed, "echo", answer[1].rsplit("/", 1)[1], "done")
    # And its daemon may hold 128 runs' descriptors (beyond systemd's soft 1024)
    pid = installed.box.show("rq@echo.service", "MainPID")
    limits = installed.run("cat", f"/proc/{pid}/limits").stdout
    assert re.search(r"Max open files\s+8192\s", limits), limits


def test_the_relay_queue_relays_to_a_queue_by_url(installed: Installed) -> None:
    # Given a second queue and the web front end that takes relayed messages
    make_queue(installed, "second")
    start_web(installed)
    # When a message is sent to that queue's URL through the relay queue
    msg_id = send_with_rq(installed, "http://127.0.0.1:3333/q/second", "relayed",
                          "--force_remote")
    # Then the relay reports the far message's URL, and that message ran
    wait_ended(installed, "relay", msg_id, "relayed")
    status = queue(installed, "relay").read_status("relayed", msg_id)
    far = re.search(r"/q/second/([^/\s]+)$", status.strip())
    assert far, status
    wait_ended(installed, "second", far.group(1), "done")


def test_the_journal_has_the_scripts_output(installed: Installed) -> None:
    make_queue(installed, "talk")
    wait_ended(installed, "talk", send_with_rq(installed, "talk", "to-journal"), "done")

    def logged() -> bool:
        log = installed.run("journalctl", "--no-pager", "-u", "rq@talk").stdout
        return "deb-test script says to-journal" in log

    wait_for(logged, 20, "the script's line in journalctl -u rq@talk")


@pytest.mark.parametrize("page", [("rq",), ("8", "rqsys"), ("5", "rqsys.json")])
def test_man_pages_open(installed: Installed, page: tuple[str, ...]) -> None:
    where = installed.run("man", "-w", *page).stdout.strip()
    assert where.startswith("/usr/share/man/"), where
    text = installed.run("man", "-P", "cat", *page).stdout
    assert "NAME" in text and page[-1] in text


def test_the_operators_docs_are_installed(installed: Installed) -> None:
    listed = installed.run("dpkg", "-L", "rqsys").stdout.split()
    docs = {Path(p).name.removesuffix(".gz") for p in listed if p.startswith("/usr/share/doc/")}
    wanted = {Path(line).name for line in (PROJECT / "debian" / "rqsys.docs").read_text().split()}
    assert wanted <= docs and "SECURITY.md" in wanted, sorted(docs)


def test_systemd_analyze_verify_prints_nothing(installed: Installed) -> None:
    listed = installed.run("dpkg", "-L", "rqsys").stdout.split()
    units = [Path(p).name.replace("@.", "@verify.") for p in listed
             if p.startswith("/lib/systemd/system/") and "." in Path(p).name]
    shipped = [p.name.replace("@.", "@verify.") for p in (PROJECT / "units").iterdir()
               if p.is_file()]
    assert sorted(units) == sorted(shipped)  # every unit of the checkout, and only those
    result = installed.run("systemd-analyze", "verify", *units, check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_remove_keeps_the_queues_and_a_reinstall_brings_them_back(
        installed: Installed) -> None:
    # Given a queue with a message done, and the operator's settings edited
    make_queue(installed, "kept")
    msg_id = send_with_rq(installed, "kept", "before-remove")
    wait_ended(installed, "kept", msg_id, "done")
    settings = installed.box.path("/etc/rqsys/config.json")
    settings.write_text('{"env": "edited"}\n')
    # When the package is removed (not purged)
    installed.run("apt-get", "-q", "-y", "remove", "rqsys", timeout=APT_TIMEOUT)
    # Then nothing of it runs, and the queues, messages and settings stay
    assert installed.run("pgrep", "-a", "-u", "rq", check=False).stdout.strip() == ""
    assert state(installed, "kept", msg_id) == "done"
    assert json.loads(settings.read_text()) == {"env": "edited"}
    # When it is installed again, the queue is back, and the settings as edited
    apt_install(installed)
    wait_for(lambda: installed.active("rq@kept.socket") == "active", 30, "rq@kept.socket")
    wait_ended(installed, "kept", send_with_rq(installed, "kept", "after-reinstall"), "done")
    assert json.loads(settings.read_text()) == {"env": "edited"}


def test_purge_leaves_only_what_debian_keeps(installed: Installed) -> None:
    # Given the package installed and running (an earlier test's queues, or these)
    make_queue(installed, "last")
    wait_ended(installed, "last", send_with_rq(installed, "last", "before-purge"), "done")
    shipped = installed.run("dpkg", "-L", "rqsys").stdout.split()
    # When it is purged
    installed.run("apt-get", "-q", "-y", "purge", "rqsys", timeout=APT_TIMEOUT)
    # Then no unit, no process of user rq, and no file of rqsys is left
    assert installed.run("systemctl", "list-units", "--all", "--plain", "--no-legend",
                         "rq*").stdout.strip() == ""
    assert installed.run("systemctl", "list-unit-files", "--no-legend", "rq*",
                         check=False).stdout.strip() == ""
    assert installed.run("pgrep", "-a", "-u", "rq", check=False).stdout.strip() == ""
    assert installed.run("ls", "/run/rq", check=False).returncode != 0
    assert [p for p in shipped if os.path.lexists(installed.box.path(p))
            and not installed.box.path(p).is_dir()] == []
    left = leftovers(installed)
    assert not left, "left behind:\n" + "\n".join(left)
    # But the rq user stays, as Debian has it: files elsewhere may still be its
    assert installed.run("getent", "passwd", "rq").stdout.startswith("rq:")


def leftovers(inst: Installed) -> list[str]:
    """Paths made since the install with an rqsys name (units, links, state,
    configuration, caches), or owned by user or group rq, logs aside."""
    ids = inst.run("id", "-u", "rq").stdout.strip(), inst.run("id", "-g", "rq").stdout.strip()
    upper = inst.box.base / "upper"
    found = []
    for path in sorted(upper_entries(inst.box) - inst.before):
        if path.startswith(NOT_OURS):
            continue
        info = os.lstat(f"{upper}{path}")
        if RQ_NAME.match(Path(path).name) or str(info.st_uid) in ids or str(info.st_gid) in ids:
            found.append(path)
    return found
