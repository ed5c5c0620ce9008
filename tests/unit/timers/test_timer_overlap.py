"""A timer's ``overlap`` in process: its record (rqsys.timers.history), the
period table with an injected clock and message directories made by hand,
the listing's skip field, and the schema's check of the field.  (The slot
table's case is in tests/integration/timers/test_overlap_slots.py: importing
croniter runs ``file``.)"""

from __future__ import annotations

import json
import re

import pytest
from overlap_util import ID1, ID2, T0, Clock, put

from rqsys.errors import ConfigError
from rqsys.observe.events import EventLog
from rqsys.timers import history
from rqsys.timers.listing import lines
from rqsys.timers.periodic import Timer, TimerTable, load_timer


# ---------------------------------------------------------------- the record
def test_the_record_keeps_the_skips_across_messages(tmp_path):
    history.record(tmp_path, "t", history.SKIP, T0, "ov", ID1)
    assert history.read(tmp_path, "t")["skipped"] == 0  # a skip timer's counter starts at 0
    put(tmp_path, "run", ID1)
    held = history.check(tmp_path, "t", T0 + 900)
    assert held == history.Held("ov", ID1, "run") and held.skipped
    history.record(tmp_path, "t", history.SKIP, T0 + 1800, "ov", ID2)
    got = history.read(tmp_path, "t")
    assert got["msg_id"] == ID2 and got["skipped"] == 1
    assert got["skips"] == [{"slot": T0 + 900, "at": got["skips"][0]["at"], "msg_id": ID1,
                             "state": "run"}]
    assert history.skip_counts(tmp_path) == [("t", "ov", 1)]


def test_a_queue_timer_counts_no_skips(tmp_path):
    assert history.skip_counts(tmp_path) == []  # no records yet
    history.record(tmp_path, "t", history.QUEUE, T0, "ov", ID1)
    assert "skipped" not in history.read(tmp_path, "t")
    assert history.skip_counts(tmp_path) == []


@pytest.mark.parametrize(("state", "live"), [("prep", True), ("que", True), ("run", True),
                                             ("err", False), (None, False)])
def test_only_a_message_that_has_not_ended_holds_the_slot(tmp_path, state, live):
    history.record(tmp_path, "t", history.SKIP, T0, "ov", ID1)
    if state:
        put(tmp_path, state, ID1)
    held = history.check(tmp_path, "t", T0 + 900)
    assert (held is not None) == live
    assert history.read(tmp_path, "t")["skipped"] == (1 if live else 0)


def test_the_slot_of_the_message_itself_is_not_a_skip(tmp_path):
    history.record(tmp_path, "t", history.SKIP, T0, "ov", ID1)
    put(tmp_path, "que", ID1)
    held = history.check(tmp_path, "t", T0)
    assert held is not None and not held.skipped and "already" in held.text("t", "slot 1")
    assert history.read(tmp_path, "t")["skipped"] == 0


@pytest.mark.parametrize("record", [{"queue": "../etc", "msg_id": ID1},
                                    {"queue": "ov", "msg_id": "../../x"},
                                    {"queue": 3, "msg_id": ID1}, {}])
def test_a_record_naming_no_message_holds_nothing(tmp_path, record):
    (tmp_path / history.LAST_DIR).mkdir()
    history.path_of(tmp_path, "t").write_text(json.dumps(record))
    assert history.check(tmp_path, "t", T0) is None


def test_the_record_keeps_the_latest_skips_and_counts_them_all(tmp_path):
    history.record(tmp_path, "t", history.SKIP, T0, "ov", ID1)
    put(tmp_path, "run", ID1)
    for n in range(history.KEPT + 5):
        assert history.check(tmp_path, "t", T0 + 60 * (n + 1)) is not None
    got = history.read(tmp_path, "t")
    assert got["skipped"] == history.KEPT + 5 and len(got["skips"]) == history.KEPT
    assert got["skips"][-1]["slot"] == T0 + 60 * (history.KEPT + 5)


# ---------------------------------------------------------------- the period table
@pytest.fixture
def sent():
    return []


def test_a_period_timer_skips_a_period_too(tmp_path, sent, capsys):
    clock = Clock()

    def send(timer, due):
        sent.append(due)
        history.record(tmp_path, timer.name, timer.overlap, due or clock(), "ov", ID1)
        return ID1

    table = TimerTable(tmp_path / "timer-state.json", send, EventLog("t", journal=False), clock)
    table.set(Timer("hourly", 3600, {"dest": "ov"}, overlap=history.SKIP))
    table.fire_due()
    put(tmp_path, "run", ID1)
    clock.now = T0 + 3600
    assert table.fire_due() == ["hourly"] and len(sent) == 1
    assert f"period skipped (overlap skip): message {ID1}" in capsys.readouterr().err
    assert table.next_wake() == T0 + 7200 - 60  # the next period comes as ever


# ---------------------------------------------------------------- file and listing
def test_the_file_gives_overlap_and_a_bad_value_names_the_field(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"cron": "* * * * *", "overlap": "skip", "msg": {"dest": "q"}}))
    assert load_timer(path).overlap == "skip"
    path.write_text(json.dumps({"period": 60, "msg": {"dest": "q"}}))
    assert load_timer(path).overlap == "queue"
    path.write_text(json.dumps({"period": 60, "overlap": "skip", "msg": {"dest": "q"}}))
    assert load_timer(path).overlap == "skip"  # a period timer may skip too
    path.write_text(json.dumps({"cron": "* * * * *", "overlap": "never", "msg": {"dest": "q"}}))
    with pytest.raises(ConfigError, match=re.escape(
            f"{path}: overlap: 'never' is not one of ['queue', 'skip']")):
        load_timer(path)


def test_rq_timers_adds_the_skips_field_only_where_there_are_skips():
    base = {"name": "t", "schedule": "cron * * * * *", "next": None, "last": None,
            "overlap": "queue", "skipped": 0, "skips": [], "last_skipped": None}
    assert lines([base]) == ["t\tcron * * * * *\t-\t-\t-\t-"]
    skip = dict(base, overlap="skip")
    assert lines([skip])[0].split("\t")[6] == "skipped 0"
    more = dict(skip, skipped=3, last_skipped=T0)
    assert re.fullmatch(r"skipped 3 \(last 2026-05-28 \d\d:30:00 \S+\)",
                        lines([more])[0].split("\t")[6])
