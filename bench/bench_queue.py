"""Queue core figures, each beside a baseline measured in the same run.

* durable enqueue over the socket, 1 and 16 clients, vs a bare Python loop of
  write + fsync + rename + fsync(dir) on the same disk;
* end to end: 2,000 messages through ``echo done >&3`` with 2 workers, vs
  Python spawning the same script 2,000 times two at a time;
* latency from enqueue to script start on an idle queue (p50, p99);
* idle daemon RSS; start-up time with 100,000 queued messages.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scratch import make_scratch

from rqsys import config
from rqsys.store import IdMaker, Layout

try:
    from rqsys.wire.client import QueueClient
except ImportError:  # a checkout from before the house was arranged by feature (make bench-ab)
    from rqsys.client import QueueClient  # type: ignore[no-redef]

ENQUEUE_N = 1500
ENQUEUE_ROUNDS = 10  # baseline and daemon alternate in short rounds
E2E_ROUNDS = 4
E2E_N = 2000
LATENCY_N = 200
STRACE_N = 500  # creates counted under strace (it slows them: not in the rates)
STARTUP_N = 100_000
RESULTS: list[tuple[str, str]] = []
# what `python -m` runs `rqsys` from in the checkout under test: the package
# (after the house was arranged by feature), else rqsys.cli_rqsys, else (wave 1) rqsys.cli
ENTRY = next(m for m in ("rqsys.__main__", "rqsys.cli_rqsys", "rqsys.cli")
             if importlib.util.find_spec(m)).removesuffix(".__main__")


def report(name: str, value: str, verdict: str = "") -> None:
    line = f"{name:<52} {value}"
    print(f"{line}  {verdict}" if verdict else line, flush=True)
    RESULTS.append((name, verdict))


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[max(0, int(len(ordered) * 0.99) - 1)]


def judge(ratio: float, target: float) -> str:
    return "PASS" if ratio >= target else "MISS"


class Daemon:
    """A real queue daemon with a NOTIFY_SOCKET we read READY=1 from."""

    def __init__(self, layout: Layout, name: str, prefix: tuple[str, ...] = ()) -> None:
        """``prefix``: words before the daemon's argv (``systemd-run --scope``, say)."""
        self.layout, self.name = layout, name
        path = layout.root / f".notify-{name}"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path.unlink(missing_ok=True)
        self.notify.bind(str(path))
        self.notify.settimeout(60)
        env = dict(os.environ, NOTIFY_SOCKET=str(path))
        env.pop("JOURNAL_STREAM", None)
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", ENTRY, "--root", str(layout.root), "queue", name],
            env=env, start_new_session=True, stderr=subprocess.DEVNULL)
        while b"READY=1" not in self.notify.recv(4096).split(b"\n"):
            pass
        self.ready_after = time.perf_counter() - self.started

    def call(self, op: str, **args):
        with QueueClient(self.layout, self.name) as client:
            return client.call(op, **args)

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.notify.close()


def make_queue(layout: Layout, name: str, body: str, **cfg) -> Path:
    script = layout.root / f"{name}.run"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    layout.create_queue_dir(name, config.queue_config(name, str(script), cfg))
    return script


# ----------------------------------------------------------------- enqueue
def bare_durable_loop(base: Path, n: int) -> float:
    """msgs/s of the bare durable loop (a fresh directory per call)."""
    base.mkdir(parents=True)
    tmp, que = base / "tmp", base / "que"
    tmp.mkdir()
    que.mkdir()
    dfd = os.open(que, os.O_RDONLY)
    start = time.perf_counter()
    for i in range(n):
        path = tmp / f"m{i}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, json.dumps({"dest": "q", "param1": str(i)}).encode())
        os.fsync(fd)
        os.close(fd)
        os.rename(path, que / f"m{i}")
        os.fsync(dfd)
    elapsed = time.perf_counter() - start
    os.close(dfd)
    return n / elapsed


def _client(args: tuple[str, int, float]) -> int:
    root, n, start_at = args
    layout = Layout.from_root(root)
    while time.time() < start_at:
        time.sleep(0.001)
    with QueueClient(layout, "enq") as client:
        for i in range(n):
            client.call("create", msg={"param1": str(i)})
    return n


def socket_enqueue(layout: Layout, clients: int, n: int) -> float:
    per = n // clients
    start_at = time.time() + 0.5
    with multiprocessing.get_context("fork").Pool(clients) as pool:
        result = pool.map_async(_client, [(str(layout.root), per, start_at)] * clients)
        sent = sum(result.get(300))
    return sent / (time.time() - start_at)


def paired(rounds: int, baseline, measured) -> tuple[float, float, float]:
    """Alternate baseline and measurement in short rounds (the disk is shared
    and its speed drifts); returns the median of each and of their ratios."""
    base, got = [], []
    for r in range(rounds):
        base.append(baseline(r))
        got.append(measured(r))
    ratios = [g / b for g, b in zip(got, base, strict=True)]
    return statistics.median(base), statistics.median(got), statistics.median(ratios)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far (steady under load, unlike rates)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of a process: "loop" (the main
    thread), its named threads, "other" for the rest (spares)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "loop" if task.name == str(pid) else (task / "comm").read_text().strip()
            secs = cpu_seconds_of(task / "stat")
        except OSError:
            continue  # a thread that just ended
        key = name if name == "loop" or name.startswith("rq-") else "other"
        out[key] = out.get(key, 0.0) + secs
    return out


def cpu_seconds_of(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def syscalls_per_create(layout: Layout, daemon: Daemon) -> None:
    """The daemon's system calls per create, every thread (strace -c), 1 client."""
    import bench_drain  # it imports this module: here, not at the top

    out = layout.root / "create.strace"
    tracer = bench_drain._strace(daemon.proc.pid, out)
    if tracer is None:
        return
    socket_enqueue(layout, 1, STRACE_N)
    tracer.send_signal(signal.SIGINT)
    tracer.wait(60)
    per = bench_drain.syscalls_per_message(out, STRACE_N)
    if per is not None:
        report("queue daemon syscalls per create, 1 client (strace)", f"{per:8.1f} calls")
        bench_drain._print_table(out, STRACE_N)


def bench_enqueue(layout: Layout, scratch: Path) -> None:
    make_queue(layout, "enq", "echo done >&3")
    daemon = Daemon(layout, "enq")
    daemon.call("adminoper", oper="pause")
    n = ENQUEUE_N // ENQUEUE_ROUNDS
    cpu: dict[str, float] = {}

    def one_client(_round: int) -> float:
        before = thread_seconds(daemon.proc.pid)
        got = socket_enqueue(layout, 1, n)
        for name, secs in thread_seconds(daemon.proc.pid).items():
            cpu[name] = cpu.get(name, 0.0) + secs - before.get(name, 0.0)
        return got

    try:
        b1, one, r1 = paired(ENQUEUE_ROUNDS, lambda r: bare_durable_loop(scratch / f"b{r}", n),
                             one_client)
        b16, many, r16 = paired(4, lambda r: bare_durable_loop(scratch / f"c{r}", n),
                                lambda r: socket_enqueue(layout, 16, n * 4))
        syscalls_per_create(layout, daemon)
    finally:
        daemon.stop()
    report("bare write+fsync+rename+fsync(dir) loop", f"{b1:8.0f} msgs/s")
    report("durable enqueue over the socket, 1 client", f"{one:8.0f} msgs/s "
           f"({r1:.0%} of bare, target >= 60%)", judge(r1, 0.60))
    creates = ENQUEUE_ROUNDS * n
    report("queue daemon CPU per create, 1 client",
           f"{sum(cpu.values()) / creates * 1e6:8.0f} us")
    for name in sorted(cpu):
        report(f"queue daemon CPU per create, thread {name}",
               f"{cpu[name] / creates * 1e6:8.0f} us")
    report("durable enqueue over the socket, 16 clients", f"{many:8.0f} msgs/s "
           f"({r16:.0%} of bare {b16:.0f}/s, target > 100%)", judge(r16, 1.0))


# ----------------------------------------------------------------- end to end
def spawn_baseline(script: Path, n: int) -> float:
    read_end, write_end = (_lift(fd) for fd in os.pipe())
    saved = _lift(3) if _fd_open(3) else None
    os.dup2(write_end, 3)
    running: list[subprocess.Popen] = []
    start = time.perf_counter()
    for _ in range(n):
        if len(running) == 2:
            running.pop(0).wait()
        running.append(subprocess.Popen([str(script)], pass_fds=(3,), stdin=subprocess.DEVNULL))
        _drain(read_end)
    for proc in running:
        proc.wait()
    elapsed = time.perf_counter() - start
    os.close(3)
    if saved is not None:
        os.dup2(saved, 3)
        os.close(saved)
    os.close(read_end)
    os.close(write_end)
    return n / elapsed


def _lift(fd: int) -> int:
    """A copy of ``fd`` numbered 10 or above (fd 3 is about to be replaced)."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    if fd != 3:
        os.close(fd)
    return high


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _drain(fd: int) -> None:
    os.set_blocking(fd, False)
    try:
        while os.read(fd, 65536):
            pass
    except BlockingIOError:
        pass


def daemon_drain(layout: Layout, n: int) -> float:
    """Queue n messages while paused, resume, and time until all are done."""
    with QueueClient(layout, "e2e") as client:
        client.call("adminoper", oper="pause")
        done = client.call("counts")["counts"]["done"]
        for _ in range(n):
            client.call("create", msg={})
        start = time.perf_counter()
        client.call("adminoper", oper="up")
        while client.call("counts")["counts"]["done"] < done + n:
            time.sleep(0.01)
    return n / (time.perf_counter() - start)


def bench_end_to_end(layout: Layout) -> None:
    script = make_queue(layout, "e2e", "echo done >&3", num_workers=2)
    daemon = Daemon(layout, "e2e")
    n = E2E_N // E2E_ROUNDS
    try:
        base, rate, ratio = paired(E2E_ROUNDS, lambda r: spawn_baseline(script, n),
                                   lambda r: daemon_drain(layout, n))
    finally:
        daemon.stop()
    report("python spawning the script, 2 at a time", f"{base:8.0f} runs/s")
    report(f"end to end, {E2E_N} messages, 2 workers", f"{rate:8.0f} msgs/s "
           f"({ratio:.0%} of spawn baseline, target >= 65%)", judge(ratio, 0.65))


# ----------------------------------------------------------------- latency, RSS
def bench_latency(layout: Layout) -> None:
    fifo = layout.root / "started.fifo"
    os.mkfifo(fifo)
    make_queue(layout, "lat", f'echo "$RQ_MSG_ID" > {fifo}\necho done >&3')
    daemon = Daemon(layout, "lat")
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    os.set_blocking(reader, True)
    keep_open = os.open(fifo, os.O_WRONLY)  # so the reader never sees EOF
    samples, after_ack = [], []
    try:
        with QueueClient(layout, "lat") as client:
            for _ in range(LATENCY_N):
                start = time.perf_counter()
                client.call("create", msg={})
                acked = time.perf_counter()
                os.read(reader, 100)
                samples.append((time.perf_counter() - start) * 1000)
                after_ack.append((time.perf_counter() - acked) * 1000)
                while client.call("counts")["counts"]["run"]:
                    time.sleep(0.001)
        p50, p99 = percentiles(samples)
        report("latency enqueue -> script start, idle queue",
               f"p50 {p50:.2f} ms, p99 {p99:.2f} ms (target p50 <= 4 ms)",
               "PASS" if p50 <= 4 else "MISS")
        p50, p99 = percentiles(after_ack)
        report("  of which after the durable ack (spawn + exec)",
               f"p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        report("queue daemon RSS when idle", f"{daemon.rss_kb() / 1024:.1f} MiB")
    finally:
        os.close(keep_open)
        os.close(reader)
        daemon.stop()


# ----------------------------------------------------------------- start-up
def fill_que(layout: Layout, name: str, n: int) -> None:
    que = layout.queue_dir(name) / "que"
    ids = IdMaker()
    for i in range(n):
        msg_id = ids.next_id()
        os.mkdir(que / msg_id)
        with open(que / msg_id / "msg", "w") as f:
            json.dump({"dest": name, "param1": str(i), "msg_id": msg_id, "count": 0, "due": 0,
                       "max_count": 15}, f)
    os.sync()


def bench_startup(layout: Layout) -> None:
    make_queue(layout, "big", "echo done >&3")
    (layout.queue_dir("big") / "admin_state").write_text("PAUSE\n")
    fill_que(layout, "big", STARTUP_N)
    daemon = Daemon(layout, "big")
    try:
        que = daemon.call("counts")["counts"]["que"]
        report(f"start-up with {que} messages in que/ (one by one)",
               f"{daemon.ready_after:8.2f} s (target < 3 s)",
               "PASS" if daemon.ready_after < 3 else "MISS")
        report("queue daemon RSS with 100,000 queued", f"{daemon.rss_kb() / 1024:.1f} MiB")
    finally:
        daemon.stop()
    daemon = Daemon(layout, "big")  # after a clean stop: from que.snapshot
    try:
        report("start-up again after a clean stop (que.snapshot)",
               f"{daemon.ready_after:8.2f} s (target < 3 s)",
               "PASS" if daemon.ready_after < 3 else "MISS")
    finally:
        daemon.stop()


SECTIONS = {"enqueue": lambda layout, scratch: bench_enqueue(layout, scratch),
            "e2e": lambda layout, _scratch: bench_end_to_end(layout),
            "latency": lambda layout, _scratch: bench_latency(layout),
            "startup": lambda layout, _scratch: bench_startup(layout)}


def main() -> int:
    """Every section, or those named on the command line (``enqueue e2e ...``)."""
    chosen = sys.argv[1:] or list(SECTIONS)
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        print(f"bench_queue: no section {', '.join(sorted(unknown))} "
              f"(one of {', '.join(SECTIONS)})", file=sys.stderr)
        return 2
    scratch = make_scratch("queue-")
    layout = Layout(scratch / "root", scratch / "root" / "sock")
    layout.make_dirs()
    layout.socket_dir.mkdir()
    try:
        for name in chosen:
            SECTIONS[name](layout, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    missed = [name for name, verdict in RESULTS if verdict == "MISS"]
    print(f"queue: {len(missed)} target(s) missed" + (f": {', '.join(missed)}" if missed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
