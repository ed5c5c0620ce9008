"""Unit tests of admission by need: slots, budgets, GPU ids, ageing into a reservation."""

import pytest

from rqsys.daemon.gates import Gate
from rqsys.daemon.room import Room, as_limits, check_create, need_of
from rqsys.daemon.scheduler import Schedule
from rqsys.errors import BadRequest
from rqsys.run.resources import room_text

QUEUE = {"num_workers": 4, "budget": {"memory": "48G", "cpus": 16, "gpus": ["0", "1"]}}


def msg(n, slots=None, **needs):
    got = {"dest": "q", "due": 0, "param1": str(n)}
    if slots:
        got["slots"] = slots
    if needs:
        got["needs"] = needs
    return got


def schedule(config=QUEUE, reserve_after=60.0):
    return Schedule([], [], Gate.from_config({}), Room(config), reserve_after)


def start(s, now):
    picked = s.pop_ready(now)
    if picked is None:
        return None
    gpus = s.started(picked[0], picked[1], now)
    return picked[0], gpus


def test_slots_add_up_to_num_workers():
    s = schedule()
    s.add("big1", msg(1, slots=3))
    s.add("big2", msg(2, slots=3))
    s.add("small", msg(3))
    assert start(s, 1)[0] == "big1"
    # big2 does not fit beside big1; the small one does, and passes it
    assert start(s, 1)[0] == "small"
    assert start(s, 1) is None
    s.ended("big1", msg(1, slots=3))
    assert start(s, 2)[0] == "big2"


def test_gpus_are_handed_out_by_id_never_twice():
    s = schedule()
    for n in range(3):
        s.add(f"g{n}", msg(n, gpus=1))
    held = [start(s, 1), start(s, 1)]
    assert sorted(gpus[0] for _id, gpus in held) == ["0", "1"]
    assert start(s, 1) is None  # no GPU left
    s.ended(held[0][0], msg(0, gpus=1))
    assert start(s, 2) == ("g2", held[0][1])


def test_memory_and_cpus_sum_within_the_budget():
    s = schedule()
    s.add("a", msg(1, memory="40G"))
    s.add("b", msg(2, memory="10G"))
    s.add("c", msg(3, cpus=16))
    s.add("d", msg(4, cpus=1))
    assert [start(s, 1)[0] for _ in range(2)] == ["a", "c"]
    assert start(s, 1) is None  # b: 50G of 48G; d: 17 of 16 CPUs
    assert s.room.usage()["memory"] == {"used": 40 << 30, "total": 48 << 30}
    assert room_text(s.room.usage()) == "slots 2/4, memory 40G/48G, cpus 16/16, gpus none of 0,1"


def test_a_big_message_is_not_starved_by_a_stream_of_small_ones():
    # Given a 4-slot message behind a steady stream of 1-slot ones on 4 workers
    s = schedule(reserve_after=10)
    for n in range(4):
        s.add(f"s{n}", msg(n))
    running = [start(s, 0)[0] for _ in range(4)]
    s.add("big", msg(0, slots=4))
    now, n = 0.0, 4
    started_big = None
    while now < 60 and started_big is None:
        while len(running) < 4:
            n += 1
            s.add(f"s{n}", msg(n))
            got = start(s, now)
            if got is None:
                break
            if got[0] == "big":
                started_big = now
                break
            running.append(got[0])
        now += 1
        if running:  # one small one ends each second
            done = running.pop(0)
            s.ended(done, {"dest": "q"})
    # Then the small ones passed it only until it had waited reserve_after, then it ran
    assert started_big is not None and 10 <= started_big <= 15


def test_a_message_that_can_never_fit_blocks_nothing():
    # Given a reload shrank num_workers below a queued message's slots
    s = schedule({"num_workers": 4}, reserve_after=0)
    s.add("big", msg(0, slots=4))
    s.room.configure({"num_workers": 2})
    s.add("small", msg(1))
    # Then the small one starts, now and after the big one has waited long
    assert start(s, 100)[0] == "small"
    s.add("small2", msg(2))
    assert start(s, 200)[0] == "small2"
    assert "big" in s


@pytest.mark.parametrize("bad, field", [
    ({"slots": 5}, "slots"),
    ({"needs": {"memory": "49G"}}, "needs.memory"),
    ({"needs": {"cpus": 17}}, "needs.cpus"),
    ({"needs": {"gpus": 3}}, "needs.gpus"),
])
def test_needs_larger_than_the_queue_are_refused_naming_the_field(bad, field):
    with pytest.raises(BadRequest, match=f"^{field}: "):
        check_create({"dest": "q", **bad}, QUEUE)


def test_a_need_the_budget_does_not_name_is_refused():
    with pytest.raises(BadRequest, match="needs.gpus: the queue has no gpus in its budget"):
        check_create({"dest": "q", "needs": {"gpus": 1}}, {"num_workers": 2})


def test_needs_become_the_runs_limits():
    assert as_limits(msg(1, memory="12G", cpus=1.5)) == {"memory_max": "12G",
                                                         "cpu_quota": "150%"}
    assert need_of({"dest": "q"}) is need_of({"dest": "q", "param1": "x"})


def test_a_reload_that_grows_the_queue_lets_a_waiting_big_message_start():
    s = schedule({"num_workers": 2})
    s.add("m0", msg(0))
    s.add("m1", msg(1, slots=2))
    assert start(s, 1)[0] == "m0"
    assert start(s, 1) is None  # the 2-slot one waits for room
    s.reconfigure(Gate.from_config({}), [], [msg(0)], {"num_workers": 3})
    assert start(s, 2)[0] == "m1"


def test_one_message_of_a_need_competes_at_a_time_and_all_start_in_the_end():
    # Given many messages of a few needs, more than fit at once
    s = schedule(reserve_after=5)
    sizes = ["1G", "4G", "12G", "20G"]
    for n in range(200):
        s.add(f"m{n}", msg(n, memory=sizes[n % 4]))
    running, now, done = [], 0.0, 0
    while len(s) or running:
        while (got := start(s, now)) is not None:
            running.append(got[0])
        assert sum(int(sizes[int(i[1:]) % 4][:-1]) for i in running) <= 48
        assert running, f"nothing runs with {len(s)} queued"
        s.ended(running.pop(0), {"dest": "q"})
        done, now = done + 1, now + 1
    assert done == 200


def test_a_backlog_is_more_due_messages_than_free_workers_in_a_queue_of_four_or_more():
    s = schedule({"num_workers": 4})
    s.add("m0", msg(0))
    s.add("m1", msg(1))
    s.add("later", {**msg(9), "due": 100})  # not due: not waiting
    assert start(s, 1)[0] == "m0"
    assert not s.backlog()  # 1 due, 3 workers free: it starts at once
    for n in range(2, 7):
        s.add(f"m{n}", msg(n))
    start(s, 1)
    assert s.backlog()  # 5 due, 2 free: they wait for workers
    two = schedule({"num_workers": 2})
    for n in range(4):
        two.add(f"t{n}", msg(n))
    start(two, 1)
    assert not two.backlog()  # a queue of 2 workers: never (its exec waits do not hold it)
    start(s, 1)
    start(s, 1)
    assert s.backlog()  # 3 due, none free
