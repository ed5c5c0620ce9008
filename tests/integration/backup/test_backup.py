"""``rqsys backup`` and ``rqsys restore`` (issue 46, item 3), on real daemons.

A backup taken under load (creates over the socket the whole time, a
script that fails one run in three, retries and deletes meanwhile) is
restored into another root and run there: every message acknowledged
before the backup began is in it, once (by id, across every state of every
queue), in a state it really had; the restored root's daemons run its
queued messages.  And each refusal, with its exact text.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from scan_util import DEADLINE, call, make_entry, start_serve

from rqsys import __version__
from rqsys.backup import manifest
from rqsys.store import Layout, QueueStore, formats

STATES = ("prep", "que", "run", "done", "err", "relayed")
ENDED = ("done", "relayed")  # a message there stays there (or is deleted)
SCRIPT = """case "$RQ_PARAM1" in
  fail) exit 1;;
  flaky) [ $(( ${RQ_MSG_ID##*.} % 3 )) = 0 ] && exit 1;;
esac
sleep 0.0$(( RANDOM % 5 ))
echo done >&3"""


def rqsys(*argv: str, root: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``rqsys [--root ROOT] ARGV...`` as a user runs it."""
    pre = ["--root", str(root)] if root is not None else []
    return subprocess.run([sys.executable, "-m", "rqsys", *pre, *argv], capture_output=True,
                          text=True, timeout=300)


def inventory(root: Path, live: bool = False) -> dict[str, tuple[str, str]]:
    """Every message of a root: id -> (queue, state); one found twice fails
    (but in a ``live`` root, walked as messages move: the later state is kept)."""
    found: dict[str, tuple[str, str]] = {}
    layout = Layout.from_root(root)
    for queue in sorted(os.listdir(layout.queues)):
        store = QueueStore(layout.queue_dir(queue))
        for state in STATES:
            for msg_id in store.ids(state):
                assert live or msg_id not in found, (msg_id, found.get(msg_id), (queue, state))
                found[msg_id] = (queue, state)
    return found


def backed_up(dest: Path) -> dict[str, tuple[str, str]]:
    """The manifest's messages: id -> (queue, state); one listed twice fails."""
    rows = json.loads((dest / manifest.NAME).read_text())["messages"]
    ids = [row[2] for row in rows]
    assert len(ids) == len(set(ids)), "a message twice in the manifest"
    return {row[2]: (row[0], row[1]) for row in rows}


# ---------------------------------------------------------------- a quiet root
@pytest.fixture
def filled(layout, make_queue, daemon, tmp_path) -> Layout:
    """A root with a message in each state a quiet queue holds, an
    attachment shared by a clone, a timer and a scandir link."""
    make_queue("work", SCRIPT, num_workers=2)
    work = daemon("work")
    done = work.call("create", msg={"dest": "work"})["msg_id"]
    err = work.call("create", msg={"dest": "work", "param1": "fail"})["msg_id"]
    prep = work.call("create", msg={"dest": "work"}, state="prep")["msg_id"]
    body = os.urandom(300_000)
    (tmp_path / "a.bin").write_bytes(body)
    with open(tmp_path / "a.bin", "rb") as f:
        work.call("attach", fds=[f.fileno()], msg_id=prep, name="a.bin",
                  md5=hashlib.md5(body).hexdigest())
    clone = work.call("clone", msg_id=prep)["msg_id"]
    store = QueueStore(layout.queue_dir("work"))
    wait_for(lambda: [store.find(i) for i in (done, err, clone)] == ["done", "err", "done"],
             DEADLINE, "the first messages to end")
    (layout.timers / "tick.json").write_text(json.dumps({"period": 3600,
                                                         "msg": {"dest": "work"}}))
    (layout.scandir / "work").symlink_to(tmp_path / "scripts" / "work")
    work.stop()
    return layout


def test_a_quiet_root_comes_back_whole(filled, tmp_path):
    dest, target = tmp_path / "backup", tmp_path / "restored"
    made = rqsys("backup", str(dest), root=filled.root)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"ok backup {dest}: 4 messages")
    done = rqsys("restore", str(dest), str(target))
    assert done.returncode == 0, done.stderr
    assert inventory(target) == inventory(filled.root)
    assert os.readlink(target / "scandir" / "work") == str(tmp_path / "scripts" / "work")
    assert (target / "timers" / "tick.json").read_bytes() == \
        (filled.timers / "tick.json").read_bytes()
    assert json.loads((target / formats.FILE).read_text())["format"] == formats.FORMAT
    store = QueueStore(target / "queue" / "work")
    attached = [store.attach_dir(s, i) / "a.bin" for i, (_q, s) in inventory(target).items()
                if store.attach_dir(s, i).is_dir()]
    assert len(attached) == 2  # the prep message and its clone, done
    assert attached[0].read_bytes() == (tmp_path / "a.bin").read_bytes()
    assert os.stat(attached[0]).st_ino == os.stat(attached[1]).st_ino  # still one file


# ---------------------------------------------------------------- refusals
def test_restore_refuses_a_root_that_is_not_empty(filled, tmp_path):
    dest, target = tmp_path / "backup", tmp_path / "restored"
    assert rqsys("backup", str(dest), root=filled.root).returncode == 0
    target.mkdir()
    (target / "something").write_text("x")
    refused = rqsys("restore", str(dest), str(target))
    assert refused.returncode == 1
    assert refused.stderr == (f"rqsys: restore: {target} is not empty: restore into a new or "
                              "empty directory, or give --force to replace what it holds\n")
    forced = rqsys("restore", "--force", str(dest), str(target))
    assert forced.returncode == 0, forced.stderr
    assert inventory(target) == inventory(filled.root)
    assert (target / "something").read_text() == "x"  # not the backup's: left alone


def test_restore_refuses_a_backup_of_a_newer_format(filled, tmp_path):
    dest, target = tmp_path / "backup", tmp_path / "restored"
    assert rqsys("backup", str(dest), root=filled.root).returncode == 0
    data = json.loads((dest / manifest.NAME).read_text())
    data["format"] = formats.FORMAT + 1
    (dest / manifest.NAME).write_text(json.dumps(data))
    refused = rqsys("restore", str(dest), str(target))
    assert refused.returncode == formats.EXIT_NEWER
    assert refused.stderr == (
        f"rqsys: the backup {dest} is in on-disk format {formats.FORMAT + 1}, newer than this "
        f"rqsys ({__version__}) knows (format {formats.FORMAT}): restore it with the rqsys "
        "that made it, or a newer one\n")
    assert not target.exists()


def test_backup_refuses_a_dest_that_is_not_empty(filled, tmp_path):
    dest = tmp_path / "backup"
    dest.mkdir()
    (dest / "old").write_text("x")
    refused = rqsys("backup", str(dest), root=filled.root)
    assert refused.returncode == 1
    assert refused.stderr == (f"rqsys: backup: {dest} exists and is not empty: give a new or "
                              "empty directory\n")


@pytest.mark.parametrize("damage", ["message gone", "msg changed", "attachment cut",
                                    "file gone", "no manifest"])
def test_restore_refuses_a_backup_that_is_not_whole(filled, tmp_path, damage):
    dest, target = tmp_path / "backup", tmp_path / "restored"
    assert rqsys("backup", str(dest), root=filled.root).returncode == 0
    rows = json.loads((dest / manifest.NAME).read_text())["messages"]
    err = next(r for r in rows if r[1] == "err")
    prep = next(r for r in rows if r[1] == "prep")
    tree = dest / manifest.TREE / "queue" / "work"
    clone = next(r for r in rows if r[1] == "done" and
                 (tree / "done" / r[2][:11] / r[2] / "attach").is_dir())
    count, first = {  # the attachment is one file in the backup too: its clone's is cut
        "message gone": (1, f"message work/err/{err[2]} missing"),
        "msg changed": (1, f"message work/err/{err[2]} differs (msg md5, entries, bytes)"),
        "attachment cut": (2, f"message work/done/{clone[2]} differs (msg md5, entries, "
                              "bytes)"),
        "file gone": (1, "file timers/tick.json missing"),
    }.get(damage, (0, None))
    if damage == "message gone":
        subprocess.run(["rm", "-r", str(tree / "err" / err[2])], check=True)
    elif damage == "msg changed":
        (tree / "err" / err[2] / "msg").write_text('{"dest": "work"}')
    elif damage == "attachment cut":
        os.truncate(tree / "prep" / prep[2] / "attach" / "a.bin", 1000)
    elif damage == "file gone":
        (dest / manifest.TREE / "timers" / "tick.json").unlink()
    else:
        (dest / manifest.NAME).unlink()
    refused = rqsys("restore", str(dest), str(target))
    assert refused.returncode == 1
    if first is None:
        assert refused.stderr == (f"rqsys: {dest} has no manifest.json: not a backup, or one "
                                  "that did not finish\n")
    else:
        assert refused.stderr == (f"rqsys: the backup {dest} is not whole ({count} "
                                  f"differences from its manifest; the first: {first}): "
                                  "nothing restored\n")
    assert not target.exists()


# ---------------------------------------------------------------- under load
class Load:
    """Creates, retries and deletes on a live root from threads, each
    remembered with when it was acknowledged."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.acked: dict[str, float] = {}  # id -> when its create was answered
        self.deleted: dict[str, float] = {}  # id -> when its delete was asked
        self.retried = 0
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard, args=(job,))
                        for job in (self._create, self._create, self._retry, self._delete)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(DEADLINE)
        assert not self.errors, self.errors

    def _guard(self, job: Any) -> None:
        try:
            while not self.stop.is_set():
                job()
        except BaseException as exc:  # noqa: B036 (told by __exit__)
            self.errors.append(exc)

    def _create(self) -> None:
        param = "flaky" if len(self.acked) % 2 else "ok"
        msg_id = call(self.layout, "work", "create",
                      msg={"dest": "work", "param1": param})["msg_id"]
        self.acked[msg_id] = time.time()

    def _ended(self, state: str) -> list[str]:
        return list(QueueStore(self.layout.queue_dir("work")).ids(state))

    def _retry(self) -> None:
        for msg_id in self._ended("err")[:5]:
            try:
                call(self.layout, "work", "retry", msg_id=msg_id)
                self.retried += 1
            except Exception:  # moved meanwhile (retried twice, deleted)
                pass
        time.sleep(0.01)

    def _delete(self) -> None:
        for msg_id in self._ended("done")[:2]:
            self.deleted[msg_id] = time.time()
            try:
                call(self.layout, "work", "delete", msg_id=msg_id)
            except Exception:  # deleted meanwhile: by nothing else here, but be safe
                pass
        time.sleep(0.05)


REACHABLE = {  # state in the backup -> states the message may be in later
    "que": set(STATES) - {"prep"}, "run": set(STATES) - {"prep"},
    "err": set(STATES) - {"prep"}, "done": {"done"}, "relayed": {"relayed"},
    "prep": set(STATES),
}


def test_a_backup_under_load_holds_every_message_once(layout, tmp_path):
    scandir = tmp_path / "scandir"
    scandir.mkdir()
    (scandir / "work").symlink_to(make_entry(tmp_path / "entries", "work", SCRIPT,
                                             num_workers=4))
    serve = start_serve(layout, scandir, tmp_path / "serve.log")
    try:
        wait_for(lambda: layout.socket_path("work").exists(), DEADLINE, "the work queue")
        dest = tmp_path / "backup"
        with Load(layout) as load:
            wait_for(lambda: len(load.acked) > 300 and load.retried > 5, DEADLINE,
                     "load to build up")
            began = time.time()
            made = rqsys("backup", str(dest), root=layout.root)
            ended = time.time()
        assert made.returncode == 0, made.stderr
        print(made.stdout.strip(), f"; creates {len(load.acked)}, retries {load.retried}, "
              f"deletes {len(load.deleted)}")
        wait_for(lambda: all(s in ("done", "err")
                             for _q, s in inventory(layout.root, live=True).values()),
                 DEADLINE, "the live root to settle")
        after = inventory(layout.root)
    finally:
        assert serve.stop() == 0, serve.log()
    copied = backed_up(dest)
    # Then: every message acknowledged before the backup began, and not deleted
    # before it ended, is in it once, in a state it really had
    must = {i for i, at in load.acked.items() if at < began} - \
        {i for i, at in load.deleted.items() if at < ended}
    assert not must - set(copied), sorted(must - set(copied))[:10]
    for msg_id, (_queue, state) in copied.items():
        later = after.get(msg_id, (None, "deleted"))[1]
        assert later == "deleted" or later in REACHABLE[state], (msg_id, state, later)
    assert {s for _q, s in copied.values()} >= {"que", "done", "err"}
    # When it is restored into another root and run there
    target = tmp_path / "restored"
    done = rqsys("restore", str(dest), str(target))
    assert done.returncode == 0, done.stderr
    restored = inventory(target)
    assert set(restored) == set(copied)
    assert all(restored[i][1] == ("que" if s == "run" else s) for i, (_q, s) in copied.items())
    # Then its daemons start and run its queued messages
    queued = [i for i, (_q, s) in restored.items() if s == "que"]
    assert queued
    again = Layout.from_root(target)
    serve = start_serve(again, scandir, tmp_path / "serve2.log")
    try:
        wait_for(lambda: all(inventory(target, live=True)[i][1] in ("done", "err")
                             for i in queued),
                 DEADLINE * 2, "the restored root's queued messages to run")
    finally:
        assert serve.stop() == 0, serve.log()


# ---------------------------------------------------------------- the walk's window
def test_a_message_moved_back_behind_the_walk_is_found(layout, tmp_path, monkeypatch):
    """run -> que just after que/ was walked and before run/ is (a resend in
    that window): the watch names it, and the backup looks for it again."""
    from rqsys.backup import copy
    from rqsys.store.view import QueueView

    layout.create_queue_dir("work", {"name": "work"})
    store = QueueStore(layout.queue_dir("work"))
    moved = store.create({"dest": "work"})
    store.move(moved, "que", "run")
    walked = QueueView.ids

    def ids(view: QueueView, state: str):  # the window, made to happen every time
        if state == "run" and (view.qdir / "run" / moved).is_dir():
            store.move(moved, "run", "que")
        return walked(view, state)

    monkeypatch.setattr(QueueView, "ids", ids)
    report = copy.backup(layout, tmp_path / "backup")
    assert (report.messages, report.moved, report.gone) == (1, 1, 0)
    assert backed_up(tmp_path / "backup") == {moved: ("work", "que")}
