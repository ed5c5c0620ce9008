"""Per-queue statistics: the O(1) counting itself, and the ``stats`` op of a
real daemon after scripted runs, across a clean stop and a SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from daemon_util import send, settle

from rqsys.errors import BadRequest
from rqsys.observe.stats import BOUNDS, QueueStats, bucket, id_time, percentiles

SCRIPT = """
case "$RQ_PARAM1" in
  err) echo "err database down" >&3 ;;
  resend) if [ "$RQ_COUNT" = 0 ]; then echo "resend 0-again" >&3; else echo "done" >&3; fi ;;
  *) echo "done fine" >&3 ;;
esac
"""


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_buckets_and_percentiles_are_fixed_log_bounds():
    assert bucket(0.0005) == 0 and bucket(0.001) == 0 and bucket(0.0011) == 1
    assert bucket(10 ** 9) == len(BOUNDS)  # +Inf
    hist = [0] * (len(BOUNDS) + 1)
    hist[bucket(0.05)] = 90
    hist[bucket(3.0)] = 9
    hist[bucket(100.0)] = 1
    got = percentiles(hist)
    assert got["count"] == 100
    assert got["p50"] == BOUNDS[bucket(0.05)] and got["p95"] == BOUNDS[bucket(3.0)]
    assert got["p99"] == BOUNDS[bucket(3.0)]
    assert percentiles([0] * len(hist))["p50"] is None


def test_windows_forget_old_slots_and_days_count_by_utc_date():
    clock = Clock(1_700_000_000.0)
    stats = QueueStats(clock)
    stats.apply({"k": "done", "t": clock.now})
    stats.apply({"k": "run", "t": clock.now, "v": 2.0})
    clock.now += 2 * 3600  # two hours later
    stats.apply({"k": "err", "t": clock.now})
    hour, day = stats.window(3600), stats.window(86400)
    assert (hour["done"], hour["err"], day["done"], day["err"]) == (0, 1, 1, 1)
    assert day["run"]["count"] == 1 and hour["run"]["count"] == 0
    assert day["throughput_per_s"] == pytest.approx(2 / 86400)
    assert stats.totals["done"] == 1 and stats.days == {
        "2023-11-14": {"created": 0, "done": 1, "err": 0, "relayed": 0, "resend": 0, "retry": 0},
        "2023-11-15": {"created": 0, "done": 0, "err": 1, "relayed": 0, "resend": 0, "retry": 0}}


def test_id_time_is_the_creation_time():
    assert id_time("20231114.2213.20.250.3") == pytest.approx(1_699_999_999.0 + 1.25 - 0.0)
    assert id_time("garbage") == 0.0


def _run_all(proc, params):
    ids = [send(proc, param1=p) for p in params]
    for msg_id in ids:
        settle(proc, msg_id)
    return ids


def test_stats_after_scripted_runs_survive_stop_and_kill(make_queue, daemon):
    # Given a queue that ends messages done, err or after one resend
    make_queue("q", SCRIPT)
    proc = daemon("q")
    _run_all(proc, ["ok", "ok", "err", "resend"])
    # Then the daemon's stats count each exactly
    got = proc.call("stats")
    assert got["totals"] == {"created": 4, "done": 3, "err": 1, "relayed": 0, "resend": 1,
                             "retry": 0}
    # a wait for each entry to the que: 4 creations and 1 resend
    assert sum(got["hist"]["run"]) == 5 and sum(got["hist"]["wait"]) == 5
    assert got["windows"]["hour"]["done"] == 3 and got["windows"]["week"]["resend"] == 1
    assert got["windows"]["hour"]["run"]["count"] == 5
    assert got["windows"]["hour"]["wait"]["p50"] is not None
    assert list(got["days"].values()) == [
        {"created": 4, "done": 3, "err": 1, "relayed": 0, "resend": 1, "retry": 0}]
    assert got["counts"]["done"] == 3 and got["starts"] == 1
    assert got["oldest_queued_s"] is None
    # When the daemon stops cleanly and starts again, and then is killed and restarted
    proc.stop()
    proc = daemon("q")
    _run_all(proc, ["ok"])
    assert proc.call("stats")["totals"]["done"] == 4
    proc.kill(signal.SIGKILL)
    proc.proc.wait()
    proc = daemon("q")
    # Then no count went back, and each start was counted
    got = proc.call("stats")
    assert got["totals"] == {"created": 5, "done": 4, "err": 1, "relayed": 0, "resend": 1,
                             "retry": 0}
    assert sum(got["hist"]["run"]) == 6 and got["starts"] == 3


def test_oldest_queued_age_and_bad_stats_request(make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    send(proc)
    assert 0 <= proc.call("stats")["oldest_queued_s"] < 30
    with pytest.raises(BadRequest, match="bad request: stats"):
        proc.client().call("stats", window="hour")


RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]


def _rq(layout, *args):
    return subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=30)


def test_rq_stats_prints_windows_and_fails_clearly(layout, make_queue, daemon):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    _run_all(proc, ["ok", "err"])
    out = _rq(layout, "stats", "q")
    assert out.returncode == 0 and out.stderr == ""
    lines = out.stdout.splitlines()
    assert lines[1] == "since ever: created 2, done 1, err 1, relayed 0, resend 0, retry 0"
    assert lines[2].startswith("last hour: done 1, err 1, relayed 0, resend 0, retry 0, ")
    assert "run p50 <=" in lines[2]
    raw = json.loads(_rq(layout, "stats", "q", "--json").stdout)
    assert raw["totals"]["err"] == 1
    missing = _rq(layout, "stats", "nosuch")
    assert missing.returncode == 1 and missing.stderr == "rq: no queue named nosuch\n"
    bad = _rq(layout, "stats", "bad..name")
    assert bad.returncode == 1 and "invalid queue name" in bad.stderr
