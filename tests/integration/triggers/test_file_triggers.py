"""Files triggers (issue 49) with real inotify, a real ``rqsys serve`` and its
rq-scan: 500 files from 4 writers (whole, slowly in several writes, renamed
in from elsewhere, renamed in from a dot file beside them) with rq-scan
SIGKILLed mid-stream and files arriving while it is down: every file exactly
one message, whose attachment is the file's bytes.  ``then`` move and delete
after done, not after err; a file on another file system copied; a bad
trigger file beside a good one; a directory missing, then gone, logged and
watched again; the creator ``trigger <name>`` in timeline and audit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from scan_util import DEADLINE, LoggedProcess, call, make_entry, start_serve, started

from rqsys.store import Layout

STATES = ("prep", "que", "run", "done", "err")
SCRIPT = 'case "$RQ_PARAM1" in *bad*) echo "err refused" >&3 ;; *) echo "done ok" >&3 ;; esac'


@pytest.fixture
def scandir(tmp_path: Path) -> Path:
    path = tmp_path / "scandir"
    path.mkdir()
    make_entry(tmp_path / "scripts", "ingest", SCRIPT, num_workers=4)
    (path / "ingest").symlink_to(tmp_path / "scripts" / "ingest")
    return path


@pytest.fixture
def serve(layout: Layout, scandir: Path, tmp_path: Path) -> Iterator[Any]:
    yield from started(lambda: start_serve(layout, scandir, tmp_path / "serve.log"))


def write_trigger(layout: Layout, name: str, data: dict[str, Any] | str) -> Path:
    tdir = layout.root / "triggers"
    tdir.mkdir(exist_ok=True)
    path = tdir / f"{name}.json"
    tmp = tdir / f".{name}.tmp"
    tmp.write_text(data if isinstance(data, str) else json.dumps(data))
    tmp.rename(path)
    return path


def files_trigger(path: Path, then: Any = "keep", glob: str = "*.csv") -> dict[str, Any]:
    return {"files": {"path": str(path), "glob": glob}, "msg": {"dest": "ingest",
                                                                "param2": "from-drop"},
            "then": then}


def messages(layout: Layout, queue: str = "ingest") -> list[tuple[str, Path, dict[str, Any]]]:
    """(state, directory, msg) of every message of the queue (once each: one
    seen in two states as it moved is taken in the later)."""
    qdir = layout.queue_dir(queue)
    found: dict[str, tuple[str, Path, dict[str, Any]]] = {}
    for state in STATES:
        for where, dirs, names in os.walk(qdir / state):  # a directory moved away: skipped
            dirs[:] = [d for d in dirs if d not in ("job", "attach")]
            if "msg" in names:
                try:
                    msg = json.loads(Path(where, "msg").read_text())
                    found[Path(where).name] = (state, Path(where), msg)
                except (FileNotFoundError, ValueError):
                    continue  # moved between states while read: read again by the next look
    return list(found.values())


def settled(layout: Layout, want: int) -> list[tuple[str, Path, dict[str, Any]]] | None:
    """All messages once ``want`` distinct keys exist and none is still on its way."""
    found = messages(layout)
    keys = {m["unique_key"] for _s, _d, m in found}
    return found if len(keys) >= want else None


def record(layout: Layout, name: str) -> dict[str, Any]:
    path = layout.root / "triggers" / ".state" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def scan_pid(serve: LoggedProcess) -> int | None:
    """rq-scan's pid among the supervisor's children."""
    task_dir = Path(f"/proc/{serve.proc.pid}/task")
    for task in task_dir.iterdir():
        for pid in (task / "children").read_text().split():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"scan" in argv and b"--scandir" in argv:
                return int(pid)
    return None


def state_of(layout: Layout, msg_id: str) -> str:
    return str(call(layout, "ingest", "state", msg_id=msg_id)["state"])


# ---------------------------------------------------------------- writers
def body(writer: int, n: int) -> bytes:
    return (f"{writer},{n},".encode() + b"x" * 61 + b"\n") * (50 + n % 40)


def write_whole(inbox: Path, staging: Path, w: int, n: int) -> None:
    (inbox / f"w{w}-{n}.csv").write_bytes(body(w, n))


def write_slowly(inbox: Path, staging: Path, w: int, n: int) -> None:
    data = body(w, n)
    with open(inbox / f"w{w}-{n}.csv", "wb") as out:
        for at in range(0, len(data), len(data) // 3 + 1):
            out.write(data[at:at + len(data) // 3 + 1])
            out.flush()
            time.sleep(0.01)


def rename_in(inbox: Path, staging: Path, w: int, n: int) -> None:
    tmp = staging / f"w{w}-{n}.csv"
    tmp.write_bytes(body(w, n))
    tmp.rename(inbox / tmp.name)


def dot_then_rename(inbox: Path, staging: Path, w: int, n: int) -> None:
    tmp = inbox / f".w{w}-{n}.csv.part"  # a dot file: not the glob's
    tmp.write_bytes(body(w, n))
    tmp.rename(inbox / f"w{w}-{n}.csv")


WRITERS = (write_whole, write_slowly, rename_in, dot_then_rename)


def test_500_files_from_4_writers_across_a_kill_each_exactly_one_whole_message(
        layout, serve, tmp_path):
    # Given rqsys serve with a files trigger on an empty directory
    inbox, staging = tmp_path / "in", tmp_path / "staging"
    inbox.mkdir()
    staging.mkdir()
    proc = serve()
    write_trigger(layout, "drop", files_trigger(inbox))
    proc.wait_log("trigger drop added")
    per_writer, killed = 125, threading.Event()
    # When 4 writers write 125 files each, and rq-scan is killed mid-stream
    def writer(w: int) -> None:
        for n in range(per_writer):
            WRITERS[w](inbox, staging, w, n)
            if n == per_writer // 3:
                killed.wait(DEADLINE)  # the rest while rq-scan is down, and after

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    straggler = (inbox / "straggler.csv").open("wb")  # half written across the restart
    try:
        straggler.write(body(9, 0)[:1000])
        straggler.flush()
        wait_for(lambda: len(messages(layout)) >= 60, DEADLINE, "some messages made")
        pid = scan_pid(proc)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
    finally:
        killed.set()
        for t in threads:
            t.join()
    proc.wait_log("rq-scan ready", count=2)
    time.sleep(2.5)  # the restarted rq-scan's catch-up saw it, old and still open
    straggler.write(body(9, 0)[1000:])
    straggler.close()
    # Then every file is exactly one message, its attachment the file's bytes
    want = 4 * per_writer + 1
    found = wait_for(lambda: settled(layout, want), 90, "501 messages")
    keys = Counter(m["unique_key"] for _s, _d, m in found)
    names = Counter(m["param1"] for _s, _d, m in found)
    assert len(found) == want, keys.most_common(3)
    assert set(names) == {f"w{w}-{n}.csv" for w in range(4) for n in range(per_writer)} | {
        "straggler.csv"}
    for _state, mdir, msg in found:
        attached = (mdir / "attach" / msg["param1"]).read_bytes()
        assert attached == (inbox / msg["param1"]).read_bytes(), msg["param1"]
        assert msg["param2"] == "from-drop"
    fires = wait_for(lambda: (r := record(layout, "drop")) and
                     r["made"] + r["duplicate"] >= want and r, DEADLINE, "the record")
    # (a message made just before the kill may be counted as a duplicate after it)
    assert fires["made"] <= want <= fires["made"] + fires["duplicate"]
    assert fires["refused"] == 0
    # and nothing more comes once all ended (the kept files are not made again)
    wait_for(lambda: all(s == "done" for s, _d, _m in messages(layout)), DEADLINE, "all done")
    assert len(messages(layout)) == want


def test_then_move_and_delete_after_done_never_after_err(layout, serve, tmp_path):
    # Given two triggers: one moves its files when done, one deletes them
    moving, deleting, processed = tmp_path / "mv-in", tmp_path / "rm-in", tmp_path / "processed"
    for d in (moving, deleting, processed):
        d.mkdir()
    proc = serve()
    write_trigger(layout, "mv", files_trigger(moving, {"move": str(processed)}))
    write_trigger(layout, "rm", files_trigger(deleting, "delete", glob="*"))
    proc.wait_log("trigger rm added")
    # When a file's message ends in err
    (moving / "bad.csv").write_text("no\n")
    (deleting / "bad.txt").write_text("no\n")
    wait_for(lambda: Counter(s for s, _d, _m in messages(layout))["err"] == 2, DEADLINE,
             "two messages in err")
    # and others end done
    (moving / "good.csv").write_text("yes\n")
    (deleting / "good.txt").write_text("yes\n")
    # Then the done ones are moved / deleted, the err ones left for a retry
    wait_for(lambda: (processed / "good.csv").exists() and not (deleting / "good.txt").exists(),
             DEADLINE, "then done")
    assert not (moving / "good.csv").exists()
    assert (processed / "good.csv").read_text() == "yes\n"
    time.sleep(1.5)  # more than a poll: the err messages were looked at again
    assert (moving / "bad.csv").exists() and (deleting / "bad.txt").exists()
    assert sorted(os.listdir(processed)) == ["good.csv"]
    # and the creator is the trigger, in the timeline and the audit trail
    made = [(d, m) for s, d, m in messages(layout) if m["param1"] == "good.csv"]
    assert len(made) == 1
    # its attachment the file itself, hard-linked (it left: then move), not a copy
    assert os.stat(made[0][0] / "attach" / "good.csv").st_ino == \
        os.stat(processed / "good.csv").st_ino
    got = call(layout, "ingest", "get", msg_id=made[0][0].name)
    assert "trigger mv" in json.dumps(got["timeline"][0]), got["timeline"]
    audit = [json.loads(line) for line in
             (layout.root / "audit" / "ingest.jsonl").read_text().splitlines()]
    creates = [r for r in audit if r["action"] == "create"]
    assert {r["actor"] for r in creates} == {"trigger mv", "trigger rm"}, creates
    assert any("rq-scan" in json.dumps(r) for r in creates), creates
    assert record(layout, "mv")["made"] == 2 and record(layout, "rm")["made"] == 2
    assert "good.csv moved to" in proc.log() and "good.txt deleted" in proc.log()


def test_a_file_on_another_file_system_is_copied(layout, serve, tmp_path):
    shm = Path("/dev/shm")
    need(shm.is_dir() and os.stat(shm).st_dev != os.stat(layout.root).st_dev,
         "a /dev/shm on another file system than the state root")
    inbox = Path(tempfile.mkdtemp(prefix="rq-files-", dir=shm))
    try:
        proc = serve()
        write_trigger(layout, "shm", files_trigger(inbox, glob="*.bin"))
        proc.wait_log("trigger shm added")
        data = os.urandom(300_000)
        (inbox / "blob.bin").write_bytes(data)
        found = wait_for(lambda: messages(layout), DEADLINE, "a message")
        attached = found[0][1] / "attach" / "blob.bin"
        assert attached.read_bytes() == data
        assert os.stat(attached).st_dev != os.stat(inbox / "blob.bin").st_dev
    finally:
        shutil.rmtree(inbox, ignore_errors=True)


def test_a_bad_trigger_file_and_a_vanished_directory_are_logged_and_others_go_on(
        layout, serve, tmp_path):
    # Given a bad trigger file, and a good one whose directory is not there yet
    inbox = tmp_path / "later"
    write_trigger(layout, "broken", '{"files": {"path": "relative"}, "msg": {}}')
    write_trigger(layout, "late", files_trigger(inbox))
    # and one whose queue does not exist
    orphans = tmp_path / "orphans"
    orphans.mkdir()
    (orphans / "lost.csv").write_text("0\n")
    write_trigger(layout, "noq", {**files_trigger(orphans), "msg": {"dest": "nosuch"}})
    proc = serve()
    # Then each is one log line, and rq-scan goes on
    proc.wait_log("trigger file refused")
    proc.wait_log("no message for")
    refused = record(layout, "noq")
    assert refused["refused"] == 1 and "no queue named nosuch" in refused["last_error"]
    proc.wait_log(f"trigger late: {inbox}: no such directory; trying again")
    # When the directory comes, with a file already in it
    staging = tmp_path / "later.tmp"
    staging.mkdir()
    (staging / "first.csv").write_text("1\n")
    staging.rename(inbox)
    proc.wait_log("is watched again")
    wait_for(lambda: len(messages(layout)) == 1, DEADLINE, "the file already there")
    (inbox / "second.csv").write_text("2\n")
    wait_for(lambda: len(messages(layout)) == 2, DEADLINE, "the file dropped")
    # When the directory goes away, and comes back
    shutil.rmtree(inbox)
    proc.wait_log("the directory went away; trying again")
    inbox.mkdir()
    proc.wait_log("is watched again", count=2)
    (inbox / "third.csv").write_text("3\n")
    wait_for(lambda: len(messages(layout)) == 3, DEADLINE, "the file in the new directory")
    assert sorted(m["param1"] for _s, _d, m in messages(layout)) == [
        "first.csv", "second.csv", "third.csv"]
    assert scan_pid(proc) is not None and "rq-scan exited" not in proc.log()
    assert record(layout, "noq")["refused"] == 1  # tried again meanwhile, counted once


def test_recursive_takes_files_below_in_directories_old_and_new(layout, serve, tmp_path):
    # Given a recursive trigger on a tree with a file below already
    top = tmp_path / "tree"
    (top / "old").mkdir(parents=True)
    (top / "old" / "a.csv").write_text("a\n")
    proc = serve()
    write_trigger(layout, "tree", {**files_trigger(top), "files": {
        "path": str(top), "glob": "*.csv", "recursive": True}})
    proc.wait_log("trigger tree added")
    # When a new directory comes with a file written at once, and a file in it later
    (top / "new" / "deep").mkdir(parents=True)
    (top / "new" / "deep" / "b.csv").write_text("b\n")
    wait_for(lambda: len(messages(layout)) == 2, DEADLINE, "two messages")
    (top / "new" / "deep" / "c.csv").write_text("c\n")
    # Then each is one message, named by its path below the trigger's
    wait_for(lambda: len(messages(layout)) == 3, DEADLINE, "three messages")
    assert sorted(m["param1"] for _s, _d, m in messages(layout)) == [
        "new/deep/b.csv", "new/deep/c.csv", "old/a.csv"]
