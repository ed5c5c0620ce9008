"""A timer's ``overlap``: ``skip`` makes no slot message while the timer's last
one is queued or running, across a SIGKILL of rq-scan and the queue daemon;
``queue`` (the default) lets them pile up.  Real rq-scan, a real queue daemon
running a 3-second script, ``rq timers``, and the web over real HTTP."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from scan_util import DEADLINE, LoggedProcess, start_scan
from web_support import web_server  # noqa: F401

from rqsys.store import STATES, QueueView
from rqsys.timers import history

EVERY_SECOND = "*-*-* *:*:*"  # period's minimum is 60 s: a calendar fires every second
RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]


def script(runs: Path) -> str:
    """A 3-second run that notes its start and end in ``runs``."""
    return (f'echo "start $(date +%s.%N) $RQ_MSG_ID" >> {runs}\n'
            "sleep 3\n"
            f'echo "end $(date +%s.%N) $RQ_MSG_ID" >> {runs}\n'
            'echo "done slept" >&3\n')


@pytest.fixture
def scans(layout, tmp_path):
    """scans() starts rq-scan; those still alive at the end must stop on TERM."""
    procs: list[LoggedProcess] = []
    scandir = tmp_path / "scandir"
    scandir.mkdir()

    def start() -> LoggedProcess:
        procs.append(start_scan(layout, scandir, tmp_path / f"scan{len(procs)}.log"))
        return procs[-1]

    yield start
    for proc in procs:
        if proc.proc.poll() is None:
            assert proc.stop() == 0, proc.log()
        else:
            proc._log.close()


def write_timer(layout, name: str, **fields: Any) -> None:
    (layout.timers / f"{name}.json").write_text(json.dumps(
        {"calendar": EVERY_SECOND, **fields, "msg": {"dest": "ov"}}))


def every_message(proc) -> list[dict[str, Any]]:
    """Each message of the queue (``get``: created_at, ended_at...), oldest first."""
    ids = [i for state in STATES for i in proc.call("list", state=state, limit=1000)["ids"]]
    return sorted((proc.call("get", msg_id=i) | {"id": i} for i in ids),
                  key=lambda m: m["created_at"])


def runs_of(path: Path) -> list[tuple[str, float, float | None]]:
    """(id, start, end or None) of each run noted by the script, in start order."""
    runs: list[tuple[str, float, float | None]] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        what, at, msg_id = line.split()
        if what == "start":
            runs.append((msg_id, float(at), None))
        else:
            index = max(i for i, r in enumerate(runs) if r[0] == msg_id)
            runs[index] = (msg_id, runs[index][1], float(at))
    return runs


def ended(proc) -> int:
    counts = proc.call("counts")["counts"]
    return int(counts["done"] + counts["err"])


def rq_timers(layout) -> dict[str, list[str]]:
    done = subprocess.run([*RQ, "timers", "--root", str(layout.root)], capture_output=True,
                          text=True, timeout=60, env={"RQ_SOCKET_DIR": str(layout.socket_dir),
                                                      "PATH": "/usr/bin:/bin", "TZ": "UTC"})
    assert done.returncode == 0, done.stderr
    return {row.split("\t")[0]: row.split("\t") for row in done.stdout.splitlines()[1:]}


def metric(server, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    status, _headers, body = server.request("GET", "/metrics")
    assert status == 200, body[:300]
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def test_skip_runs_never_overlap_and_the_skips_are_shown(layout, make_queue, daemon, scans,
                                                          tmp_path, web_server):
    # Given a queue whose script runs 3 s, and a skip timer firing every second
    runs = tmp_path / "runs.log"
    make_queue("ov", script(runs))
    dest = daemon("ov")
    write_timer(layout, "every", overlap="skip")
    scan = scans()
    began = time.monotonic()
    # When it has run for some 8 s and two runs have ended
    wait_for(lambda: ended(dest) >= 2 and time.monotonic() - began >= 8, DEADLINE,
             "two runs ended, 8 s")
    assert scan.stop() == 0, scan.log()
    wait_for(lambda: sum(dest.call("counts")["counts"][s] for s in ("que", "run")) == 0,
             DEADLINE, "the last run ended")
    # Then the runs never overlapped: each began after the one before ended
    noted = runs_of(runs)
    assert len(noted) >= 2 and all(end is not None for _i, _s, end in noted), noted
    for (_a, _s, end), (_b, start, _e) in zip(noted, noted[1:], strict=False):
        assert start >= end, noted
    # and no message was made while the one before it was queued or running
    made = every_message(dest)
    assert len(made) == len(noted)
    for before, after in zip(made, made[1:], strict=False):
        assert after["created_at"] >= before["ended_at"], (before, after)
    # and the slots it skipped meanwhile are counted: the log, the record, rq timers
    log = scan.log()
    skipped = log.count("skipped (overlap skip)")
    assert skipped >= 2 and "timer every: message" in log, log
    record = history.read(layout.root, "every")
    assert record["skipped"] == skipped and record["skips"][-1]["state"] in ("que", "run")
    assert record["skips"][-1]["msg_id"] in {m["id"] for m in made}
    row = rq_timers(layout)["every"]
    assert len(row) == 7 and row[6].startswith(f"skipped {skipped} (last ")
    # and the web's Timers page, /timers.json and /metrics
    server = web_server()
    _status, listed = server.get_json("/timers.json")
    [every] = listed
    assert every["overlap"] == "skip" and every["skipped"] == skipped
    assert every["last_skipped"] == record["skips"][-1]["slot"]
    status, _headers, html = server.request("GET", "/timers", headers={"Accept": "text/html"})
    assert status == 200 and f"skipped {skipped} (last " in html.decode()
    assert metric(server, "rqsys_timer_slots_skipped_total", queue="ov",
                  timer="every") == skipped > 0


def test_queue_is_the_default_and_slot_messages_pile_up(layout, make_queue, daemon, scans,
                                                        tmp_path):
    # Given the same queue (one worker) and a timer without overlap
    runs = tmp_path / "runs.log"
    make_queue("ov", script(runs), num_workers=1)
    dest = daemon("ov")
    write_timer(layout, "every")
    scan = scans()
    # Then slot messages queue up behind the running one
    wait_for(lambda: dest.call("counts")["counts"]["que"] >= 2
             and dest.call("counts")["counts"]["run"] == 1, DEADLINE, "two queued behind a run")
    assert scan.stop() == 0, scan.log()
    assert "skipped" not in scan.log()
    made = every_message(dest)
    assert len(made) >= 3 and made[0]["ended_at"] is None  # the first one still runs
    assert sum(m["state"] == "que" for m in made) >= 2
    # and the listing shows no skip column for it, the record counts none
    assert len(rq_timers(layout)["every"]) == 6
    assert "skipped" not in history.read(layout.root, "every")


def live(layout) -> list[str]:
    """The ids in prep, que and run, read from the disk (the daemon may be dead)."""
    view = QueueView(layout.queue_dir("ov"))
    return sorted(i for state in ("prep", "que", "run") for i in view.ids(state))


def test_a_sigkill_of_rq_scan_and_the_daemon_makes_no_new_message_meanwhile(
        layout, make_queue, daemon, scans, tmp_path):
    # Given a skip timer whose message is running
    runs = tmp_path / "runs.log"
    make_queue("ov", script(runs))
    dest = daemon("ov")
    write_timer(layout, "every", overlap="skip")
    scan = scans()
    slots = layout.root / "timer-slots.json"
    wait_for(lambda: runs_of(runs) and slots.exists() and "every" in json.loads(
        slots.read_text()), DEADLINE, "a run started, its slot saved")
    [first] = live(layout)
    assert QueueView(layout.queue_dir("ov")).find(first) == "run"
    # When rq-scan and the queue daemon are killed with SIGKILL
    os.killpg(scan.proc.pid, signal.SIGKILL)
    dest.kill(signal.SIGKILL)
    scan.proc.wait()
    dest.proc.wait()
    time.sleep(2)  # slots pass while both are down
    # and rq-scan starts again first: its missed slot (persistent), and the next, are skipped
    again = scans()
    log = again.wait_log(f"skipped (overlap skip): message {first} in ov is still run",
                         count=2)
    assert "timer every: message" not in log
    assert live(layout) == [first] and history.read(layout.root, "every")["msg_id"] == first
    # and the daemon starts again, puts the message back in que and runs it again
    restarted = daemon("ov")
    wait_for(lambda: len(runs_of(runs)) >= 2, DEADLINE, "the message run again")
    assert runs_of(runs)[1][0] == first
    # Then while it is queued or running again, no other message is made
    while first in live(layout):
        assert set(live(layout)) <= {first}
        time.sleep(0.05)
    assert again.log().count(f"message {first} in ov is still que") + \
        again.log().count(f"message {first} in ov is still run") >= 3
    # and once it ended, the timer makes its next message
    again.wait_log("timer every: message")
    assert again.stop() == 0, again.log()
    wait_for(lambda: restarted.call("counts")["counts"]["run"] == 0, DEADLINE, "all ended")
    made = every_message(restarted)
    assert made[0]["id"] == first and len(made) >= 2
    for before, after in zip(made, made[1:], strict=False):
        assert after["created_at"] >= before["ended_at"], (before, after)


def test_a_bad_overlap_is_refused_naming_the_field(layout, make_queue, daemon, scans):
    make_queue("ov", 'echo "done" >&3\n')
    daemon("ov")
    scan = scans()
    write_timer(layout, "bad", overlap="sometimes")
    log = scan.wait_log("timer file refused")
    assert f"{layout.timers}/bad.json: overlap: 'sometimes' is not one of " \
           "['queue', 'skip']" in log
    row = rq_timers(layout)["bad"]
    assert row[1] == "REFUSED" and "overlap: 'sometimes' is not one of" in row[2]
