"""A batch whose members are in a pool queue (issue 34 item 3): two hosts,
each in its own network namespace with ``rqsys serve``, work pool queue
``bp`` on one real nats-server (a third namespace); the batch is made on
host a, whose callback queue ``cb`` is local to it, and most members run on
host b (a has 1 worker, b 3).

* 40 members, 3 of them failing: b's ends reach a's batch through the
  pool's bucket, and a's ``cb`` gets ``on_err`` once, with the counts;
* a's queue daemon killed, and its restart held back (``rqsys serve``
  stopped), while b ends members: the ends wait in the bucket, and once a's
  daemon is back the batch completes, with one ``on_done``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from daemon_util import rq
from nats_util import nats_available
from netns import NetLab, Rqsys, netns_available
from pool_lab import one_nats, pool_host

from rqsys.store import QueueStore

HOSTS = ("a", "b")
MEMBER = """#!/bin/bash
echo "$RQ_MSG_ID" >> "$RUNLOG"
sleep "${RQ_PARAM2:-0.2}"
[ "$RQ_PARAM1" = fail ] && { echo "err asked to" >&3; exit 0; }
echo "done ran" >&3
"""
CALLBACK = """#!/bin/bash
part="$OUT/.part.$RQ_MSG_ID"
cat "$RQ_MSG_DIR/../msg" > "$part" && mv "$part" "$OUT/called.$RQ_MSG_ID"
echo "done called" >&3
"""


class Lab:
    def __init__(self, net: NetLab, hosts: dict[str, Rqsys], base: Path) -> None:
        self.net, self.hosts, self.base = net, hosts, base

    def batch(self, body: dict[str, Any], name: str) -> str:
        path = self.base / f"{name}.json"
        path.write_text(json.dumps(body))
        out = rq(self.hosts["a"].layout, "batch", "--file", str(path))
        assert out.startswith("ok http://"), out
        return out.rsplit("/", 1)[1]

    def status(self, bid: str) -> str:
        return rq(self.hosts["a"].layout, "batchstatus", "--batch", bid)

    def ran(self, host: str) -> set[str]:
        path = self.base / host / "bp.log"
        return set(path.read_text().split()) if path.exists() else set()

    def ended(self, host: str, ids: set[str]) -> set[str]:
        store = QueueStore(self.hosts[host].layout.queue_dir("bp"))
        return (set(store.ids("done")) | set(store.ids("err"))) & ids

    def callbacks(self, bid: str) -> list[dict[str, Any]]:
        made = [json.loads(p.read_text()) for p in sorted((self.base / "out").glob("called.*"))]
        return [m for m in made if m["batch_of"]["id"] == bid]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    need(netns_available(), "network namespaces need root and iproute2")
    need(nats_available(), "nats-server (Debian package nats-server)")
    base = tmp_path_factory.mktemp("poolbatch")
    (base / "out").mkdir()
    net = NetLab()
    hosts: dict[str, Rqsys] = {}
    try:
        nats = one_nats(net, base, HOSTS)
        hosts = {name: _host(net, name, base, nats) for name in HOSTS}
        for host in hosts.values():
            host.start(wait_queues=())
        for host in hosts.values():
            wait_for(lambda h=host: h.pingable("bp"), 60, f"bp on {host.host}")
        wait_for(lambda: hosts["a"].pingable("cb"), 60, "cb on a")
        yield Lab(net, hosts, base)
    finally:
        for host in hosts.values():
            host.stop()
        net.close()


def _host(net: NetLab, name: str, base: Path, nats: str) -> Rqsys:
    queues = {"bp": (MEMBER, {"num_workers": 1 if name == "a" else 3,
                              "env_vars": {"RUNLOG": str(base / name / "bp.log")},
                              "pool": {"name": "bp", "replicas": 1, "ack_wait": 4}})}
    if name == "a":
        queues["cb"] = (CALLBACK, {"env_vars": {"OUT": str(base / "out")}})
    return pool_host(net, name, base, nats, queues)


def test_ends_on_another_host_complete_the_batch(lab: Lab) -> None:
    # Given a batch on host a of 40 members in pool queue bp, 3 of them failing
    body = {"messages": [{"dest": "bp", "param1": "fail" if n % 13 == 5 else str(n)}
                         for n in range(40)],
            "on_done": {"dest": "cb", "param1": "all done"},
            "on_err": {"dest": "cb", "param1": "some failed"}}
    bid = lab.batch(body, "forty")
    # When they run, most on host b
    made = wait_for(lambda: lab.callbacks(bid), 120, "the batch's callback")
    # Then a's batch heard of every end: on_err once, with the counts
    assert [m["param1"] for m in made] == ["some failed"]
    assert made[0]["batch_of"] == {"id": bid, "total": 40, "done": 37, "err": 3,
                                   "relayed": 0, "gone": 0}
    assert lab.status(bid).startswith("ok 40/40 done 37 err 3 relayed 0 gone 0 callback http")
    members = {line.split()[0] for line in
               (lab.hosts["a"].layout.batches / bid / "members.bp").read_text().splitlines()}
    assert len(members) == 40
    on_b = lab.ended("b", members)
    assert len(on_b) >= 10, on_b  # b has 3 workers to a's 1
    assert lab.ended("a", members) | on_b == members
    # and nothing more comes: no second callback
    time.sleep(2)
    assert len(lab.callbacks(bid)) == 1


def test_ends_wait_in_the_pool_while_the_makers_daemon_is_down(lab: Lab) -> None:
    a = lab.hosts["a"]
    assert a.proc is not None
    body = {"messages": [{"dest": "bp", "param1": str(n), "param2": "0.5"} for n in range(24)],
            "on_done": {"dest": "cb", "param1": "all done"}}
    bid = lab.batch(body, "held")
    members = set((a.layout.batches / bid / "members.bp").read_text().split())
    # When a's queue daemon is killed and rqsys serve (which would restart it) is stopped
    wait_for(lambda: lab.ran("b") & members, 30, "a member running on b")
    pid = a.call("bp", "ping")["pid"]
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        os.kill(pid, signal.SIGKILL)
        # while b ends every member (a's one in hand comes to b after ack_wait)
        wait_for(lambda: lab.ended("b", members) == members - lab.ended("a", members), 120,
                 "b to end the members")
        time.sleep(1)
        assert not lab.callbacks(bid)
        assert lab.status(bid).split()[1] != "24/24"  # the ends wait in the bucket
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    # Then once a's daemon is back, the batch completes: one on_done, with every end
    made = wait_for(lambda: lab.callbacks(bid), 120, "the batch's callback")
    assert [m["param1"] for m in made] == ["all done"]
    assert made[0]["batch_of"] == {"id": bid, "total": 24, "done": 24, "err": 0,
                                   "relayed": 0, "gone": 0}
    time.sleep(2)
    assert len(lab.callbacks(bid)) == 1
