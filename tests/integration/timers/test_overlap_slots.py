"""A skip timer's slots in rq-scan's SlotTable, with an injected clock, real
cron elapses (croniter) and message directories made by hand: a persistent
slot missed while rq-scan was down is skipped as any other while the
timer's last message has not ended."""

from __future__ import annotations

import pytest
from overlap_util import ID1, ID2, T0, Clock, put

from rqsys.observe.events import EventLog
from rqsys.timers import history
from rqsys.timers.calendar import Spec
from rqsys.timers.periodic import Timer
from rqsys.timers.slots import SlotTable

QUARTER = Timer("q15", 0, {"dest": "ov"}, Spec("cron", "*/15 * * * *", "UTC"),
                overlap=history.SKIP)




@pytest.fixture
def sent():
    return []


def slot_table(root, clock, sent) -> SlotTable:
    """A SlotTable whose send records as rq-scan's does (rqsys.timers.listing.record)."""
    def send(timer, due, extra):
        msg_id = ID2 if sent else ID1
        sent.append((timer.name, extra["slot"]))
        history.record(root, timer.name, timer.overlap, extra["slot"], "ov", msg_id)
        return msg_id

    return SlotTable(root / "timer-slots.json", send, EventLog("t", journal=False), clock)


def test_a_persistent_missed_slot_at_start_is_skipped_while_the_last_message_runs(
        tmp_path, sent, capsys):
    # Given a skip timer whose slot's message is still running when rq-scan stops
    clock = Clock()
    table = slot_table(tmp_path, clock, sent)
    table.set(QUARTER)
    clock.now = T0 + 900
    assert table.fire_due() == ["q15"] and sent == [("q15", T0 + 900)]
    put(tmp_path, "run", ID1)
    # When it starts again two slots later, the message back in que (recovery)
    clock.now = T0 + 3 * 900 + 10
    put(tmp_path, "que", ID1)
    again = slot_table(tmp_path, clock, sent)
    again.set(QUARTER)
    # Then the missed slot fires, and makes no message: it is skipped, and counted
    assert again.fire_due() == ["q15"] and len(sent) == 1
    assert f"slot {T0 + 2700:.0f} skipped (overlap skip): message {ID1} in ov is still que" \
        in capsys.readouterr().err
    assert history.read(tmp_path, "q15")["skipped"] == 1
    assert again.next_wake() == T0 + 4 * 900
    # and once the message ended, the next slot makes its message
    put(tmp_path, "err", ID1)
    clock.now = T0 + 4 * 900
    assert again.fire_due() == ["q15"] and sent[-1] == ("q15", T0 + 3600)


def test_a_queue_timer_never_looks(tmp_path, sent):
    clock = Clock()
    table = slot_table(tmp_path, clock, sent)
    table.set(Timer("q15", 0, {"dest": "ov"}, QUARTER.spec))
    clock.now = T0 + 900
    table.fire_due()
    put(tmp_path, "run", ID1)
    clock.now = T0 + 1800
    table.fire_due()
    assert len(sent) == 2 and "skipped" not in history.read(tmp_path, "q15")


def test_under_systemd_rqsys_timer_skips_too(layout):
    # Given a skip timer (rq-timer@ fires it) whose last message is still queued
    from rqsys.timers.units import send_slot

    (layout.timers / "q15.json").write_text(
        '{"cron": "*/15 * * * *", "timezone": "UTC", "overlap": "skip", "msg": {"dest": "ov"}}')
    history.record(layout.root, "q15", history.SKIP, T0, "ov", ID1)
    put(layout.root, "que", ID1)
    # When its service runs for a later slot: no message (no daemon is even asked),
    # the skip is recorded and the last message's id is the answer
    assert send_slot(layout, "q15", now=T0 + 2 * 900 + 5) == ID1
    got = history.read(layout.root, "q15")
    assert got["msg_id"] == ID1 and got["skipped"] == 1
    assert got["skips"][0]["slot"] == T0 + 2 * 900
