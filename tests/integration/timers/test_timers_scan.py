"""Timer files under a running rq-scan: real files, real inotify, a real daemon.

rq-scan runs alone (no supervisor); the destination is a real queue daemon.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
from conftest import wait_for
from scan_util import DEADLINE, start_scan, started


@pytest.fixture
def scan(layout, tmp_path):
    scandir = tmp_path / "scandir"
    scandir.mkdir()
    yield from started(lambda: start_scan(layout, scandir, tmp_path / "scan.log"))


@pytest.fixture
def dest(make_queue, daemon):
    make_queue("tq", 'echo "done $RQ_PARAM1" >&3\n')
    return daemon("tq")


def messages(proc) -> int:
    return sum(proc.call("counts")["counts"].values())


def write_timer(path, period=3600, **msg):
    path.write_text(json.dumps({"period": period, "msg": {"dest": "tq", **msg}}))


def test_timer_create_modify_remove(layout, scan, dest):
    # Given rq-scan and a queue
    proc = scan()
    # When a timer file appears, it fires at once
    write_timer(layout.timers / "hourly.json", param1="first")
    proc.wait_log("timer hourly: message")
    wait_for(lambda: messages(dest) == 1, DEADLINE, "one message")
    # When it is modified, the new content replaces it (and it does not fire again now)
    write_timer(layout.timers / "hourly.json", period=7200, param1="second")
    proc.wait_log("timer hourly changed: every 7200s")
    # When it is removed, it stops and its saved firing is forgotten
    (layout.timers / "hourly.json").unlink()
    proc.wait_log("timer hourly removed")
    assert "hourly" not in json.loads(layout.timer_state.read_text())
    assert messages(dest) == 1 and proc.log().count("timer hourly: message") == 1


def test_a_symlinked_timer_follows_edits_of_its_target(layout, scan, dest, tmp_path):
    proc = scan()
    target = tmp_path / "elsewhere" / "daily.json"
    target.parent.mkdir()
    write_timer(target, period=86400)
    (layout.timers / "daily.json").symlink_to(target)
    proc.wait_log("timer daily: message")
    write_timer(target, period=600)
    proc.wait_log("timer daily changed: every 600s")


def test_a_restart_between_two_firings_sends_nothing_extra(layout, scan, dest):
    # Given a timer that has fired once
    first = scan()
    write_timer(layout.timers / "hourly.json")
    first.wait_log("timer hourly: message")
    assert first.stop() == 0
    # When rq-scan starts again within the period, and a new timer is added after
    second = scan()
    write_timer(layout.timers / "marker.json")
    second.wait_log("timer marker: message")
    # Then the marker fired (so the loop ran) but the hourly timer did not fire again
    assert second.log().count("timer hourly: message") == 1
    assert messages(dest) == 2


def test_a_paused_destination_gets_no_message_and_the_log_says_so(layout, scan, dest):
    dest.call("adminoper", oper="pause")
    proc = scan()
    write_timer(layout.timers / "paused.json")
    proc.wait_log("timer paused: no message this period: destination queue tq is PAUSE")
    assert messages(dest) == 0


def test_bad_timer_files_are_logged_and_ignored(layout, scan, dest):
    proc = scan()
    (layout.timers / "two.dots.json").write_text('{"period": 60, "msg": {"dest": "tq"}}')
    (layout.timers / "short.json").write_text('{"period": 5, "msg": {"dest": "tq"}}')
    (layout.timers / "nodest.json").write_text('{"period": 60, "msg": {"dest": "nosuch"}}')
    log = proc.wait_log("timer file refused", count=2)
    assert "two.dots.json: a timer file is named NAME.json" in log
    assert "short.json: period: 5 is less than the minimum of 60" in log
    proc.wait_log("timer nodest: no message this period: no queue named nosuch")
    assert messages(dest) == 0


def test_timers_in_the_scandir_dot_timers_directory_are_used(layout, scan, dest, tmp_path):
    (tmp_path / "scandir" / ".timers").mkdir()
    write_timer(tmp_path / "scandir" / ".timers" / "shipped.json", param1="example")
    proc = scan()
    proc.wait_log("timer shipped: message")
    assert "scandir entry '.timers'" not in proc.log()


def test_a_hung_destination_holds_no_loop(layout, scan, dest):
    # Given rq-scan, and the destination daemon stopped (it accepts, never answers)
    proc = scan()
    os.kill(dest.proc.pid, signal.SIGSTOP)
    try:
        # When a timer fires at it, and another timer file appears while that hangs
        write_timer(layout.timers / "hourly.json")
        proc.wait_log("timer hourly added")
        write_timer(layout.timers / "other.json", period=7200)
        log = proc.wait_log("timer other added")
        # Then rq-scan took the new file in while the first delivery was still waiting
        assert "timer hourly:" not in log
    finally:
        os.kill(dest.proc.pid, signal.SIGCONT)
    # and once the destination answers, the message is there
    proc.wait_log("timer hourly: message")
    wait_for(lambda: messages(dest) >= 1, DEADLINE, "the hourly message")
