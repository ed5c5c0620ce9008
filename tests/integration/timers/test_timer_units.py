"""Calendar and cron timers as systemd units: the rendered rq-timer@NAME.timer
(checked by systemd-analyze verify beside rq-timer@.service), and ``rqsys timer
NAME`` sending a slot to a real daemon, once however often it runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, need

from rqsys.observe.events import EventLog
from rqsys.timers.calendar import Spec
from rqsys.timers.periodic import Timer
from rqsys.timers.units import MARK, SystemdTimers, unit_text

RQSYS = str(Path(sys.executable).parent / "rqsys")
UNITS = REPO / "units"


def test_rendered_units_verify_with_the_service(tmp_path):
    need(shutil.which("systemd-analyze") is not None, "systemd-analyze is not installed")
    shutil.copy(UNITS / "rq-timer@.service", tmp_path / "rq-timer@nightly.service")
    shutil.copy(UNITS / "rq-timer@.service", tmp_path / "rq-timer@q15.service")
    nightly = Timer("nightly", 0, {"dest": "q"}, Spec("calendar", "Mon..Fri 02:00",
                                                      "Europe/Berlin"), jitter=300,
                    source="/var/lib/rq/timers/nightly.json")
    q15 = Timer("q15", 0, {"dest": "q"}, Spec("cron", "5 4 1,15 * sun"), persistent=False)
    for timer in (nightly, q15):
        (tmp_path / f"rq-timer@{timer.name}.timer").write_text(unit_text(timer))
    text = unit_text(nightly)
    assert "OnCalendar=Mon..Fri 02:00 Europe/Berlin\n" in text
    assert "Persistent=true\n" in text and "RandomizedDelaySec=300\n" in text
    assert text.startswith(f"{MARK} /var/lib/rq/timers/nightly.json")
    assert "OnCalendar=*-*-1,15 4:5:00\nOnCalendar=Sun *-*-* 4:5:00\n" in unit_text(q15)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no",
                             "./rq-timer@nightly.timer", "./rq-timer@q15.timer"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (result.returncode, result.stdout + result.stderr) == (0, ""), result.stderr


def test_units_are_written_restarted_and_removed_in_steps(tmp_path):
    steps: list[tuple[list[list[str]], bool]] = []
    units = SystemdTimers(EventLog("t", journal=False), lambda s, a: steps.append((s, a)),
                          "systemctl", tmp_path)
    timer = Timer("t", 0, {"dest": "q"}, Spec("cron", "*/5 * * * *"), source="/x/t.json")
    units.install(timer)
    assert steps.pop() == ([["systemctl", "daemon-reload"], ["systemctl", "enable",
                            "rq-timer@t.timer"], ["systemctl", "restart", "rq-timer@t.timer"]],
                           True)
    units.install(timer)  # unchanged: only made sure it is enabled and started
    assert steps.pop() == ([["systemctl", "enable", "--now", "rq-timer@t.timer"]], True)
    assert units.made() == ["t"]
    (tmp_path / "rq-timer@mine.timer").write_text("[Timer]\nOnCalendar=daily\n")
    units.remove("mine")  # the operator's own unit: left alone
    assert not steps and units.made() == ["t"]
    units.remove("t")
    assert steps.pop() == ([["systemctl", "disable", "--now", "rq-timer@t.timer"],
                            ["rm", "-f", str(tmp_path / "rq-timer@t.timer")],
                            ["systemctl", "daemon-reload"]], False)


def test_a_timer_that_cannot_be_a_unit_is_fired_by_rq_scan(tmp_path, capsys):
    steps: list = []
    units = SystemdTimers(EventLog("t", journal=False), lambda s, a: steps.append(s),
                          "systemctl", tmp_path)
    assert not units.install(Timer("a b", 0, {"dest": "q"}, Spec("cron", "* * * * *")))
    assert not steps and "not a unit name" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")  # unwritable unit dir (as NixOS's), even for root
    readonly = SystemdTimers(EventLog("t", journal=False), lambda s, a: steps.append(s),
                             "systemctl", tmp_path / "afile")
    assert not readonly.install(Timer("t", 0, {"dest": "q"}, Spec("cron", "* * * * *")))
    assert not steps and "rq-scan fires it itself" in capsys.readouterr().err


def _rqsys(layout, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RQSYS, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=60, env={"RQ_SOCKET_DIR": str(layout.socket_dir),
                                                      "PATH": "/usr/bin:/bin"})


def test_rqsys_timer_sends_the_latest_slot_once(layout, make_queue, daemon):
    # Given a queue and a cron timer file
    make_queue("tq", 'echo "done $RQ_PARAM1" >&3\n')
    proc = daemon("tq")
    (layout.timers / "every.json").write_text(json.dumps(
        {"cron": "0 0 * * *", "timezone": "UTC", "msg": {"dest": "tq", "param1": "x"}}))
    # When its service runs twice (a re-delivered trigger)
    first, second = _rqsys(layout, "timer", "every"), _rqsys(layout, "timer", "every")
    # Then one message, for the latest midnight (daily: no new slot between the two runs),
    # carrying timer, slot and due
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout and first.stdout.startswith("ok ")
    msg = proc.call("get", msg_id=first.stdout.split()[1])["msg"]
    assert msg["timer"] == "every" and msg["slot"] == msg["due"] and msg["slot"] % 86400 == 0
    assert msg["unique_key"] == f"timer every {msg['slot']:.0f}"
    assert sum(proc.call("counts")["counts"].values()) == 1


@pytest.mark.parametrize(("content", "why"), [
    (None, "no timer file nope.json"),
    ({"period": 3600, "msg": {"dest": "tq"}}, "a period timer is fired by rq-scan"),
    ({"calendar": "2001-01-01 00:00", "msg": {"dest": "tq"}}, "no slot of calendar"),
])
def test_rqsys_timer_refuses_with_a_reason(layout, content, why):
    if content is not None:
        (layout.timers / "nope.json").write_text(json.dumps(content))
    done = _rqsys(layout, "timer", "nope")
    assert done.returncode == 1 and why in done.stderr and done.stdout == ""
