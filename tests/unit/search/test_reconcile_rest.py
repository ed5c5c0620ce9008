"""A reconcile that reads messages from disk rests between its reads while
messages run (rqsys.search.rows.reconcile, SearchIndex._rest): a real store
and a real index file; only the clock's sleeps are counted."""

from __future__ import annotations

from rqsys.search import index as searchindex
from rqsys.search import rows
from rqsys.store import QueueStore


def _store(layout, n):
    layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
    store = QueueStore(layout.queue_dir("q"))
    ids = [store.create({"dest": "q", "param1": f"m{i}"}) for i in range(n)]
    return store, ids


def test_a_reconcile_pauses_after_every_pace_of_rows_it_reads(layout):
    # Given 250 queued messages the index file does not have
    store, ids = _store(layout, 250)
    db = searchindex.connect(store.qdir / searchindex.FILE)
    # When it is reconciled
    took: list[float] = []
    got = rows.reconcile(db, store, (), took.append)
    # Then every message was read into it, with a pause after each PACE_ROWS
    assert got == {"dropped": 0, "added": 250, "moved": 0}
    assert db.execute("SELECT count(*) FROM msgs WHERE state='que'").fetchone() == (250,)
    assert len(took) == -(-250 // rows.PACE_ROWS) and all(t > 0 for t in took)
    # and an index that agrees reads nothing, so it does not pause
    took.clear()
    assert rows.reconcile(db, store, (), took.append)["added"] == 0 and took == []


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
