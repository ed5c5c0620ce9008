"""Folding a batch's index events per message (rqsys.search.fold) leaves the
same rows, tags and full-text matches as applying them one by one, with
fewer row writes."""

from __future__ import annotations

import pytest

from rqsys.search import fold as searchfold
from rqsys.search.index import connect
from rqsys.search.rows import apply
from rqsys.store import QueueView

A, B, C, D = (f"20261124.0200.00.00{i}.0" for i in range(4))
MSG = {"param1": "alpha", "tags": ["night"], "dest": "q"}


def _batch(made):
    """A drain's events: C was indexed before; A runs, fails, is retried and
    runs again; B is created and deleted; D ends without a start."""
    return [
        ("created", "", A, "que", None, 1.0, made),
        ("created", "", B, "que", None, 1.1, made),
        ("started", "", A, "run", None, 2.0, None),
        ("started", "", C, "run", None, 2.1, None),
        ("status", "half way", A, "run", None, 2.2, None),
        ("exit", "", A, "run", 0.5, 2.5, None),
        ("err", "database down", A, "err", None, 2.6, None),
        ("deleted", "", B, "", None, 2.7, None),
        ("retried", "", A, "que", None, 3.0, None),
        ("started", "", A, "run", None, 3.1, None),
        ("exit", "", A, "run", None, 3.2, None),
        ("done", "fine now", A, "done", None, 3.3, None),
        ("exit", "", C, "run", 1.25, 3.4, None),
        ("done", "", C, "done", None, 3.5, None),
        ("done", "late", D, "done", None, 3.6, None),
    ]


def _state(db):
    rows = db.execute("SELECT id, state, created, started, ended, run_s, status, params,"
                      " tags, text FROM msgs ORDER BY id").fetchall()
    words = {w: db.execute("SELECT count(*) FROM fts WHERE fts MATCH ?", (w,)).fetchone()[0]
             for w in ("alpha", "night", "database", "fine", "now", "half")}
    tags = db.execute("SELECT tag, m.id FROM msg_tags JOIN msgs m ON m.rowid = rid"
                      " ORDER BY 2").fetchall()
    return rows, words, tags


def _run(tmp_path, name, fold, monkeypatch):
    view = QueueView(tmp_path / "q")
    db = connect(tmp_path / f"{name}.sqlite")
    apply(db, view, ("created", "", C, "que", None, 0.5, MSG))
    monkeypatch.setattr(searchfold, "ENABLED", fold)
    writes: list[str] = []
    db.set_trace_callback(lambda sql: writes.append(sql) if "UPDATE msgs" in sql
                          or "INSERT INTO msgs" in sql else None)
    db.execute("BEGIN")
    assert searchfold.apply_batch(db, view, _batch(MSG)) is False
    db.execute("COMMIT")
    db.set_trace_callback(None)
    return _state(db), len(writes)


def test_a_folded_batch_leaves_what_event_by_event_leaves(tmp_path, monkeypatch):
    # Given the same index and the same batch of a drain's events
    # When one copy applies them one by one and the other folds them
    plain, plain_writes = _run(tmp_path, "plain", False, monkeypatch)
    folded, folded_writes = _run(tmp_path, "folded", True, monkeypatch)
    # Then rows, full-text matches and tags agree, from fewer row writes
    assert folded == plain
    rows = {r[0]: r for r in folded[0]}
    assert rows[A][1:7] == ("done", 1.0, 2.0, 3.3, 0.5, "fine now")
    assert rows[C][1] == "done" and rows[C][3:6] == (2.1, 3.5, 1.25)
    assert B not in rows and D not in rows  # D was never indexed and is not on disk
    assert folded[1] == {"alpha": 2, "night": 2, "database": 0, "fine": 1, "now": 1,
                         "half": 0}
    assert folded_writes < plain_writes


def test_a_prune_still_asks_for_a_walk(tmp_path, monkeypatch):
    view = QueueView(tmp_path / "q")
    db = connect(tmp_path / "p.sqlite")
    monkeypatch.setattr(searchfold, "ENABLED", True)
    db.execute("BEGIN")
    assert searchfold.apply_batch(db, view, [("deleted", "", "", "", None, 1.0, None)])
    db.execute("COMMIT")


@pytest.mark.parametrize("fold", [True, False])
def test_an_exit_alone_keeps_the_state(tmp_path, monkeypatch, fold):
    # An exit whose end comes in the next batch writes only run_s
    view = QueueView(tmp_path / "q")
    db = connect(tmp_path / "e.sqlite")
    apply(db, view, ("created", "", C, "que", None, 0.5, MSG))
    monkeypatch.setattr(searchfold, "ENABLED", fold)
    searchfold.apply_batch(db, view, [("started", "", C, "run", None, 1.0, None)])
    searchfold.apply_batch(db, view, [("exit", "", C, "run", 0.25, 1.5, None)])
    assert db.execute("SELECT state, started, run_s FROM msgs").fetchone() == ("run", 1.0, 0.25)


def _batches(tmp_path, name, fold, monkeypatch, batches):
    """The index after ``batches`` (C indexed first) and the rows it read."""
    view = QueueView(tmp_path / "q")
    db = connect(tmp_path / f"{name}.sqlite")
    apply(db, view, ("created", "", C, "que", None, 0.5, MSG))
    monkeypatch.setattr(searchfold, "ENABLED", fold)
    reads: list[str] = []
    db.set_trace_callback(lambda sql: reads.append(sql) if sql.startswith("SELECT") else None)
    for batch in batches:
        searchfold.apply_batch(db, view, batch)
    db.set_trace_callback(None)
    return _state(db), len(reads)


@pytest.mark.parametrize("status", ["", "fine now"])
def test_an_end_after_a_retry_drops_the_failure_words(tmp_path, monkeypatch, status):
    # Given C failed ("database down") and was retried (blank status; its
    # text keeps the failure's words until it ends again), in earlier batches
    batches = [[("started", "", C, "run", None, 1.0, None),
                ("err", "database down", C, "err", None, 1.1, None)],
               [("retried", "", C, "que", None, 2.0, None)],
               [("started", "", C, "run", None, 3.0, None),
                ("exit", "", C, "run", 0.5, 3.5, None),
                ("done", status, C, "done", None, 3.6, None)]]
    # When its next run ends, folded and one by one
    plain, _ = _batches(tmp_path, "plain", False, monkeypatch, batches)
    folded, _ = _batches(tmp_path, "folded", True, monkeypatch, batches)
    # Then both leave the same row and words: the failure's are gone
    assert folded == plain
    assert folded[1]["database"] == 0 and folded[0][0][6] == status


def test_an_end_that_keeps_the_text_reads_nothing(tmp_path, monkeypatch):
    # A drained run that says a bare done: one UPDATE, no SELECT of its row
    batch = [("started", "", C, "run", None, 1.0, None), ("exit", "", C, "run", 0.5, 1.5, None),
             ("done", "", C, "done", None, 1.6, None)]
    (rows, words, _tags), reads = _batches(tmp_path, "f", True, monkeypatch, [batch])
    assert reads == 0
    assert rows[0][1:7] == ("done", 0.5, 1.0, 1.6, 0.5, "")
    assert words["alpha"] == 1 and words["night"] == 1
