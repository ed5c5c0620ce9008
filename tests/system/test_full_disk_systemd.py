"""A full state file system under a real booted systemd (issue 46 item 1): the
container's ``/var/lib/rq`` is a small ext4 image the test makes and
loop-mounts on the host, the queue daemons run as user ``rq`` from their
shipped units, and the host fills the image to its last inode while a
message runs.  No unit restarts, ``rq sendmesg`` is refused with the
figures, the running message's end is recorded, the journal says it once
when it fills and once when it clears, and the queued message runs within
5 s of room coming back, with no restart."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import need, wait_for
from fillfs import fill_inodes
from nspawn import Container, booted_with_units, can_boot

from rqsys.store import QueueStore

VENV_BIN = Path(sys.executable).parent
RQ = str(VENV_BIN / "rq")
ROOT = "/var/lib/rq"
GATE = "/opt/fulltest/gate"
SCRIPTS = {"busy": f'while [ ! -e {GATE} ]; do sleep 0.05; done\necho "done ok" >&3\n',
           "idle": 'echo "done idle" >&3\n'}
REFUSED = re.compile(r"no space left on device: /var/lib/rq has \d+ free inodes "
                     r"\(\d+ of \d+\), [\d.]+ [KMG]?i?B free; the message was not taken")
RESUME = 5.0


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Iterator[Path]:
    """A 96 MB ext4 of 3,000 inodes, mounted on the host; unmounted at the end."""
    need(os.geteuid() == 0 and shutil.which("mkfs.ext4") is not None, "root and mkfs.ext4")
    base = tmp_path_factory.mktemp("fullfs")
    img, mnt = base / "img", base / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "96M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-N", "3000", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="module")
def box(image: Path) -> Iterator[Container]:
    reason = can_boot()
    need(not reason, reason)
    with booted_with_units(VENV_BIN.parent, "rq-scan.service", binds={image: ROOT}) as box:
        for name, body in SCRIPTS.items():
            entry = box.path(f"/opt/fulltest/{name}")
            entry.mkdir(parents=True)
            (entry / "run").write_text("#!/bin/sh\n" + body)
            (entry / "run").chmod(0o755)
            box.run("ln", "-s", f"/opt/fulltest/{name}", f"{ROOT}/scandir/{name}")
            wait_for(lambda n=name: box.show(f"rq@{n}.socket", "ActiveState") == "active",
                     30, f"rq@{name}.socket active")
        yield box


def send(box: Container, queue: str) -> subprocess.CompletedProcess[str]:
    return box.run(RQ, "sendmesg", "--dest", queue, check=False)


def sent_id(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout.split()[-1].rstrip("/").rsplit("/", 1)[1]


def state(image: Path, queue: str, msg_id: str) -> str:
    return QueueStore(image / "queue" / queue).find(msg_id)


def service(box: Container, queue: str) -> tuple[str, str]:
    unit = f"rq@{queue}.service"
    return box.show(unit, "MainPID"), box.show(unit, "NRestarts")


def journal(box: Container, queue: str) -> str:
    return box.run("journalctl", "-q", "-o", "cat", "-u", f"rq@{queue}.service").stdout


def test_a_full_disk_under_systemd_refuses_ends_and_resumes(box: Container, image: Path):
    # Given a message running in busy, one queued behind it, and idle served
    running = sent_id(send(box, "busy"))
    wait_for(lambda: state(image, "busy", running) == "run", 60, "busy to run")
    queued = sent_id(send(box, "busy"))
    idle = sent_id(send(box, "idle"))
    wait_for(lambda: state(image, "idle", idle) == "done", 60, "idle's message")
    units = {q: service(box, q) for q in ("busy", "idle")}
    assert json.loads((image / "format.json").read_text())["format"] >= 1

    # When the host takes the last inode of the file system
    fill_inodes(image / "filler")
    # Then a create is refused with the figures, and exit status 1
    wait_for(lambda: send(box, "idle").returncode == 1, RESUME, "a create refused")
    refused = send(box, "idle")
    assert refused.returncode == 1 and REFUSED.search(refused.stdout + refused.stderr), \
        (refused.stdout, refused.stderr)
    # When the running message ends, Then its end is recorded; the queued one waits
    box.path(GATE).touch()
    wait_for(lambda: state(image, "busy", running) == "done", 60, "the end recorded")
    time.sleep(1.5)
    assert state(image, "busy", queued) == "que"
    assert {q: service(box, q) for q in units} == units  # nothing restarted
    assert journal(box, "busy").count("the state file system is full") == 1

    # When room comes back, Then within 5 s a create is taken and the queued one ran
    shutil.rmtree(image / "filler")
    freed = time.monotonic()
    wait_for(lambda: send(box, "idle").returncode == 0, RESUME, "a create taken")
    wait_for(lambda: state(image, "busy", queued) == "done", RESUME, "the queued one")
    assert time.monotonic() - freed < RESUME
    assert {q: service(box, q) for q in units} == units
    logged = journal(box, "busy")
    assert "has room again" in logged and "Traceback" not in logged, logged
