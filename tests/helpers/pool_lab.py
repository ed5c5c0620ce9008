"""The three-host lab of ``test_pool_e2e``: network namespaces a, b and c,
each with a clustered nats-server (JetStream, R3) and ``rqsys serve`` working
pool queue ``pq`` (pool ``e2e``), as a module-scoped fixture; and the helpers
its tests use to send, kill, wait and count."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for
from nats_util import CLIENT_PORT, HTTP_PORT, cluster_conf, nats_available, server_conf
from netns import NetLab, Rqsys, netns_available
from prometheus_client.parser import text_string_to_metric_families

from rqsys.errors import Unavailable
from rqsys.observe import timeline
from rqsys.store import QueueStore
from rqsys.wire.client import QueueClient

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


def one_nats(net: NetLab, base: Path, hosts: tuple[str, ...]) -> str:
    """A lone nats-server (JetStream) in namespace ``n``, and the namespaces
    ``hosts`` beside it; its URL once it is healthy."""
    addr = net.host("n")
    (base / "n").mkdir()
    conf = base / "n" / "nats.conf"
    conf.write_text(server_conf("n", addr, CLIENT_PORT, base / "n" / "js", [],
                                f'http: "{addr}:{HTTP_PORT}"'))
    with open(base / "n" / "nats.log", "ab") as log:
        net.popen("n", ["nats-server", "-c", str(conf)], stdout=log, stderr=log)
    for name in hosts:
        net.host(name)
    wait_for(lambda: b'"ok"' in net.run("n", ["curl", "-s", "--max-time", "2",
                                              f"http://{addr}:{HTTP_PORT}/healthz"]
                                        ).stdout.encode(), 30, "JetStream up")
    return f"nats://{addr}:{CLIENT_PORT}"


def pool_host(net: NetLab, name: str, base: Path, nats: str,
              queues: dict[str, tuple[str, dict[str, Any]]]) -> Rqsys:
    """``rqsys serve`` (not started) in namespace ``name`` on the NATS at
    ``nats``, its scandir holding ``queues``: name -> (run script, config)."""
    host = Rqsys(net, name, base / name)
    cfg = json.loads(host.layout.config_file.read_text())
    cfg["nats"] = {"servers": [nats]}
    host.layout.config_file.write_text(json.dumps(cfg))
    for queue, (script, config) in queues.items():
        entry = host.scandir / queue
        entry.mkdir()
        (entry / "run").write_text(script)
        (entry / "run").chmod(0o755)
        (entry / "config.json").write_text(json.dumps(config))
    return host


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


def metrics_of(pool: Pool, host: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Host's /metrics, parsed: (name, labels) -> value."""
    got = pool.lab.run(host, ["curl", "-sS", "--max-time", "30", f"{pool.hosts[host].url}metrics"])
    assert got.returncode == 0, got.stderr
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(got.stdout) for s in family.samples}


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
        stopped = stop_namespace(pool.lab.ns("b"))
        assert len(stopped) >= 3, stopped  # nats-server, rqsys serve, its daemons and scripts
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):  # a child that died with its parent
                os.kill(pid, signal.SIGKILL)
    killed, ended_on_b = pool.ids("b", "run") & set(ids), pool.ends("b") & set(ids)
    assert killed
    return ids, killed, ended_on_b


def stop_namespace(ns: str) -> set[int]:
    """SIGSTOP every process of a namespace until a listing finds none new (one
    forked meanwhile, such as a daemon the supervisor restarts, is in the next
    listing), so that the SIGKILLs after it meet processes that can no longer
    act: a kill in one pass let a restarted daemon finish a message."""
    stopped: set[int] = set()
    while True:
        listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                check=True, timeout=20).stdout.split()
        new = {int(pid) for pid in listed} - stopped
        if not new:
            return stopped
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new


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
