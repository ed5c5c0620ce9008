"""Pool queue throughput with 1, 2 and 3 hosts, and enqueue latency and drain rate
beside a local queue's, all in one run on three network namespaces.

Each namespace runs a nats-server of one JetStream cluster (R3) and
``rqsys serve``.  Three pools are set up once: ``p1`` worked by host a
only, ``p2`` by a and b, ``p3`` by a, b and c (2 workers each, a no-op
script).  For each, every host's queue is paused, COUNT messages are sent on
a (one client, each create timed until its ``ok``, i.e. JetStream's publish
ack), then all hosts resume together and the drain is timed until every
message is done.  A plain queue on a takes COUNT creates in the same run:
its latency is the baseline; so is its latency with a 1 MB attachment
(COUNT/20 creates, the pool's going to its object store).  Each drain's CPU
time per message (every process of the lab, from /proc: steady under load)
gives the CPU-bound ceiling on this machine.  ``python bench/bench_pool.py
[COUNT]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from nats_util import CLIENT_PORT, HTTP_PORT, cluster_conf  # noqa: E402
from netns import NetLab, Rqsys, netns_available, wait_until  # noqa: E402

from rqsys.wire.client import QueueClient  # noqa: E402

HOSTS = ("a", "b", "c")
NOOP = "#!/bin/bash\necho 'done ok' >&3\n"
POOLS = {"p1": ("a",), "p2": ("a", "b"), "p3": ("a", "b", "c")}


def start_nats(lab: NetLab, base: Path) -> None:
    for host in HOSTS:
        lab.host(host)
    for host in HOSTS:
        conf = base / host / "nats.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        peers = [lab.hosts[h] for h in HOSTS if h != host]
        conf.write_text(cluster_conf(host, lab.hosts[host], base / host / "js", peers))
        with open(base / host / "nats.log", "ab") as log:
            lab.popen(host, ["nats-server", "-c", str(conf)], stdout=log, stderr=log)
    for host in HOSTS:
        wait_until(lambda h=host: '"ok"' in lab.run(h, [
            "curl", "-s", "--max-time", "2",
            f"http://{lab.hosts[h]}:{HTTP_PORT}/healthz"]).stdout, 60, f"JetStream on {host}")


def add_queue(host: Rqsys, name: str, pool: str | None) -> None:
    entry = host.scandir / name
    entry.mkdir()
    (entry / "run").write_text(NOOP)
    (entry / "run").chmod(0o755)
    cfg: dict[str, object] = {"num_workers": 2}
    if pool:
        cfg["pool"] = {"name": pool, "replicas": 3}
    (entry / "config.json").write_text(json.dumps(cfg))


def start_rqsys(lab: NetLab, base: Path) -> dict[str, Rqsys]:
    servers = [f"nats://{lab.hosts[h]}:{CLIENT_PORT}" for h in HOSTS]
    hosts = {name: Rqsys(lab, name, base / name) for name in HOSTS}
    for name, host in hosts.items():
        cfg = json.loads(host.layout.config_file.read_text())
        host.layout.config_file.write_text(json.dumps(dict(cfg, nats={"servers": servers})))
        for pool, members in POOLS.items():
            if name in members:
                add_queue(host, pool, pool)
    add_queue(hosts["a"], "local", None)
    for name, host in hosts.items():
        queues = tuple(p for p, members in POOLS.items() if name in members)
        host.start(wait_queues=("relay", *queues))
    return hosts


def enqueue(host: Rqsys, queue: str, count: int) -> list[float]:
    """Latency of each of ``count`` creates, one client, in ms."""
    took = []
    with QueueClient(host.layout, queue, timeout=30) as client:
        for n in range(count):
            start = time.perf_counter()
            client.call("create", msg={"dest": queue, "param1": str(n)})
            took.append((time.perf_counter() - start) * 1000)
    return took


def done(hosts: dict[str, Rqsys], queue: str) -> int:
    members = POOLS.get(queue, ("a",))
    return sum(int(hosts[h].call(queue, "counts")["counts"]["done"]) for h in members)


def drain(hosts: dict[str, Rqsys], queue: str, count: int) -> float:
    """Pause the queue's hosts, send ``count`` on a, resume all: drain seconds."""
    members, before = POOLS.get(queue, ("a",)), done(hosts, queue)
    for h in members:
        hosts[h].call(queue, "adminoper", oper="pause")
    enqueue(hosts["a"], queue, count)
    start = time.perf_counter()
    for h in members:
        hosts[h].call(queue, "adminoper", oper="resume")
    wait_until(lambda: done(hosts, queue) >= before + count, 600, f"{queue} drained")
    return time.perf_counter() - start


def lab_cpu(lab: NetLab) -> float:
    """CPU seconds used so far by every process the lab started (nats-servers,
    rqsys serve) and their descendants, live or reaped: steady under load,
    unlike wall-clock rates."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _ticks) in stats.items():
        children.setdefault(ppid, []).append(pid)
    todo, ticks = [p.pid for p in lab.procs], 0
    while todo:
        pid = todo.pop()
        ticks += stats.get(pid, (0, 0))[1]
        todo.extend(children.get(pid, []))
    return ticks / os.sysconf("SC_CLK_TCK")


def with_file(host: Rqsys, queue: str, count: int, path: Path) -> list[float]:
    """Latency of each of ``count`` creates carrying ``path`` as an attachment, in ms."""
    md5, took = hashlib.md5(path.read_bytes()).hexdigest(), []
    with QueueClient(host.layout, queue, timeout=60) as client:
        for _n in range(count):
            start = time.perf_counter()
            with open(path, "rb") as f:
                client.call("create", fds=[f.fileno()], msg={"dest": queue},
                            attachments=[{"name": "f", "md5": md5}])
            took.append((time.perf_counter() - start) * 1000)
    return took


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def latencies(hosts: dict[str, Rqsys], count: int, tmp: Path) -> None:
    local = enqueue(hosts["a"], "local", count)
    pooled = enqueue(hosts["a"], "p3", count)  # 3 hosts working: the latency users see
    wait_until(lambda: done(hosts, "p3") >= count, 600, "p3 drained")
    big = tmp / "attachment"
    big.write_bytes(os.urandom(1 << 20))
    files = max(10, count // 20)
    local_f = with_file(hosts["a"], "local", files, big)
    pooled_f = with_file(hosts["a"], "p3", files, big)
    wait_until(lambda: done(hosts, "p3") >= count + files, 600, "p3 drained")
    print(f"enqueue latency, one client (ms): {count} creates, {files} with 1 MB attached")
    for name, got in (("local queue", local), ("pool queue (R3 ack)", pooled),
                      ("local, 1 MB attached", local_f), ("pool, 1 MB attached", pooled_f)):
        print(f"  {name:22} p50 {statistics.median(got):7.2f}  p99 {pct(got, 0.99):7.2f}")


def report(hosts: dict[str, Rqsys], lab: NetLab, count: int, tmp: Path) -> None:
    latencies(hosts, count, tmp)
    cpu = lab_cpu(lab)
    local_rate = count / drain(hosts, "local", count)
    local_cpu, cpu = (lab_cpu(lab) - cpu) / count * 1000, lab_cpu(lab)
    print(f"local queue on a: {local_rate:6.0f} msgs/s (2 workers, the baseline), "
          f"CPU {local_cpu:5.1f} ms/msg")
    rates = {}
    for queue in POOLS:
        seconds = drain(hosts, queue, count)
        rates[queue] = count / seconds
        used, cpu = (lab_cpu(lab) - cpu) / count * 1000, lab_cpu(lab)
        print(f"{len(POOLS[queue])} host(s): {count} messages drained in {seconds:5.2f} s "
              f"= {rates[queue]:6.0f} msgs/s (x{rates[queue] / rates['p1']:.2f} of 1 host, "
              f"{rates[queue] / local_rate:.0%} of the local queue), "
              f"CPU {used:5.1f} ms/msg (enqueue and run, all hosts and servers)")
    cores = os.cpu_count() or 1
    print(f"CPU-bound ceiling on {cores} cores: {cores / (used / 1000):.0f} msgs/s for the "
          f"3-host pool, {cores / (local_cpu / 1000):.0f} for the local queue")


def main() -> int:
    if not netns_available():
        print("bench_pool: needs root and iproute2 (network namespaces)", file=sys.stderr)
        return 1
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        lab, hosts = NetLab(), {}
        try:
            start_nats(lab, Path(tmp))
            hosts = start_rqsys(lab, Path(tmp))
            report(hosts, lab, count, Path(tmp))
        finally:
            for host in hosts.values():
                host.stop()
            lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
