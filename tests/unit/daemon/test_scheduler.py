"""Unit tests of the in-memory que: due order, blocking keys, coalescing."""


from rqsys.daemon.gates import Gate
from rqsys.daemon.scheduler import Schedule
from rqsys.store.layout import arrival


def msg(due=0, **params):
    return {"dest": "q", "due": due, **params}


def test_due_order_and_not_yet_due():
    s = Schedule([], [])
    s.add("b", msg(due=5))
    s.add("a", msg(due=1))
    s.add("c", msg(due=50))
    assert s.pop_ready(10)[0] == "a"
    assert s.pop_ready(10)[0] == "b"
    assert s.pop_ready(10) is None
    assert s.next_due() == 50 and len(s) == 1


def test_readd_and_remove_leave_no_stale_entries():
    s = Schedule([], [])
    s.add("a", msg(due=1))
    s.add("a", msg(due=100))  # re-timed (run_now / resend)
    assert s.pop_ready(10) is None
    s.remove("a")
    assert s.next_due() is None and len(s) == 0


def test_blocking_keys_wait_and_release():
    s = Schedule([1], [])
    s.add("a1", msg(param1="a"))
    s.add("a2", msg(param1="a"))
    s.add("b1", msg(param1="b"))
    first = s.pop_ready(1)
    assert first[0] == "a1"
    s.started(first[0], first[1], 1)
    second = s.pop_ready(1)
    assert second[0] == "b1"
    s.started(second[0], second[1], 1)
    assert s.pop_ready(1) is None
    s.ended(first[0], first[1])
    assert s.pop_ready(1)[0] == "a2"


def test_concurrency_limit_two_by_param1():
    s = Schedule([], [], Gate.from_config({"concurrency": {"by": [1], "limit": 2}}))
    for n in range(4):
        s.add(f"a{n}", msg(param1="a"))
    s.add("b", msg(param1="b"))
    started = []
    for _ in range(3):
        started.append(s.pop_ready(1))
        s.started(started[-1][0], started[-1][1], 1)
    assert [i for i, _m in started] == ["a0", "a1", "b"]
    assert s.pop_ready(1) is None
    s.remove("a2")  # a parked one deleted: the next of its key takes its place
    s.ended(started[0][0], started[0][1])
    assert s.pop_ready(1)[0] == "a3"


def test_rate_limit_wakes_at_the_window_opening():
    s = Schedule([], [], Gate.from_config({"rate_limit": {"limit": 2, "per": 10}}))
    for n in range(3):
        s.add(f"m{n}", msg())
    for now in (100, 101):
        picked = s.pop_ready(now)
        s.started(picked[0], picked[1], now)
    assert s.pop_ready(102) is None
    assert s.next_due() == 110  # the loop's timeout: no polling
    assert s.pop_ready(109.9) is None
    assert s.pop_ready(110)[0] == "m2"


def test_waiting_for_dependencies_until_unheld():
    s = Schedule([], [])
    s.add("w", msg())
    s.after.add("w")
    assert s.pop_ready(1) is None and s.next_due() is None
    s.unhold("w")
    assert s.pop_ready(1)[0] == "w"


def test_a_waiting_message_does_not_ride_along_with_a_coalesced_run():
    s = Schedule([], [1])
    s.add("run", msg(param1="x"))
    s.add("waits", msg(param1="x"))
    s.after.add("waits")
    running = s.pop_ready(1)
    assert running[0] == "run" and s.take_coalesced(running[1]) == []
    assert "waits" in s


def test_coalesce_takes_identical_messages_whatever_their_due_time():
    # RQ's handle_dups: every queued message with the same coalesce params
    s = Schedule([], [1, 2])
    s.add("x1", msg(param1="x", param2="1"))
    s.add("x2", msg(param1="x", param2="1"))
    s.add("x3", msg(due=99, param1="x", param2="1"))
    s.add("y", msg(param1="x", param2="2"))
    running = s.pop_ready(1)
    assert [i for i, _m in s.take_coalesced(running[1])] == ["x2", "x3"]
    assert sorted(s.msgs) == ["y"] and s.next_due() == 0
    s.add("x3", msg(due=99, param1="x", param2="1"))  # back after a failed primary
    assert [i for i, _m in s.take_coalesced(running[1])] == ["x3"]


def test_single_que_match():
    s = Schedule([], [])
    s.add("a", msg(param1="p"))
    assert s.find_same_params(msg(param1="p")) == "a"
    assert s.find_same_params(msg(param1="q")) is None


def test_a_reload_counts_the_running_in_the_new_gate_and_keeps_rate_windows():
    s = Schedule([], [], Gate.from_config({"rate_limit": {"limit": 1, "per": 10}}))
    for name in ("a", "b", "c"):
        s.add(name, msg(param1="x"))
    running = s.pop_ready(100)
    s.started(running[0], running[1], 100)
    assert s.pop_ready(101) is None  # b parked until 110
    # When the config becomes concurrency 1 by param1, same rate limit
    s.reconfigure(Gate.from_config({"concurrency": {"by": [1], "limit": 1},
                                    "rate_limit": {"limit": 1, "per": 10}}), [],
                  [running[1]], {"num_workers": 4})
    # Then b waits (a runs, and the window of its start is kept)
    assert s.pop_ready(105) is None
    s.ended(running[0], running[1])
    # and once a ended, the window of its start holds b until 110
    assert s.pop_ready(105) is None and s.next_due() == 110
    assert s.pop_ready(110)[0] == "b"


def test_the_que_tab_order_stays_right_through_starts_retries_and_removals():
    # Given a que listed once (its order sorted), then changed every way
    s = Schedule([], [])
    for n in range(20):
        s.add(f"20261128.0100.00.000.{n}", msg())
    assert s.ordered_ids(0, 3) == [f"20261128.0100.00.000.{n}" for n in range(3)]
    started = [s.pop_ready(10)[0] for _ in range(5)]  # the first five run
    s.remove("20261128.0100.00.000.9")  # one deleted
    s.add("20261128.0100.00.000.7", msg())  # one taken out and put back unchanged
    s.add("20261128.0100.00.000.8", msg(priority=-1))  # one re-keyed: it goes first
    s.add("20261128.0100.00.001.0", msg())  # a new one: last
    # Then the listing is the que as it is, each id once, in run order, at any offset
    want = sorted(s.msgs, key=lambda i: (s.msgs[i].get("priority") or 0, arrival(i)))
    assert started == [f"20261128.0100.00.000.{n}" for n in range(5)]
    assert s.ordered_ids() == want and want[0] == "20261128.0100.00.000.8"
    assert s.ordered_ids(4, 3) == want[4:7] and len(want) == 15
    # and after more removals than the pass needs, still
    for msg_id in want[:10]:
        s.remove(msg_id)
    assert s.ordered_ids() == want[10:]


def test_messages_made_in_one_millisecond_run_in_the_order_made():
    # Given 25 ids made in one millisecond (a bulk send): their counters 0..24, where a
    # string sort puts "….10" before "….2" (they ran 0-1, 10-19, 2, 20-24, 3-9 before)
    ids = [f"20261128.0100.00.000.{n}" for n in range(25)]
    s = Schedule([], [])
    for msg_id in reversed(ids):
        s.add(msg_id, msg())
    # Then the que lists them in that order, and they start in it
    assert s.ordered_ids() == ids
    assert [s.pop_ready(1)[0] for _ in ids] == ids


def test_the_que_is_listed_in_run_order():
    s = Schedule([], [])
    s.add("20261128.0100.00.000.1", msg(due=5))
    s.add("20261128.0100.00.000.2", msg(priority=-1, due=9))
    s.add("20261128.0100.00.000.3", msg())
    s.add("20261128.0100.00.001.0", msg())
    order = s.ordered_ids()
    assert order == ["20261128.0100.00.000.2", "20261128.0100.00.000.3",
                     "20261128.0100.00.001.0", "20261128.0100.00.000.1"]
    assert [s.pop_ready(10)[0] for _ in order] == order


def test_the_run_order_is_kept_through_adds_and_removes_once_asked():
    import random

    rng = random.Random(7)
    s = Schedule([], [])
    ids = [f"20261128.0100.00.{ms:03d}.{n}" for ms in range(3) for n in range(12)]
    for msg_id in ids[:20]:
        s.add(msg_id, msg(due=rng.choice([0, 5]), priority=rng.choice([0, 0, -1])))
    s.ordered_ids()  # sorted once; kept in order from here on
    for msg_id in ids[20:]:
        s.add(msg_id, msg(due=rng.choice([0, 5])))
    for msg_id in rng.sample(ids, 10):
        s.remove(msg_id)
    s.add(ids[0], msg(due=9))  # re-timed
    fresh = Schedule([], [])
    for msg_id, m in s.msgs.items():
        fresh.add(msg_id, m)
    assert s.ordered_ids() == fresh.ordered_ids() and len(s.ordered_ids()) == len(s)
    assert s.ordered_ids(2, 3) == fresh.ordered_ids()[2:5]
