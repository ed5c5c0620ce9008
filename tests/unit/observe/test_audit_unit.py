"""The audit trail's pieces on their own: records, journal fields (a fake
sender: journald is not running here), describing an op's target, the
file's rotation, and reading with filters and bad times."""

from __future__ import annotations

import pytest

from rqsys.daemon.audit import describe, outcome
from rqsys.errors import BadRequest
from rqsys.observe import audit, auditread


def _rec(at: float, **kw) -> dict:
    return audit.record(kw.pop("actor", "ann"), "127.0.0.1", kw.pop("action", "delete"),
                        kw.pop("queue", "q"), kw.pop("result", "ok"), at, **kw)


def test_journal_fields_name_the_actor_action_and_messages():
    sent = []
    rec = _rec(5.0, msg_ids=["20240101.0000.00.001", "20240101.0000.00.002"], count=2)
    sent.append((audit.text(rec), audit.journal_fields(rec)))
    text, fields = sent[0]
    assert fields["MESSAGE_ID"] == audit.MESSAGE_ID and len(audit.MESSAGE_ID) == 32
    assert fields["RQ_AUDIT_ACTOR"] == "ann" and fields["RQ_AUDIT_ACTION"] == "delete"
    assert fields["RQ_QUEUE"] == "q" and fields["RQ_MSG_ID"] == "20240101.0000.00.001"
    assert fields["RQ_AUDIT_MSG_IDS"].split() == rec["msg_ids"]
    assert fields["RQ_AUDIT_COUNT"] == "2"
    assert text.startswith("audit: ann (127.0.0.1) delete q 20240101.0000.00.001")


def test_describe_names_each_kind_of_target():
    ok = {"ok": True}
    assert describe("adminoper", {"oper": "pause"}, ok) == ("pause", {"msg_ids": []})
    action, target = describe("bulk", {"op": "bulk", "action": "delete", "state": "err",
                                       "actor": {"user": "ann"}},
                              {"ok": True, "count": 3, "matched": 3})
    assert action == "bulk_delete" and target["filter"] == {"state": "err"}
    assert target["count"] == 3
    _, target = describe("create_many", {}, {"ok": True, "results": [
        {"msg_id": "a"}, {"index": 1, "error": "bad"}, {"msg_id": "b"}]})
    assert target == {"msg_ids": ["a", "b"], "count": 2}
    failed = {"ok": False, "kind": "NotFound", "error": "no message x"}
    _, target = describe("delete", {"msg_id": "x"}, failed)
    assert target == {"msg_ids": ["x"], "error": "NotFound: no message x"}
    assert outcome(failed) == "failed" and outcome({"ok": False, "kind": "Forbidden"}) == \
        "refused" and outcome(ok) == "ok"


def test_a_file_past_its_size_is_rotated_keeping_n(tmp_path):
    f = audit.AuditFile(tmp_path / "q.jsonl", max_size=100, keep=2)
    for n in range(12):
        f.write(audit.line(_rec(float(n))))
        f.sync_now()
    f.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["q.jsonl", "q.jsonl.1", "q.jsonl.2"]
    times = [r["time"] for r in auditread.records(tmp_path, auditread.Filter())]
    assert times[0] == 11.0 and times == sorted(times, reverse=True)


def test_reading_filters_by_actor_action_queue_and_time(tmp_path):
    f = audit.AuditFile(tmp_path / "q.jsonl")
    for rec in (_rec(10.0), _rec(20.0, actor="bob"), _rec(30.0, action="retry")):
        f.write(audit.line(rec))
    f.sync_now()
    f.close()
    (tmp_path / "other.jsonl").write_text(audit.line(_rec(40.0, queue="other")).decode()
                                          + "{cut short\n")
    read = auditread.records
    assert [r["time"] for r in read(tmp_path, auditread.Filter())] == [40.0, 30.0, 20.0, 10.0]
    assert [r["time"] for r in read(tmp_path, auditread.Filter(actor="bob"))] == [20.0]
    assert [r["time"] for r in read(tmp_path, auditread.Filter(action="retry"))] == [30.0]
    assert [r["time"] for r in read(tmp_path, auditread.Filter(queue="q", since=20,
                                                               until=30))] == [20.0]


@pytest.mark.parametrize("text", ["yesterday", "2024-13-01", "-5", ""])
def test_a_bad_time_names_its_field(text):
    with pytest.raises(BadRequest, match="^since: "):
        auditread.parse_time(text, "since")


def test_times_and_counts_parse():
    assert auditread.parse_time("1700000000.5", "since") == 1700000000.5
    assert auditread.parse_time("1970-01-01T00:01:00", "since") == 60.0
    assert auditread.parse_time("1970-01-01T01:00:00+01:00", "until") == 0.0
    with pytest.raises(BadRequest, match="^limit: "):
        auditread.parse_count("-1", "limit", 100)
    with pytest.raises(BadRequest, match="^limit: at most"):
        auditread.parse_count("5000", "limit", 100, 1000)


def test_a_rotation_between_listing_and_reading_shows_each_record_once(tmp_path, monkeypatch):
    # Given a queue's trail of a current file and one rotated before
    (tmp_path / "q.jsonl").write_text('{"time": 2, "queue": "q", "action": "b"}\n')
    (tmp_path / "q.jsonl.1").write_text('{"time": 1, "queue": "q", "action": "a"}\n')
    real_read, rotated = auditread._read, []

    def read(path):  # the writer rotates right after the first file is read
        got = real_read(path)
        if not rotated:
            rotated.append(path)
            (tmp_path / "q.jsonl.1").rename(tmp_path / "q.jsonl.2")
            (tmp_path / "q.jsonl").rename(tmp_path / "q.jsonl.1")
            (tmp_path / "q.jsonl").write_text('{"time": 3, "queue": "q", "action": "c"}\n')
        return got

    monkeypatch.setattr(auditread, "_read", read)
    # When the trail is read meanwhile
    got = auditread.records(tmp_path, auditread.Filter(queue="q"))
    # Then every record once, newest first
    assert [rec["action"] for rec in got] == ["c", "b", "a"]
