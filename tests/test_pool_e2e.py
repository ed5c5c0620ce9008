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

import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from nats_util import CLIENT_PORT, HTTP_PORT, cluster_conf, nats_available
from netns import NetLab, Rqsys, netns_available, stop
from prometheus_client.parser import text_string_to_metric_families

from rqsys import timeline
from rqsys.client import QueueClient
from rqsys.errors import Unavailable
from rqsys.store import QueueStore

N = int(os.environ.get("RQ_POOL_N", "200"))
ACK_WAIT = 4  # seconds: how soon a dead host's messages go elsewhere
SCRIPT = """#!/bin/bash
echo "$RQ_MSG_ID $RQ_COUNT" >> "$RUNLOG"
sleep "${RQ_PARAM1:-0}"
echo "$RQ_MSG_ID" >> "$RUNLOG.end"
sum=$([ -e ../attach/f ] && md5sum < ../attach/f | cut -c1-32)
echo "done ran on $RQ_HOST count $RQ_COUNT $sum" >&3
"""
TAMPER = """if 1:
    import asyncio, sys, nats
    async def main(url, name, how):
        nc = await nats.connect(url)
        obs = await nc.jetstream().object_store("rq-pool-e2e")
        await (obs.delete(name) if how == "delete" else obs.put(name, b"not the file"))
        await nc.close()
    asyncio.run(main(*sys.argv[1:]))
"""
HOSTS = ("a", "b", "c")


class Pool:
    def __init__(self, lab: NetLab, hosts: dict[str, Rqsys], base: Path,
                 nats: dict[str, subprocess.Popen[Any]]) -> None:
        self.lab, self.hosts, self.base, self.nats = lab, hosts, base, nats

    def send(self, count: int, **fields: Any) -> list[str]:
        a = self.hosts["a"]
        return [a.call("pq", "create", msg={"dest": "pq", **fields})["msg_id"]
                for _ in range(count)]

    def runs(self, host: str) -> list[tuple[str, int]]:
        """(id, RQ_COUNT) of every run the host's scripts started."""
        path = self.base / host / "runs.log"
        lines = path.read_text().split() if path.exists() else []
        return [(lines[i], int(lines[i + 1])) for i in range(0, len(lines), 2)]

    def ends(self, host: str) -> set[str]:
        """Ids whose script ran to its end on the host."""
        path = self.base / host / "runs.log.end"
        return set(path.read_text().split()) if path.exists() else set()

    def timeline(self, host: str, msg_id: str) -> list[dict[str, Any]]:
        store = QueueStore(self.hosts[host].layout.queue_dir("pq"))
        return timeline.read(store.msg_dir("done", msg_id))

    def ids(self, host: str, state: str) -> set[str]:
        return set(QueueStore(self.hosts[host].layout.queue_dir("pq")).ids(state))

    def done_everywhere(self, ids: list[str], hosts: tuple[str, ...] = HOSTS) -> bool:
        done = set().union(*(self.ids(h, "done") for h in hosts))
        return set(ids) <= done


def start_nats(lab: NetLab, base: Path, hosts: tuple[str, ...] = HOSTS
               ) -> dict[str, subprocess.Popen[Any]]:
    addrs = {h: lab.hosts[h] for h in HOSTS}
    procs = {}
    for host in hosts:
        conf = base / host / "nats.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        peers = [a for h, a in addrs.items() if h != host]
        conf.write_text(cluster_conf(host, addrs[host], base / host / "js", peers))
        with open(base / host / "nats.log", "ab") as log:
            procs[host] = lab.popen(host, ["nats-server", "-c", str(conf)], stdout=log,
                                    stderr=log)
    for host in hosts:
        wait_for(lambda h=host: jsz(lab, h, "healthz") == {"status": "ok"}, 60,
                 f"JetStream on {host}")
    return procs


def jsz(lab: NetLab, host: str, what: str) -> Any:
    """A nats-server's monitoring answer (``healthz``, ``jsz?streams=true``), or None."""
    got = lab.run(host, ["curl", "-s", "--max-time", "2",
                         f"http://{lab.hosts[host]}:{HTTP_PORT}/{what}"])
    try:
        return json.loads(got.stdout)
    except ValueError:
        return None


def stream_last_seq(lab: NetLab, host: str) -> int:
    """The last sequence of the pool's stream as ``host``'s server has it (-1: none)."""
    info = jsz(lab, host, "jsz?streams=true") or {}
    for account in info.get("account_details", []):
        for stream in account.get("stream_detail", []):
            if stream["name"] == "RQ_POOL_e2e":
                return int(stream["state"]["last_seq"])
    return -1


def start_rqsys(lab: NetLab, base: Path) -> dict[str, Rqsys]:
    servers = [f"nats://{lab.hosts[h]}:{CLIENT_PORT}" for h in HOSTS]
    hosts = {}
    for name in HOSTS:
        host = hosts[name] = Rqsys(lab, name, base / name)
        cfg = json.loads(host.layout.config_file.read_text())
        cfg["nats"] = {"servers": servers}
        host.layout.config_file.write_text(json.dumps(cfg))
        entry = host.scandir / "pq"
        entry.mkdir()
        (entry / "run").write_text(SCRIPT)
        (entry / "run").chmod(0o755)
        (entry / "config.json").write_text(json.dumps({
            "num_workers": 2, "env_vars": {"RUNLOG": str(base / name / "runs.log")},
            "pool": {"name": "e2e", "replicas": 3, "ack_wait": ACK_WAIT}}))
    for host in hosts.values():  # all three start at once, then each is waited for
        host.start(wait_queues=())
    for host in hosts.values():
        wait_for(lambda h=host: h.pingable("pq"), 60, f"pool queue on {host.host}")
    return hosts


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    need(netns_available(), "network namespaces need root and iproute2")
    need(nats_available(), "nats-server (Debian package nats-server)")
    base = tmp_path_factory.mktemp("pool")
    lab = NetLab()
    hosts: dict[str, Rqsys] = {}
    try:
        for name in HOSTS:
            lab.host(name)
        nats = start_nats(lab, base)
        hosts = start_rqsys(lab, base)
        yield Pool(lab, hosts, base, nats)
    finally:
        for host in hosts.values():
            host.stop()
        lab.close()


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
        for host in pool.hosts.values():
            got = host.call("pq", "get", msg_id=msg_id)
            assert got["state"] == "done", (host.host, got)
            assert got["status"].startswith(f"ran on {pool.hosts[ran_on].url}")
        c = pool.hosts["c"]
        http = pool.lab.run("c", ["curl", "-sS", "--max-time", "30",
                                  f"{c.url}q/pq/{msg_id}.json"])
        assert http.returncode == 0, http.stderr
        assert json.loads(http.stdout)["state"] == "done"


def send_file(host: Rqsys, path: Path, md5: str, **fields: Any) -> str:
    with open(path, "rb") as f, QueueClient(host.layout, "pq", timeout=60) as client:
        return str(client.call("create", fds=[f.fileno()], msg={"dest": "pq", **fields},
                               attachments=[{"name": "f", "md5": md5}])["msg_id"])


def http_prep_attach_commit(pool: Pool, path: Path) -> str:
    """A message with ``path`` attached made through a's web as RQ's clients do."""
    a = pool.hosts["a"]

    def curl(*args: str) -> Any:
        got = pool.lab.run("a", ["curl", "-sS", "--fail-with-body", "--max-time", "60", *args])
        assert got.returncode == 0, got.stdout + got.stderr
        return json.loads(got.stdout) if got.stdout.strip() else None

    url = curl("-d", "x_format=json", "-d", 'mesg={"_method": "prep"}',
               f"{a.url}q/pq/new_message")[1]
    msg_id = url.rsplit("/", 1)[1]
    curl("-F", "x_format=json", "-F", f"filedata=@{path};filename=f",
         f"{a.url}q/pq/{msg_id}/attach/new")
    curl("-d", "_method=commit", "-d", "x_format=json", f"{a.url}q/pq/{msg_id}")
    return str(msg_id)


def pause_all(pool: Pool, oper: str) -> None:
    for host in pool.hosts.values():
        host.call("pq", "adminoper", oper=oper)


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
    for msg_id in ids:
        assert pool.hosts["c"].call("pq", "get", msg_id=msg_id)["status"].endswith(md5)
    # And RQ's HTTP way (prep, attach/new, commit) on a's web runs it the same
    via_http = http_prep_attach_commit(pool, data)
    wait_for(lambda: pool.done_everywhere([via_http]), 60, "the HTTP one done")
    assert pool.hosts["b"].call("pq", "get", msg_id=via_http)["status"].endswith(md5)
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


def metrics_of(pool: Pool, host: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Host's /metrics, parsed: (name, labels) -> value."""
    got = pool.lab.run(host, ["curl", "-sS", "--max-time", "30", f"{pool.hosts[host].url}metrics"])
    assert got.returncode == 0, got.stderr
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(got.stdout) for s in family.samples}


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
    assert '<section class="pools" id="pools">' in page and "<td>e2e</td>" in page
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


def kill_on_b(pool: Pool, how: str, count: int = 12) -> tuple[list[str], set[str], set[str]]:
    """Slow messages sent on a; once b runs some, ``how`` is SIGKILLed: b's queue
    daemon, or every process of b's namespace.  (ids sent, ids b was running,
    ids whose script had ended on b)"""
    wait_for(lambda: settled(pool.hosts["a"]), 60, "nothing in flight from earlier tests")
    ids = pool.send(count, param1="2")
    wait_for(lambda: pool.ids("b", "run") & set(ids), 30, "a message running on b")
    if how == "daemon":
        pid = pool.hosts["b"].call("pq", "ping")["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}/exe"), 10, "b's daemon dead")
    else:
        pids = subprocess.run(["ip", "netns", "pids", pool.lab.ns("b")], capture_output=True,
                              text=True, check=True, timeout=20).stdout.split()
        assert len(pids) >= 3, pids  # nats-server, rqsys serve, its daemons and scripts
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # a child that died with its parent
                os.kill(int(pid), signal.SIGKILL)
    killed, ended_on_b = pool.ids("b", "run") & set(ids), pool.ends("b") & set(ids)
    assert killed
    return ids, killed, ended_on_b


def check_none_lost(pool: Pool, ids: list[str], killed: set[str], ended_on_b: set[str]
                    ) -> dict[str, set[str]]:
    """Every message done; twice only if its script had ended on b (ack lost);
    each run after the first shows itself in the timeline of the host that ran it."""
    wait_for(lambda: pool.done_everywhere(ids), 90, "all done after the kill")
    done = {h: pool.ids(h, "done") & set(ids) for h in HOSTS}
    twice = {i for i in ids if sum(i in d for d in done.values()) > 1}
    assert twice <= ended_on_b, (twice, ended_on_b)
    for msg_id in killed - ended_on_b:
        host = next(h for h in ("a", "c", "b") if msg_id in done[h])
        events = pool.timeline(host, msg_id)
        created = next(e for e in events if e["ev"] == "created")
        started = [e for e in events if e["ev"] == "started"]
        assert re.fullmatch(r"pool e2e delivery ([2-9]|\d\d+)", created["by"]), created
        assert started and started[-1]["count"] >= 1, started
    return done


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


def figures(host: Rqsys) -> dict[str, Any] | None:
    """The pool's figures from host (None while its NATS connection is being
    replaced, or JetStream elects a leader: the figures come from JetStream)."""
    try:
        return host.call("pq", "pool")
    except Unavailable:
        return None


def sent(host: Rqsys, **fields: Any) -> str | None:
    """A new message's id, or None while the stream has no leader (an election
    after the cluster lost a server: a client tries again)."""
    try:
        return str(host.call("pq", "create", msg={"dest": "pq", **fields})["msg_id"])
    except Unavailable:
        return None


def settled(host: Rqsys) -> bool:
    """Nothing pending or in flight in the pool."""
    got = figures(host)
    return got is not None and got["in_flight"] == 0 and got["pending"] == 0


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
