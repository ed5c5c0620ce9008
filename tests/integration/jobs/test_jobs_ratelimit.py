"""Rate limits and concurrency limits through a real daemon: start times
recorded by the scripts, running counts seen through the socket."""

# ruff: noqa: F811  (the web_server fixture imported from web_support is a parameter)
from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from conftest import wait_for
from daemon_util import send, settle
from web_support import web_server  # noqa: F401

from rqsys.errors import ConfigError

SLACK = 0.4  # a script reads the clock a little after the daemon started it (busy machine)


def test_rate_limit_five_per_second_over_fifty_messages(tmp_path, make_queue, daemon):
    # Given a queue of 8 workers limited to 5 starts a second, paused with 50 messages
    out = tmp_path / "starts"
    make_queue("q", 'date +%s.%N >> "$OUT"; echo done >&3', num_workers=8,
               env_vars={"OUT": str(out)}, rate_limit={"limit": 5, "per": 1})
    proc = daemon("q")
    proc.call("adminoper", oper="pause")
    ids = [send(proc, param1=str(n)) for n in range(50)]
    # When it resumes
    proc.call("adminoper", oper="resume")
    for msg_id in ids:
        assert settle(proc, msg_id, timeout=60)["state"] == "done"
    # Then no second holds more than 5 starts, and each start came as soon as allowed
    starts = sorted(float(line) for line in out.read_text().split())
    assert len(starts) == 50
    gaps = [starts[n + 5] - starts[n] for n in range(45)]
    assert min(gaps) >= 1 - SLACK, gaps
    assert 9 - SLACK <= starts[-1] - starts[0] < 9 + 5, starts[-1] - starts[0]


def test_concurrency_two_by_param1(tmp_path, make_queue, daemon):
    # Given 6 workers, at most 2 running per param1, and scripts that wait for a gate
    running, gate = tmp_path / "running", tmp_path / "gate"
    running.mkdir()
    body = f"""touch "{running}/$RQ_PARAM1.$RQ_MSG_ID"
        [ "$(ls {running} | grep -c "^$RQ_PARAM1\\.")" -gt 2 ] && echo over >> "{tmp_path}/over"
        while [ ! -e "{gate}" ]; do sleep 0.02; done
        rm "{running}/$RQ_PARAM1.$RQ_MSG_ID"; echo done >&3"""
    make_queue("q", body, num_workers=6, concurrency={"by": [1], "limit": 2})
    proc = daemon("q")
    a_ids = [send(proc, param1="a") for _ in range(4)]
    b_id = send(proc, param1="b")
    # Then two a's and the b run; the other a's wait in que
    wait_for(lambda: proc.call("counts")["counts"]["run"] == 3, what="2 a's and b running")
    assert [proc.call("state", msg_id=i)["state"] for i in a_ids[2:]] == ["que", "que"]
    gate.write_text("")
    for msg_id in [*a_ids, b_id]:
        assert settle(proc, msg_id)["state"] == "done"
    assert not (tmp_path / "over").exists()


@pytest.mark.parametrize(("cfg", "field"), [
    ({"rate_limit": {"limit": 0, "per": 1}}, "rate_limit/limit"),
    ({"rate_limit": {"limit": 5}}, "rate_limit"),
    ({"rate_limit": {"limit": 5, "per": 0}}, "rate_limit/per"),
    ({"rate_limit": {"limit": 5, "per": 1, "by": [5]}}, "rate_limit/by/0"),
    ({"concurrency": {"limit": "two"}}, "concurrency/limit"),
    ({"concurrency": {"limit": 2, "by": [1, 1]}}, "concurrency/by"),
    ({"concurrency": {"by": [1]}}, "concurrency"),
])
def test_bad_limits_are_refused_naming_the_field(make_queue, cfg, field):
    with pytest.raises(ConfigError, match=f"{field}: "):
        make_queue("q", "echo done >&3", **cfg)


def test_new_queue_form_takes_the_limits_and_refuses_bad_ones(web_server, layout):
    # Given a web front end that allows new queues, and RQ's nested form fields
    server = web_server(allow_new_queue=True)
    form = {"queue[name]": "made", "queue[script]": "/bin/true",
            "queue[rate_limit][limit]": "5", "queue[rate_limit][per]": "1.5",
            "queue[concurrency][limit]": "2", "queue[concurrency][by][]": "1"}
    form_type = {"Content-Type": "application/x-www-form-urlencoded"}
    status, _h, data = server.request("POST", "/new_queue", urlencode(form), form_type)
    assert status == 200, data
    cfg = json.loads((layout.queue_dir("made") / "config.json").read_text())
    assert cfg["rate_limit"] == {"limit": 5, "per": 1.5}
    assert cfg["concurrency"] == {"limit": 2, "by": [1]}
    # Then a bad value is refused with 400, naming the field
    form.update({"queue[name]": "bad", "queue[rate_limit][per]": "-1"})
    status, _h, data = server.request("POST", "/new_queue", urlencode(form), form_type)
    assert status == 400 and b"rate_limit/per" in data, data
