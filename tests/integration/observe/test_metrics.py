"""``GET /metrics`` and ``GET /q/<q>/stats.json`` over real daemons, parsed with
prometheus_client's own parser and checked value by value."""

from __future__ import annotations

import base64
import json
import signal

from conftest import web_client
from daemon_util import send, settle
from prometheus_client.parser import text_string_to_metric_families

SCRIPT = """
case "$RQ_PARAM1" in
  err) echo "err database down" >&3 ;;
  relay) echo "relayed http://far.example:3333/q/x/20250101.0000.00.000.0" >&3 ;;
  resend) if [ "$RQ_COUNT" = 0 ]; then echo "resend 0-again" >&3; else echo "done" >&3; fi ;;
  *) echo "done fine" >&3 ;;
esac
"""
AUTH = {"Authorization": "Basic " + base64.b64encode(b"u:p").decode()}


def _client(layout):
    layout.config_file.write_text(json.dumps({
        "host": "h.example", "port": 3333, "basic_auth": {"realm": "R", "users": {"u": "p"}}}))
    return web_client(layout)


def _scrape(client):
    got = client.simulate_get("/metrics", headers=AUTH)
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/plain")
    values = {}
    for family in text_string_to_metric_families(got.text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def _value(values, name, **labels):
    return values[(name, tuple(sorted(labels.items())))]


def test_metrics_after_scripted_runs_and_a_restart(make_queue, daemon, layout):
    # Given a queue that ends messages done, err, relayed or after a resend, and
    # a paused one holding one queued message
    make_queue("q", SCRIPT)
    make_queue("idle", SCRIPT)
    proc, idle = daemon("q"), daemon("idle")
    idle.call("adminoper", oper="pause")
    send(idle)
    for param in ("ok", "ok", "err", "relay", "resend"):
        settle(proc, send(proc, param1=param))
    client = _client(layout)
    # Then /metrics is behind basic auth
    assert client.simulate_get("/metrics").status_code == 401
    # and tells each number
    v = _scrape(client)
    assert _value(v, "rqsys_queue_up", queue="q") == 1.0
    assert _value(v, "rqsys_messages_created_total", queue="q") == 5
    assert [_value(v, "rqsys_messages_ended_total", queue="q", state=s)
            for s in ("done", "err", "relayed")] == [3, 1, 1]
    assert _value(v, "rqsys_messages_resent_total", queue="q") == 1
    assert _value(v, "rqsys_queue_messages", queue="q", state="done") == 3
    assert _value(v, "rqsys_queue_messages", queue="idle", state="que") == 1
    assert _value(v, "rqsys_queue_in_flight", queue="q") == 0
    assert _value(v, "rqsys_queue_admin_state", queue="idle", admin_state="PAUSE") == 1
    assert _value(v, "rqsys_queue_admin_state", queue="idle", admin_state="UP") == 0
    assert _value(v, "rqsys_queue_oldest_queued_age_seconds", queue="idle") > 0
    assert _value(v, "rqsys_message_run_seconds_count", queue="q") == 6
    assert _value(v, "rqsys_message_run_seconds_bucket", queue="q", le="+Inf") == 6
    assert _value(v, "rqsys_message_wait_seconds_count", queue="q") == 6  # 5 + the resend
    assert _value(v, "rqsys_message_run_seconds_sum", queue="q") > 0
    assert _value(v, "rqsys_queue_daemon_starts_total", queue="q") == 1
    # and where its loop's time went: some waiting, some starting the six runs
    waited, spawned, cpu = (_value(v, f"rqsys_queue_loop_{k}_seconds_total", queue="q")
                            for k in ("idle", "spawn", "cpu"))
    assert 0 < spawned < waited + spawned <= _value(v, "rqsys_queue_daemon_uptime_seconds",
                                                    queue="q")
    assert cpu > 0 and _value(v, "rqsys_queue_loop_spawn_seconds_total", queue="idle") == 0
    # and its copies of the store lost no write (test_copyhealth.py makes them fail)
    assert [_value(v, "rqsys_queue_copy_write_failures_total", queue="q", copy=c)
            for c in ("timelines", "index")] == [0, 0]
    assert _value(v, "rqsys_queue_search_index_behind", queue="q") == 0
    # When the daemon is killed and another starts
    proc.kill(signal.SIGKILL)
    proc.proc.wait()
    assert _value(_scrape(client), "rqsys_queue_up", queue="q") == 0.0
    proc = daemon("q")
    settle(proc, send(proc))
    # Then no counter went back, and the restart is counted
    after = _scrape(client)
    for key, value in v.items():
        if key[0].endswith(("_total", "_count", "_bucket")) and "_loop_" not in key[0]:
            assert after[key] >= value, key  # the loop's are since the daemon started
    assert _value(after, "rqsys_messages_created_total", queue="q") == 6
    assert _value(after, "rqsys_queue_daemon_starts_total", queue="q") == 2


def test_stats_json_and_its_errors(make_queue, daemon, layout):
    make_queue("q", SCRIPT)
    proc = daemon("q")
    settle(proc, send(proc, param1="err"))
    client = _client(layout)
    got = client.simulate_get("/q/q/stats.json", headers=AUTH)
    assert got.status_code == 200
    assert got.json["totals"]["err"] == 1 and got.json["windows"]["day"]["err"] == 1
    missing = client.simulate_get("/q/nosuch/stats.json", headers=AUTH)
    assert missing.status_code == 404 and "no queue named nosuch" in missing.json[1]
    bad = client.simulate_get("/q/bad..name/stats.json", headers=AUTH)
    assert bad.status_code == 400 and "invalid queue name" in bad.json[1]
