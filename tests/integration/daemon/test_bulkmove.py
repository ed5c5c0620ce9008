"""A bulk move of queued messages with real daemons: while a step's copies
are on their way to the other queue (its daemon frozen with SIGSTOP) the
originals cannot start here, and afterwards each message is in exactly one
queue; those the other queue refuses, or all when it cannot be reached,
run here afterwards; one riding along with a running one is passed over."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_for
from daemon_util import send, settle, stopped, write_gate

from rqsys.errors import NotFound, RQError

MOVING = 3


def script(gate):
    return f"""
    if [ "$RQ_PARAM1" = block ]; then
        while [ ! -e "{gate}$RQ_PARAM2" ]; do sleep 0.02; done
    fi
    echo "done ran $RQ_PARAM1" >&3
    """


def queued_behind_a_blocker(q):
    """q's one worker held by a running message; MOVING tagged ones queued
    behind it (found by the search index)."""
    blocker = send(q, param1="block")
    settle(q, blocker, states=("run",))
    ids = [send(q, param1=f"m{n}", tags=["moving"], timeout=60) for n in range(MOVING)]
    wait_for(lambda: q.call("search", state="que", tag="moving")["total"] == MOVING,
             10, "the index to list the queued ones")
    return blocker, ids


@pytest.fixture
def q(make_queue, daemon, tmp_path):
    gate = tmp_path / "gate"
    make_queue("q", script(gate), num_workers=1, timeout=120, coalesce_params=[1])
    # the send to a frozen peer waits however long a busy machine takes to run the probe
    proc = daemon("q", env={"RQ_DUP_TIMEOUT": "60"})
    proc.gate = gate
    return proc


def test_queued_ones_do_not_start_while_their_copies_are_sent(q, make_queue, daemon):
    make_queue("q2", 'echo "done ran there" >&3')
    q2 = daemon("q2")
    blocker, ids = queued_behind_a_blocker(q)
    answer = {}
    with stopped(q2):
        # Given a bulk move whose step is sent to a frozen peer
        mover = threading.Thread(target=lambda: answer.update(q.call(
            "bulk", action="move", dest="q2", state="que", tag="moving")))
        mover.start()
        wait_for(lambda: q.call("counts")["counts"]["que"] == 0, 10,
                 "the step to hold its messages")
        # When q's worker is free again and a later message runs to its end
        write_gate(q.gate)
        assert settle(q, blocker)["state"] == "done"
        probe = send(q, param1="probe")
        assert settle(q, probe)["status"] == "ran probe"
        # Then none of the held ones started meanwhile
        assert [q.call("status", msg_id=i)["state"] for i in ids] == ["que"] * MOVING
    mover.join(20)
    assert not mover.is_alive() and answer["count"] == MOVING, answer
    # And afterwards each is in the other queue only
    for msg_id in ids:
        with pytest.raises(NotFound):
            q.call("status", msg_id=msg_id)
    wait_for(lambda: q2.call("counts")["counts"]["done"] == MOVING, 10, "the copies to run")
    assert q.call("counts")["counts"]["done"] == 2  # the blocker and the probe


def test_refused_ones_run_here_afterwards(q, make_queue, daemon):
    make_queue("q2", 'echo "done ran there" >&3', timeout=5)  # refuses timeout 60
    q2 = daemon("q2")
    blocker, ids = queued_behind_a_blocker(q)
    got = q.call("bulk", action="move", dest="q2", state="que", tag="moving")
    assert (got["count"], got["passed_over"]) == (0, MOVING), got
    write_gate(q.gate)
    assert [settle(q, i)["status"] for i in ids] == [f"ran m{n}" for n in range(MOVING)]
    assert sum(q2.call("counts")["counts"].values()) == 0
    settle(q, blocker)


def test_an_unreachable_queue_leaves_them_to_run_here(q, make_queue):
    make_queue("q3", 'echo "done ran there" >&3')  # installed, its daemon not started
    blocker, ids = queued_behind_a_blocker(q)
    began = time.monotonic()
    with pytest.raises(RQError, match="q3"):
        q.client().call("bulk", action="move", dest="q3", state="que", tag="moving")
    assert time.monotonic() - began < 10
    write_gate(q.gate)
    assert [settle(q, i)["status"] for i in ids] == [f"ran m{n}" for n in range(MOVING)]
    settle(q, blocker)


def test_one_riding_along_with_a_running_one_stays_here(q, make_queue, daemon):
    make_queue("q2", 'echo "done ran there" >&3')
    q2 = daemon("q2")
    blocker = send(q, param1="block")
    settle(q, blocker, states=("run",))
    # Given a rider: queued with the params of the one that starts next
    primary = send(q, param1="block", param2="2")
    rider = send(q, param1="block", tags=["moving"])
    write_gate(q.gate)
    settle(q, primary, states=("run",))
    wait_for(lambda: q.call("search", state="que", tag="moving")["total"] == 1,
             10, "the index to list the rider")
    # When it is moved, it is passed over: it ends with its primary here
    got = q.call("bulk", action="move", dest="q2", state="que", tag="moving")
    assert (got["count"], got["passed_over"]) == (0, 1), got
    write_gate(q.gate.with_name("gate2"))
    assert settle(q, rider)["status"].startswith("duplicate")
    assert sum(q2.call("counts")["counts"].values()) == 0, "a copy was made"


def test_a_prep_message_being_moved_takes_no_attachment_and_its_commit_waits(
        q, make_queue, daemon, tmp_path):
    make_queue("q2", 'echo "done ran there $RQ_PARAM1" >&3')
    q2 = daemon("q2")
    # Given a prep message whose bulk move is on its way to a frozen peer
    prep = q.call("create", msg={"param1": "p", "tags": ["moving"]}, state="prep")["msg_id"]
    wait_for(lambda: q.call("search", state="prep", tag="moving")["total"] == 1, 10, "indexed")
    payload = tmp_path / "payload.bin"
    payload.write_bytes(b"late data")
    answers: dict[str, object] = {}

    def commit() -> None:
        try:
            answers["commit"] = q.call("commit", msg_id=prep)
        except RQError as exc:
            answers["commit"] = exc
    with stopped(q2):
        mover = threading.Thread(target=lambda: answers.update(move=q.call(
            "bulk", action="move", dest="q2", state="prep", tag="moving")))
        mover.start()
        # When a file is attached meanwhile, Then it is refused
        wait_for(lambda: _refused_attach(q, prep, payload), 10, "the step to hold it")
        # When it is committed here meanwhile: the commit waits (it ran here and there)
        committer = threading.Thread(target=commit)
        committer.start()
        time.sleep(0.5)
        assert committer.is_alive() and "commit" not in answers
    mover.join(20)
    committer.join(20)
    # Then the move took it, the commit says it is gone here, and nothing ran here
    assert answers["move"]["count"] == 1, answers
    assert isinstance(answers["commit"], NotFound), answers
    assert q.call("counts")["counts"]["done"] == 0


def _refused_attach(q, msg_id, payload) -> bool:
    """An attach to a message being moved is refused (it was taken, and lost
    with the original)."""
    with open(payload, "rb") as f:
        try:
            q.call("attach", fds=[f.fileno()], msg_id=msg_id, name="late.bin",
                   md5="5b8e10e83a7a2c5b2b1a0a3b1d0ae3b1")
        except RQError as exc:
            return "being moved" in str(exc)
    return False
