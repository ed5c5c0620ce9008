"""The make targets' set-up steps as a newcomer meets them.

``.ci/install-debs`` (which ``make run``, ``make test`` and ``make deb`` call)
must wait for another apt holding the lock, not fail.  It runs in a
container (systemd-nspawn, not booted) on a throw-away overlay of this
machine, installing a package made here from a local apt repository, while
this test holds the very lock apt takes: an fcntl lock on
/var/lib/dpkg/lock-frontend (``flock(1)`` takes another kind of lock, which
apt never sees), or on /var/lib/apt/lists/lock, which ``apt-get update``
takes and for which it has no timeout of its own.

``make run`` prints one line, the web UI's URL and how to stop it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO, need, wait_for
from scan_util import free_port

PROJECT = REPO
PACKAGE = "rqsys-locktest"
REPO = "/opt/locktest/repo"
HOLD_S = 3.0
DRIVER = """\
import fcntl, json, subprocess, sys, threading, time
lock = open(sys.argv[1], "w")
fcntl.lockf(lock, fcntl.LOCK_EX)  # what apt and dpkg take (fcntl F_SETLK)
threading.Timer(float(sys.argv[2]), lock.close).start()
start = time.monotonic()
done = subprocess.run(["bash", sys.argv[3], sys.argv[4]], capture_output=True, text=True)
print(json.dumps({"rc": done.returncode, "seconds": time.monotonic() - start,
                  "out": done.stdout + done.stderr}))
"""


@contextmanager
def overlay_root() -> Iterator[Path]:
    """A writable view of ``/`` whose writes go to a tmpfs, unmounted after."""
    base = Path(tempfile.mkdtemp(prefix="rq-locktest-"))
    mounted: list[Path] = []
    try:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(base)], check=True, timeout=30)
        mounted.append(base)
        for sub in ("upper", "work", "merged"):
            (base / sub).mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir=/,upperdir={base}/upper,workdir={base}/work",
                        str(base / "merged")], check=True, timeout=30)
        mounted.append(base / "merged")
        yield base / "merged"
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)
        shutil.rmtree(base, ignore_errors=True)


def local_repository(root: Path) -> None:
    """A one-package apt repository in ``root``, the only source apt knows there."""
    repo = root / REPO.lstrip("/")
    pkg = repo.parent / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        f"Package: {PACKAGE}\nVersion: 1\nArchitecture: all\n"
        "Maintainer: rqsys tests <t@localhost>\n"
        "Description: installed by tests/system/test_make.py in a throw-away container\n")
    (pkg / "usr" / "share" / PACKAGE).mkdir(parents=True)
    (pkg / "usr" / "share" / PACKAGE / "ok").write_text("ok\n")
    repo.mkdir(parents=True)
    deb = repo / f"{PACKAGE}_1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(deb)],
                   check=True, capture_output=True, timeout=60)
    data = deb.read_bytes()
    control = (pkg / "DEBIAN" / "control").read_text()
    (repo / "Packages").write_text(
        f"{control}Filename: ./{deb.name}\nSize: {len(data)}\n"
        f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n")
    sources = root / "etc" / "apt"
    for old in [sources / "sources.list", *(sources / "sources.list.d").iterdir()]:
        old.unlink(missing_ok=True)
    (sources / "sources.list.d" / "locktest.list").write_text(
        f"deb [trusted=yes] file:{REPO} ./\n")


def in_container(root: Path, *argv: str, timeout: float = 120.0
                 ) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``root`` by systemd-nspawn (no boot, no network)."""
    return subprocess.run(
        ["systemd-nspawn", "-q", "-D", str(root), "--private-network", "--register=no",
         "--keep-unit", "--as-pid2", f"--bind-ro={PROJECT}", "--setenv=PATH=/usr/sbin:/usr/bin:"
         "/sbin:/bin", *argv], capture_output=True, text=True, timeout=timeout)


def install_while_locked(root: Path, lock: str) -> dict[str, object]:
    """Run .ci/install-debs for the test package while ``lock`` is held HOLD_S."""
    (root / "opt" / "locktest" / "driver.py").write_text(DRIVER)
    ran = in_container(root, "python3", "/opt/locktest/driver.py", lock, str(HOLD_S),
                       str(PROJECT / ".ci" / "install-debs"), PACKAGE)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return dict(json.loads(ran.stdout.strip().splitlines()[-1]))


@pytest.fixture
def root() -> Iterator[Path]:
    need(os.geteuid() == 0, "installing Debian packages needs root")
    need(shutil.which("systemd-nspawn") is not None, "systemd-nspawn (systemd-container)")
    need(shutil.which("dpkg-deb") is not None and shutil.which("apt-get") is not None,
         "dpkg and apt (Debian)")
    with overlay_root() as merged:
        local_repository(merged)
        yield merged


def installed(root: Path) -> bool:
    return (root / "usr" / "share" / PACKAGE / "ok").is_file()


def test_install_debs_waits_for_the_dpkg_lock(root: Path) -> None:
    # Given package lists that know the package, and the dpkg lock held
    update = in_container(root, "apt-get", "-q", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    # When install-debs installs it
    result = install_while_locked(root, "/var/lib/dpkg/lock-frontend")
    # Then it waited for the lock and succeeded
    assert result["rc"] == 0, result["out"]
    assert float(str(result["seconds"])) >= HOLD_S - 0.5, result
    assert installed(root)


def test_install_debs_waits_for_the_lists_lock(root: Path) -> None:
    # Given lists that do not know the package yet (an update is needed),
    # and the lock apt-get update takes held
    result = install_while_locked(root, "/var/lib/apt/lists/lock")
    # Then install-debs retried the update until the lock was free, and installed
    assert result["rc"] == 0, result["out"]
    assert float(str(result["seconds"])) >= HOLD_S - 0.5, result
    assert installed(root)


def test_make_run_prints_its_url_and_the_rq_root_line_and_serves(tmp_path: Path) -> None:
    need(shutil.which("make") is not None, "make")
    port = free_port()
    # -o: the venv running this test is the one make would (re)install
    make = subprocess.Popen(
        ["make", "-s", "-o", ".venv/.installed", "run", f"PORT={port}", f"ROOT={tmp_path}"],
        cwd=PROJECT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        assert make.stdout is not None
        line = make.stdout.readline()
        assert line == (f"rqsys: web UI on http://localhost:{port}/ - Ctrl-C stops it "
                        f"(log: {tmp_path}/serve.log)\n")
        assert make.stdout.readline() == (f"rqsys: in another shell, for rq: export "
                                          f"RQ_ROOT={tmp_path} PATH={PROJECT}/.venv/bin:$PATH\n")
        manpath = make.stdout.readline()
        assert manpath == f"rqsys: and for man rq: export MANPATH={PROJECT}/build/man:\n"
        found = subprocess.run(["man", "-w", "rq"], capture_output=True, text=True,
                               env={**os.environ, "MANPATH": f"{PROJECT}/build/man:"})
        assert found.stdout == f"{PROJECT}/build/man/man1/rq.1\n", found.stderr
        wait_for(lambda: _answers(f"http://localhost:{port}/"), 30, "the web UI to answer")
    finally:
        os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C does: the whole group
        out, err = make.communicate(timeout=60)
    assert out == ""
    assert [e for e in err.splitlines() if not e.endswith("Interrupt")] == []


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False
