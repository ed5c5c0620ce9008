"""A queue daemon never waits on another one: while the daemon it dups to,
or its webhook queue's daemon, is stopped (SIGSTOP), it answers at once,
runs other messages and takes attachments; the stuck call gives up after
its timeout (``fail`` on the script's fd 4; a logged webhook)."""

from __future__ import annotations

import hashlib
import time

import pytest
from conftest import wait_for
from daemon_util import send, settle, stopped

TIMEOUT = 3  # seconds: RQ_DUP_TIMEOUT / RQ_WEBHOOK_TIMEOUT of the daemon under test
QUICK = 0.1  # seconds: what "at once" means here (a stuck loop would take TIMEOUT)

SCRIPT = """
    if [ "$RQ_PARAM1" = dup ]; then
        echo "run asking" >&3
        echo "dup 0-x-other" >&3
        read -r -u 4 answer
        echo "done $answer" >&3
    else
        echo "done quick" >&3
    fi
"""


def answers_at_once(proc, tmp_path):
    """Ping, a message run to done and an attachment, each well within the
    timeout of the stuck call (the ping: within QUICK)."""
    for _ in range(5):
        begun = time.monotonic()
        assert proc.call("ping")["ok"]
        assert time.monotonic() - begun < QUICK
    begun = time.monotonic()
    assert settle(proc, send(proc, param1="other work"), timeout=TIMEOUT)["status"] == "quick"
    ran_in = time.monotonic() - begun
    data = tmp_path / "a.bin"
    data.write_bytes(b"attached while a peer hangs")
    prep = proc.call("create", msg={}, state="prep")["msg_id"]
    with open(data, "rb") as f, proc.client() as client:
        got = client.call("attach", fds=[f.fileno()], msg_id=prep, name="a.bin",
                          md5=hashlib.md5(data.read_bytes()).hexdigest())
    assert got["size"] == len(data.read_bytes())
    return ran_in


@pytest.fixture
def queues(make_queue, daemon):
    make_queue("other", 'echo "done copy" >&3')
    make_queue("webhook", 'echo "done noted" >&3')
    make_queue("q", SCRIPT, num_workers=2)
    env = {"RQ_DUP_TIMEOUT": str(TIMEOUT), "RQ_WEBHOOK_TIMEOUT": str(TIMEOUT)}
    return daemon("q", env=env), daemon("other"), daemon("webhook")


def test_a_dup_to_a_stopped_daemon_does_not_stall_the_queue(queues, tmp_path):
    q, other, _webhook = queues
    # Given the daemon of queue "other" frozen
    with stopped(other):
        # When a script of q dups its message to "other"
        asking = send(q, param1="dup")
        wait_for(lambda: q.call("status", msg_id=asking)["status"] == "asking", TIMEOUT,
                 "the script to ask for its dup")
        asked_at = time.monotonic()
        # Then q answers, runs another message and takes a file meanwhile
        ran_in = answers_at_once(q, tmp_path)
        assert q.call("status", msg_id=asking)["state"] == "run", "the dup is still stuck"
        # And the script is told "fail" on its fd 4 once the timeout has passed
        reply = settle(q, asking, timeout=TIMEOUT + 10)
        failed_after = time.monotonic() - asked_at
    assert reply["state"] == "done" and reply["status"].startswith("fail queue other:")
    assert failed_after >= TIMEOUT - 0.5, reply
    print(f"other message ran in {ran_in * 1000:.0f} ms while the peer hung")
    # And once "other" runs again, dups to it work
    answer = settle(q, send(q, param1="dup"), timeout=20)["status"]
    assert answer.startswith("ok http://") and "/q/other/" in answer


def test_a_stopped_webhook_queue_does_not_stall_the_queue(queues, tmp_path):
    q, _other, webhook = queues
    # Given the webhook queue's daemon frozen
    with stopped(webhook):
        # When a message with a post_run_webhook ends
        ended = send(q, post_run_webhook=["http://127.0.0.1:9/hook"])
        assert settle(q, ended, timeout=TIMEOUT)["state"] == "done"
        ended_at = time.monotonic()
        # Then q answers, runs another message and takes a file meanwhile
        answers_at_once(q, tmp_path)
        # And the call gives up after its timeout, saying so in q's log
        wait_for(lambda: "webhook not queued" in q.stderr_text(), TIMEOUT + 10,
                 "the webhook call to give up")
        gave_up_after = time.monotonic() - ended_at
    line = next(x for x in q.stderr_text().splitlines() if "webhook not queued" in x)
    assert f"{ended}: err: webhook not queued: queue webhook:" in line
    assert gave_up_after >= TIMEOUT - 0.5
    assert "Traceback" not in q.stderr_text()
    assert q.stop() == 0


def test_a_bad_timeout_setting_stops_the_daemon_at_start(make_queue, daemon):
    make_queue("q", SCRIPT)
    with pytest.raises(AssertionError, match="RQ_DUP_TIMEOUT"):
        daemon("q", env={"RQ_DUP_TIMEOUT": "soon"})
