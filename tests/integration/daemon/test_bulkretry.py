"""Unit tests of a bulk retry's batches (rqsys.daemon.bulkretry,
rqsys.store.retrybatch) on a real store in a temp dir: the disk half runs on
a background lane, the loop's picture follows when it answers, and what is
no longer in err, running or busy is passed over."""

from __future__ import annotations

import time

import pytest
from daemon_util import drain

from rqsys.background import SYNC, Background
from rqsys.daemon import bulkdelete, bulkmove, bulkretry
from rqsys.daemon.bulkdelete import Deletion
from rqsys.daemon.bulkmove import Mover
from rqsys.daemon.bulkretry import BulkRetry
from rqsys.daemon.context import QueueContext
from rqsys.daemon.queload import QueLoad
from rqsys.daemon.scheduler import Schedule
from rqsys.daemon.transitions import Ledger, Transitions
from rqsys.errors import NotFound
from rqsys.life.moments import Moments
from rqsys.observe.events import EventLog
from rqsys.run.verdict import Outcome
from rqsys.store import QueueStore, pruning, retrybatch


@pytest.fixture
def t(layout):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    store = QueueStore(layout.queue_dir("q"))
    background = Background()
    t = Transitions(Ledger(store, Schedule([], []), EventLog("q", journal=False), Moments()),
                    lambda work, then: background.submit(work, then, SYNC))
    load = QueLoad(t)  # as a start: recovery, que/ listed, then read
    load.start()
    load.read()
    t.background = background  # type: ignore[attr-defined]
    return t


def failed(t: Transitions, n: int) -> list[str]:
    """``n`` messages that ran once and ended in err with a status line."""
    ids = []
    for i in range(n):
        staged = t.store.stage({"dest": "q", "count": 0, "due": 0, "param1": str(i)}, "que")
        t.store.publish([staged])
        t.placed([staged], "que")
        msg_id, _path, _msg = t.start_next(time.time())  # type: ignore[misc]
        t.store.write_status("run", msg_id, "database down")
        t.end(msg_id, Outcome("err", "database down"), written="database down")
        ids.append(msg_id)
    return ids


def run(t: Transitions, ids: list[str]) -> tuple[int, int, BaseException | None]:
    got: list[tuple[int, int, BaseException | None]] = []
    BulkRetry(t, t.background, ids, lambda *a: got.append(a)).start()  # type: ignore[attr-defined]
    drain(t.background)  # type: ignore[attr-defined]
    assert len(got) == 1
    return got[0]


def test_batches_move_on_the_lane_and_join_the_schedule(t, monkeypatch):
    monkeypatch.setattr(bulkretry, "BATCH", 3)  # several batches, two in flight
    ids = failed(t, 8)
    delete_waited: list[BaseException | None] = []
    chosen = t.retries.take_batch([ids[0]])  # a batch of its own, still on its way
    t.delete(ids[0], delete_waited.append)  # waits until that batch has landed
    assert delete_waited == [] and t.store.find(ids[0]) == "err"
    assert run(t, ids + ["20260101.0000.00.000.1"]) == (7, 2, None)
    t.retries.batch_landed(chosen, [])  # its lane never ran: it is free, still in err
    drain(t.background)
    assert delete_waited == [None]
    assert t.ledger.counts()["que"] == 7 and t.ledger.counts()["err"] == 0
    for msg_id in ids[1:]:
        assert t.store.find(msg_id) == "que"
        assert t.store.read_status("que", msg_id) == ""
        assert (t.store.msg_dir("que", msg_id) / "status.last").read_text() == (
            "database down")  # set aside, not lost
        assert t.ledger.schedule.msgs[msg_id]["param1"] == t.store.read_msg(
            "que", msg_id)["param1"]


def test_a_single_retry_sets_the_status_aside_as_a_bulk_one_does(t):
    one, many = failed(t, 2)
    answered: list[BaseException | None] = []
    assert t.retries.retry([one], answered.append) == 1
    assert run(t, [many]) == (1, 0, None)
    drain(t.background)
    assert answered == [None]
    for msg_id in (one, many):  # the same verb leaves the same files
        assert t.store.read_status("que", msg_id) == ""
        assert not (t.store.msg_dir("que", msg_id) / "status").exists()
        assert (t.store.msg_dir("que", msg_id) / "status.last").read_text() == (
            "database down")


def test_an_unreadable_message_stays_in_err(t):
    good, bad = failed(t, 2)
    (t.store.msg_dir("err", bad) / "msg").write_text("{not json")
    assert retrybatch.retry_batch(t.store, [bad, good])[0][0] == good
    assert t.store.find(bad) == "err" and t.store.find(good) == "que"


def test_an_error_of_the_lane_is_the_answer_and_frees_the_batch(t, monkeypatch):
    ids = failed(t, 2)

    def broken(_store, _ids):
        raise OSError("disk gone")
    monkeypatch.setattr(retrybatch, "retry_batch", broken)
    retried, passed, error = run(t, ids)
    assert (retried, passed, str(error)) == (0, 2, "disk gone")
    assert t.ledger.busy(ids[0]) == "" and t.ledger.counts()["err"] == 2


def test_a_batch_the_disk_stops_after_its_renames_leaves_them_queued(t, monkeypatch):
    ids = failed(t, 3)

    def sync_fails(paths):
        raise OSError("EIO")
    monkeypatch.setattr(retrybatch.durable, "fsync_dirs", sync_fails)
    retried, passed, error = run(t, ids)
    # the answer is the error, and the daemon's state follows the directories:
    # what is in que/ is queued (not stranded as err until a restart)
    assert "EIO" in str(error) and (retried, passed) == (3, 0)
    assert [t.store.find(i) for i in ids] == ["que"] * 3
    assert t.ledger.counts()["err"] == 0 and t.ledger.counts()["que"] == 3
    assert all(t.ledger.busy(i) == "" for i in ids)

# ------------------------------------------------- other bulk actions wait for a batch
def land(t: Transitions, chosen: list[str], moved: bool = True) -> None:
    """A retry batch's lane job and its callback, run by the test when it likes
    (``moved=False``: the lane failed, they stay in err)."""
    t.retries.batch_landed(chosen, retrybatch.retry_batch(t.store, chosen) if moved else [])


@pytest.mark.parametrize("moved", [True, False])
def test_a_prune_deletes_an_acknowledged_err_message_after_its_batch(t, moved):
    ids = failed(t, 3)
    for msg_id in ids:
        (t.store.msg_dir("err", msg_id) / "ack").write_text("")
    chosen = t.retries.take_batch([ids[0]])  # a retry batch has it, not landed yet
    done: list[BaseException | None] = []
    removed = t.prune(time.time(), 3, None, done.append)
    assert removed["err"] == 2 and t.store.find(ids[0]) == "err"  # not taken under the lane
    drain(t.background)
    assert done == []  # the answer waits for the busy one
    land(t, chosen, moved)
    drain(t.background)
    assert done == [None]
    assert removed["err"] == (2 if moved else 3)
    assert t.ledger.counts()["err"] == 0 and t.ledger.counts()["que"] == (1 if moved else 0)
    for msg_id in ids[1:]:
        with pytest.raises(NotFound):
            t.store.find(msg_id)


def test_a_prune_checks_no_ack_per_busy_id(t, monkeypatch):
    ids = failed(t, 3)
    for msg_id in ids:
        (t.store.msg_dir("err", msg_id) / "ack").write_text("")
    chosen = t.retries.take_batch([ids[0]])
    t.retries.take_batch([f"20260101.0000.00.{n:03}.1" for n in range(200)])  # busy elsewhere
    checked: list[str] = []
    real = pruning.is_acked
    monkeypatch.setattr(pruning, "is_acked", lambda s, st, i: checked.append(i) or real(s, st, i))
    done: list[BaseException | None] = []
    removed = t.prune(time.time(), 3, None, done.append)
    # one walk of err/ decides all three, the busy one left for its batch
    assert sorted(checked) == sorted(ids) and removed["err"] == 2
    land(t, chosen, moved=False)
    drain(t.background)
    assert done == [None] and removed["err"] == 3 and t.ledger.counts()["err"] == 0
    assert checked.count(ids[0]) == 2  # and once more when its batch has landed


def test_a_bulk_move_waits_for_a_retry_batch(t, layout, make_queue, daemon):
    make_queue("dest", "echo done >&3")
    dest = daemon("dest")
    ids = failed(t, 3)
    chosen = t.retries.take_batch([ids[0]])
    ctx = QueueContext(layout, "q")
    got: list[tuple[int, int, BaseException | None]] = []
    Mover(ctx, t.store, t, t.background).run(ids, "dest", "err",
                                                            lambda *a: got.append(a))
    assert not t.background.busy() and got == []  # nothing chosen while it is busy
    land(t, chosen)  # the batch moved it back to que: no longer an err message
    drain(t.background)
    assert got == [(2, 1, None)]
    there = dest.call("counts")["counts"]
    assert t.store.find(ids[0]) == "que" and there["que"] + there["run"] + there["done"] == 2
    assert t.ledger.counts()["err"] == 0


def test_a_bulk_move_passing_over_thousands_of_steps_does_not_recurse(t, layout,
                                                                     monkeypatch):
    monkeypatch.setattr(bulkmove, "STEP", 1)  # 1,500 steps (as 75,000 messages make)
    many = [f"20260101.0000.00.{i % 1000:03d}.{i}" for i in range(1500)]  # none here
    got: list[tuple[int, int, BaseException | None]] = []
    Mover(QueueContext(layout, "q"), t.store, t, t.background).run(
        many, "dest", "err", lambda *a: got.append(a))
    assert got == [(0, 1500, None)]


def test_a_bulk_delete_of_err_messages_waits_for_a_retry_batch(t):
    ids = failed(t, 3)
    chosen = t.retries.take_batch([ids[0]])
    got: list[tuple[int, int, BaseException | None]] = []
    Deletion(t, ids, "err", lambda *a: got.append(a)).step()
    assert got == [] and t.store.find(ids[1]) == "err"  # the step waits for the batch
    land(t, chosen)  # back in que: no longer what the delete was asked for
    drain(t.background)
    assert got == [(2, 1, None)]
    assert t.store.find(ids[0]) == "que" and t.ledger.counts()["err"] == 0


def test_a_bulk_delete_passing_over_thousands_of_steps_does_not_recurse(t, monkeypatch):
    monkeypatch.setattr(bulkdelete, "STEP", 1)
    many = [f"20260101.0000.00.{i % 1000:03d}.{i}" for i in range(1500)]  # none here
    got: list[tuple[int, int, BaseException | None]] = []
    Deletion(t, many, "err", lambda *a: got.append(a)).step()
    assert got == [(0, 1500, None)]


def test_ordered_ext4_fsyncs_que_at_once_when_a_rename_grows_it(t, monkeypatch):
    """Without a journal (``ordered``) the err entry is gone from the disk
    inside the rename: que/ must have its new block mapped on disk before
    the next rename, as a single move does, not only at the batch's end."""
    ids = failed(t, 150)  # ~36 bytes an entry: que/'s first 4 KiB block overflows
    que = str(t.store.state_dir("que"))
    renamed, synced = [], []
    real_rename = retrybatch.durable.rename
    monkeypatch.setattr(retrybatch.durable, "rename",
                        lambda old, new: (real_rename(old, new), renamed.append(new))[0])
    monkeypatch.setattr(retrybatch.durable, "fsync_path",
                        lambda path: synced.append((path, len(renamed))))
    monkeypatch.setattr(retrybatch.durable, "fsync_dirs", lambda paths: None)
    t.store.ordered = True
    assert len(retrybatch.retry_batch(t.store, ids)) == 150
    # the fsync followed the rename that grew que/, within the batch
    assert [path for path, _ in synced] == [que]
    assert 0 < synced[0][1] < len(renamed)
