"""A reconcile (rqsys.search.reconcile) makes the index agree with the store a
chunk at a time, and rests between its chunks while messages run
(SearchIndex._rest): a real store and a real index file."""

from __future__ import annotations

import time

from rqsys.search import index as searchindex
from rqsys.search import reconcile as agree
from rqsys.store import QueueStore


def _store(layout, n):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    store = QueueStore(layout.queue_dir("q"))
    ids = [store.create({"dest": "q", "param1": f"m{i}"}) for i in range(n)]
    return store, ids


def test_a_reconcile_pauses_after_its_lookup_and_every_pace_of_rows_it_reads(layout):
    # Given 250 queued messages the index file does not have
    store, _ids = _store(layout, 250)
    db = searchindex.connect(store.qdir / searchindex.FILE)
    # When it is reconciled
    took: list[float] = []
    got = agree.reconcile(db, store, (), took.append)
    # Then every message was read into it, with a pause after the chunk's lookup
    # and after each PACE_ROWS read
    assert got == {"dropped": 0, "added": 250, "moved": 0}
    assert db.execute("SELECT count(*) FROM msgs WHERE state='que'").fetchone() == (250,)
    assert len(took) == 1 + -(-250 // agree.PACE_ROWS) and all(t >= 0 for t in took)
    # and an index that agrees reads nothing: its lookup's pause only
    took.clear()
    assert agree.reconcile(db, store, (), took.append)["added"] == 0 and len(took) == 1


def test_a_reconcile_a_chunk_at_a_time_moves_drops_and_rereads(layout, monkeypatch):
    # Given an index of 7 messages, looked up 3 at a time, that then disagrees with
    # the store: one deleted, one moved to err, a row of a state no store has, one
    # whose events were lost (its status changed on disk)
    monkeypatch.setattr(agree, "LOOKUP", 3)
    store, ids = _store(layout, 7)
    db = searchindex.connect(store.qdir / searchindex.FILE)
    agree.reconcile(db, store)
    store.delete(ids[0], "que")
    store.move(ids[1], "que", "err")
    store.flush(force=True)
    db.execute("UPDATE msgs SET state='limbo' WHERE id=?", (ids[2],))
    store.write_status("que", ids[3], "changed while the events were lost")
    # When it is reconciled, ids[3] read again
    got = agree.reconcile(db, store, {ids[3]})
    # Then the index is the store's picture again
    rows = dict(db.execute("SELECT id, state FROM msgs").fetchall())
    assert rows == {**dict.fromkeys(ids[2:], "que"), ids[1]: "err"}
    assert got == {"added": 0, "moved": 3, "dropped": 1}
    assert db.execute("SELECT status FROM msgs WHERE id=?", (ids[3],)).fetchone() == (
        "changed while the events were lost",)


def test_the_thread_rests_only_while_messages_run(layout, monkeypatch):
    store, _ids = _store(layout, 1)
    slept: list[float] = []
    monkeypatch.setattr(searchindex.time, "sleep", slept.append)
    running: dict[str, object] = {}
    index = searchindex.SearchIndex(store, None, lambda: bool(running))
    index._rest(0.01)
    running["m"] = object()
    index._rest(0.01)
    assert slept == [0.01 * searchindex.RECONCILE_REST]


def test_far_behind_the_loop_keeps_only_ids_and_the_thread_reads_them_again(layout,
                                                                          monkeypatch):
    # Given an index thread that has made its index of 6 queued messages
    store, ids = _store(layout, 6)
    monkeypatch.setattr(searchindex, "HEAL_WAIT", 0.05)
    index = searchindex.SearchIndex(store)
    index.start()
    assert index.ready.wait(10)
    # When it is far behind (a bound of -1 events) while turns tell of 2 of them
    monkeypatch.setattr(searchindex, "BACKLOG_MAX", -1)
    handed = index._handed
    for msg_id in ids[4:]:
        store.write_status("que", msg_id, "told while the index was behind")
        index("retried", "", msg_id, {"RQ_STATE": "que"})
        index.flush()
    # Then their events were not handed over, only their ids kept
    assert index._handed == handed and index._passed == set(ids[4:])
    # And once it has caught up, it is handed the ids, and mends by reading
    # those messages again (a status changed in the same state: no reconcile sees it)
    monkeypatch.setattr(searchindex, "BACKLOG_MAX", 100)
    index.flush()
    assert not index._passed
    db = searchindex.open_reader(store.qdir / searchindex.FILE)
    want = {**dict.fromkeys(ids[:4], ""),
            **dict.fromkeys(ids[4:], "told while the index was behind")}
    deadline = time.monotonic() + 10
    while dict(db.execute("SELECT id, status FROM msgs").fetchall()) != want:
        assert time.monotonic() < deadline, "not mended"
        time.sleep(0.02)
    index.close()
