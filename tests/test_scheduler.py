"""Unit tests of the in-memory que: due order, blocking keys, coalescing."""

from rqsys.scheduler import Schedule


def msg(due=0, **params):
    return {"dest": "q", "due": due, **params}


def test_due_order_and_not_yet_due():
    s = Schedule([], [])
    s.add("b", msg(due=5))
    s.add("a", msg(due=1))
    s.add("c", msg(due=50))
    assert s.pop_ready(10, set())[0] == "a"
    assert s.pop_ready(10, set())[0] == "b"
    assert s.pop_ready(10, set()) is None
    assert s.next_due() == 50 and len(s) == 1


def test_readd_and_remove_leave_no_stale_entries():
    s = Schedule([], [])
    s.add("a", msg(due=1))
    s.add("a", msg(due=100))  # re-timed (run_now / resend)
    assert s.pop_ready(10, set()) is None
    s.remove("a")
    assert s.next_due() is None and len(s) == 0


def test_blocking_keys_wait_and_release():
    s = Schedule([1], [])
    s.add("a1", msg(param1="a"))
    s.add("a2", msg(param1="a"))
    s.add("b1", msg(param1="b"))
    first = s.pop_ready(1, set())
    assert first[0] == "a1"
    assert s.pop_ready(1, {("a",)})[0] == "b1"
    assert s.pop_ready(1, {("a",), ("b",)}) is None
    s.release(("a",))
    assert s.pop_ready(1, set())[0] == "a2"


def test_coalesce_takes_identical_messages_whatever_their_due_time():
    # RQ's handle_dups: every queued message with the same coalesce params
    s = Schedule([], [1, 2])
    s.add("x1", msg(param1="x", param2="1"))
    s.add("x2", msg(param1="x", param2="1"))
    s.add("x3", msg(due=99, param1="x", param2="1"))
    s.add("y", msg(param1="x", param2="2"))
    running = s.pop_ready(1, set())
    assert [i for i, _m in s.take_coalesced(running[1])] == ["x2", "x3"]
    assert sorted(s.msgs) == ["y"] and s.next_due() == 0
    s.add("x3", msg(due=99, param1="x", param2="1"))  # back after a failed primary
    assert [i for i, _m in s.take_coalesced(running[1])] == ["x3"]


def test_single_que_match():
    s = Schedule([], [])
    s.add("a", msg(param1="p"))
    assert s.find_same_params(msg(param1="p")) == "a"
    assert s.find_same_params(msg(param1="q")) is None
