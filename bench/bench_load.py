"""Under load: many HTTP and socket clients enqueue while scripts run and the cleaner prunes.

One ``rqsys serve`` (supervisor, web, queue daemons, rq-scan) on loopback;
64 HTTP clients (keep-alive ``POST /q/load/new_message``, RQ's form) and 64
socket clients (``create``), each a thread sending one message every
``--interval`` seconds (staggered), for ``--seconds``; the ``load`` queue's
script (4 workers) notes its message id in a file and says ``done``; every
``--clean-every`` seconds a ``cleaner`` message prunes ``load``'s done
messages older than ``--prune-age`` seconds.  A warm-up of the same load
comes first, then the queue drains and the processes are measured
("before"); after the timed load it drains again and they are measured
("after").  Judged:

- no error answer (any HTTP status but 200 with ``["ok", url]``, any socket
  error, any message in ``err``);
- no lost message: every acknowledged id is in the store, or its script ran
  (its id in the script's file) and the cleaner pruned it from ``done``;
- the queue daemon's and the web's RSS after = before +- 10 %, and their
  open file descriptors the same.

The pace is set so that 4 workers keep up on a 2-core machine shared with
other work: the memory check then measures leaks, not a growing queue.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

from procs import stop
from scratch import make_scratch

from rqsys.store import Layout
from rqsys.web.connections import IDLE_CLOSE
from rqsys.wire.client import QueueClient

QUEUE = "load"
SCRIPT = '#!/bin/sh\necho "$RQ_MSG_ID" >> "$RAN_LOG"\necho "done ok" >&3\n'
STATES = ("prep", "que", "run", "done", "err", "relayed")


class Tally:
    """Acknowledged ids and error answers, from every client thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: set[str] = set()
        self.errors: list[str] = []
        self.waits: dict[str, list[float]] = {"HTTP": [], "socket": []}  # seconds per answer

    def ok(self, msg_id: str) -> None:
        with self.lock:
            self.acked.add(msg_id)

    def waited(self, door: str, seconds: float) -> None:
        with self.lock:
            self.waits[door].append(seconds)

    def latency(self, door: str) -> str:
        waits = sorted(self.waits[door]) or [0.0]
        pick = [waits[min(len(waits) - 1, int(len(waits) * q))] for q in (0.5, 0.99)]
        return f"p50 {pick[0] * 1000:.0f} ms, p99 {pick[1] * 1000:.0f} ms, max {waits[-1]:.1f} s"

    def error(self, why: str) -> None:
        with self.lock:
            self.errors.append(why)


class Serve:
    """``rqsys serve`` in a scratch root with the ``load`` queue; its processes by role."""

    def __init__(self, base: Path) -> None:
        self.base, self.port = base, _free_port()
        self.layout = Layout(base / "root", base / "root" / "sock")
        self.ran_log = base / "ran.log"
        scandir, entry = base / "scandir", base / "load-script"
        for path in (self.layout.root, scandir, entry):
            path.mkdir(parents=True)
        (entry / "run").write_text(SCRIPT)
        (entry / "run").chmod(0o755)
        (entry / "config.json").write_text(json.dumps(
            {"num_workers": 4, "env_vars": {"RAN_LOG": str(self.ran_log)}}))
        (scandir / QUEUE).symlink_to(entry)
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "LISTEN_FDS", "LISTEN_PID")}
        with open(base / "serve.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rqsys", "--root", str(self.layout.root), "serve",
                 "--scandir", str(scandir), "--listen", f"127.0.0.1:{self.port}"],
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                start_new_session=True)
        _wait(lambda: self._up(), 60, "rqsys serve up")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise SystemExit(f"rqsys serve ended: {(self.base / 'serve.log').read_text()[-2000:]}")
        try:
            return all(self.call(q, "ping") for q in (QUEUE, "cleaner")) and _http_up(self.port)
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def call(self, queue: str, op: str, **args: object) -> dict:
        with QueueClient(self.layout, queue, timeout=60) as client:
            return client.call(op, **args)

    def pids(self) -> dict[str, int]:
        """The web's and the load queue daemon's pids (children of the supervisor)."""
        found = {}
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        for pid in children.split():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"web" in argv:
                found["web"] = int(pid)
            elif b"queue" in argv and QUEUE.encode() in argv:
                found[f"queue {QUEUE}"] = int(pid)
        return found


def _free_port() -> int:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def _http_up(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", f"/q/{QUEUE}.json")
        return conn.getresponse().status == 200
    finally:
        conn.close()


def _wait(pred, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_load: timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


# ------------------------------------------------------------------ clients
def paced(stop_at: float, interval: float, offset: float, send) -> None:  # noqa: ANN001
    """Call ``send(i)`` every ``interval`` seconds from ``offset`` until ``stop_at``."""
    next_at, i = time.monotonic() + offset, 0
    while next_at < stop_at:
        time.sleep(max(0.0, next_at - time.monotonic()))
        send(i)
        i, next_at = i + 1, next_at + interval


def http_client(port: int, tally: Tally, stop_at: float, interval: float, offset: float) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/x-www-form-urlencoded"}

    def send(i: int) -> None:
        body = urlencode({"x_format": "json", "mesg": json.dumps({"param1": f"h{i}"})})
        sent = time.monotonic()
        try:
            conn.request("POST", f"/q/{QUEUE}/new_message", body, headers)
            resp = conn.getresponse()
            answer = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            tally.error(f"HTTP: {exc!r}")
            conn.close()
            return
        finally:
            tally.waited("HTTP", time.monotonic() - sent)
        if resp.status != 200:
            tally.error(f"HTTP {resp.status}: {answer[:200]!r}")
            return
        verdict = json.loads(answer)
        if verdict[0] != "ok":
            tally.error(f"HTTP answer {verdict!r}")
            return
        tally.ok(str(verdict[1]).rstrip("/").rsplit("/", 1)[-1])

    try:
        paced(stop_at, interval, offset, send)
    finally:
        conn.close()


def socket_client(layout: Layout, tally: Tally, stop_at: float, interval: float,
                  offset: float) -> None:
    with QueueClient(layout, QUEUE, timeout=60) as client:

        def send(i: int) -> None:
            sent = time.monotonic()
            try:
                tally.ok(str(client.call("create", msg={"param1": f"s{i}"})["msg_id"]))
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                tally.error(f"socket: {exc!r}")
            finally:
                tally.waited("socket", time.monotonic() - sent)

        paced(stop_at, interval, offset, send)


def cleaner(serve: Serve, tally: Tally, stop_at: float, every: float, age: float) -> int:
    """A cleaner message every ``every`` seconds; how many were sent."""
    sent = 0
    while time.monotonic() + every < stop_at:
        time.sleep(every)
        try:
            serve.call("cleaner", "create", msg={"param1": f"{age / 86400:.8f}",
                                                 "param2": QUEUE})
            sent += 1
        except Exception as exc:  # noqa: BLE001 - counted as an error answer
            tally.error(f"cleaner create: {exc!r}")
    return sent


def load(serve: Serve, args: argparse.Namespace, seconds: float) -> Tally:
    """The clients and the cleaner for ``seconds``; the tally of their answers."""
    tally = Tally()
    stop_at = time.monotonic() + seconds
    n, step = args.http + args.socket, args.interval / (args.http + args.socket)
    threads = [threading.Thread(target=http_client, args=(
        serve.port, tally, stop_at, args.interval, step * k)) for k in range(args.http)]
    threads += [threading.Thread(target=socket_client, args=(
        serve.layout, tally, stop_at, args.interval, step * k)) for k in range(args.http, n)]
    threads.append(threading.Thread(target=cleaner, args=(
        serve, tally, stop_at, args.clean_every, args.prune_age)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally


# ------------------------------------------------------------------ checks
def drained(serve: Serve) -> bool:
    counts = serve.call(QUEUE, "counts")["counts"]
    cleaning = serve.call("cleaner", "counts")["counts"]
    return not any(counts.get(s, 0) for s in ("que", "run")) and \
        not any(cleaning.get(s, 0) for s in ("que", "run"))


def measure(serve: Serve, pids: dict[str, int]) -> dict[str, tuple[int, int]]:
    """role -> (RSS in KiB, open fds), once the web's pool closed its idle connections
    to the daemon (after IDLE_CLOSE, at its next call) and the clients' are gone."""
    time.sleep(IDLE_CLOSE + 1)
    _http_up(serve.port)
    time.sleep(1)
    out = {}
    for role, pid in pids.items():
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(next(line.split()[1] for line in status.splitlines()
                       if line.startswith("VmRSS:")))
        out[role] = (rss, len(os.listdir(f"/proc/{pid}/fd")))
    return out


def lost(serve: Serve, acked: set[str]) -> tuple[list[str], int, int]:
    """Acknowledged ids neither in the store nor run; (lost, in err, pruned)."""
    qdir = serve.layout.queue_dir(QUEUE)
    present: dict[str, str] = {}
    for state in STATES:
        base = qdir / state
        if not base.is_dir():
            continue
        for entry in base.iterdir():
            inner = entry.iterdir() if state in ("done", "relayed") and entry.is_dir() else [entry]
            for mdir in inner:
                present[mdir.name] = state
    ran = set(serve.ran_log.read_text().split()) if serve.ran_log.exists() else set()
    missing = sorted(i for i in acked if i not in present and i not in ran)
    in_err = sum(1 for i in acked if present.get(i) == "err")
    pruned = sum(1 for i in acked if i not in present and i in ran)
    return missing, in_err, pruned


def judge(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def flat(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> bool:
    """RSS within +-10 % and the same number of fds, for every process measured."""
    return all(abs(after[r][0] - rss) <= rss // 10 and after[r][1] == fds
               for r, (rss, fds) in before.items())


def report(args: argparse.Namespace, tally: Tally, serve: Serve, seconds: float,
           before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> bool:
    missing, in_err, pruned = lost(serve, tally.acked)
    print(f"load: {args.http} HTTP + {args.socket} socket clients, one message each every "
          f"{args.interval:g} s, for {seconds:.0f} s; cleaner every {args.clean_every:g} s "
          f"(done older than {args.prune_age:g} s)")
    print(f"acknowledged {len(tally.acked)} ({len(tally.acked) / seconds:.0f} msgs/s), "
          f"{len(tally.errors)} error answers, {in_err} in err, {len(missing)} lost, "
          f"{pruned} run and pruned by the cleaner   "
          f"{judge(not tally.errors and not in_err and not missing)}")
    for door in tally.waits:
        print(f"answer times, {door:<6}: {tally.latency(door)}")
    for why in tally.errors[:5]:
        print(f"  error: {why}")
    for msg_id in missing[:5]:
        print(f"  lost: {msg_id}")
    for role, (rss, fds) in before.items():
        rss2, fds2 = after[role]
        print(f"{role:<12} RSS {rss / 1024:6.1f} MiB -> {rss2 / 1024:6.1f} MiB "
              f"({(rss2 - rss) / rss:+.1%}), fds {fds} -> {fds2}")
    memory_ok = flat(before, after)
    print(f"memory and fds flat (RSS +-10 %, same fds): {judge(memory_ok)}")
    return not tally.errors and not in_err and not missing and memory_ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warmup", type=float, default=20)
    parser.add_argument("--http", type=int, default=64)
    parser.add_argument("--socket", type=int, default=64)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between a "
                        "client's messages (128 clients every 2 s: 64 msgs/s)")
    parser.add_argument("--clean-every", type=float, default=10)
    parser.add_argument("--prune-age", type=float, default=15)
    args = parser.parse_args(argv)
    base = make_scratch("load-")
    serve = Serve(base)
    try:
        pids = serve.pids()
        warm = load(serve, args, args.warmup)
        _wait(lambda: drained(serve), 300, "the warm-up to drain")
        before = measure(serve, pids)
        started = time.monotonic()
        tally = load(serve, args, args.seconds)
        seconds = time.monotonic() - started
        _wait(lambda: drained(serve), 300, "the load to drain")
        after = measure(serve, pids)
        tally.acked |= warm.acked
        tally.errors += warm.errors
        ok = report(args, tally, serve, seconds, before, after)
    finally:
        stop(serve.proc)
        shutil.rmtree(base, ignore_errors=True)
    print("bench_load:", "all PASS" if ok else "some MISS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
