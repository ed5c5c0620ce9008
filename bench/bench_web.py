"""Web figures, each beside a baseline measured in the same run.

* HTTP enqueue (``POST /q/<q>/new_message``, keep-alive, 1 and 16 clients)
  vs durable socket enqueue to the same daemon; targets: >= 70 % of the
  socket rate with one client (issue 15), >= 40 % and >= 1,500 msgs/s with
  16; beside it the web process's CPU per request (steady under load); the
  targets are for rq-web as installed (loopback, no password); one client
  against an rq-web with ``basic_auth`` is shown beside them;
* ``GET /q/<q>.json`` on a queue with 1,000,000 messages in ``done/``
  (created directly in the sharded layout: bench only); target < 50 ms.
"""

from __future__ import annotations

import base64
import http.client
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

from procs import stop
from scratch import make_scratch

from rqsys.scan.scandir import install_queue
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

PER_CLIENT_16 = 200
PER_CLIENT_1 = 500
ROUNDS = 3
DONE_N = 1_000_000
LAUNCH = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
          "os.environ.update(LISTEN_FDS='1', LISTEN_FDNAMES='web', LISTEN_PID=str(os.getpid())); "
          "os.execv(sys.executable, [sys.executable, '-m', 'rqsys', '--root', sys.argv[2], "
          "'web'])")
VERDICTS: list[str] = []


def report(name: str, value: str, verdict: str = "") -> None:
    print(f"{name:<58} {value}  {verdict}".rstrip(), flush=True)
    if verdict:
        VERDICTS.append(verdict)


def judge(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def wait_ready(notify: socket.socket, proc: subprocess.Popen) -> None:
    notify.settimeout(60)
    while b"READY=1" not in notify.recv(4096).split(b"\n"):
        if proc.poll() is not None:
            raise SystemExit(f"process exited {proc.returncode}")


def start(layout: Layout, args: list[str], tag: str, **popen) -> subprocess.Popen:
    path = layout.root / f".notify-{tag}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(path))
    env = dict(os.environ, NOTIFY_SOCKET=str(path))
    env.pop("JOURNAL_STREAM", None)
    proc = subprocess.Popen(args, env=env, start_new_session=True, stderr=subprocess.DEVNULL,
                            **popen)
    wait_ready(notify, proc)
    notify.close()
    return proc


def start_daemon(layout: Layout, name: str) -> subprocess.Popen:
    return start(layout, [sys.executable, "-m", "rqsys", "--root", str(layout.root),
                          "queue", name], f"q-{name}")


def start_web(layout: Layout, auth: dict | None = None,
              tag: str = "web") -> tuple[subprocess.Popen, int]:
    """rq-web as installed: on loopback without a password (the default), or
    with ``auth`` as its ``basic_auth``."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = {"host": "127.0.0.1", "port": port, **({"basic_auth": auth} if auth else {})}
    layout.config_file.write_text(json.dumps(settings))
    proc = start(layout, [sys.executable, "-c", LAUNCH, str(sock.fileno()), str(layout.root)],
                 tag, pass_fds=(sock.fileno(),))
    sock.close()
    return proc, port



# ------------------------------------------------------------------ load clients
def socket_client(args: tuple[str, str, int, multiprocessing.Barrier]) -> None:
    root, queue, count, barrier = args
    layout = Layout(Path(root), Path(root) / "sock")
    with QueueClient(layout, queue) as client:
        client.call("ping")
        barrier.wait()
        for i in range(count):
            client.call("create", msg={"param1": f"s{i}"})


def http_client(args: tuple) -> None:
    """(port, queue, count, barrier[, "user:password"]): a keep-alive client,
    with Basic credentials on every request when given one (as browsers do)."""
    port, queue, count, barrier, *login = args
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if login:
        headers["Authorization"] = "Basic " + base64.b64encode(login[0].encode()).decode()
    conn.request("GET", "/q.json", headers=headers)
    conn.getresponse().read()
    barrier.wait()
    for i in range(count):
        conn.request("POST", f"/q/{queue}/new_message",
                     urlencode({"mesg": json.dumps({"param1": f"h{i}"})}), headers)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise SystemExit(f"HTTP {resp.status}: {body[:200]!r}")
    conn.close()


def rate(worker, make_args, clients: int, per_client: int) -> float:
    """Messages per second over all clients, timed from a common start."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(clients + 1)
    procs = [ctx.Process(target=worker, args=(make_args(barrier),)) for _ in range(clients)]
    for proc in procs:
        proc.start()
    barrier.wait()
    started = time.perf_counter()
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise SystemExit(f"a load client failed ({proc.exitcode})")
    return clients * per_client / (time.perf_counter() - started)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_enqueue(layout: Layout, port: int, web_pid: int) -> None:
    """Socket and HTTP rounds alternate; medians of ROUNDS damp a shared disk's noise."""
    root = str(layout.root)
    for clients, per in ((1, PER_CLIENT_1), (16, PER_CLIENT_16)):
        socks, https, web_cpu = [], [], 0.0
        for _ in range(ROUNDS):
            socks.append(rate(socket_client, lambda b, per=per: (root, "bench", per, b),
                              clients, per))
            before = cpu_seconds(web_pid)
            https.append(rate(http_client, lambda b, per=per: (port, "bench", per, b),
                              clients, per))
            web_cpu += cpu_seconds(web_pid) - before
        sock_rate, http_rate = statistics.median(socks), statistics.median(https)
        ratio = http_rate / sock_rate
        report(f"enqueue, {clients:>2} client(s): socket (baseline, median of {ROUNDS})",
               f"{sock_rate:8.0f} msgs/s")
        report(f"enqueue, {clients:>2} client(s): HTTP new_message",
               f"{http_rate:8.0f} msgs/s = {ratio:.0%} of socket",
               judge(ratio >= 0.70 if clients == 1 else ratio >= 0.40 and http_rate >= 1500))
        report(f"enqueue, {clients:>2} client(s): web process CPU per request",
               f"{web_cpu * 1000 / (ROUNDS * clients * per):8.2f} ms")


def bench_auth(layout: Layout) -> None:
    """One client again, against an rq-web with ``basic_auth`` (an argon2 hash, as
    ``rqsys passwd`` makes), the credentials sent on every request."""
    from rqsys.web.auth import hash_password

    web, port = start_web(layout, {"realm": "rqsys",
                                       "users": {"bench": hash_password("s3cret")}}, "web-auth")
    try:
        root, socks, https = str(layout.root), [], []
        for _ in range(ROUNDS):
            socks.append(rate(socket_client, lambda b: (root, "bench", PER_CLIENT_1, b),
                              1, PER_CLIENT_1))
            https.append(rate(http_client,
                              lambda b: (port, "bench", PER_CLIENT_1, b, "bench:s3cret"),
                              1, PER_CLIENT_1))
        ratio = statistics.median(https) / statistics.median(socks)
        report("enqueue,  1 client(s): HTTP new_message with basic_auth",
               f"{statistics.median(https):8.0f} msgs/s = {ratio:.0%} of socket")
    finally:
        stop(web)


# ------------------------------------------------------------------ 1M done
def fill_done(layout: Layout, queue: str, count: int) -> None:
    """Make ``count`` done message directories straight in the sharded layout."""
    done = layout.queue_dir(queue) / "done"
    per_shard = 10_000
    for shard_no in range(count // per_shard):
        day, hour = divmod(shard_no, 24)
        shard = done / f"2025{1 + day // 28:02d}{1 + day % 28:02d}.{hour:02d}"
        shard.mkdir()
        for n in range(per_shard):
            minute, rest = divmod(n, 6000)
            sec, ms = divmod(rest, 100)
            os.mkdir(shard / f"{shard.name}{minute:02d}.{sec:02d}.{ms * 10:03d}.0")


def bench_big_queue() -> None:
    """On tmpfs when there is one: making and removing 1M directories on disk takes minutes."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    base = Path(tempfile.mkdtemp(prefix="rqsys-bench-web-1m-", dir=shm))
    layout = new_layout(base)
    make_queue(layout, base, "million")
    started = time.perf_counter()
    fill_done(layout, "million", DONE_N)
    report(f"create 1,000,000 done dirs in {base.parent} (setup)",
           f"{time.perf_counter() - started:8.1f} s")
    web, port = start_web(layout)
    daemon = start_daemon(layout, "million")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        times, body = [], b""
        for _ in range(30):
            t0 = time.perf_counter()
            conn.request("GET", "/q/million.json")
            body = conn.getresponse().read()
            times.append((time.perf_counter() - t0) * 1000)
        counts = json.loads(body)["counts"]
        assert counts["done"] == DONE_N, counts
        p50, worst = statistics.median(times), max(times)
        report("GET /q/<q>.json with 1,000,000 done (p50 / max)",
               f"{p50:6.1f} / {worst:.1f} ms", judge(worst < 50))
        t0 = time.perf_counter()
        conn.request("GET", "/q/million/done.json?limit=10")
        conn.getresponse().read()
        report("GET /q/<q>/done.json?limit=10 with 1,000,000 done",
               f"{(time.perf_counter() - t0) * 1000:6.1f} ms")
    finally:
        stop(daemon)
        stop(web)
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def new_layout(base: Path) -> Layout:
    layout = Layout(base / "root", base / "root" / "sock")
    layout.make_dirs()
    layout.socket_dir.mkdir()
    return layout


def make_queue(layout: Layout, base: Path, name: str) -> None:
    entry = base / "scripts" / name
    entry.mkdir(parents=True)
    (entry / "run").write_text('#!/bin/bash\necho "done ok" >&3\n')
    (entry / "run").chmod(0o755)
    install_queue(layout, name, entry)


def main() -> int:
    base = make_scratch("web-")
    layout = new_layout(base)
    procs: list[subprocess.Popen] = []
    try:
        web, port = start_web(layout)
        procs.append(web)
        make_queue(layout, base, "bench")
        procs.append(start_daemon(layout, "bench"))
        with QueueClient(layout, "bench") as client:
            client.call("adminoper", oper="pause")  # measure enqueue, not the script
        bench_enqueue(layout, port, web.pid)
        bench_auth(layout)
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(base, ignore_errors=True)
    bench_big_queue()
    print("bench_web:", "all PASS" if all(v == "PASS" for v in VERDICTS) else "some MISS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
