"""The que's tail (rqsys.daemon.quetail): past its window a plain message stays on
disk only, and the order, the count and every client action come out as without it.
Real transitions over a real store, a window of 4 instead of 50,000."""

from __future__ import annotations

import time

import pytest
from daemon_util import drain

from rqsys import tunables
from rqsys.background import SYNC, Background
from rqsys.daemon.queload import QueLoad
from rqsys.daemon.scheduler import Schedule
from rqsys.daemon.transitions import Ledger, Transitions
from rqsys.errors import NotFound
from rqsys.life.moments import Moments
from rqsys.observe.events import EventLog
from rqsys.run.verdict import Outcome
from rqsys.store import QueueStore

WINDOW = 4


class Tailed:
    """Transitions over queue ``q`` whose que holds WINDOW plain messages in memory."""

    def __init__(self, layout, read=True):
        if not layout.queue_dir("q").exists():
            layout.create_queue_dir("q", {"name": "q", "script": "/bin/true"})
        self.store = QueueStore(layout.queue_dir("q"))
        self.background = Background()
        self.schedule = Schedule([], [])
        self.ledger = Ledger(self.store, self.schedule, EventLog("q", journal=False), Moments(),
                             WINDOW)
        self.t = Transitions(self.ledger,
                             lambda work, then: self.background.submit(work, then, SYNC))
        self.load = QueLoad(self.t)
        self.load.start()
        if read:
            self.load.read()

    def new(self, **fields):
        staged = self.store.stage({"dest": "q", "count": 0, "due": 0, **fields}, "que")
        self.store.publish([staged])
        self.t.placed([staged], "que")
        return staged.msg_id

    def run_all(self):
        """Start and end every runnable message, one at a time: the ids in start order."""
        order = []
        while (picked := self.t.start_next(time.time())) is not None:
            assert len(self.schedule) <= WINDOW + 2  # the tail's stay on disk
            order.append(picked[0])
            self.t.end(picked[0], Outcome("done", "fine"), written="")
        return order


@pytest.fixture
def tailed(layout):
    return Tailed(layout)


def test_past_the_window_plain_messages_wait_on_disk_and_run_in_order(tailed):
    ids = [tailed.new(param1=str(n)) for n in range(10)]
    # Only the window is in memory; the count is every one of them
    assert len(tailed.schedule) == WINDOW and tailed.ledger.count("que") == 10
    assert tailed.ledger.on_disk_only == 10 - WINDOW
    # and they start in the order they were made, each once
    assert tailed.run_all() == ids
    assert tailed.ledger.count("que") == 0 and tailed.ledger.count("done") == 10


def test_a_better_priority_goes_first_and_a_worse_one_waits_for_the_tail(tailed):
    plain = [tailed.new() for _ in range(8)]
    worse, better = tailed.new(priority=5), tailed.new(priority=-5)
    assert better in tailed.schedule and worse in tailed.schedule  # never in the tail
    assert tailed.run_all() == [better, *plain, worse]


def test_a_due_time_passed_sorts_after_the_plain_ones_as_without_a_tail(tailed):
    plain = [tailed.new() for _ in range(6)]
    was_due = tailed.new(due=time.time() - 60)
    assert tailed.run_all() == [*plain, was_due]


def test_a_tail_message_can_be_cancelled_run_now_and_deleted(tailed):
    ids = [tailed.new() for _ in range(10)]
    cancelled, rescheduled, deleted = ids[6], ids[7], ids[8]
    answers = []
    tailed.t.cancel(cancelled, "cancelled by test", answers.append)
    tailed.t.run_now(rescheduled, answers.append)
    tailed.t.removals.delete(deleted, answers.append)
    drain(tailed.background)
    assert answers == [None, None, None]
    assert tailed.store.find(cancelled) == "err" and tailed.ledger.count("err") == 1
    with pytest.raises(NotFound):
        tailed.store.find(deleted)
    assert tailed.ledger.count("que") == 8
    ran = tailed.run_all()
    assert sorted(ran) == sorted(set(ids) - {cancelled, deleted}) and len(ran) == 8


def test_a_start_reads_a_deep_que_into_the_window_and_its_tail(layout):
    first = Tailed(layout)
    ids = [first.new() for _ in range(9)]
    # When a new daemon starts on it (as after a crash: no snapshot)
    again = Tailed(layout)
    assert len(again.schedule) == WINDOW and again.ledger.count("que") == 9
    assert again.run_all() == ids


def test_while_messages_run_a_start_reads_que_only_a_little_ahead_of_them(layout,
                                                                          monkeypatch):
    # Given a que of 9 on disk and a daemon starting on it (read ahead: 3)
    first = Tailed(layout)
    ids = [first.new() for _ in range(9)]
    monkeypatch.setattr(tunables, "READ_AHEAD", 3)
    again = Tailed(layout, read=False)
    load = again.load
    # While nothing runs it reads; once one runs, only while fewer than 3 wait in memory
    assert again.ledger.wants_reading()
    load._read_one(again.ledger.next_unread())
    started = again.t.start_next(time.time())[0]
    assert started == ids[0] and again.ledger.running
    while again.ledger.wants_reading():
        load._read_one(again.ledger.next_unread())
    assert again.schedule.plain == 3 and again.ledger.unread == 5
    # and the count is every one of them, read or not; they run in order
    assert again.ledger.count("que") == 8
    again.t.end(started, Outcome("done", "fine"), written="")
    load.read()
    assert again.run_all() == ids[1:]
