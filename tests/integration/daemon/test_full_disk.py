"""A full state file system, for real: a small ext4 or xfs image the test
makes and loop-mounts, filled to its last block or its last inode while
``rqsys serve`` runs queues on it, then given room back.

Nothing restarts and nothing crash-loops: a create is refused with
``NoSpace`` (HTTP 507, ``rq sendmesg`` exits 1) and its figures; the running
message ends and is recorded in done; ``/metrics`` says full; the log says
it once; and when room comes back a create is taken and the queued message
runs within 5 s, without a restart."""

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
from urllib.parse import urlencode

import pytest
from conftest import need, wait_for, web_client
from fillfs import fill_blocks, fill_blocks_again, fill_inodes, fill_inodes_in
from scan_util import DEADLINE, LoggedProcess, call, clean_env, make_entry, start_serve

from rqsys.errors import NoSpace
from rqsys.store import Layout, room

RESUME = 5.0  # seconds within which work goes on once there is room
WAITER = 'while [ ! -e "{gate}" ]; do sleep 0.05; done\necho "done ok" >&3'
IMAGES = {"ext4": ("96M", ["mkfs.ext4", "-q", "-F", "-m", "0", "-N", "3000"]),
          "xfs": ("300M", ["mkfs.xfs", "-q", "-f", "-i", "maxpct=1"])}
FULL = "the state file system is full"
FIGURES = r"\d+ free inodes \(\d+ of \d+\), \d+(?:\.\d)? (?:B|KiB|MiB|GiB) free"


@pytest.fixture(params=sorted(IMAGES))
def image(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A fresh, loop-mounted file system of its own; unmounted (and its loop
    device detached) at the end."""
    size, mkfs = IMAGES[request.param]
    need(os.geteuid() == 0 and shutil.which(mkfs[0]) is not None
         and shutil.which("losetup") is not None, f"root and {mkfs[0]}")
    img, mnt = tmp_path / "img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", size, str(img)], check=True)
    subprocess.run([*mkfs, str(img)], check=True, capture_output=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        _unmount(img, mnt)


def _unmount(img: Path, mnt: Path) -> None:
    for _ in range(50):
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        held = subprocess.run(["fuser", "-vm", str(mnt)], capture_output=True, text=True)
        print(f"{mnt} still busy: {held.stdout}{held.stderr}")
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    def attached() -> list[str]:
        listed = subprocess.run(["losetup", "-j", str(img)], capture_output=True, text=True)
        return [line.split(":")[0] for line in listed.stdout.splitlines()]

    for _ in range(50):  # autoclear detaches it, not always at once
        devices = attached()
        if not devices:
            return
        for device in devices:
            subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
        time.sleep(0.1)
    pytest.fail(f"loop device still attached: {attached()}")


@pytest.fixture
def served(image: Path, tmp_path: Path) -> Iterator[tuple[Layout, LoggedProcess]]:
    """``rqsys serve`` with its root on the image (its sockets, scripts and
    scandir outside it), a ``busy`` queue whose script waits for a gate
    file, and an ``idle`` one."""
    layout = Layout(image / "root", tmp_path / "sock")
    layout.make_dirs()
    layout.socket_dir.mkdir()
    scandir = tmp_path / "scandir"
    scandir.mkdir()
    gate = tmp_path / "gate"
    for name, body in (("busy", WAITER.format(gate=gate)), ("idle", 'echo "done idle" >&3')):
        (scandir / name).symlink_to(make_entry(tmp_path / "scripts", name, body))
    serve = start_serve(layout, scandir, tmp_path / "serve.log")
    try:
        for name in ("busy", "idle"):
            wait_for(layout.socket_path(name).exists, DEADLINE, f"queue {name} served")
        yield layout, serve
    finally:
        assert serve.stop() == 0, serve.log()


@pytest.mark.parametrize("what", ["blocks", "inodes"])
def test_a_full_disk_refuses_creates_ends_runs_and_resumes(served, image, tmp_path, what):
    layout, serve = served
    # Given: a running message in busy, one queued behind it, an idle queue
    # that has taken a message (both have their spares)
    running = _create(layout, "busy")
    wait_for(lambda: _state(layout, "busy", running) == "run", DEADLINE, "busy to run")
    queued = _create(layout, "busy")
    _run_to_end(layout, "idle")
    pids = _daemon_pids(serve)
    assert set(pids) >= {"busy", "idle"}, pids

    # When: the file system is filled to its last block, or its last inode
    filler = image / "filler"
    fill_blocks(filler) if what == "blocks" else fill_inodes(filler)

    # Then: a create is refused, before anything is made, with the figures
    # (a daemon reads the file system at most once a second: until it has,
    # a create may still take a spare, whole)
    wait_for(lambda: _try_create(layout, "idle") is None, RESUME, "a create refused")
    before = _tmp_entries(layout, "idle")
    with pytest.raises(NoSpace) as refused:
        _create(layout, "idle")
    now = room.read(str(layout.root))
    assert now.full  # the figures: as read then (the audit trail's reserve may be freed)
    assert re.fullmatch(f"no space left on device: {re.escape(now.mount)} has {FIGURES}; "
                        "the message was not taken", str(refused.value)), refused.value
    assert _tmp_entries(layout, "idle") == before  # nothing half-made
    # ... over HTTP as 507 in RQ's dialect, without a server path
    client = web_client(layout)
    got = client.simulate_post("/q/idle/new_message", body=urlencode(
        {"mesg": json.dumps({"dest": "idle"})}),
        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert got.status_code == 507, got.text
    assert got.json[0] == "fail" and re.fullmatch(
        f"no space left on device: the state file system has {FIGURES}; the message was "
        "not taken", got.json[1]), got.json
    # ... and by ``rq sendmesg``: exit 1 and the line
    sent = subprocess.run([str(Path(sys.executable).parent / "rq"), "--root", str(layout.root),
                           "sendmesg", "--dest", "idle"], capture_output=True, text=True,
                          env=clean_env(RQ_SOCKET_DIR=str(layout.socket_dir)), timeout=60)
    now = room.read(str(layout.root))
    assert sent.returncode == 1, (sent.stdout, sent.stderr)
    assert re.search(f"no space left on device: {re.escape(now.mount)} has {FIGURES}; "
                     "the message was not taken", sent.stdout + sent.stderr), sent
    # ... /metrics says full, the console shows the banner
    metrics = client.simulate_get("/metrics").text
    assert "rqsys_state_fs_full 1.0" in metrics
    assert re.search(r"^rqsys_state_fs_free_inodes \d+\.0$", metrics, re.M)
    assert "rqsys_state_fs_free_bytes" in metrics
    page = client.simulate_get("/", headers={"Accept": "text/html"}).text
    assert 'id="state-fs-full"' in page and re.search(FIGURES, page)

    # When: the running message ends while the disk is full (a start reads the file
    # system again when its last reading is CHECK_EVERY old: let busy's last one age)
    time.sleep(room.CHECK_EVERY + 0.1)
    (tmp_path / "gate").touch()
    # Then: its end is recorded in done (a spare's room), the queued one waits
    wait_for(lambda: _state(layout, "busy", running) == "done", DEADLINE, "the end recorded")
    time.sleep(1.5)  # the loop's room checks (each second) hold the queued one
    assert _state(layout, "busy", queued) == "que"
    assert _daemon_pids(serve) == pids  # no daemon restarted
    log = serve.log()
    assert "Traceback" not in log and "exited" not in log, log
    assert log.count(f"busy: warning: {FULL}") == 1, log  # one line, not one a write
    assert log.count("writes failed since the start") <= 1 and log.count("lines not written") <= 1

    # When: room comes back
    shutil.rmtree(filler)
    freed = time.monotonic()
    # Then: within 5 s a create is taken and the queued message has run
    taken = wait_for(lambda: _try_create(layout, "idle"), RESUME, "a create taken")
    wait_for(lambda: _state(layout, "busy", queued) == "done", RESUME, "the queued one to run")
    took = time.monotonic() - freed
    assert took < RESUME, took
    _wait_done(layout, "idle", taken)
    assert _daemon_pids(serve) == pids
    log = serve.log()
    assert "Traceback" not in log, log
    assert "has room again" in log
    assert "rqsys_state_fs_full 0.0" in client.simulate_get("/metrics").text
    print(f"{what} on {image}: work resumed {took:.2f} s after room came back")


def _create(layout: Layout, queue: str) -> str:
    return str(call(layout, queue, "create", msg={"dest": queue})["msg_id"])


def _try_create(layout: Layout, queue: str) -> str | None:
    try:
        return _create(layout, queue)
    except NoSpace:
        return None


def _state(layout: Layout, queue: str, msg_id: str) -> str:
    return str(call(layout, queue, "status", msg_id=msg_id)["state"])


def _run_to_end(layout: Layout, queue: str) -> str:
    msg_id = _create(layout, queue)
    _wait_done(layout, queue, msg_id)
    return msg_id


def _wait_done(layout: Layout, queue: str, msg_id: str) -> None:
    wait_for(lambda: _state(layout, queue, msg_id) == "done", DEADLINE, f"{msg_id} done")


def _tmp_entries(layout: Layout, queue: str) -> list[str]:
    return sorted(os.listdir(layout.queue_dir(queue) / ".tmp"))


def _daemon_pids(serve: LoggedProcess) -> dict[str, int]:
    """The queue daemons serve runs, by queue: their pids."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == serve.proc.pid and b"queue" in argv:
            pids[argv[argv.index(b"queue") + 1].decode()] = int(entry)
    return pids


def test_an_action_whose_audit_record_cannot_be_written_is_refused(served, image):
    # Given done messages in a queue, and then a file system full to its last block
    layout, serve = served
    done = [_run_to_end(layout, "idle") for _ in range(3)]
    reserve = layout.audit_dir / "idle.reserve"
    assert reserve.stat().st_size == 256 << 10  # the trail's room, kept while there is room
    filler = image / "filler"
    fill_blocks(filler)
    # When actions that free nothing come (a reload writes only its record), each time
    # after the disk was filled again (other writers take what is freed), Then each one
    # answered ok is on the record, until one is refused, once its record could not be
    # written: the reserve's room was spent
    answered, why = 0, ""
    for n in range(400):
        try:
            call(layout, "idle", "reload")
        except NoSpace as exc:
            why = str(exc)
            break
        answered += 1
        fill_blocks_again(filler)
        fill_inodes_in(filler, f"again{n}-")
    assert why.startswith("no space left on device: ") and why.endswith(
        "; the action was refused: its audit record could not be written"), why
    recorded = [json.loads(line) for line in (layout.audit_dir / "idle.jsonl").read_bytes()
                .splitlines() if line.strip()]
    reloads = [r["result"] for r in recorded if r["action"] == "reload"]
    assert reloads[:answered] == ["ok"] * answered and answered > 0
    assert reloads[answered:] in ([], ["failed"])  # the refusal, when its line still fit
    assert not reserve.exists()
    # And a delete, which frees room before its record, is still taken and recorded
    call(layout, "idle", "delete", msg_id=done[0])
    recorded = (layout.audit_dir / "idle.jsonl").read_text()
    assert '"action":"delete"' in recorded.replace(" ", "")
    # And once there is room again, the reserve is made again and actions go on
    shutil.rmtree(filler)
    wait_for(lambda: _try_reload(layout, "idle"), RESUME, "a reload taken")
    assert reserve.stat().st_size == 256 << 10
    assert "Traceback" not in serve.log()


def _try_reload(layout: Layout, queue: str) -> bool:
    try:
        call(layout, queue, "reload")
    except NoSpace:
        return False
    return True
