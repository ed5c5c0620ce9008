"""Timeouts and automatic retries through a real daemon and real scripts:
the whole process group stopped at the deadline, the deadline kept across
a daemon stop and a crash, retries timed through the ``due`` written."""

from __future__ import annotations

import signal
import time

import pytest
from conftest import wait_for
from daemon_util import job_file, pid_alive, send, settle, store_of

from rqsys.errors import BadRequest, ConfigError

SLEEPER = """
    sleep 1000 &
    echo $! > bg.pid
    echo "run waiting" >&3
    sleep 1000
"""


def _pid(layout, msg_id, name="bg.pid"):
    path = wait_for(lambda: _if_written(job_file(layout, "q", msg_id, name)), what=name)
    return int(path.read_text())


def _if_written(path):
    return path if path.exists() and path.read_text().strip() else None


def test_timeout_kills_script_and_its_background_child(layout, make_queue, daemon):
    # Given a queue with a 1 s timeout whose script sleeps with a child in the background
    make_queue("q", SLEEPER, timeout=1)
    proc = daemon("q")
    # When a message runs past its timeout
    msg_id = send(proc)
    background = _pid(layout, msg_id)
    # Then it ends in err with the timeout's status, and its background child is gone too
    reply = settle(proc, msg_id)
    assert (reply["state"], reply["status"]) == ("err", "timed out after 1 s")
    wait_for(lambda: not pid_alive(background), what="the background child to end")


def test_script_ignoring_term_is_killed_after_stop_grace(layout, make_queue, daemon):
    make_queue("q", "trap '' TERM\n" + SLEEPER, stop_grace=0.5)
    proc = daemon("q")
    msg_id = send(proc, timeout=0.5)  # the message's own (the queue has none)
    background = _pid(layout, msg_id)
    reply = settle(proc, msg_id)
    assert (reply["state"], reply["status"]) == ("err", "timed out after 0.5 s")
    wait_for(lambda: not pid_alive(background), what="SIGKILL of the group")


def test_message_timeout_over_the_queue_s_is_refused(make_queue, daemon):
    make_queue("q", 'echo done >&3', timeout=10)
    proc = daemon("q")
    with pytest.raises(BadRequest, match="timeout: 20 s is more than queue q's timeout of 10"):
        send(proc, timeout=20)
    for bad in (0, -1, "soon", 10**9):
        with pytest.raises(BadRequest, match="timeout"):
            send(proc, timeout=bad)
    assert settle(proc, send(proc, timeout=5))["state"] == "done"


def test_bad_queue_timeout_and_retry_are_refused(make_queue):
    with pytest.raises(ConfigError, match="timeout"):
        make_queue("q", "echo done >&3", timeout=-1)
    with pytest.raises(ConfigError, match="retry/backoff"):
        make_queue("r", "echo done >&3", retry={"backoff": "sometimes"})
    with pytest.raises(ConfigError, match="retry/on/0"):
        make_queue("s", "echo done >&3", retry={"on": ["oops"]})


def test_time_used_is_kept_across_a_clean_stop(layout, make_queue, daemon):
    # Given a message with a timeout, running when its daemon stops
    make_queue("q", SLEEPER, timeout=100)
    proc = daemon("q")
    msg_id = send(proc)
    _pid(layout, msg_id)
    started = proc.call("get", msg_id=msg_id)
    assert started["state"] == "run"
    proc.stop()
    # Then it is back in que with the time it used written in its msg
    msg = store_of(layout, "q").read_msg("que", msg_id)
    assert 0 < msg["timeout_used"] < 100


def test_time_used_is_kept_across_a_crash(layout, make_queue, daemon):
    # Given a running message with a timeout whose script showed life 0.5 s in
    make_queue("q", 'sleep 0.5; echo "run alive" >&3; sleep 1000', timeout=100)
    proc = daemon("q")
    msg_id = send(proc)
    wait_for(lambda: proc.call("status", msg_id=msg_id)["status"] == "alive", what="status")
    # When the daemon is killed and started again
    proc.kill(signal.SIGKILL)
    proc.proc.wait()
    proc = daemon("q")
    # Then the run cut short counted from its start to its last sign of life
    used = proc.call("get", msg_id=msg_id)["msg"]["timeout_used"]
    assert 0.4 < used < 100


def test_no_budget_left_times_out_without_running(layout, make_queue, daemon):
    make_queue("q", 'echo ran > ran.txt; echo done >&3', timeout=5)
    store = store_of(layout, "q")
    store.recover()
    msg_id = store.create({"dest": "q", "timeout_used": 6})
    proc = daemon("q")
    reply = settle(proc, msg_id)
    assert (reply["state"], reply["status"]) == ("err", "timed out after 5 s")
    assert not job_file(layout, "q", msg_id, "ran.txt").exists()


RETRY = {"max": 2, "base": 100, "backoff": "exponential"}


def _retry_status(proc, msg_id, text):
    wait_for(lambda: proc.call("status", msg_id=msg_id) == {
        "ok": True, "state": "que", "status": text}, what=text)
    return proc.call("get", msg_id=msg_id)["msg"]


def test_retries_back_off_then_err(layout, make_queue, daemon):
    # Given a queue that retries failures twice, exponentially from 100 s
    make_queue("q", 'echo "err boom" >&3', retry=RETRY)
    proc = daemon("q")
    # When a message fails
    before = time.time()
    msg_id = send(proc)
    # Then it waits in que, due 100 s after it failed, with the retry in its status
    msg = _retry_status(proc, msg_id, "retry 1 of 2 in 100 s: boom")
    assert (msg["retries"], msg["count"]) == (1, 0)
    assert before + 100 <= msg["due"] <= time.time() + 100
    assert store_of(layout, "q").read_msg("que", msg_id)["due"] == msg["due"]  # durable
    # When it is run now and fails again: 200 s; the third failure is the last
    before = time.time()  # before run_now: the run may fail before its answer is read
    proc.call("run_now", msg_id=msg_id)
    msg = _retry_status(proc, msg_id, "retry 2 of 2 in 200 s: boom")
    assert before + 200 <= msg["due"] <= time.time() + 200
    proc.call("run_now", msg_id=msg_id)
    reply = settle(proc, msg_id)
    assert (reply["state"], reply["status"]) == ("err", "boom (after 2 retries)")


def test_retry_on_timeout_only(make_queue, daemon):
    make_queue("q", '[ "$RQ_PARAM1" = slow ] && sleep 1000; echo "err boom" >&3',
               timeout=0.5, retry={"on": ["timeout"], "max": 1, "base": 50,
                                    "backoff": "fixed"})
    proc = daemon("q")
    failed, slow = send(proc), send(proc, param1="slow")
    assert settle(proc, failed)["status"] == "boom"  # an err: not retried
    _retry_status(proc, slow, "retry 1 of 1 in 50 s: timed out after 0.5 s")


def test_message_retry_max(make_queue, daemon):
    make_queue("q", "exit 3", retry={"max": 5, "base": 0})
    proc = daemon("q")
    assert settle(proc, send(proc, retry_max=0))["status"].startswith("PROCESS EXITED")
    reply = settle(proc, send(proc, retry_max=1))
    assert reply["status"].endswith("exit 3 (after 1 retry)")
    with pytest.raises(BadRequest, match="retry_max"):
        send(proc, retry_max=-1)
