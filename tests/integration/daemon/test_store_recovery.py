"""Unit tests of recovery at start, spare directories and the que snapshot,
on a real file system."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import wait_for

from rqsys.errors import NotFound, StoreError
from rqsys.store import SPARE_BATCH, SPARE_DIRS, QueueStore


@pytest.fixture
def store(layout):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    return QueueStore(layout.queue_dir("q"))


def test_recover_moves_run_back_keeps_prep_cleans_tmp(store):
    running = store.create({"dest": "q"})
    store.move(running, "que", "run")
    prep = store.create({"dest": "q"}, state="prep")
    store.stage({"dest": "q"})  # a create that never finished
    assert store.recover() == [running]
    assert store.find(running) == "que" and store.find(prep) == "prep"
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_recover_completes_publishes_cut_short(store):
    # A crash after the msg was written and synced, before the move into que/
    tmp = store.qdir / ".tmp"
    good, broken, unfinished = (store.stage({"dest": "q"}, state) for state in
                                ("que", "prep", "que"))
    Path(good.tmp, "msg").write_text(json.dumps(good.msg))
    Path(broken.tmp, "msg").write_text('{"dest": "q", "par')
    assert Path(good.tmp) == tmp / f"{good.msg_id}.que"
    store.recover()
    assert store.find(good.msg_id) == "que"
    assert store.read_msg("que", good.msg_id)["msg_id"] == good.msg_id
    for gone in (broken, unfinished):
        with pytest.raises(NotFound):
            store.find(gone.msg_id)
    assert list(tmp.iterdir()) == []


def test_new_messages_take_spare_directories_and_recovery_drops_the_rest(store):
    # Given the thread that keeps SPARE_DIRS spare directories ready, each with
    # only its msg, blank (two inodes a queued message: the rest comes at its start)
    tmp = store.qdir / ".tmp"
    store.spares.start()
    wait_for(lambda: len(store.spares) == SPARE_DIRS)
    spare = next(tmp.iterdir())
    assert spare.name.startswith("spare.")
    assert {p.relative_to(spare).as_posix() for p in spare.rglob("*")} == {"msg"}
    assert (spare / "msg").read_bytes().strip() == b""
    # When a message is created, it takes one of them (renamed, not made),
    # its msg written over the blank one
    msg_id = store.create({"dest": store.name, "param1": "x" * 2000})
    assert store.read_msg("que", msg_id)["param1"] == "x" * 2000
    assert [p.name for p in store.msg_dir("que", msg_id).iterdir()] == ["msg"]
    assert len(list(tmp.iterdir())) == SPARE_DIRS - 1
    # and once a batch has been taken, the thread makes a batch
    for _ in range(SPARE_BATCH - 1):
        store.create({"dest": store.name})
    wait_for(lambda: len(store.spares) == SPARE_DIRS)
    # Then, the thread stopped, recovery removes the unused spares like any
    # stray temp directory
    store.spares.stop()
    store.recover()
    assert list(tmp.iterdir()) == []


def test_recovery_places_a_spare_holding_a_published_message(store):
    # Given a que create that took a spare, whose msg was made durable when
    # the daemon was killed before moving it into que/
    store.spares.start()
    wait_for(lambda: len(store.spares) == SPARE_DIRS)
    published = store.stage({"dest": "q", "param1": "kept"})
    assert Path(published.tmp).name.startswith("spare.")
    store.publish([published])
    torn = store.stage({"dest": "q"})
    Path(torn.tmp, "msg").write_text('{"dest": "q", "msg_id": "2026')
    store.spares.stop()
    # When the daemon starts again
    store.recover()
    # Then the published message is in que/ under its id; the torn one and the
    # empty spares are gone
    assert store.read_msg("que", published.msg_id)["param1"] == "kept"
    assert list(store.ids("que")) == [published.msg_id]
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_creates_without_a_ready_spare_make_their_directory(store):
    # Given no spare thread running
    # When messages are created
    ids = [store.create({"dest": store.name, "param1": str(i)}) for i in range(3)]
    # Then each has its own directory and msg, nothing is left in .tmp/
    assert [store.read_msg("que", i)["param1"] for i in ids] == ["0", "1", "2"]
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_recovery_counts_the_run_a_crash_cut_short(store):
    # Given a message that was running (its msg still holds the count before the run)
    msg_id = store.create({"dest": store.name, "count": 2})
    store.move(msg_id, "que", "run")
    # When the daemon restarts
    store.recover()
    # Then the interrupted run counts: the message is back in que with count 3
    assert store.read_msg("que", msg_id)["count"] == 3


def test_que_snapshot_is_used_only_when_it_matches_que_and_is_taken_once(store):
    # Given a clean stop that saved the two queued messages
    ids = [store.create({"dest": "a-longer-queue", "param1": str(n)}) for n in range(2)]
    store.save_que_snapshot({i: store.read_msg("que", i) for i in ids})
    # When the next start takes it
    msgs = store.take_que_snapshot(list(store.ids("que")))
    # Then it holds exactly que/, and it is gone: a later start reads que/ itself
    assert msgs is not None and sorted(msgs) == sorted(ids)
    assert msgs[ids[1]]["param1"] == "1"
    # and the messages share one string of their queue's name, as read from que/
    assert msgs[ids[0]]["dest"] is msgs[ids[1]]["dest"]
    assert not (store.qdir / "que.snapshot").exists()
    assert store.take_que_snapshot(list(store.ids("que"))) is None


def test_a_stale_que_snapshot_is_removed_and_ignored(store):
    # Given a snapshot saved before one more message reached que/
    kept = store.create({"dest": "q"})
    store.save_que_snapshot({kept: store.read_msg("que", kept)})
    store.create({"dest": "q"})
    # When it is taken, Then it is not used, and not left for later
    assert store.take_que_snapshot(list(store.ids("que"))) is None
    assert not (store.qdir / "que.snapshot").exists()


@pytest.mark.parametrize("mangle", [
    lambda text: text[:-9],  # a torn last line
    lambda text: text + text.splitlines()[0] + "\n",  # a message twice
    lambda text: text.replace("[", "[1, ", 1),  # a row of three
    lambda text: text + "[\"x\", 1]\n",  # a message that is no object
])
def test_a_mangled_que_snapshot_is_ignored(store, mangle):
    # Given a snapshot of que/ that was damaged after it was written
    ids = [store.create({"dest": "q", "param1": str(n)}) for n in range(2)]
    store.save_que_snapshot({i: store.read_msg("que", i) for i in ids})
    path = store.qdir / "que.snapshot"
    path.write_text(mangle(path.read_text()))
    # When it is taken, Then it is not used (que/ is read one by one), and it is gone
    assert store.take_que_snapshot(list(store.ids("que"))) is None
    assert not path.exists()


def test_recovery_finishes_a_prep_publish_into_prep(store):
    # Given a prep create whose msg was synced when the daemon died
    staged = store.stage({"dest": "q"}, "prep")
    store.publish([staged])
    # When the daemon starts again, Then it is in prep/, not que/
    assert store.recover() == []
    assert store.find(staged.msg_id) == "prep"


def test_recovery_drops_a_temp_copy_of_a_message_already_placed(store):
    # Given a power cut (and fsck) that left a message both in que/ and as the
    # temp directory it was published from
    placed = store.stage({"dest": "q", "param1": "placed"})
    Path(placed.tmp, "msg").write_text(json.dumps(placed.msg))
    store.recover()
    leftover = store.qdir / ".tmp" / f"{placed.msg_id}.que"
    leftover.mkdir()
    (leftover / "msg").write_text(json.dumps(placed.msg))
    # When the daemon starts again, Then recovery does not crash on the second
    # copy: the placed message stays, the leftover goes
    store.recover()
    assert store.read_msg("que", placed.msg_id)["param1"] == "placed"
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_recovery_replaces_a_torn_target_with_the_whole_temp_copy(store):
    # Given a publish whose target in que/ reached the disk without its msg
    staged = store.stage({"dest": "q", "param1": "whole"})
    Path(staged.tmp, "msg").write_text(json.dumps(staged.msg))
    torn = store.state_dir("que") / staged.msg_id
    torn.mkdir()
    (torn / "job").mkdir()
    # When the daemon starts again
    store.recover()
    # Then the message is in que/ whole
    assert store.read_msg("que", staged.msg_id)["param1"] == "whole"
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_recovery_sets_aside_what_is_no_message_directory(store):
    # Given e2fsck's work after a power cut: a running and a queued message's
    # directories made files, the same in a done shard, and a good message
    bad_run, bad_que, bad_done, good = (store.create({"dest": "q"}) for _ in range(4))
    store.move(bad_run, "que", "run")
    store.move(bad_done, "que", "done")
    for msg_id, state in ((bad_run, "run"), (bad_que, "que"), (bad_done, "done")):
        path = next(p for p in store.state_dir(state).rglob(msg_id))
        shutil.rmtree(path)
        path.write_bytes(b"\x00" * 8)
    # When the store recovers
    assert store.recover() == []
    # Then those a start reads are set aside, bytes kept, the good message untouched
    assert sorted(store.found.set_aside) == sorted([f"run.{bad_run}", f"que.{bad_que}"])
    for name in store.found.set_aside:
        assert (store.qdir / ".set-aside" / name).read_bytes() == b"\x00" * 8
    assert [store.find(good)] == ["que"] and list(store.ids("run")) == []
    for gone in (bad_run, bad_que):
        with pytest.raises(NotFound):
            store.find(gone)
    # and the ended one, read by nobody at start, fails alone when read
    with pytest.raises(StoreError, match="unreadable message"):
        store.read_msg("done", bad_done)


def test_a_daemon_starts_past_a_run_entry_that_is_no_directory(layout, make_queue, daemon):
    # Given a queue whose run/ holds a file under a message's name (what an
    # e2fsck left of a half-written directory) beside a queued message
    make_queue("q", 'echo "done ok" >&3')
    store = QueueStore(layout.queue_dir("q"))
    queued = store.create({"dest": "q"})
    stray = store.create({"dest": "q"})
    shutil.rmtree(store.msg_dir("que", stray))
    store.msg_dir("run", stray).write_text("not a message\n")
    # When its daemon starts
    proc = daemon("q")
    # Then it says so, keeps the file aside, and runs the queued message
    wait_for(lambda: store.find(queued) == "done", what="the queued message done")
    assert (store.qdir / ".set-aside" / f"run.{stray}").read_text() == "not a message\n"
    proc.stop()
    assert f"run/{stray} was no message directory" in proc.stderr_text()
