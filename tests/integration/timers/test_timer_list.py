"""``rq timers``, ``GET /timers.json`` and the Timers page, over real timer files,
a real daemon and a message made by ``rqsys timer``."""
# ruff: noqa: F811  (pytest fixtures imported from web_support are parameters here)

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scan_util import start_scan
from web_support import web_server  # noqa: F401

RQSYS = str(Path(sys.executable).parent / "rqsys")
RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]


def _run(layout, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*argv, "--root", str(layout.root)] if argv[0] != RQSYS else
                          [RQSYS, "--root", str(layout.root), *argv[1:]],
                          capture_output=True, text=True, timeout=60,
                          env={"RQ_SOCKET_DIR": str(layout.socket_dir), "PATH": "/usr/bin:/bin",
                               "TZ": "UTC"})


@pytest.fixture
def timers(layout, make_queue, daemon):
    """A queue, a cron timer that has sent one slot, a period timer, a bad file."""
    make_queue("tq", 'echo "done $RQ_PARAM1" >&3\n')
    proc = daemon("tq")
    (layout.timers / "every.json").write_text(json.dumps(
        {"cron": "*/5 * * * *", "timezone": "UTC", "msg": {"dest": "tq"}}))
    (layout.timers / "hourly.json").write_text(json.dumps({"period": 3600, "msg": {"dest": "tq"}}))
    (layout.timers / "broken.json").write_text(json.dumps({"cron": "* *", "msg": {"dest": "tq"}}))
    sent = _run(layout, [RQSYS, "timer", "every"])
    assert sent.returncode == 0, sent.stderr
    return proc, sent.stdout.split()[1]


def test_rq_timers_lists_schedule_next_last_and_the_last_message(layout, timers):
    _proc, msg_id = timers
    done = _run(layout, [*RQ, "timers"])
    assert done.returncode == 0, done.stderr
    head, *rows = done.stdout.splitlines()
    assert head == "ok 3"
    by_name = {row.split("\t")[0]: row.split("\t") for row in rows}
    assert by_name["broken"][1] == "REFUSED" and "not 5 fields" in by_name["broken"][2]
    name, schedule, nxt, last, url, state = by_name["every"]
    assert schedule == "cron */5 * * * * (UTC)" and url.endswith(f"/q/tq/{msg_id}")
    assert state in ("que", "run", "done") and last.endswith("UTC") and nxt > last
    assert by_name["hourly"][1:2] == ["every 3600 s"] and by_name["hourly"][3:] == ["-", "-", "-"]


def test_timers_json_and_page(layout, timers, web_server):
    _proc, msg_id = timers
    server = web_server()
    status, got = server.get_json("/timers.json")
    assert status == 200 and [t["name"] for t in got] == ["broken", "every", "hourly"]
    every = got[1]
    assert every["last_msg_id"] == msg_id and every["next"] > time.time() - 1
    assert every["file"] == "timers/every.json"  # no server path
    assert every["last_slot"] % 300 == 0
    status, _headers, html = server.request("GET", "/timers", headers={"Accept": "text/html"})
    page = html.decode()
    assert status == 200 and "<h1>Timers</h1>" in page and f"/q/tq/{msg_id}" in page
    assert "cron */5 * * * * (UTC)" in page and str(layout.root) not in page


def test_the_listings_read_the_timers_of_the_scandir_rq_scan_watches(layout, tmp_path,
                                                                     web_server):
    # Given rq-scan watching a scandir that is not <root>/scandir (make run's
    # scandir-examples/), whose .timers/ holds a timer (the page left it out)
    scandir = tmp_path / "elsewhere"
    (scandir / ".timers").mkdir(parents=True)
    (scandir / ".timers" / "nightly.json").write_text(json.dumps(
        {"cron": "0 3 * * *", "timezone": "UTC", "msg": {"dest": "tq"}}))
    scan = start_scan(layout, scandir, tmp_path / "scan.log")
    try:
        # Then rq timers, /timers.json and the page list it, and every page links to it
        done = _run(layout, [*RQ, "timers"])
        assert done.returncode == 0 and done.stdout.splitlines()[0] == "ok 1", done.stderr
        assert done.stdout.splitlines()[1].startswith("nightly\tcron 0 3 * * * (UTC)")
        server = web_server()
        assert [t["name"] for t in server.get_json("/timers.json")[1]] == ["nightly"]
        _status, _headers, html = server.request("GET", "/", headers={"Accept": "text/html"})
        assert '<a class="timers" href="/timers">Timers</a>' in html.decode()
    finally:
        assert scan.stop() == 0, scan.log()
