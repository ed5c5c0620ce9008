"""Drain scaling and the queue daemon's cost per message (issues 15 and 35).

Gate, then drain: N no-op messages (``echo done >&3``) are queued while the
queue cannot start them, then released, and timed until the last has ended.
Beside rqsys, in the same run and on the same script:

* the raw ceiling: Python ``posix_spawn`` of the script, N slots in flight;
* task-spooler (Debian ``task-spooler``, ``tsp -S N``), gated by N jobs that
  block on a FIFO until released;
* the floor of a Python daemon (``drain_floor``): only the renames
  ``queue/ -> run/ -> done/``, the start (``posix_spawn``), a pidfd and the
  reaping, its CPU a message (this process's own, not its scripts'); and
  that floor with the other system calls rqsys's run path makes a message
  (``drain_with_calls``: fd 4, a new session, the timeline, stats and log
  lines, the group's signal, ``wait4``, the leftovers check's read);
* rqsys starting its scripts in process (``RQ_FORK_SERVER=off``: the loop
  waits for each exec), alternated with the rounds of a daemon as it runs
  by default (``auto``: its fork server takes the starts while messages
  wait for a worker, in a queue of 4 workers or more), the figures judged.

For rqsys it also prints the daemon's own CPU per message (utime + stime of
every thread from ``/proc``, its fork server's added: a figure steady even
when wall-clock rates wobble; judged against the same run's
``drain_with_calls`` + 80 us, issue 50's target), how much of each message's wall time the loop
thread spent on the CPU, blocked in the spawn helper (its vfork waits for the
script's exec; with the fork server, the sending of the request)
and idle (the daemon's own sums: ``stats``' ``loop``; the first two overlap,
and the idle holds the slack of the last 50 ms poll, as the wall does: up
to 60 us a message), and,
when strace is installed, the daemon's system calls per message (every
thread, not the scripts; under strace each script's SIGCHLD, which the
kernel otherwise discards, interrupts a sleeping thread's futex wait, so
about 0.7 futex calls a message are strace's own), and, when valgrind is
installed, the daemon's user-space instructions per message under
callgrind: a count the machine's load does not move, unlike CPU time,
which a busy 2-core machine inflates by half (``BENCH_INSTR=0``: not
measured; it takes about half a minute per worker count).  ``BENCH_DIR=<dir>``
runs it on another file system (a journalled ext4 beside this machine's
unjournalled root: see docs/BENCHMARKS.md for the ``chattr +D`` cost).
"""

from __future__ import annotations

import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import drain_floor
from bench_queue import Daemon, make_queue, report
from scratch import scratch_layout

from rqsys.store import Layout

try:
    from rqsys.wire.client import QueueClient
except ImportError:  # a checkout from before the house was arranged by feature (make bench-ab)
    from rqsys.client import QueueClient  # type: ignore[no-redef]

try:
    from rqsys.search.index import GATHER_BUSY
except ImportError:  # wave 1 (make bench-ab): no index
    GATHER_BUSY = 0.0

N = 800  # task-spooler's server takes at most 1,000 clients, one per queued job
ROUNDS = 3  # each figure is the median of this many gated drains
SLOTS = (2, 8)
STRACE_N = 1000
CPU_OVER_FLOOR = 80.0  # us a message over drain_with_calls the daemon may take (issue 50)
INSTR_N = 300  # messages drained under callgrind (about 50x slower)
TICK = os.sysconf("SC_CLK_TCK")
INDEX = "rq-search"  # the search index's thread (rqsys.search.index names it)
SETTLE = GATHER_BUSY + 0.2  # longer than the index thread's longest batch
SHOW_TABLE = os.environ.get("BENCH_SYSCALLS", "") == "table"  # each call per message


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (all threads) or of one of its threads."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def server_cpu(pid: int) -> float:
    """utime + stime of the daemon's fork server (``rqspawnd``; 0 when it has none)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    for kid in kids:
        try:
            if Path(f"/proc/{kid}/comm").read_text().strip() == "rqspawnd":
                return cpu_seconds(int(kid))
        except OSError:
            pass  # a script that ended meanwhile
    return 0.0


def thread_cpu(pid: int, comm: str) -> float:
    """utime + stime of the daemon's threads named ``comm`` (0 if none)."""
    total = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == comm:
                total += cpu_seconds(pid, int(tid))
        except OSError:
            pass  # the thread ended meanwhile
    return total


# ----------------------------------------------------------------- the ceiling
def ceiling(script: Path, slots: int, n: int) -> float:
    """runs/s of posix_spawn with fd 3 on a pipe, ``slots`` in flight."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    actions = [(os.POSIX_SPAWN_DUP2, write_end, 3)]
    running, started = 0, time.perf_counter()
    for _ in range(n):
        if running == slots:
            os.wait()
            running -= 1
        os.posix_spawn(str(script), [str(script)], os.environ, file_actions=actions)
        running += 1
        _drain(read_end)
    for _ in range(running):
        os.wait()
    elapsed = time.perf_counter() - started
    os.close(read_end)
    os.close(write_end)
    return n / elapsed


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except BlockingIOError:
        pass


# ----------------------------------------------------------------- the Python floor
def python_floor(scratch: Path, script: Path, slots: int, n: int,
                 calls: bool = False) -> tuple[float, float]:
    """(msgs/s, CPU us a message) of ``drain_floor`` over n messages in
    ``scratch``; ``calls``: with rqsys's other system calls (``drain_with_calls``)."""
    names = drain_floor.prepare(scratch, n)
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    (drain_floor.drain_with_calls if calls else drain_floor.drain)(scratch, names, script, slots)
    elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    shutil.rmtree(scratch)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return n / elapsed, cpu / n * 1e6


# ----------------------------------------------------------------- task-spooler
def task_spooler(scratch: Path, slots: int, n: int) -> tuple[float, float] | None:
    """(jobs/s, its server's CPU us a job) of ``tsp -S slots`` over n jobs,
    gated; None without tsp.  The server's own CPU (utime + stime: its
    forks counted, not its jobs'), the figure beside the daemon's."""
    tsp = shutil.which("tsp") or shutil.which("ts")
    if tsp is None:
        return None
    scratch.mkdir()
    env = dict(os.environ, TS_SOCKET=str(scratch / f"tsp-{slots}.sock"),
               TS_MAXFINISHED=str(n + slots + 10), TMPDIR=str(scratch))
    gate = scratch / f"gate-{slots}"
    os.mkfifo(gate)
    job = scratch / "tsp-job"
    job.write_text("#!/bin/sh\necho done\n")
    job.chmod(0o755)

    def tsp_run(*args: str) -> None:
        subprocess.run([tsp, *args], env=env, check=True, stdout=subprocess.DEVNULL)

    try:
        tsp_run("-S", str(slots))
        for _ in range(slots):
            tsp_run("-n", "sh", "-c", f"cat {gate} > /dev/null")
        for _ in range(n):
            tsp_run("-n", str(job))
        _wait_running(tsp, env, slots)
        server = _tsp_server(env["TS_SOCKET"])
        cpu0, started = cpu_seconds(server), time.perf_counter()
        os.close(os.open(gate, os.O_WRONLY))  # every gate job reads EOF and ends
        tsp_run("-w")  # waits for the last job
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(server) - cpu0
        return n / elapsed, cpu / n * 1e6
    finally:
        _open_gate(gate)  # on failure too: no gate job is left blocked on the FIFO
        subprocess.run([tsp, "-K"], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def _tsp_server(sock: str) -> int:
    """The pid of the task-spooler server listening on ``sock``."""
    mark = f"TS_SOCKET={sock}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() not in ("tsp", "ts"):
                continue
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return int(pid)
        except OSError:
            pass  # ended meanwhile, or not ours to read
    raise RuntimeError(f"no task-spooler server on {sock}")


def _open_gate(gate: Path) -> None:
    try:
        os.close(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # ENXIO: nobody is reading it (any more)


def _wait_running(tsp: str, env: dict[str, str], slots: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listing = subprocess.run([tsp], env=env, capture_output=True, text=True).stdout
        if listing.count(" running ") >= slots:
            return
        time.sleep(0.05)
    raise RuntimeError("task-spooler gate jobs did not start")


# ----------------------------------------------------------------- rqsys
def rqsys_drain(daemon: Daemon, layout: Layout, name: str, n: int,
                strace_out: Path | None = None) -> dict[str, float]:
    """Gate (pause), queue n, resume; rate and the daemon's cost per message."""
    pid = daemon.proc.pid
    with QueueClient(layout, name) as client:
        client.call("adminoper", oper="pause")
        done = client.call("counts")["counts"]["done"]
        for _ in range(n):
            client.call("create", msg={})
        index0 = _index_settled(pid)  # the creates' rows are not the drain's cost
        clock0 = _loop_clock(client)
        tracer = _strace(pid, strace_out) if strace_out else None
        cpu0, loop0, server0 = cpu_seconds(pid), cpu_seconds(pid, pid), server_cpu(pid)
        started = time.perf_counter()
        client.call("adminoper", oper="up")
        while client.call("counts")["counts"]["done"] < done + n:
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        server = server_cpu(pid) - server0  # counted in the daemon's CPU
        cpu, loop = cpu_seconds(pid) - cpu0 + server, cpu_seconds(pid, pid) - loop0
        clock = {k: v - clock0[k] for k, v in _loop_clock(client).items()}
        index = _index_settled(pid) - index0
    if tracer is not None:
        tracer.terminate()
        tracer.wait(30)
    return {"rate": n / elapsed, "cpu_us": cpu / n * 1e6, "loop_busy_us": loop / n * 1e6,
            "wall_us": elapsed / n * 1e6, "index_us": index / n * 1e6,
            "idle_us": clock["idle_s"] / n * 1e6, "spawn_us": clock["spawn_s"] / n * 1e6,
            "server_us": server / n * 1e6}


def _loop_clock(client: QueueClient) -> dict[str, float]:
    """The loop's idle and spawn-blocked seconds so far (rqsys.daemon.loopclock;
    NaN from a daemon without them: wave 1, in ``make bench-ab``)."""
    got = client.call("stats").get("loop") or {}
    return {k: float(got.get(k, math.nan)) for k in ("idle_s", "spawn_s")}


def _index_settled(pid: int) -> float:
    """The index thread's CPU once it has caught up (a busy queue's last
    batch is written up to GATHER_BUSY after the last event): no change over
    longer than that (at once without an index: wave 1, in ``make bench-ab``)."""
    last, deadline = thread_cpu(pid, INDEX), time.monotonic() + 10
    while last and time.monotonic() < deadline:
        time.sleep(SETTLE)
        now = thread_cpu(pid, INDEX)
        if now == last:
            break
        last = now
    return last


def _strace(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """strace -c on every thread of the daemon (not -f: the scripts are not
    the daemon's cost), once it has attached to all of them."""
    if shutil.which("strace") is None:
        return None
    tids = os.listdir(f"/proc/{pid}/task")
    tracer = subprocess.Popen(["strace", "-c", "-o", str(out), *(f"-p{t}" for t in tids)],
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not all(_traced_by(pid, tid, tracer.pid) for tid in tids):
        if time.monotonic() > deadline or tracer.poll() is not None:
            raise RuntimeError("strace did not attach to every thread of the daemon")
        time.sleep(0.05)
    return tracer


def instructions(layout: Layout, scratch: Path, slots: int) -> tuple[float, float] | None:
    """The daemon's user-space instructions per message over a gated drain
    of INSTR_N, (every thread, the loop thread alone), counted by callgrind
    from the resume to the last end (None without valgrind, or with
    BENCH_INSTR=0).  The loop's share is the figure to judge the run path
    by: under callgrind the drain runs about 50 times slower, so the search
    index's thread commits a batch for every message or two, where at full
    speed one holds a hundred."""
    if shutil.which("valgrind") is None or os.environ.get("BENCH_INSTR") == "0":
        return None
    name, out = f"instr{slots}", scratch / f"callgrind-{slots}.out"
    make_queue(layout, name, "echo done >&3", num_workers=slots)
    daemon = Daemon(layout, name, prefix=("valgrind", "--tool=callgrind", "-q",
                                          "--separate-threads=yes", "--instr-atstart=no",
                                          f"--callgrind-out-file={out}"))
    try:
        _gated(daemon, layout, name, 50, lambda _on: None)  # warm: spares, caches
        _gated(daemon, layout, name, INSTR_N, lambda on: subprocess.run(
            ["callgrind_control", "-i", "on" if on else "off", str(daemon.proc.pid)],
            check=True, capture_output=True))
    finally:
        daemon.stop()
    threads = {path.name.rsplit("-", 1)[-1]: _callgrind_total(path)
               for path in out.parent.glob(f"{out.name}*")}
    if not threads:
        return None
    return sum(threads.values()) / INSTR_N, threads.get("01", 0) / INSTR_N  # 01: the main thread


def _callgrind_total(path: Path) -> int:
    return sum(int(line.split()[1]) for line in path.read_text(errors="replace").splitlines()
               if line.startswith("totals:"))


def _gated(daemon: Daemon, layout: Layout, name: str, n: int, count: Any) -> None:
    """A gated drain of n, ``count(True)`` at the resume, ``count(False)`` at the end."""
    with QueueClient(layout, name) as client:
        client.call("adminoper", oper="pause")
        done = client.call("counts")["counts"]["done"]
        for _ in range(n):
            client.call("create", msg={})
        _index_settled(daemon.proc.pid)  # the creates' rows are not the drain's cost
        count(True)
        client.call("adminoper", oper="up")
        while client.call("counts")["counts"]["done"] < done + n:
            time.sleep(0.1)
        _index_settled(daemon.proc.pid)  # nor is a drain's last batch left out
        count(False)


def _traced_by(pid: int, tid: str, tracer: int) -> bool:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return f"TracerPid:\t{tracer}\n" in status


def strace_table(out: Path) -> list[tuple[str, int, int]]:
    """(syscall, calls, errors) rows of an ``strace -c`` summary, "total" last.

    Read by column position under the header, so a blank cell (no errors,
    or a total line without usecs/call in some strace versions) is not
    mistaken for the next column."""
    if not out.exists():
        return []
    lines = out.read_text().splitlines()
    header = next((line for line in lines if line.lstrip().startswith("% time")), None)
    if header is None:
        return []
    ends = {name: header.index(name) + len(name) for name in ("calls", "errors")}
    rows = []
    for line in lines:
        cells = {m.end(): m.group() for m in re.finditer(r"\S+", line)}
        calls = cells.get(ends["calls"], "")
        if calls.isdigit():
            errors = cells.get(ends["errors"], "0")
            rows.append((line.split()[-1], int(calls), int(errors) if errors.isdigit() else 0))
    return rows


def syscalls_per_message(out: Path, n: int) -> float | None:
    """The daemon's system calls per message: the summary's total over n."""
    total = [calls for name, calls, _errors in strace_table(out) if name == "total"]
    return total[0] / n if total else None


def _print_table(out: Path, n: int) -> None:
    """The per-syscall counts per message, for the report."""
    rows = [row for row in strace_table(out) if row[0] != "total"]
    cells = [f"{name} {calls / n:.2f}" + (f" ({fails:.2f} failed)" if fails >= 0.005 else "")
             for name, calls, errors in sorted(rows, key=lambda r: -r[1])
             if calls / n >= 0.05 and (fails := errors / n) is not None]
    for start in range(0, len(cells), 4):
        print(f"{'':<52}     " + ", ".join(cells[start:start + 4]), flush=True)


def bench_slots(layout: Layout, scratch: Path, slots: int) -> None:
    name = f"drain{slots}"
    script = make_queue(layout, name, "echo done >&3", num_workers=slots)
    make_queue(layout, f"{name}old", "echo done >&3", num_workers=slots)
    daemon, old = _daemon(layout, name, None), _daemon(layout, f"{name}old", "off")
    bases, spoolers, runs, olds, floors, with_calls = [], [], [], [], [], []
    try:
        rqsys_drain(daemon, layout, name, N // 4)  # warm: spares, caches
        rqsys_drain(old, layout, f"{name}old", N // 4)
        for r in range(ROUNDS):  # alternate, so drift of the machine hits all four
            bases.append(ceiling(script, slots, N))
            spoolers.append(task_spooler(scratch / f"tsp-{slots}-{r}", slots, N))
            floors.append(python_floor(scratch / f"floor-{slots}-{r}", script, slots, N))
            with_calls.append(python_floor(scratch / f"calls-{slots}-{r}", script, slots, N,
                                           calls=True))
            runs.append(rqsys_drain(daemon, layout, name, N))
            olds.append(rqsys_drain(old, layout, f"{name}old", N))
        traced = scratch / f"strace-{slots}.txt"
        rqsys_drain(daemon, layout, name, STRACE_N, traced)
    finally:
        daemon.stop()
        old.stop()
    base = statistics.median(bases)
    spooler = spooler_cpu = None
    if None not in spoolers:
        spooler = statistics.median(s[0] for s in spoolers if s)
        spooler_cpu = statistics.median(s[1] for s in spoolers if s)
    got = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    _report_slots(slots, base, (spooler, spooler_cpu), got,
                  syscalls_per_message(traced, STRACE_N),
                  statistics.median(f[1] for f in with_calls))
    _report_in_process(slots, spooler, {k: statistics.median(run[k] for run in olds)
                                        for k in olds[0]})
    for floor, calls in ((floors, False), (with_calls, True)):
        _report_floor(slots, spooler, statistics.median(f[0] for f in floor),
                      statistics.median(f[1] for f in floor), calls)
    if SHOW_TABLE:
        _print_table(traced, STRACE_N)
    _report_instructions(layout, scratch, slots)


def _report_instructions(layout: Layout, scratch: Path, slots: int) -> None:
    instr = instructions(layout, scratch, slots)
    if instr is not None:
        report(f"rqsys daemon instructions per message, {slots}",
               f"{instr[0] / 1000:8.0f} kinstr (loop thread {instr[1] / 1000:.0f}; user space,"
               " callgrind: steady under load)")


def _daemon(layout: Layout, name: str, fork_server: str | None) -> Daemon:
    """A daemon as ``RQ_FORK_SERVER`` says (None: its default, ``auto``), or
    starting its scripts in process (``off``: the loop waits for each exec),
    the same-run baseline."""
    os.environ.pop("RQ_FORK_SERVER", None)
    if fork_server is not None:
        os.environ["RQ_FORK_SERVER"] = fork_server
    try:
        return Daemon(layout, name)
    finally:
        os.environ.pop("RQ_FORK_SERVER", None)


def _report_in_process(slots: int, spooler: float | None, old: dict[str, float]) -> None:
    vs = f", {old['rate'] / spooler:.2f}x task-spooler" if spooler else ""
    report(f"baseline: scripts started in process, {slots} workers",
           f"{old['rate']:8.0f} msgs/s{vs}; daemon CPU {old['cpu_us']:.0f} us, "
           f"{old['spawn_us']:.0f} us blocked in the spawn helper (RQ_FORK_SERVER=off)")


def _report_floor(slots: int, spooler: float | None, rate: float, cpu: float,
                  calls: bool) -> None:
    vs = f", {rate / spooler:.2f}x task-spooler" if spooler else ""
    what = ("with rqsys's system calls", "rqsys's other calls: drain_with_calls") if calls \
        else ("", "renames, posix_spawn, pidfd, waitpid: drain_floor")
    report(f"the Python floor{' ' if calls else ''}{what[0]}, {slots} workers",
           f"{rate:8.0f} msgs/s{vs}; its CPU {cpu:.0f} us a message ({what[1]})")


def _report_slots(slots: int, base: float, tsp: tuple[float | None, float | None],
                  got: dict[str, float], calls: float | None, floor_cpu: float) -> None:
    """``floor_cpu``: the same run's floor with rqsys's calls, CPU us a message."""
    spooler, spooler_cpu = tsp
    rate, ratio = got["rate"], got["rate"] / base
    report(f"raw posix_spawn ceiling, {slots} slots", f"{base:8.0f} runs/s")
    if spooler is None:
        report(f"task-spooler -S {slots}", "     n/a (apt-get install task-spooler)")
    else:
        report(f"task-spooler -S {slots}",
               f"{spooler:8.0f} jobs/s ({spooler / base:.0%} of ceiling); its server's CPU"
               f" {spooler_cpu:.0f} us a job")
    ok = spooler is not None and rate >= spooler
    vs = f", {rate / spooler:.2f}x task-spooler" if spooler else ""
    report(f"rqsys drain, num_workers {slots}", f"{rate:8.0f} msgs/s ({ratio:.0%} of ceiling"
           f"{vs}; target >= 1.0x task-spooler)", "PASS" if ok else "MISS")
    cpu, most = got["cpu_us"], floor_cpu + CPU_OVER_FLOOR
    report(f"rqsys daemon CPU per message, {slots} workers",
           f"{cpu:8.0f} us, fork server's {got['server_us']:.0f} us in it (target <= the floor"
           f" with rqsys's calls + {CPU_OVER_FLOOR:.0f} = {most:.0f} us)",
           "PASS" if cpu <= most else "MISS")
    report(f"rqsys loop busy per message, {slots} workers",
           f"{got['loop_busy_us']:8.0f} us CPU, {got['spawn_us']:.0f} us blocked in the spawn"
           f" helper, {got['idle_us']:.0f} us idle (of {got['wall_us']:.0f} us wall)")
    report(f"rqsys index thread CPU per message, {slots} workers",
           f"{got['index_us']:8.0f} us (the search index's, in the daemon's CPU)")
    report(f"rqsys loop blocked in spawn per message, {slots} workers",
           f"{got['spawn_us']:8.1f} us (target < 20 us)",
           "PASS" if got["spawn_us"] < 20 else "MISS")
    if calls is None:
        report(f"rqsys daemon syscalls per message, {slots} workers",
               "     n/a (apt-get install strace)")
    else:
        report(f"rqsys daemon syscalls per message, {slots} workers",
               f"{calls:8.1f} calls (target <= 16)", "PASS" if calls <= 16 else "MISS")


def main() -> int:
    scratch, layout = scratch_layout("drain-")
    try:
        for slots in SLOTS:
            bench_slots(layout, scratch, slots)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
