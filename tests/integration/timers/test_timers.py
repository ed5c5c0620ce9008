"""Timers: the schedule (injectable clock), delivery to real daemons, bad files.

Period arithmetic is tested against a TimerTable with a clock the test moves
and a sender that records; delivery is tested against real queue daemons.
The inotify side (timer files created, changed, removed under a running
rq-scan) is in test_timers_scan.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from rqsys import config
from rqsys.errors import ConfigError, NotFound, QueueDown, Unavailable
from rqsys.observe.events import EventLog
from rqsys.timers import periodic
from rqsys.timers.periodic import RETRY, Timer, TimerTable, deliver, load_timer

T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sent() -> list[tuple[str, float, float]]:
    return []


@pytest.fixture
def make_table(tmp_path, clock, sent):
    """make_table(fail=None) -> a TimerTable on tmp_path/state.json; a new one = a restart."""

    def make(fail: Exception | None = None) -> TimerTable:
        def send(timer: Timer, due: float) -> str:
            sent.append((timer.name, due, clock()))
            if fail is not None:
                raise fail
            return f"id{len(sent)}"

        return TimerTable(tmp_path / "state.json", send, EventLog("t", journal=False), clock)

    return make


HOURLY = Timer("hourly", 3600, {"dest": "q"})


def test_a_new_timer_fires_at_once_then_every_period(make_table, clock, sent):
    table = make_table()
    table.set(HOURLY)
    assert table.fire_due() == ["hourly"] and sent == [("hourly", 0.0, T0)]
    clock.now = T0 + 3600 - 61  # more than a minute before the next period
    assert table.fire_due() == []
    clock.now = T0 + 3600 - 59  # within the minute: queued early, due at the period
    assert table.fire_due() == ["hourly"]
    assert sent[-1] == ("hourly", T0 + 3600, clock.now)
    assert table.next_wake() == T0 + 7200 - 60


def test_a_restart_between_two_firings_neither_skips_nor_doubles(make_table, clock, sent):
    # Given a timer that fired at T0
    first = make_table()
    first.set(HOURLY)
    first.fire_due()
    # When rq-scan restarts half-way through the period
    clock.now = T0 + 1800
    second = make_table()
    second.set(HOURLY)
    # Then nothing fires now, and the next firing is still due at T0 + 3600
    assert second.fire_due() == [] and len(sent) == 1
    assert second.next_wake() == T0 + 3600 - 60
    clock.now = T0 + 3600
    assert second.fire_due() == ["hourly"] and sent[-1][1] == 0.0  # on time: due now
    assert len(sent) == 2


def test_a_restart_a_little_late_keeps_the_phase(make_table, clock, sent):
    table = make_table()
    table.set(HOURLY)
    table.fire_due()
    clock.now = T0 + 3600 + 600  # restarted ten minutes after the period was due
    later = make_table()
    later.set(HOURLY)
    assert later.fire_due() == ["hourly"]
    assert later.next_wake() == T0 + 7200 - 60


def test_down_for_several_periods_fires_once_not_a_burst(make_table, clock, sent):
    table = make_table()
    table.set(HOURLY)
    table.fire_due()
    clock.now = T0 + 5 * 3600 + 10
    later = make_table()
    later.set(HOURLY)
    assert later.fire_due() == ["hourly"] and later.fire_due() == []
    assert len(sent) == 2
    assert later.next_wake() == clock.now + 3600 - 60


def test_a_modified_timer_overrides_and_keeps_its_last_firing(make_table, clock, sent):
    table = make_table()
    table.set(HOURLY)
    table.fire_due()
    table.set(Timer("hourly", 7200, {"dest": "other", "param1": "x"}))
    clock.now = T0 + 3600
    assert table.fire_due() == []
    assert table.next_wake() == T0 + 7200 - 60


def test_a_removed_timer_stops_and_fires_at_once_when_created_again(make_table, clock, sent):
    table = make_table()
    table.set(HOURLY)
    table.fire_due()
    table.remove("hourly")
    assert table.next_wake() is None
    clock.now = T0 + 10
    assert table.fire_due() == []
    restarted = make_table()  # the removal was saved too
    restarted.set(HOURLY)
    assert restarted.fire_due() == ["hourly"] and sent[-1] == ("hourly", 0.0, T0 + 10)


def test_a_short_period_is_never_queued_a_whole_period_early(make_table, clock, sent):
    table = make_table()
    table.set(Timer("minutely", 60, {"dest": "q"}))
    table.fire_due()
    clock.now = T0 + 29
    assert table.fire_due() == []
    clock.now = T0 + 30
    assert table.fire_due() == ["minutely"] and sent[-1][1] == T0 + 60


def test_a_paused_destination_skips_the_period_and_logs(make_table, clock, sent, capsys):
    table = make_table(fail=QueueDown("destination queue q is PAUSE"))
    table.set(HOURLY)
    assert table.fire_due() == ["hourly"]
    assert "timer hourly: no message this period: destination queue q is PAUSE" in \
        capsys.readouterr().err
    clock.now = T0 + 60
    assert table.fire_due() == [] and table.next_wake() == T0 + 3600 - 60


def test_an_unreachable_destination_is_tried_again(make_table, clock, sent, capsys):
    table = make_table(fail=Unavailable("queue q is not running"))
    table.set(HOURLY)
    table.fire_due()
    assert "trying again" in capsys.readouterr().err
    assert table.next_wake() == T0 + RETRY
    clock.now = T0 + RETRY
    assert table.fire_due() == ["hourly"] and len(sent) == 2


def test_an_unreadable_state_file_starts_afresh_and_says_so(tmp_path, make_table, capsys):
    (tmp_path / "state.json").write_text("{not json")
    table = make_table()
    table.set(HOURLY)
    assert table.fire_due() == ["hourly"]
    assert "unreadable" in capsys.readouterr().err
    assert json.loads((tmp_path / "state.json").read_text()) == {"hourly": T0}


@pytest.mark.parametrize("filename, content, why", [
    ("a.b.json", '{"period": 60, "msg": {"dest": "q"}}', "single '.'"),
    ("noext", '{"period": 60, "msg": {"dest": "q"}}', "single '.'"),
    ("t.json", '{"period": 59, "msg": {"dest": "q"}}', "period"),
    ("t.json", '{"period": "60", "msg": {"dest": "q"}}', "period"),
    ("t.json", '{"period": 60, "msg": {}}', "msg: 'dest' is a required property"),
    ("t.json", '{"period": 60}', "'msg' is a required property"),
    ("t.json", '{"period": 60, "msg": {"dest": "q", "param5": "x"}}', "msg"),
    ("t.json", '{"period": 60, "msg": {"dest": "q"}, "extra": 1}', "extra"),
    ("t.json", "{oops", "t.json"),
    ("t.json", "[]", "(top level)"),
])
def test_bad_timer_files_are_refused_with_the_reason(tmp_path, filename, content, why):
    path = tmp_path / filename
    path.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_timer(path)
    assert why in str(info.value) and str(path) in str(info.value)


def test_a_broken_timer_link_is_refused(tmp_path):
    (tmp_path / "t.json").symlink_to(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="broken link"):
        load_timer(tmp_path / "t.json")


# ------------------------------------------------------------ real daemons
def test_deliver_queues_the_message_with_its_due_time(layout, make_queue, daemon):
    make_queue("tq", 'echo "done" >&3\n')
    proc = daemon("tq")
    due = time.time() + 45  # queued early: it waits in que/ until then
    sysconfig = config.load_system_config(layout)
    msg_id = deliver(layout, sysconfig, Timer("t", 300, {"dest": "tq", "param1": "p"}), due)
    got = proc.call("get", msg_id=msg_id)
    assert got["state"] == "que" and got["msg"]["due"] == due and got["msg"]["param1"] == "p"


@pytest.mark.parametrize("oper, admin", [("pause", "PAUSE"), ("down", "DOWN")])
def test_deliver_sends_nothing_to_a_paused_or_down_queue(layout, make_queue, daemon, oper, admin):
    make_queue("tq", 'echo "done" >&3\n')
    proc = daemon("tq")
    proc.call("adminoper", oper=oper)
    with pytest.raises(QueueDown, match=f"is {admin}"):
        deliver(layout, config.load_system_config(layout), Timer("t", 300, {"dest": "tq"}), 0)
    assert sum(proc.call("counts")["counts"].values()) == 0


def test_deliver_to_a_missing_queue_says_so(layout):
    with pytest.raises(NotFound, match="no queue named nosuch"):
        deliver(layout, config.load_system_config(layout), Timer("t", 300, {"dest": "nosuch"}), 0)


def test_deliver_to_another_host_goes_through_the_relay(layout, make_queue, daemon):
    make_queue("relay", "sleep 30\n")
    proc = daemon("relay")
    url = "http://elsewhere.example:3333/q/far"
    msg_id = deliver(layout, config.load_system_config(layout),
                     Timer("t", 300, {"dest": url}), 0)
    assert proc.call("get", msg_id=msg_id)["msg"]["dest"] == url


class Deferred:
    """A runner that keeps each firing's send until the test lets it end."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, Any]] = []

    def __call__(self, work: Any, then: Any, lane: str) -> None:
        assert lane == "peer:q"  # one lane per destination: one hung queue holds only its own
        self.pending.append((work, then))

    def end(self) -> None:
        work, then = self.pending.pop(0)
        periodic.run_now(work, then)


def test_a_firing_in_flight_does_not_fire_again_until_its_outcome(tmp_path, clock, sent):
    # Given a timer whose send has started but not ended (its destination hangs)
    runner = Deferred()
    table = TimerTable(tmp_path / "state.json", lambda t, due: sent.append(t.name) or "id1",
                       EventLog("t", journal=False), clock, runner)
    table.set(HOURLY)
    assert table.fire_due() == ["hourly"] and len(runner.pending) == 1
    # Then it is not fired again, and the loop is not woken for it meanwhile
    clock.now = T0 + 30
    assert table.fire_due() == [] and table.next_wake() is None
    assert not (tmp_path / "state.json").exists()
    # When the send ends, its firing is recorded and the next one scheduled
    runner.end()
    assert sent == ["hourly"] and table.next_wake() == T0 + 3600 - 60
    assert json.loads((tmp_path / "state.json").read_text()) == {"hourly": T0}


def test_a_timer_removed_while_in_flight_records_nothing(tmp_path, clock, sent):
    runner = Deferred()
    table = TimerTable(tmp_path / "state.json", lambda t, due: "id1",
                       EventLog("t", journal=False), clock, runner)
    table.set(HOURLY)
    table.fire_due()
    table.remove("hourly")
    runner.end()
    assert table.last == {} and not (tmp_path / "state.json").exists()
