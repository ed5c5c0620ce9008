"""A pool queue worked by three hosts, each in its own network namespace
with its own clustered nats-server (JetStream, R3) and ``rqsys serve``.

Messages are sent on host a; every host runs some; each runs exactly once
(counted by id in each host's run log and store); their URLs resolve from
all three hosts.  One nats-server stopped: work goes on; restarted, it
catches up.  Host b's queue daemon SIGKILLed while its scripts run, and
then every process of b's namespace (nats-server too): JetStream gives those
messages to another host after ``ack_wait``, none is lost, one ends twice
only if its script had ended on b (its ack lost), and each rerun says so in
its timeline.  Host c's link cut for longer than ``ack_wait`` while it runs
messages, then restored: nothing is lost, nothing it had finished runs
again, and a message ends twice only if it had been handed to c before the
cut (at least once).  Host c stopped cleanly: the pool's figures say so at
once, and its messages end elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pool_lab
from conftest import wait_for
from nats_util import CLIENT_PORT
from netns import stop
from pool_lab import (
    HOSTS,
    TAMPER,
    N,
    Pool,
    check_none_lost,
    figures,
    http_prep_attach_commit,
    jsz,
    kill_on_b,
    metrics_of,
    pause_all,
    send_file,
    sent,
    settled,
    start_nats,
    stream_last_seq,
)

from rqsys.store import QueueStore

pool = pool_lab.pool  # the fixture: the three hosts, once for the module
















def test_messages_from_one_host_run_once_across_three(pool: Pool) -> None:
    # Given three hosts working pool queue pq; when N messages are sent on a
    ids = pool.send(N, param1="0.02")
    assert len(set(ids)) == N
    # Then all end done, somewhere
    wait_for(lambda: pool.done_everywhere(ids), 120, f"{N} messages done")
    # And each ran exactly once (every host's run log, every host's done/)
    runs = [msg_id for h in HOSTS for msg_id, _count in pool.runs(h)]
    assert sorted(runs) == sorted(ids)
    done = [pool.ids(h, "done") for h in HOSTS]
    assert sum(len(d) for d in done) == N
    # And every host ran some
    assert all(done), [len(d) for d in done]
    print("done per host:", [len(d) for d in done])
    # And each URL resolves from all three hosts (socket and HTTP)
    for msg_id in (ids[0], ids[N // 2], ids[-1]):
        ran_on = next(h for h, d in zip(HOSTS, done, strict=True) if msg_id in d)
        for host in pool.hosts.values():  # (the pool's record may lag the runner's disk)
            got = wait_for(lambda h=host, i=msg_id: (g := h.call("pq", "get", msg_id=i))[
                "state"] == "done" and g, 20, f"{host.host}'s lookup of {msg_id}")
            assert got["status"].startswith(f"ran on {pool.hosts[ran_on].url}")
        c = pool.hosts["c"]
        http = pool.lab.run("c", ["curl", "-sS", "--max-time", "30",
                                  f"{c.url}q/pq/{msg_id}.json"])
        assert http.returncode == 0, http.stderr
        assert json.loads(http.stdout)["state"] == "done"








def status_of(pool: Pool, host: str, msg_id: str) -> str:
    return str(pool.hosts[host].call("pq", "get", msg_id=msg_id)["status"])


def test_attachments_arrive_byte_identical_or_not_at_all(pool: Pool, tmp_path: Path) -> None:
    # Given a 1 MB file (8 object chunks); when 9 messages carrying it are sent on a
    data = tmp_path / "f"
    data.write_bytes(os.urandom(1 << 20))
    md5 = hashlib.md5(data.read_bytes()).hexdigest()
    ids = [send_file(pool.hosts["a"], data, md5, param1="0.3") for _ in range(9)]
    # Then each runs once, with the same bytes, on b or c as well as a
    wait_for(lambda: pool.done_everywhere(ids), 60, "messages with attachments done")
    ran_on = {h for h in HOSTS if pool.ids(h, "done") & set(ids)}
    assert ran_on - {"a"}, ran_on
    for msg_id in ids:  # (the pool's record follows the runner's disk: a lookup may lag)
        wait_for(lambda i=msg_id: status_of(pool, "c", i).endswith(md5), 20, "c's lookup")
    # And RQ's HTTP way (prep, attach/new, commit) on a's web runs it the same
    via_http = http_prep_attach_commit(pool, data)
    wait_for(lambda: pool.done_everywhere([via_http]), 60, "the HTTP one done")
    wait_for(lambda: status_of(pool, "b", via_http).endswith(md5), 20, "b's lookup")
    # And a message whose object is missing or replaced ends err with the reason, unrun
    pause_all(pool, "pause")
    wait_for(lambda: pool.hosts["a"].call("pq", "pool")["waiting_pulls"] == 0, 20, "no pulls")
    gone, changed = (send_file(pool.hosts["a"], data, md5) for _ in range(2))
    url = f"nats://{pool.lab.hosts['a']}:{CLIENT_PORT}"
    for msg_id, how in ((gone, "delete"), (changed, "replace")):
        done = pool.lab.run("a", [sys.executable, "-c", TAMPER, url, f"{msg_id}/f", how])
        assert done.returncode == 0, done.stderr
    pause_all(pool, "resume")
    for msg_id, why in ((gone, "not in the pool's object store"), (changed, "not the file sent")):
        got = wait_for(lambda i=msg_id: (g := pool.hosts["b"].call("pq", "get", msg_id=i))[
            "state"] == "err" and g, 30, f"{msg_id} ended err")
        assert got["status"].startswith(f"not run: attachment f: {why}"), got
    assert not {i for h in HOSTS for i, _n in pool.runs(h)} & {gone, changed}
    # And each is in the err/ of the host that took it, without the wrong file
    for msg_id in (gone, changed):
        took = [h for h in HOSTS if msg_id in pool.ids(h, "err")]
        assert len(took) == 1, took
        store = QueueStore(pool.hosts[took[0]].layout.queue_dir("pq"))
        assert not store.attachments("err", msg_id)




def test_metrics_and_dashboard_show_the_pool(pool: Pool) -> None:
    # Given all hosts paused and 5 messages sent: they wait in the stream, undelivered
    wait_for(lambda: settled(pool.hosts["a"]), 60, "earlier messages settled")
    pause_all(pool, "pause")
    wait_for(lambda: pool.hosts["a"].call("pq", "pool")["waiting_pulls"] == 0, 20, "no pulls")
    pool.send(5, param1="4")
    e2e = (("pool", "e2e"),)
    got = metrics_of(pool, "b")
    assert got[("rqsys_pool_messages", e2e)] == 5
    assert got[("rqsys_pool_consumer_lag", e2e)] == 5
    assert got[("rqsys_pool_in_flight", e2e)] == 0
    assert got[("rqsys_pool_up", (("pool", "e2e"), ("queue", "pq")))] == 1
    # When they run (2 workers a host): in flight on each host, summing to the pool's
    pause_all(pool, "resume")
    names = {h: pool.hosts[h].addr for h in HOSTS}

    def running() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        m = metrics_of(pool, "c")
        each = [m.get(("rqsys_pool_host_in_flight", (("host", a), ("pool", "e2e"))), -1)
                for a in names.values()]
        return m if m[("rqsys_pool_in_flight", e2e)] == 5 == sum(each) else None

    got = wait_for(running, 30, "5 in flight, per host")
    assert got[("rqsys_pool_consumer_lag", e2e)] == 0
    for addr in names.values():
        assert got[("rqsys_pool_host_alive", (("host", addr), ("pool", "e2e")))] == 1
        assert 0 <= got[("rqsys_pool_host_in_flight", (("host", addr), ("pool", "e2e")))] <= 2
    # And the dashboard of a host has the pool's section with the same figures
    page = pool.lab.run("a", ["curl", "-sS", "--max-time", "30", pool.hosts["a"].url]).stdout
    assert '<section class="pools" id="pools">' in page
    assert '<td data-label="Pool">e2e</td><td data-label="Queue">pq</td>' in page
    wait_for(lambda: settled(pool.hosts["a"]), 60, "the 5 done")


def test_one_nats_server_stopped_then_back(pool: Pool) -> None:
    # Given c's nats-server stopped
    stop(pool.nats["c"])
    # When messages are sent on a, they are taken and all run (quorum: a and b)
    ids = pool.send(30, param1="0.02")
    wait_for(lambda: pool.done_everywhere(ids), 60, "done with one server down")
    assert sum(len(pool.ids(h, "done") & set(ids)) for h in HOSTS) == len(ids)
    # And once it is back, c's server catches up with the stream
    pool.nats.update(start_nats(pool.lab, pool.base, ("c",)))
    wait_for(lambda: stream_last_seq(pool.lab, "c") == stream_last_seq(pool.lab, "a") > 0,
             60, "c's server caught up")






def test_a_hosts_queue_daemon_killed_mid_run(pool: Pool) -> None:
    # Given slow messages, some running on b; when b's queue daemon is SIGKILLed
    b = pool.hosts["b"]
    ids, killed, ended_on_b = kill_on_b(pool, "daemon")
    # Then its supervisor starts it again, and every message ends done, once
    # (twice only if b's script had ended and its ack was lost), each run after
    # the first named so in the timeline of the host that ran it
    wait_for(lambda: b.pingable("pq"), 30, "b's queue daemon back")
    check_none_lost(pool, ids, killed, ended_on_b)


def test_a_hosts_whole_namespace_killed_mid_run(pool: Pool) -> None:
    # Given slow messages, some running on b
    b = pool.hosts["b"]
    before = {h: len(pool.runs(h)) for h in HOSTS}
    # When every process of b's namespace (nats-server, rqsys, scripts) is SIGKILLed
    ids, killed, ended_on_b = kill_on_b(pool, "namespace")
    assert b.proc is not None
    b.proc.wait(10)
    pool.nats["b"].wait(10)
    # Then those messages end done on a or c (a and c are a quorum), none lost
    done = check_none_lost(pool, ids, killed, ended_on_b)
    assert killed - ended_on_b <= done["a"] | done["c"]
    # And their second run shows the redelivery in RQ_COUNT
    again = [(i, n) for h in ("a", "c") for i, n in pool.runs(h)[before[h]:] if i in killed]
    assert {i for i, _n in again} >= killed - ended_on_b and all(n >= 1 for _i, n in again)
    # And the pool's figures show b silent, nothing in flight there any more
    hosts = wait_for(lambda: (h := pool.hosts["a"].call("pq", "pool")["hosts"])[b.addr][
        "alive"] is False and h, 30, "b silent in the pool's figures")
    assert hosts[b.addr]["in_flight"] == 0 and hosts[pool.hosts["c"].addr]["alive"]
    assert not hosts[b.addr]["stopped"]
    # And b's nats-server, started again, catches up (the later tests need a quorum)
    pool.nats.update(start_nats(pool.lab, pool.base, ("b",)))
    wait_for(lambda: stream_last_seq(pool.lab, "b") == stream_last_seq(pool.lab, "a") > 0,
             60, "b's server caught up")


def test_a_partitioned_host_rejoins(pool: Pool) -> None:
    # Given slow messages, some running on c, and what c had finished before
    # (after the earlier tests' messages have settled: their redeliveries are theirs)
    wait_for(lambda: settled(pool.hosts["a"]), 60, "nothing in flight from earlier tests")
    before = {h: len(pool.runs(h)) for h in HOSTS}
    finished_on_c = pool.ids("c", "done")
    ids = pool.send(9, param1="2")
    wait_for(lambda: pool.ids("c", "run") & set(ids), 30, "a message running on c")
    # When c's link is cut for longer than ack_wait, then restored
    pool.lab.set_link("c", False)
    wait_for(lambda: pool.done_everywhere(ids), 60, "all done while c is cut off")
    pool.lab.set_link("c", True)
    wait_for(lambda: settled(pool.hosts["a"]), 60, "nothing in flight once c is back")
    # Then nothing is lost, and nothing c had finished ran again
    done = {h: pool.ids(h, "done") & set(ids) for h in HOSTS}
    assert set().union(*done.values()) == set(ids)
    rerun = [i for h in HOSTS for i, _n in pool.runs(h)[before[h]:]]
    assert set(rerun) <= set(ids) and not finished_on_c & set(rerun)
    # And a message ended twice only if it had been handed to c before the cut
    # (running, or pulled and about to start): c ended it, its ack was lost
    twice = {i for i in ids if sum(i in d for d in done.values()) > 1}
    assert twice <= {i for i, _n in pool.runs("c")[before["c"]:]}








def test_a_host_stopped_cleanly_says_so(pool: Pool) -> None:
    # Given slow messages, some running on c
    a, c = pool.hosts["a"], pool.hosts["c"]
    wait_for(lambda: settled(a), 60, "nothing in flight from earlier tests")
    wait_for(lambda: figures(c), 60, "c back in the pool after its partition")
    wait_for(lambda: all(jsz(pool.lab, h, "healthz") == {"status": "ok"} for h in HOSTS), 60,
             "every server current again")
    ids = [wait_for(lambda: sent(pool.hosts["a"], param1="3"), 30, "a create") for _ in range(6)]
    wait_for(lambda: pool.ids("c", "run") & set(ids), 60, "a message running on c")
    # When c's rqsys is stopped cleanly (TERM)
    c.stop()
    # Then the pool's figures show c stopped with nothing in flight, at once
    # (not alive with its last count until ack_wait passes)
    hosts = wait_for(lambda: figures(a), 30, "the pool's figures from a")["hosts"]
    assert hosts[c.addr] == {"number": hosts[c.addr]["number"], "alive": False,
                             "stopped": True, "in_flight": 0}
    # And what it was running was handed back (requeued in its que/ as it
    # stopped): those end done on a.  (A script the stop's TERM reached as it
    # started ends err on c, as on any queue.)
    handed_back = pool.ids("c", "que") & set(ids)
    ended = lambda: {i for h in HOSTS for s in ("done", "err") for i in pool.ids(h, s)}  # noqa: E731
    wait_for(lambda: set(ids) <= ended(), 60, "all ended after c stopped")
    assert handed_back <= pool.ids("a", "done")
