"""Unit tests of the store: ids, validators, durable creation, transitions,
message files and counts, on a real file system."""

from __future__ import annotations

import json

import pytest

from rqsys.errors import BadRequest, NotFound
from rqsys.store import (
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
    for msg_id, count in ((once, 0), (thrice, 3)):
        store.move(msg_id, "que", "run")
        store.write_count("run", msg_id, count)
        store.move(msg_id, "run", "done")
    assert not (store.msg_dir("done", once) / "count").exists()
    assert store.read_msg("done", once)["count"] == 0
    assert store.read_msg("done", thrice)["count"] == 3
    assert "count" not in store.read_msg("que", store.create({"dest": "q"}))


def test_a_status_that_cannot_be_written_fails_nothing(store):
    msg_id = store.create({"dest": "q"})
    store.move(msg_id, "que", "run")
    status = store.msg_dir("run", msg_id) / "status"
    status.unlink(missing_ok=True)
    status.mkdir()  # opening it to write fails (EISDIR), as out of fds or disk would
    store.write_status("run", msg_id, "half way")  # advisory: the run goes on
    store.move(msg_id, "run", "que")
    assert store.msg_dir("que", msg_id).is_dir()
