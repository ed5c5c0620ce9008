"""Calendar and cron timers in embedded mode: slots, catch-up, jitter, bad files;
the table with an injected clock and the real parsers, then two real rq-scans."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import wait_for
from scan_util import DEADLINE, start_scan, started

from rqsys.errors import ConfigError, QueueDown
from rqsys.observe.events import EventLog
from rqsys.timers.calendar import Spec
from rqsys.timers.periodic import Timer, load_timer
from rqsys.timers.slots import UNIQUE_FOR, SlotTable, delay

T0 = 1_780_000_200.0  # 2026-05-28 20:30 UTC: a quarter hour
QUARTER = Timer("q15", 0, {"dest": "q"}, Spec("cron", "*/15 * * * *", "UTC"))


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sent() -> list[tuple[str, float, dict]]:
    return []


@pytest.fixture
def make_table(tmp_path, clock, sent):
    """make_table() -> a SlotTable on tmp_path/slots.json; a new one = a restart."""

    def make(fail: Exception | None = None) -> SlotTable:
        def send(timer: Timer, due: float, extra: dict) -> str:
            sent.append((timer.name, due, extra))
            if fail is not None:
                raise fail
            return f"id{len(sent)}"

        return SlotTable(tmp_path / "slots.json", send, EventLog("t", journal=False), clock)

    return make


def test_a_new_timer_waits_for_its_first_slot_then_fires_each_once(make_table, clock, sent):
    table = make_table()
    table.set(QUARTER)
    assert table.fire_due() == [] and table.next_wake() == T0 + 900
    clock.now = T0 + 900
    assert table.fire_due() == ["q15"] and table.fire_due() == []
    name, due, extra = sent[0]
    assert due == T0 + 900 and extra["slot"] == T0 + 900 and extra["timer"] == "q15"
    assert extra["unique_key"] == f"timer q15 {T0 + 900:.0f}"
    assert extra["unique_for"] == UNIQUE_FOR
    assert table.next_wake() == T0 + 1800


def test_three_missed_slots_fire_once_at_start_for_the_latest(make_table, clock, sent):
    # Given a timer that fired its slot, then rq-scan stopped
    table = make_table()
    table.set(QUARTER)
    clock.now = T0 + 900
    table.fire_due()
    # When it starts again three slots later (and a bit)
    clock.now = T0 + 900 + 3 * 900 + 100
    table = make_table()
    table.set(QUARTER)
    # Then it fires once, for the latest missed slot, and waits for the next one
    assert table.fire_due() == ["q15"] and table.fire_due() == []
    assert [s[1] for s in sent] == [T0 + 900, T0 + 900 + 3 * 900]
    assert table.next_wake() == T0 + 900 + 4 * 900


def test_a_timer_that_is_not_persistent_skips_missed_slots(make_table, clock, sent):
    timer = Timer("q15", 0, {"dest": "q"}, QUARTER.spec, persistent=False)
    table = make_table()
    table.set(timer)
    clock.now = T0 + 900
    table.fire_due()
    clock.now = T0 + 3 * 900 + 100
    table = make_table()
    table.set(timer)
    assert table.fire_due() == [] and table.next_wake() == T0 + 4 * 900


def test_jitter_delays_each_slot_alike_in_every_process(make_table, clock, sent):
    timer = Timer("j", 0, {"dest": "q"}, QUARTER.spec, jitter=600, unique=False)
    table = make_table()
    table.set(timer)
    wake = table.next_wake()
    assert wake == T0 + 900 + delay(timer, T0 + 900) and T0 + 900 <= wake < T0 + 1500
    assert make_table().next_wake() is None  # not set there
    clock.now = wake
    table.fire_due()
    assert sent[0][1] == T0 + 900 and "unique_key" not in sent[0][2]


def test_a_paused_destination_loses_that_slot_only(make_table, clock, sent):
    table = make_table(fail=QueueDown("destination queue q is PAUSE"))
    table.set(QUARTER)
    clock.now = T0 + 900
    assert table.fire_due() == ["q15"]
    assert table.next_wake() == T0 + 1800


def test_a_bad_expression_is_refused_and_other_timers_go_on(make_table, clock, sent, capsys):
    table = make_table()
    bad = Timer("bad", 0, {"dest": "q"}, Spec("calendar", "Mon..Fry 02:00"), source="/t/bad.json")
    table.set(bad)
    table.set(QUARTER)
    assert "bad" not in table.timers
    assert "timer file refused: /t/bad.json: calendar: 'Mon..Fry 02:00'" in capsys.readouterr().err
    clock.now = T0 + 900
    assert table.fire_due() == ["q15"]


@pytest.mark.parametrize(("content", "why"), [
    ({"period": 3600, "calendar": "hourly"}, "period/calendar/cron: give exactly one "
                                             "(given: period and calendar)"),
    ({"cron": "* * * * *", "calendar": "hourly"}, "given: calendar and cron"),
    ({}, "given: none"),
    ({"period": 3600, "jitter": 5}, "jitter: goes with calendar or cron"),
    ({"cron": "* * * * *", "jitter": -1}, "jitter"),
    ({"cron": "* * * * *", "persistent": "yes"}, "persistent"),
    ({"calendar": ""}, "calendar"),
])
def test_bad_timer_files_name_the_file_and_field(tmp_path, content, why):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"msg": {"dest": "q"}, **content}))
    with pytest.raises(ConfigError) as info:
        load_timer(path)
    assert why in str(info.value) and str(path) in str(info.value)


# ---------------------------------------------------------------- real rq-scans
@pytest.fixture
def scans(layout, tmp_path):
    scandir = tmp_path / "scandir"
    scandir.mkdir()
    count = iter(range(100))
    yield from started(lambda: start_scan(layout, scandir, tmp_path / f"scan{next(count)}.log"))


def _slots_of(proc) -> Counter:
    ids = proc.call("list", state="done", limit=1000)["ids"] + \
        proc.call("list", state="que", limit=1000)["ids"] + \
        proc.call("list", state="run", limit=1000)["ids"]
    return Counter(proc.call("get", msg_id=i)["msg"]["slot"] for i in ids)


def test_two_rq_scans_and_a_restart_make_one_message_per_slot(layout, make_queue, daemon,
                                                              scans, tmp_path):
    # Given a queue, and two rq-scans over the same root with a timer every 2 s
    make_queue("tq", 'echo "done $RQ_PARAM1" >&3\n')
    dest = daemon("tq")
    (layout.timers / "fast.json").write_text(json.dumps(
        {"calendar": "*:*:0/2", "timezone": "UTC", "msg": {"dest": "tq"}}))
    killed = start_scan(layout, tmp_path / "scandir", tmp_path / "killed.log")
    try:
        second = scans()
        # When both have fired two slots, and one is killed and started again
        killed.wait_log("timer fast: message", count=2)
        second.wait_log("timer fast: message", count=2)
    finally:
        killed.proc.kill()
        killed.proc.wait()
        killed._log.close()
    third = scans()
    third.wait_log("timer fast: message", count=2)
    second.wait_log("timer fast: message", count=5)
    # Then every slot has exactly one message
    slots = _slots_of(dest)
    assert len(slots) >= 5 and set(slots.values()) == {1}, slots
    fired = sum(p.log().count("timer fast: message") for p in (killed, second, third))
    assert fired > len(slots)  # both asked for most slots: the unique key kept one
    wait_for(lambda: dest.call("counts")["counts"]["que"] == 0, DEADLINE, "all run")


def test_bad_calendar_files_are_refused_in_the_log_and_others_fire(layout, make_queue, daemon,
                                                                   scans):
    # Given a good fast timer and three bad files under a running rq-scan
    make_queue("tq", 'echo "done" >&3\n')
    daemon("tq")
    files = {"badexpr": {"calendar": "Mon..Fry 02:00"}, "badzone": {"cron": "* * * * *",
                                                                     "timezone": "Mars/Olympus"},
             "both": {"period": 3600, "calendar": "hourly"},
             "good": {"calendar": "*:*:0/2", "timezone": "UTC"}}
    proc = scans()
    for name, content in files.items():
        (layout.timers / f"{name}.json").write_text(json.dumps({**content,
                                                                "msg": {"dest": "tq"}}))
    # Then each bad one is one log line naming its file and field; the good one fires
    log = proc.wait_log("timer file refused", count=3)
    assert f"{layout.timers}/badexpr.json: calendar: 'Mon..Fry 02:00': Failed to parse" in log
    assert f"{layout.timers}/badzone.json: timezone: unknown time zone 'Mars/Olympus'" in log
    assert f"{layout.timers}/both.json: period/calendar/cron: give exactly one" in log
    proc.wait_log("timer good: message", count=2)


def test_a_timer_systemd_cannot_take_is_fired_here(make_table, clock, sent):
    class NoUnits:
        def install(self, timer: Timer) -> bool:
            return timer.name != "local"

        def remove(self, name: str) -> None:
            pass

        def made(self) -> list[str]:
            return []

    table = make_table()
    table.units = NoUnits()
    table.set(QUARTER)  # systemd's
    table.set(Timer("local", 0, {"dest": "q"}, QUARTER.spec))
    clock.now = T0 + 900
    assert table.fire_due() == ["local"]
