"""Admission by need through a real daemon: slots, a memory/CPU/GPU budget, no starvation.

Each script appends its start and end times (and what it holds) to a log;
the tests check from those times, as a user would, that the running set
never exceeded what the queue has."""

from __future__ import annotations

import random
import time

import pytest
from conftest import wait_for
from daemon_util import rq, send, settle

from rqsys.errors import BadRequest

SCRIPT = """\
echo "start $RQ_MSG_ID $(date +%s.%N) ${RQ_GPUS-} ${CUDA_VISIBLE_DEVICES-}" >> {log}
sleep "$RQ_PARAM1"
echo "end $RQ_MSG_ID $(date +%s.%N)" >> {log}
echo "done ok" >&3
"""


def runs(log):
    """id -> (start, end, gpu ids, CUDA_VISIBLE_DEVICES) from the scripts' log."""
    got: dict[str, list] = {}
    for line in log.read_text().splitlines():
        words = line.split(" ")
        if words[0] == "start":
            got[words[1]] = [float(words[2]), None, words[3], words[4]]
        else:
            got[words[1]][1] = float(words[2])
    return got


def peak(intervals, weight):
    """The most that ``weight`` of the runs added up to at any one time."""
    edges = sorted([(start, 1, i) for i, (start, _e) in intervals.items()]
                   + [(end, 0, i) for i, (_s, end) in intervals.items()])  # ends first
    now = top = 0.0
    for _t, starting, i in edges:
        now += weight[i] if starting else -weight[i]
        top = max(top, now)
    return top


def test_two_three_slot_messages_never_overlap_and_a_one_slot_runs_beside(
        tmp_path, make_queue, daemon):
    log = tmp_path / "runs.log"
    make_queue("q", SCRIPT.replace("{log}", str(log)), num_workers=4)
    proc = daemon("q")
    big = [send(proc, param1="1", slots=3) for _ in range(2)]
    small = [send(proc, param1="0.4") for _ in range(4)]
    for msg_id in big + small:
        assert settle(proc, msg_id, timeout=30)["state"] == "done"
    got = runs(log)
    (a0, a1), (b0, b1) = (got[i][:2] for i in big)
    assert a1 <= b0 or b1 <= a0  # never at once
    beside = [i for i in small if got[i][0] < a1 and got[i][1] > a0 or
              got[i][0] < b1 and got[i][1] > b0]
    assert beside  # a 1-slot message ran beside a 3-slot one
    slots = {i: 3 if i in big else 1 for i in got}
    assert peak({i: got[i][:2] for i in got}, slots) <= 4


def test_mixed_needs_never_exceed_the_budget_and_all_finish(tmp_path, make_queue, daemon):
    # Given a queue with 4 workers, 6G of memory, 3 CPUs and three (fake) GPUs
    log = tmp_path / "runs.log"
    make_queue("q", SCRIPT.replace("{log}", str(log)), num_workers=4,
               budget={"memory": "6G", "cpus": 3, "gpus": ["a", "b", "c"]})
    proc = daemon("q")
    rng = random.Random(7)
    wants = {}
    for _ in range(200):
        needs = {"memory": f"{rng.choice([1, 2, 3])}G"}
        if rng.random() < 0.5:
            needs["cpus"] = rng.choice([0.5, 1, 2])
        if rng.random() < 0.4:
            needs["gpus"] = rng.choice([1, 2])
        wants[send(proc, param1="0.05", slots=rng.choice([1, 1, 2]), needs=needs)] = needs
    # While they run, what the daemon says is held stays within the budget
    room = proc.call("counts")["room"]
    assert room["memory"]["total"] == 6 << 30 and room["memory"]["used"] <= 6 << 30
    for msg_id in wants:
        assert settle(proc, msg_id, timeout=120)["state"] == "done"
    got = runs(log)
    spans = {i: got[i][:2] for i in got}
    assert peak(spans, {i: int(wants[i]["memory"][0]) for i in got}) <= 6
    assert peak(spans, {i: wants[i].get("cpus", 0) for i in got}) <= 3
    for i, (start, end, gpus, cuda) in got.items():
        held = gpus.split(",") if gpus else []
        assert cuda == gpus and len(held) == wants[i].get("gpus", 0)
        for j, (start2, end2, gpus2, _c) in got.items():
            if j != i and start < end2 and start2 < end:  # ran at once: no id shared
                assert not set(held) & set(gpus2.split(",") if gpus2 else [])


def test_a_big_message_waits_only_reserve_after_behind_small_ones(tmp_path, make_queue, daemon):
    # Given 2 workers kept busy by a stream of small messages, and a 2-slot one
    log = tmp_path / "runs.log"
    make_queue("q", SCRIPT.replace("{log}", str(log)), num_workers=2, reserve_after=1)
    proc = daemon("q")
    for _ in range(2):
        send(proc, param1="0.5")
    sent_at = time.time()  # the scripts log wall-clock times
    big = send(proc, param1="0.1", slots=2)
    sent = time.monotonic()
    while time.monotonic() - sent < 8 and proc.call("status", msg_id=big)["state"] == "que":
        send(proc, param1="0.5")
        time.sleep(0.15)
    # Then it ran within reserve_after and the runs' drain, small ones passing it before
    assert settle(proc, big, timeout=10)["state"] == "done"
    got = runs(log)
    waited = got[big][0] - sent_at  # a busy host delays a script's line, never the reserve
    passed = [i for i in got if i != big and got[i][0] < got[big][0]]
    assert 1 <= waited < 4 and len(passed) > 2


@pytest.mark.parametrize(("msg", "words"), [
    ({"slots": 3}, "slots: 3 is more than the queue's num_workers (2)"),
    ({"slots": 0}, "slots"),
    ({"needs": {"memory": "5G"}}, "needs.memory: 5G is more than the queue's budget (4G)"),
    ({"needs": {"gpus": 1}}, "needs.gpus: the queue has no gpus in its budget"),
    ({"needs": {"memory": "lots"}}, "needs"),
])
def test_needs_that_cannot_fit_are_refused_at_create(make_queue, daemon, msg, words):
    make_queue("q", "echo done >&3", num_workers=2, budget={"memory": "4G"})
    proc = daemon("q")
    with pytest.raises(BadRequest, match=words.replace("(", r"\(").replace(")", r"\)")):
        proc.call("create", msg=msg)
    assert wait_for(lambda: sum(proc.call("counts")["counts"].values()) == 0)


def test_rq_sends_slots_and_needs_and_stats_shows_the_room(layout, make_queue, daemon):
    make_queue("q", 'while [ ! -e "$RQ_MSG_DIR/../../../go" ]; do sleep 0.05; done; '
               'echo "done $RQ_GPUS" >&3', num_workers=3,
               budget={"memory": "8G", "cpus": 4, "gpus": ["g0", "g1"]})
    proc = daemon("q")
    url = rq(layout, "sendmesg", "--dest", "q", "--slots", "2", "--need", "memory=3G",
             "--need", "cpus=1.5", "--need", "gpus=1")
    msg_id = url.rsplit("/", 1)[1]
    wait_for(lambda: proc.call("status", msg_id=msg_id)["state"] == "run")
    assert proc.call("get", msg_id=msg_id)["msg"]["needs"] == {"memory": "3G", "cpus": 1.5,
                                                                "gpus": 1}
    assert "room: slots 2/3, memory 3G/8G, cpus 1.5/4, gpus g0 of g0,g1" in \
        rq(layout, "stats", "q").splitlines()
    (layout.queue_dir("q") / "go").write_text("")
    assert settle(proc, msg_id) == {"ok": True, "state": "done", "status": "g0"}


@pytest.mark.parametrize(("args", "words"), [
    (["--need", "disk=3G"], "--need disk=3G: say memory=SIZE, cpus=N or gpus=N"),
    (["--need", "gpus=two"], "--need gpus=two: 'two' is not a number"),
    (["--need", "memory=9G"], "needs.memory: 9G is more than the queue's budget (8G)"),
    (["--slots", "4"], "slots: 4 is more than the queue's num_workers (3)"),
])
def test_rq_refuses_bad_needs_with_a_clear_line(layout, make_queue, daemon, args, words):
    make_queue("q", "echo done >&3", num_workers=3, budget={"memory": "8G"})
    proc = daemon("q")
    out = rq(layout, "sendmesg", "--dest", "q", *args, code=1)
    assert words in out
    assert sum(proc.call("counts")["counts"].values()) == 0


def test_a_bulk_send_refuses_the_one_that_cannot_fit_alone(layout, make_queue, daemon):
    make_queue("q", "echo done >&3", num_workers=2)
    proc = daemon("q")
    got = proc.call("create_many", msgs=[{"slots": 2}, {"slots": 3}, {}])["results"]
    assert "msg_id" in got[0] and "msg_id" in got[2]
    assert "slots: 3 is more than the queue's num_workers (2)" in got[1]["error"]
    for result in (got[0], got[2]):
        assert settle(proc, result["msg_id"])["state"] == "done"
