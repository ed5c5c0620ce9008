"""Unit tests of the store: ids, durable creation, transitions, recovery,
attachments, counts and listings, on a real file system."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from conftest import wait_for

from rqsys.errors import BadRequest, NotFound
from rqsys.store import (
    SPARE_BATCH,
    SPARE_DIRS,
    STATES,
    IdMaker,
    QueueStore,
    check_attach_name,
    check_msg_id,
    check_queue_name,
)


@pytest.fixture
def store(layout):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    return QueueStore(layout.queue_dir("q"))


def test_ids_strictly_increase_even_when_the_clock_stalls_or_goes_back():
    times = iter([1700000000.0011, 1700000000.0011, 1700000000.0011, 1699999999.0, 1700000001.5])
    maker = IdMaker(clock=lambda: next(times))
    ids = [maker.next_id() for _ in range(5)]
    assert ids[:3] == ["20231114.2213.20.001.0", "20231114.2213.20.001.1",
                       "20231114.2213.20.001.2"]
    assert ids[3] == "20231114.2213.20.001.3"
    assert ids[4] == "20231114.2213.21.500.0"
    assert all(check_msg_id(i) for i in ids)


def test_many_ids_unique():
    maker = IdMaker()
    ids = [maker.next_id() for _ in range(20000)]
    def order(msg_id):
        stamp, n = msg_id.rsplit(".", 1)
        return stamp, int(n)

    assert len(set(ids)) == len(ids) and ids == sorted(ids, key=order)


def test_create_is_in_place_and_complete(store):
    msg_id = store.create({"dest": "q", "param1": "p"})
    assert store.find(msg_id) == "que"
    assert store.read_msg("que", msg_id) == {"dest": "q", "param1": "p", "msg_id": msg_id}
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_group_publish(store):
    staged = [store.stage({"dest": "q", "param1": str(n)}) for n in range(20)]
    store.publish(staged)
    store.place(staged, "que")
    assert sorted(store.ids("que")) == sorted(s.msg_id for s in staged)


def test_transitions_shard_done_and_count_without_walking(store):
    ids = [store.create({"dest": "q"}) for _ in range(3)]
    for msg_id in ids:
        store.move(msg_id, "que", "run")
        store.move(msg_id, "run", "done")
    store.flush()
    assert store.msg_dir("done", ids[0]).parent.name == ids[0][:11]
    assert store.count("done") == 3 and store.count("que") == 0
    assert store.newest("done", 0, 2) == [ids[2], ids[1]]
    assert store.newest("done", 2, 5) == [ids[0]]
    with pytest.raises(NotFound):
        store.move(ids[0], "que", "run")


def test_recover_moves_run_back_keeps_prep_cleans_tmp(store):
    running = store.create({"dest": "q"})
    store.move(running, "que", "run")
    prep = store.create({"dest": "q"}, state="prep")
    store.stage({"dest": "q"})  # a create that never finished
    assert store.recover() == [running]
    assert store.find(running) == "que" and store.find(prep) == "prep"
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_delete_and_find(store):
    msg_id = store.create({"dest": "q"})
    store.delete(msg_id, "que")
    with pytest.raises(NotFound):
        store.find(msg_id)
    with pytest.raises(NotFound):
        store.delete(msg_id, "que")


def test_unreadable_message(store):
    msg_id = store.create({"dest": "q"})
    (store.msg_dir("que", msg_id) / "msg").write_text("{broken")
    with pytest.raises(Exception, match="unreadable message"):
        store.read_msg("que", msg_id)


def _attach(store, msg_id, name, fd, md5):
    """What the daemon does, minus the thread: take in, fill, place."""
    upload = store.new_upload(fd)
    actual = store.fill_upload(upload, fd)
    try:
        return store.place_upload(upload, store.prep_attach_dir(msg_id), name, md5, actual,
                                  sync=True)
    except BadRequest:
        store.drop_upload(upload)
        raise


def test_attach_links_a_file_and_copies_a_memfd(store, tmp_path):
    msg_id = store.create({"dest": "q"}, state="prep")
    src = tmp_path / "big"
    src.write_bytes(b"a" * 1000)
    with open(src, "rb") as f:
        path = _attach(store, msg_id, "big", f.fileno(), hashlib.md5(b"a" * 1000).hexdigest())
    assert os.stat(path).st_ino == os.stat(src).st_ino  # hard-linked, not copied
    mem = os.memfd_create("x")
    os.write(mem, b"from memory")
    try:
        path = _attach(store, msg_id, "mem", mem, hashlib.md5(b"from memory").hexdigest())
    finally:
        os.close(mem)
    assert path.read_bytes() == b"from memory"
    assert [p.name for p in store.attachments("prep", msg_id)] == ["big", "mem"]
    assert store.attachment_md5(path) == hashlib.md5(b"from memory").hexdigest()
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_attach_md5_mismatch_leaves_nothing(store, tmp_path):
    msg_id = store.create({"dest": "q"}, state="prep")
    src = tmp_path / "f"
    src.write_bytes(b"data")
    with open(src, "rb") as f, pytest.raises(BadRequest, match="md5 mismatch"):
        _attach(store, msg_id, "f", f.fileno(), "0" * 32)
    assert list(store.attach_dir("prep", msg_id).iterdir()) == []
    assert list((store.qdir / ".tmp").iterdir()) == []


def test_admin_state_persisted(store):
    assert store.admin_state() == "UP"
    store.set_admin_state("PAUSE")
    assert QueueStore(store.qdir).admin_state() == "PAUSE"
    with pytest.raises(BadRequest):
        store.set_admin_state("SIDEWAYS")


def test_write_msg_replaces_atomically(store):
    msg_id = store.create({"dest": "q"})
    store.write_msg("que", msg_id, {"dest": "q", "count": 2})
    assert json.loads((store.msg_dir("que", msg_id) / "msg").read_text())["count"] == 2
    assert [p.name for p in store.msg_dir("que", msg_id).iterdir()] == ["msg"]


@pytest.mark.parametrize("check", [check_queue_name, check_msg_id, check_attach_name])
@pytest.mark.parametrize("bad", ["..", "../x", "a/b", "", ".x", None, 5])
def test_validators_refuse_paths(check, bad):
    with pytest.raises(BadRequest):
        check(bad)


def test_every_state_has_a_directory(store):
    assert all((store.qdir / s).is_dir() for s in STATES)


def test_run_count_of_an_ended_message(store):
    once, thrice = store.create({"dest": "q", "count": 0}), store.create({"dest": "q"})
    for msg_id, count in ((once, 1), (thrice, 3)):
        store.move(msg_id, "que", "run")
        store.write_count("run", msg_id, count)
        store.move(msg_id, "run", "done")
    assert not (store.msg_dir("done", once) / "count").exists()
    assert store.read_msg("done", once)["count"] == 1
    assert store.read_msg("done", thrice)["count"] == 3
    assert "count" not in store.read_msg("que", store.create({"dest": "q"}))


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
    # Given the thread that keeps 16 spare directories ready, each with the
    # files a message needs, its msg blank
    tmp = store.qdir / ".tmp"
    store.spares.start()
    wait_for(lambda: len(store.spares) == SPARE_DIRS)
    spare = next(tmp.iterdir())
    assert spare.name.startswith("spare.")
    assert {p.relative_to(spare).as_posix() for p in spare.rglob("*")} == {
        "msg", "status", "job", "job/stdio.log"}
    assert (spare / "msg").read_bytes().strip() == b""
    # When a message is created, it takes one of them (renamed, not made),
    # its msg written over the blank one
    msg_id = store.create({"dest": store.name, "param1": "x" * 2000})
    assert store.read_msg("que", msg_id)["param1"] == "x" * 2000
    assert (store.msg_dir("que", msg_id) / "job" / "stdio.log").exists()
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
