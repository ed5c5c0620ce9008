"""Search and bulk retry over 1,000,000 done + 100,000 err messages.

What it builds, in its own scratch directory (removed at the end):

* a paused queue ``s`` (retried messages stay queued: no script runs);
* 100,000 **real** err messages ``database down on db0N`` and 1,000 real err
  messages ``disk full on /dev/sdN`` (directories with msg, status and count,
  written before the daemon starts, as a crash-free store would hold them);
* the daemon starts and reconciles its search index from the store (timed);
* 1,000,000 done messages as **index rows only** (params, tags, status,
  times over the last week), inserted into the daemon's ``search.sqlite``
  once its reconcile has ended: a million real directories would cost ~5M
  inodes on this disk.  The daemon keeps them until it restarts (the next
  reconcile drops rows the store lacks, as it should).

Then: the first page (25 rows) of several searches through the daemon's
``search`` op and through the web app's ``search.json`` and queue page
(falcon, in process), 30 rounds each, p50 and p99 (target p50 < 50 ms);
and one ``bulk`` retry of the 100,000 ``database`` err messages while
another client sends ``counts`` in a loop (its latency printed; target
< 30 s).  Checked after: 100,000 in que, the 1,000 others still in err.

Before and after a change, alternated in one run at a smaller count:
``python bench/ab.py --bench bench_search.py BEFORE_DIR AFTER_DIR 0 10000``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import sys
import threading
import time

import falcon.testing
from bench_queue import Daemon, judge, make_queue, report
from scratch import make_scratch

from rqsys import config
from rqsys.search import index as searchindex
from rqsys.search import rows
from rqsys.store import IdMaker, Layout
from rqsys.web.app import create_app
from rqsys.wire.client import QueueClient

DONE_N, ERR_N, OTHER_N = 1_000_000, 100_000, 1_000
ROUNDS = 30
PAGE_TARGET_MS, BULK_TARGET_S = 50.0, 30.0
BULK_TIMEOUT = 3600.0  # on a machine under a load of 15 the 100,000 retries took over 600 s
SEARCHES = {
    "done, newest first": {"state": "done"},
    "text 'processed' (1M match)": {"text": "processed"},
    "text 'host7 rows' (100k match)": {"text": "host7 rows"},
    "err text 'database db03'": {"state": "err", "text": "database db03"},
    "tag 'nightly'": {"tag": "nightly"},
    "done ended in the last hour": {"state": "done", "since": 0.0, "when": "ended"},
    "done sorted by run time": {"state": "done", "sort": "run_s"},
}


def write_errs(layout: Layout, n: int, status: str, ids: IdMaker) -> None:
    err = layout.queue_dir("s") / "err"
    for i in range(n):
        msg_id = ids.next_id()
        path = err / msg_id
        os.mkdir(path)
        with open(path / "msg", "w") as f:
            json.dump({"dest": "s", "param1": f"import {i}", "msg_id": msg_id, "count": 1,
                       "due": 0, "max_count": 15, "tags": ["nightly"]}, f)
        (path / "status").write_text(status.format(n=i % 10))
        (path / "count").write_text("1")


def done_rows(n: int, now: float):
    for i in range(n):
        created = now - 7 * 86400 + i * (7 * 86400 / n)
        stamp = time.strftime("%Y%m%d.%H%M.%S", time.gmtime(created))
        msg_id = f"{stamp}.{int(created * 1000) % 1000:03d}.{i}"
        run_s = 0.05 + (i % 97) / 10
        tags = "nightly" if i % 10 == 0 else "adhoc"
        params = f"job {i} s"
        status = f"done processed {i % 5000} rows on host{i % 10}"
        yield (msg_id, "done", created, created + 1, created + 1 + run_s, run_s, status,
               params, tags, rows.row_text(params, [tags], status))


def insert_done(layout: Layout, n: int) -> float:
    start = time.perf_counter()
    db = searchindex.connect(layout.queue_dir("s") / searchindex.FILE)
    db.execute("BEGIN")
    db.executemany("INSERT INTO msgs(id, state, created, started, ended, run_s, status, "
                   "params, tags, text) VALUES (?,?,?,?,?,?,?,?,?,?)", done_rows(n, time.time()))
    db.execute("INSERT INTO msg_tags(tag, rid) SELECT tags, rowid FROM msgs WHERE state='done'")
    db.execute("COMMIT")
    db.close()
    return time.perf_counter() - start


def wait_indexed(daemon: Daemon) -> float:
    start = time.perf_counter()
    while daemon.call("search", limit=1)["partial"]:
        time.sleep(0.5)  # the reconcile of 101,000 messages takes seconds
    return time.perf_counter() - start


def timed(fn, rounds: int = ROUNDS) -> tuple[float, float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.99) - 1)]


def bench_pages(layout: Layout, daemon: Daemon) -> None:
    client = QueueClient(layout, "s")
    web = falcon.testing.TestClient(create_app(layout, config.load_system_config(layout)))
    for name, args in SEARCHES.items():
        args = dict(args, since=time.time() - 3600) if "since" in args else args
        p50, p99 = timed(lambda a=args: client.call("search", **a))
        report(f"search op: {name}", f"p50 {p50:.1f} ms, p99 {p99:.1f} ms "
               f"(total {client.call('search', **args)['total']:,})",
               judge(PAGE_TARGET_MS, p50))
    for name, path, params in (
            ("web search.json, text 'processed'", "/q/s/search.json", {"text": "processed"}),
            ("web queue page, done", "/q/s", {"state": "done"}),
            ("web queue page, text 'database db03'", "/q/s", {"state": "err",
                                                              "text": "database db03"})):
        p50, p99 = timed(lambda p=path, q=params: web.simulate_get(p, params=q))
        report(name, f"p50 {p50:.1f} ms, p99 {p99:.1f} ms", judge(PAGE_TARGET_MS, p50))
    client.close()


def cpu_s(pid: int, task: str = "") -> float:
    """User + system CPU seconds of a process (or one of its threads): steady
    under load, unlike wall time."""
    with open(f"/proc/{pid}{'/task/' + task if task else ''}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds by thread name (the loop is the process's own name)."""
    out: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/comm") as f:
            name = "loop" if task == str(pid) else f.read().strip()
        out[name] = out.get(name, 0.0) + cpu_s(pid, task)
    return out


def bench_bulk(layout: Layout, daemon: Daemon) -> None:
    latencies: list[float] = []
    stop = threading.Event()

    def other_client() -> None:
        with QueueClient(layout, "s") as client:
            while not stop.is_set():
                start = time.perf_counter()
                client.call("counts")
                latencies.append((time.perf_counter() - start) * 1000)
                time.sleep(0.01)  # a client asking 100 times a second
    thread = threading.Thread(target=other_client)
    thread.start()
    start, cpu, before = time.perf_counter(), cpu_s(daemon.proc.pid), threads_cpu(daemon.proc.pid)
    with QueueClient(layout, "s", timeout=BULK_TIMEOUT) as client:
        got = client.call("bulk", action="retry", text="database")
    took, cpu = time.perf_counter() - start, cpu_s(daemon.proc.pid) - cpu
    time.sleep(2)  # the index thread catches up with the last events
    after = threads_cpu(daemon.proc.pid)
    split = ", ".join(f"{name} {after[name] - before.get(name, 0.0):.1f} s"
                      for name in sorted(after) if after[name] - before.get(name, 0.0) >= 0.05)
    stop.set()
    thread.join()
    report(f"bulk retry of {got['matched']:,} matches",
           f"{took:.1f} s, daemon CPU {cpu:.1f} s (count {got['count']:,})",
           judge(BULK_TARGET_S, took))
    report("  daemon CPU by thread", split)
    latencies.sort()
    report("  meanwhile another client's counts", f"{len(latencies)} answers, p50 "
           f"{statistics.median(latencies):.1f} ms, p99 "
           f"{latencies[int(len(latencies) * 0.99) - 1]:.1f} ms, max {latencies[-1]:.1f} ms")
    with QueueClient(layout, "s") as client:
        counts = client.call("counts")["counts"]
    right = counts["que"] == ERR_N and counts["err"] == OTHER_N
    report("  after: que / err", f"{counts['que']:,} / {counts['err']:,}",
           "PASS" if right else "MISS")


def main() -> int:
    """``bench_search.py [DONE_N ERR_N]`` (smaller counts for a quick look)."""
    global DONE_N, ERR_N
    if len(sys.argv) > 2:
        DONE_N, ERR_N = int(sys.argv[1]), int(sys.argv[2])
    scratch = make_scratch("search-")
    layout = Layout(scratch / "root", scratch / "root" / "sock")
    layout.make_dirs()
    layout.socket_dir.mkdir()
    daemon = None
    try:
        make_queue(layout, "s", "echo done >&3")
        (layout.queue_dir("s") / "admin_state").write_text("PAUSE\n")
        start = time.perf_counter()
        ids = IdMaker()
        write_errs(layout, ERR_N, "database down on db0{n} after 30 s", ids)
        write_errs(layout, OTHER_N, "disk full on /dev/sd{n}", ids)
        os.sync()
        report(f"build: {ERR_N + OTHER_N:,} real err messages",
               f"{time.perf_counter() - start:.1f} s")
        daemon = Daemon(layout, "s")
        report("daemon start, index reconciled from the store", f"{wait_indexed(daemon):.1f} s")
        report(f"build: {DONE_N:,} done index rows", f"{insert_done(layout, DONE_N):.1f} s")
        bench_pages(layout, daemon)
        bench_bulk(layout, daemon)
    except sqlite3.Error as exc:
        print(f"bench_search: {exc}", file=sys.stderr)
        return 1
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
