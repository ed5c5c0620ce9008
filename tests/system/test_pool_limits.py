"""A pool queue's limits hold across its hosts (issue 34 item 5): two hosts,
each in its own network namespace with ``rqsys serve``, work pool queues
on one real nats-server (in a third namespace), and the scripts record when
they start and end.

* ``concurrency: {limit: 2}``: 12 messages of 1 s never run three at once
  over both hosts, both run some, and all end done;
* ``concurrency: {by: [1], limit: 1}`` over two params: never two of one
  param at once, the other param's messages pass meanwhile;
* ``rate_limit: {limit: 2, per: 2}``: never more than two starts in any 2 s;
* host b SIGKILLed (every process of its namespace) while it holds both
  places of a limit: host a starts the messages waiting for them within
  ``ack_wait`` and a poll, never more than two at once, all end done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from nats_util import nats_available
from netns import NetLab, Rqsys, netns_available
from pool_lab import one_nats, pool_host, stop_namespace

from rqsys.observe import timeline
from rqsys.store import QueueStore

HOSTS = ("a", "b")
ACK_WAIT = 4  # seconds: a dead host's places come back within this (and a poll)
POLL = 0.5  # rqsys.pool.admission.POLL
SCRIPT = """#!/bin/bash
echo "start $(date +%s.%N) $RQ_MSG_ID" >> "$RUNLOG"
sleep "${RQ_PARAM2:-1}"
echo "end $(date +%s.%N) $RQ_MSG_ID" >> "$RUNLOG"
echo "done ran" >&3
"""
QUEUES: dict[str, dict[str, Any]] = {
    "cq": {"concurrency": {"limit": 2}},
    "bq": {"concurrency": {"by": [1], "limit": 1}},
    "rq": {"rate_limit": {"limit": 2, "per": 2}},
    "kq": {"concurrency": {"limit": 2}},
}


class Lab:
    def __init__(self, lab: NetLab, hosts: dict[str, Rqsys], base: Path) -> None:
        self.lab, self.hosts, self.base = lab, hosts, base

    def send(self, queue: str, count: int, **fields: Any) -> list[str]:
        a = self.hosts["a"]
        return [a.call(queue, "create", msg={"dest": queue, **fields})["msg_id"]
                for _ in range(count)]

    def runs(self, host: str, queue: str, killed_at: float | None = None
             ) -> dict[str, list[float]]:
        """id -> [start, end] of each run the host's scripts began (end: the
        kill's time for a run killed, else inf)."""
        path = self.base / host / f"{queue}.log"
        runs: dict[str, list[float]] = {}
        for line in (path.read_text().splitlines() if path.exists() else []):
            what, at, msg_id = line.split()
            if what == "start":
                runs[msg_id] = [float(at), killed_at or float("inf")]
            else:
                runs[msg_id][1] = float(at)
        return runs

    def done(self, queue: str, host: str) -> set[str]:
        return set(QueueStore(self.hosts[host].layout.queue_dir(queue)).ids("done"))

    def all_done(self, queue: str, ids: list[str], hosts: tuple[str, ...] = HOSTS) -> bool:
        return set(ids) <= set().union(*(self.done(queue, h) for h in hosts))

    def started_at(self, queue: str, host: str, msg_id: str) -> float:
        """The daemon's own start of a run (its timeline), not the script's."""
        store = QueueStore(self.hosts[host].layout.queue_dir(queue))
        return float(next(e["t"] for e in timeline.read(store.msg_dir("done", msg_id))
                          if e["ev"] == "started"))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    need(netns_available(), "network namespaces need root and iproute2")
    need(nats_available(), "nats-server (Debian package nats-server)")
    base = tmp_path_factory.mktemp("limits")
    net = NetLab()
    hosts: dict[str, Rqsys] = {}
    try:
        nats = one_nats(net, base, HOSTS)
        hosts = {name: _host(net, name, base, nats) for name in HOSTS}
        for host in hosts.values():
            host.start(wait_queues=())
        for host in hosts.values():
            for queue in QUEUES:
                wait_for(lambda h=host, q=queue: h.pingable(q), 60, f"{queue} on {host.host}")
        yield Lab(net, hosts, base)
    finally:
        for host in hosts.values():
            host.stop()
        net.close()


def _host(net: NetLab, name: str, base: Path, nats: str) -> Rqsys:
    return pool_host(net, name, base, nats, {queue: (SCRIPT, {
        "num_workers": 3, "env_vars": {"RUNLOG": str(base / name / f"{queue}.log")},
        "pool": {"name": queue, "replicas": 1, "ack_wait": ACK_WAIT}, **limits})
        for queue, limits in QUEUES.items()})


def most_at_once(intervals: list[list[float]]) -> int:
    """The most intervals open at one time (an end before a start at the same time)."""
    edges = sorted([(s, 1) for s, _e in intervals] + [(e, -1) for _s, e in intervals])
    running = most = 0
    for _at, step in edges:
        running += step
        most = max(most, running)
    return most


def test_concurrency_limit_holds_across_two_hosts(lab: Lab) -> None:
    # Given pool queue cq on hosts a and b, concurrency {limit: 2}, 3 workers each
    # When 12 messages of 1 s are sent
    began = time.monotonic()
    ids = lab.send("cq", 12, param2="1")
    # Then all end done
    wait_for(lambda: lab.all_done("cq", ids), 60, "12 messages done")
    took = time.monotonic() - began
    runs = {h: lab.runs(h, "cq") for h in HOSTS}
    # And each ran once, both hosts ran some
    assert sorted(i for r in runs.values() for i in r) == sorted(ids)
    assert all(runs.values()), {h: len(r) for h, r in runs.items()}
    # And never three at once over both hosts (twice at once: the limit is used)
    assert most_at_once([iv for r in runs.values() for iv in r.values()]) == 2
    print(f"per host: { {h: len(r) for h, r in runs.items()} }, {took:.1f} s")


def test_concurrency_by_params_holds_and_lets_others_pass(lab: Lab) -> None:
    # Given pool queue bq: concurrency {by: [1], limit: 1}
    # When 4 messages of param x (1 s each) and then 4 of param y are sent
    xs = lab.send("bq", 4, param1="x", param2="1")
    ys = lab.send("bq", 4, param1="y", param2="1")
    wait_for(lambda: lab.all_done("bq", xs + ys), 60, "8 messages done")
    runs = {i: iv for h in HOSTS for i, iv in lab.runs(h, "bq").items()}
    # Then never two of one param at once, over both hosts
    assert most_at_once([runs[i] for i in xs]) == 1
    assert most_at_once([runs[i] for i in ys]) == 1
    # And the y messages did not wait for all the x ones (another param passes)
    assert min(runs[i][0] for i in ys) < max(runs[i][0] for i in xs)


def test_rate_limit_holds_across_two_hosts(lab: Lab) -> None:
    # Given pool queue rq: rate_limit {limit: 2, per: 2}
    # When 8 short messages are sent
    ids = lab.send("rq", 8, param2="0.1")
    wait_for(lambda: lab.all_done("rq", ids), 60, "8 messages done")
    starts = sorted(lab.started_at("rq", h, i) for h in HOSTS for i in lab.done("rq", h)
                    if i in ids)
    assert len(starts) == 8
    # Then no 2 s window holds more than 2 starts (the daemon's own start times;
    # 10 ms for the stamps' rounding and the start event's lag behind the spawn)
    for first in starts:
        assert sum(first <= s < first + 2 - 0.01 for s in starts) <= 2, starts
    # And the limit was used, not starved: 8 starts took at most 4 windows and a bit
    assert starts[-1] - starts[0] < 3 * 2 + 4, starts


def test_places_of_a_killed_host_come_back_within_ack_wait(lab: Lab) -> None:
    a = lab.hosts["a"]
    # Given host b runs two long messages of kq (concurrency {limit: 2}): both places
    a.call("kq", "adminoper", oper="pause")
    time.sleep(1.5)  # a's last pull out has ended
    long = lab.send("kq", 2, param2="6")
    wait_for(lambda: len(lab.runs("b", "kq")) == 2, 30, "b runs both long messages")
    # And four short ones wait for places on a
    a.call("kq", "adminoper", oper="resume")
    short = lab.send("kq", 4, param2="1")
    time.sleep(1.5)
    assert not lab.runs("a", "kq")  # the limit holds them
    # When every process of b's namespace is killed (its scripts too)
    killing = time.time()
    for pid in stop_namespace(lab.lab.ns("b")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed = time.time()
    # Then all end done on a
    wait_for(lambda: lab.all_done("kq", long + short, ("a",)), 60, "all done on a")
    on_a = lab.runs("a", "kq")
    # And a started the first within ack_wait (b's last word) and a poll or so
    first = min(s for s, _e in on_a.values())
    assert first - killing < ACK_WAIT + 4 * POLL, first - killing
    # And never more than two at once, b's runs counted until the kill
    on_b = lab.runs("b", "kq", killed_at=killed)
    assert most_at_once([*on_a.values(), *on_b.values()]) <= 2
    print(f"first start on a {first - killing:.2f} s after the kill")

