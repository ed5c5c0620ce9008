"""Unit tests of the daemon's ledger (rqsys.daemon.transitions) on a real
store in a temp dir: every transition moves the message on disk and in the
daemon's picture (que, running, counts) together, and refuses what it must."""

from __future__ import annotations

import json
import time

import pytest
from daemon_util import drain

from rqsys.background import SYNC, Background
from rqsys.daemon.queload import QueLoad
from rqsys.daemon.scheduler import Schedule
from rqsys.daemon.transitions import Ledger, Transitions
from rqsys.errors import BadRequest, InternalError, NotFound, StoreError
from rqsys.life.moments import Moments
from rqsys.observe.events import EventLog
from rqsys.run.verdict import Outcome
from rqsys.store import QueueStore


class World:
    """A Transitions over a fresh queue, with the background it offloads to."""

    def __init__(self, layout, coalesce=()):
        layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
        self.store = QueueStore(layout.queue_dir("q"))
        self.background = Background()
        self.schedule = Schedule([], list(coalesce))
        ledger = Ledger(self.store, self.schedule, EventLog("q", journal=False), Moments())
        self.t = Transitions(ledger,
                             lambda work, then: self.background.submit(work, then, SYNC))
        load = QueLoad(self.t)  # as a start: recovery, que/ listed, then read
        load.start()
        load.read()

    def new(self, state="que", **fields):
        staged = self.store.stage({"dest": "q", "count": 0, "due": 0, **fields}, state)
        self.store.publish([staged])
        self.t.placed([staged], state)
        return staged.msg_id

    def run(self, **fields):
        """A new message taken from que to run: (id, msg as it runs)."""
        msg_id = self.new(**fields)
        picked = self.t.start_next(time.time())
        assert picked is not None and picked[0] == msg_id
        return msg_id, picked[2]

    def where(self, msg_id):
        try:
            return self.store.find(msg_id)
        except NotFound:
            return "gone"


@pytest.fixture
def ledger(layout):
    return World(layout)


def test_new_messages_are_placed_in_que_or_prep(ledger):
    que, prep = ledger.new(), ledger.new("prep")
    assert (ledger.where(que), ledger.where(prep)) == ("que", "prep")
    assert que in ledger.schedule and prep not in ledger.schedule
    assert ledger.t.ledger.counts() == {"prep": 1, "que": 1, "run": 0, "done": 0, "err": 0,
                                 "relayed": 0}


def test_commit_moves_prep_to_que_and_answers_once_durable(ledger):
    msg_id = ledger.new("prep")
    answers = []
    ledger.t.commit(msg_id, answers.append)
    # The move is made at once, in memory and on disk; the answer waits for the sync
    assert ledger.where(msg_id) == "que" and msg_id in ledger.schedule
    assert ledger.t.ledger.count("prep") == 0 and answers == []
    drain(ledger.background)
    assert answers == [None]


def test_commit_of_a_message_not_in_prep_is_refused(ledger):
    msg_id = ledger.new()
    with pytest.raises(BadRequest, match="not prep"):
        ledger.t.commit(msg_id, print)


def test_start_moves_que_to_run_with_rqs_count(ledger):
    msg_id, msg = ledger.run()
    assert ledger.where(msg_id) == "run" and msg["count"] == 0  # RQ_COUNT 0: first run
    assert ledger.t.ledger.running == {msg_id: msg} and ledger.t.ledger.count("run") == 1
    assert ledger.t.ledger.count("que") == 0
    assert ledger.t.start_next(time.time()) is None


def test_a_message_not_due_is_not_started(ledger):
    ledger.new(due=time.time() + 3600)
    assert ledger.t.start_next(time.time()) is None


def test_unstart_puts_it_back_as_it_was(ledger):
    msg_id, _msg = ledger.run()
    ledger.t.unstart(msg_id, {"dest": "q", "count": 0, "due": 0}, "SCRIPTERROR: gone")
    assert ledger.where(msg_id) == "que" and ledger.schedule.msgs[msg_id]["count"] == 0
    assert ledger.store.read_status("que", msg_id) == "SCRIPTERROR: gone"
    assert ledger.t.ledger.running == {}


@pytest.mark.parametrize("state", ["done", "err", "relayed"])
def test_end_moves_run_to_its_final_state(ledger, state):
    msg_id, msg = ledger.run()
    ended = ledger.t.end(msg_id, Outcome(state, "said so"), written="")
    assert ended == [(msg_id, msg, Outcome(state, "said so"))]
    assert ledger.where(msg_id) == state and ledger.t.ledger.count(state) == 1
    assert ledger.store.read_status(state, msg_id) == "said so"
    assert ledger.store.read_msg(state, msg_id)["count"] == 0
    assert not (ledger.store.msg_dir(state, msg_id) / "count").exists()


def test_a_resend_that_hits_max_count_ends_with_the_raised_count(ledger):
    msg_id, _msg = ledger.run(count=2)
    ledger.t.end(msg_id, Outcome("err", "HIT MAX", recount=1), written="")
    assert ledger.store.read_msg("err", msg_id)["count"] == 3


def test_resend_is_busy_until_its_new_due_is_durable_then_queued(ledger):
    msg_id, _msg = ledger.run()
    before = time.time()
    assert ledger.t.end(msg_id, Outcome("que", "later", delay=60, recount=1),
                        written="later") == []
    # Still in run/ while its msg is rewritten: no client may move it meanwhile
    assert ledger.where(msg_id) == "run" and ledger.t.ledger.busy(msg_id)
    drain(ledger.background)
    assert ledger.where(msg_id) == "que" and not ledger.t.ledger.busy(msg_id)
    on_disk = ledger.store.read_msg("que", msg_id)
    assert on_disk["count"] == 1 and before + 59 < on_disk["due"] < time.time() + 61
    assert ledger.schedule.msgs[msg_id] == on_disk


def test_a_delete_of_a_message_being_requeued_waits_then_deletes_it(ledger):
    msg_id, _msg = ledger.run()
    ledger.t.end(msg_id, Outcome("que", "later", delay=60, recount=1), written="later")
    answers: list[BaseException | None] = []
    ledger.t.delete(msg_id, answers.append)
    assert answers == [] and ledger.where(msg_id) == "run"  # waits for the rewrite
    drain(ledger.background)
    drain(ledger.background)  # the delete itself, queued by the first
    assert answers == [None] and ledger.where(msg_id) == "gone"
    assert msg_id not in ledger.schedule.msgs and not ledger.t.ledger.busy(msg_id)


def test_a_run_now_of_a_message_being_requeued_makes_it_due_after_the_rewrite(ledger):
    msg_id, _msg = ledger.run()
    ledger.t.end(msg_id, Outcome("que", "later", delay=60, recount=1), written="later")
    answers: list[BaseException | None] = []
    ledger.t.run_now(msg_id, answers.append)
    drain(ledger.background)
    assert answers == [None] and ledger.schedule.msgs[msg_id]["due"] == 0
    assert ledger.store.read_msg("que", msg_id)["due"] == 0


def coalesced(layout, n=2):
    """A ledger whose first message runs with ``n`` riders (one due later) and one other."""
    ledger = World(layout, coalesce=[1])
    first = ledger.new(param1="x")
    riders = [ledger.new(param1="x", due=time.time() + 3600 * i) for i in range(n)]
    other = ledger.new(param1="y")
    picked = ledger.t.start_next(time.time())
    assert picked is not None and picked[0] == first
    ledger.t.coalesce(first, picked[2], f"http://h/q/q/{first}")
    return ledger, first, riders, other


@pytest.mark.parametrize("state", ["done", "relayed"])
def test_riders_end_as_duplicates_of_a_primary_that_succeeded(layout, state):
    ledger, first, riders, other = coalesced(layout)
    # Riders stay in que/ on disk (a crash leaves them queued), out of the que in memory
    assert [ledger.where(i) for i in riders] == ["que", "que"]
    assert ledger.t.ledger.busy(riders[1]).endswith(f"coalesced with {first}: destroy that one")
    assert list(ledger.schedule.msgs) == [other] and ledger.t.ledger.count("run") == 1
    ended = ledger.t.end(first, Outcome(state, "ran"), written="ran")
    assert [e[0] for e in ended] == [first, *riders]
    for rider in riders:
        assert ledger.where(rider) == state
        assert ledger.store.read_status(state, rider) == f"duplicate http://h/q/q/{first}"
    assert ledger.t.ledger.count(state) == 3 and list(ledger.schedule.msgs) == [other]


@pytest.mark.parametrize("outcome", [Outcome("err", "by design"),
                                     Outcome("que", "later", delay=8, recount=1),
                                     Outcome("deleted", "destroyed")])
def test_riders_of_a_primary_that_failed_wait_again_on_their_own(layout, outcome):
    ledger, first, riders, other = coalesced(layout)
    ended = ledger.t.end(first, outcome, written="")
    assert [e[0] for e in ended] == ([first] if outcome.state == "err" else [])
    drain(ledger.background)
    assert [ledger.where(i) for i in riders] == ["que", "que"]
    assert set(riders) | {other} <= set(ledger.schedule.msgs)
    assert ledger.t.ledger.count("done") == 0 and not ledger.t.ledger.busy(riders[0])


def test_riders_of_a_resent_primary_wait_for_it_and_take_it_along_next(layout):
    # RQ's resend coalesce: a rider already due must not start before the
    # resent primary is back in the que, or it would run without it
    ledger, first, riders, _other = coalesced(layout, n=1)
    ledger.t.end(first, Outcome("que", "later", delay=8, recount=1), written="")
    assert f"waiting for {first}" in ledger.t.ledger.busy(riders[0])
    assert riders[0] not in ledger.schedule.msgs
    drain(ledger.background)
    assert {first, riders[0]} <= set(ledger.schedule.msgs) and not ledger.t.ledger.busy(riders[0])
    taken = ledger.schedule.take_coalesced(ledger.schedule.msgs[riders[0]])
    assert first in [msg_id for msg_id, _msg in taken]


@pytest.mark.parametrize("state", ["prep", "que", "done"])
def test_delete(ledger, state):
    if state == "done":
        msg_id, _msg = ledger.run()
        ledger.t.end(msg_id, Outcome("done", "ok"), written="ok")
    else:
        msg_id = ledger.new(state)
    answers = []
    ledger.t.delete(msg_id, answers.append)
    # Gone at once from its state and from the counts; answered once durable
    assert ledger.where(msg_id) == "gone" and msg_id not in ledger.schedule
    assert ledger.t.ledger.count(state) == 0 and answers == []
    drain(ledger.background)
    assert answers == [None]
    assert [p.name for p in (ledger.store.qdir / ".tmp").iterdir()
            if p.name.startswith("deleted.")] == []


def test_a_running_message_is_not_deleted(ledger):
    msg_id, _msg = ledger.run()
    with pytest.raises(BadRequest, match="destroy it instead"):
        ledger.t.delete(msg_id, print)
    with pytest.raises(NotFound):
        ledger.t.delete("20200101.0000.00.000.0", print)


def test_run_now_is_out_of_the_que_until_durable(ledger):
    msg_id = ledger.new(due=time.time() + 3600)
    answers = []
    ledger.t.run_now(msg_id, answers.append)
    assert msg_id not in ledger.schedule and "rescheduled" in ledger.t.ledger.busy(msg_id)
    assert ledger.t.start_next(time.time()) is None
    drain(ledger.background)
    assert answers == [None] and ledger.schedule.msgs[msg_id]["due"] == 0
    assert ledger.store.read_msg("que", msg_id)["due"] == 0
    with pytest.raises(BadRequest, match="not queued"):
        ledger.t.run_now(ledger.new("prep"), print)


def test_prune_keeps_the_counts(ledger):
    ids = []
    for state in ("done", "err"):
        msg_id, _msg = ledger.run()
        ledger.t.end(msg_id, Outcome(state, "x"), written="x")
        ids.append(msg_id)
    (ledger.store.msg_dir("err", ids[1]) / "ack").write_text("")
    ledger.new("prep")
    answers: list[BaseException | None] = []
    removed = ledger.t.prune(time.time() + 86400, 0, 0, answers.append)
    assert removed == {"done": 1, "relayed": 0, "err": 1, "prep": 1}
    assert ledger.t.ledger.counts() == dict.fromkeys(("prep", "que", "run", "done", "err",
                                               "relayed"), 0)
    # Out of sight at once (renamed into .tmp/), removed for good off the loop
    assert all(ledger.where(i) == "gone" for i in ids) and answers == []
    tmp = ledger.store.qdir / ".tmp"
    assert any(p.name.startswith("deleted.") for p in tmp.iterdir())
    drain(ledger.background)
    assert answers == [None]
    assert not any(p.name.startswith("deleted.") for p in tmp.iterdir())


def test_load_requeues_runs_and_moves_unreadable_messages_to_err(layout):
    first = World(layout)
    running, _msg = first.run()
    broken = first.new()
    (first.store.msg_dir("que", broken) / "msg").write_text("{not json")
    # When a new daemon loads the same queue
    again = World(layout)
    assert again.where(running) == "que" and running in again.schedule
    assert again.store.read_msg("que", running)["count"] == 1  # the cut-short run counted
    assert again.where(broken) == "err" and again.t.ledger.count("err") == 1
    assert "unreadable" in again.store.read_status("err", broken)
    assert json.loads((again.store.msg_dir("que", running) / "msg").read_text())["dest"] == "q"


def test_a_transition_the_daemon_should_never_ask_for_is_a_bug(ledger):
    msg_id = ledger.new()
    with pytest.raises(InternalError, match="not running"):
        ledger.t.end(msg_id, Outcome("done", "x"), written="")
    with pytest.raises(InternalError, match="cannot go to done"):
        ledger.t.placed([], "done")


def test_a_retry_with_an_unreadable_message_moves_nothing(ledger):
    # Given two failed messages, the second's msg file damaged
    ok_id, bad_id = (ledger.run()[0] for _ in range(2))
    for msg_id in (ok_id, bad_id):
        ledger.t.end(msg_id, Outcome("err", "failed"), written="")
    (ledger.store.msg_dir("err", bad_id) / "msg").write_text("{torn")
    # When both are retried, Then the error names the file and nothing moved
    with pytest.raises(StoreError, match="unreadable message"):
        ledger.t.retries.retry([ok_id, bad_id], lambda _error: None)
    assert ledger.where(ok_id) == ledger.where(bad_id) == "err"
    assert ledger.t.ledger.count("err") == 2 and ok_id not in ledger.schedule.msgs
