"""A million queued (issue 50): one queue of 8 workers, N no-op messages deep.

    python bench/bench_depth.py [--million]     (N: BENCH_DEPTH_N, else 100,000)

On the file system under ``BENCH_DIR`` (``scratch.py``); the script is
``echo done >&3``, making a flag file first when there is none (a first start
seen).  In one run: the bulk enqueue of N (``create_many``, ``wire.bulk``'s
batches) while RQ's admin file ``config/<q>.pause`` gates the queue; inodes
per queued message (under the root; ``statvfs``, which others' files move too)
and the daemon's RSS; pages over HTTP with N queued (median of 5 after a
warm-up: the dashboard, each tab of the queue page, a message's page,
``q.json``, ``/q/<q>.json``, two searches); start-up after SIGKILL and after
SIGTERM, the gate removed just before it: until a create is taken (a probe to
``prep`` in a loop, ``que`` untouched) and until the first start, gated again
at once; a baseline drain of 2,000 on a fresh queue; the deep drain (the first
1 % and tenth against 2 % to 1 % left, the whole; the que tab fetched every 3
s); the pages again with N done; a table of the figures against the issue's
targets, and ``/proc/loadavg`` at both ends (how quiet the host was).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import bench_queue
from bench_console import raw_get
from bench_drain import INDEX, SETTLE, thread_cpu
from bench_queue import Daemon, make_queue, report
from bench_web import start_web
from procs import stop
from scratch import scratch_layout

from rqsys.errors import RQError
from rqsys.store import STATES, Layout
from rqsys.wire import bulk
from rqsys.wire.client import QueueClient

N_DEFAULT, MILLION = 100_000, 1_000_000
WORKERS = 8
BASE_N = 2_000
REPEATS = 5  # a page's figure: the median of this many, after one warm-up
PAGE_MS = 200.0
PAGE_EVERY = 3.0  # seconds between the operator's looks at the que tab while it drains
POLL = 0.05  # seconds between the drain's counts
WAIT = 900.0  # seconds to wait for a start, a flag (1M queued)
STALLED = 120.0  # seconds without a message ended: the drain has stalled
LOADAVG = Path("/proc/loadavg")
ROWS: list[tuple[str, str, str, str]] = []  # figure, value, target, verdict


def note(name: str, value: str, target: str = "", ok: bool | None = None,
         short: str = "") -> None:
    """A figure printed now and, when it has a target, kept for the table
    (``short``: its value there)."""
    verdict = "" if ok is None else ("PASS" if ok else "MISS")
    report(name, value + (f" (target {target})" if target else ""), verdict)
    if target:
        ROWS.append((name, short or value, target, verdict or "n/a"))


class Launched(Daemon):
    """A queue daemon started without waiting for its READY=1 (``ready`` does):
    what ``bench_queue.Daemon`` does up to its wait."""

    def __init__(self, layout: Layout, name: str, live: list[Launched]) -> None:
        """Started, and put in ``live`` (what the run ends, whatever happens)."""
        self.layout, self.name, self.ended = layout, name, False
        path = layout.root / f".notify-{name}"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path.unlink(missing_ok=True)
        self.notify.bind(str(path))
        self.notify.settimeout(WAIT)
        env = dict(os.environ, NOTIFY_SOCKET=str(path))
        env.pop("JOURNAL_STREAM", None)
        self.started = time.perf_counter()
        self.log = layout.root / f"{name}.log"  # its lines, shown if the run fails
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", bench_queue.ENTRY, "--root", str(layout.root), "queue",
                 name], env=env, start_new_session=True, stderr=log)
        live.append(self)

    def ready(self) -> Launched:
        while b"READY=1" not in self.notify.recv(4096).split(b"\n"):
            pass
        self.ready_after = time.perf_counter() - self.started
        return self

    def end(self, sig: signal.Signals) -> None:
        """``sig`` to the daemon alone, then whatever of its group is left is killed."""
        if self.ended:
            return
        self.ended = True
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(WAIT)
        self.notify.close()
        with contextlib.suppress(ProcessLookupError):  # nothing left of it
            os.killpg(self.proc.pid, signal.SIGKILL)


def gate(layout: Layout, name: str) -> Path:
    """The queue's RQ admin file ``config/<q>.pause``: there, the queue is paused."""
    return layout.config_file.parent / f"{name}.pause"


def flag(layout: Layout, name: str) -> Path:
    return layout.root / f"{name}.started"


def new_queue(layout: Layout, name: str, live: list[Launched]) -> Launched:
    """The queue, made gated, and its daemon running."""
    mark = flag(layout, name)
    make_queue(layout, name, f"[ -e {mark} ] || : > {mark}\necho done >&3",
               num_workers=WORKERS)
    gate(layout, name).touch()
    return Launched(layout, name, live).ready()


def counts(layout: Layout, name: str) -> dict[str, int]:
    with QueueClient(layout, name) as client:
        return dict(client.call("counts")["counts"])


# ----------------------------------------------------------------- enqueue, room
def enqueue(layout: Layout, name: str, n: int) -> tuple[float, list[str]]:
    """msgs/s of n creates in create_many batches (``wire.bulk``), and their ids."""
    with QueueClient(layout, name, timeout=300) as client:
        def create_many(msgs: list[object]) -> list[dict[str, object]]:
            return list(client.call("create_many", msgs=msgs)["results"])

        started = time.perf_counter()
        got = list(bulk.send(({"param1": f"m{i}"} for i in range(n)), create_many))
        elapsed = time.perf_counter() - started
    failed = [r for r in got if "error" in r]
    if failed:
        raise SystemExit(f"{len(failed)} creates failed, the first: {failed[0]}")
    return n / elapsed, [str(r["msg_id"]) for r in got]


def inodes(path: Path) -> int:
    """Inodes in use on ``path``'s file system (anyone else's files count too)."""
    st = os.statvfs(path)
    return st.f_files - st.f_ffree


def inodes_under(path: Path) -> int:
    """Inodes under ``path``, itself not counted: files and directories, each once."""
    seen, todo = set(), [str(path)]
    while todo:
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                seen.add(entry.inode())
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
    return len(seen)


def settled(pid: int) -> float:
    """Seconds until the search index's thread has caught up (its CPU unchanged
    for longer than its longest batch; bench_drain's test, without its 10 s cap)."""
    started, last = time.perf_counter(), thread_cpu(pid, INDEX)
    while time.perf_counter() - started < WAIT:
        time.sleep(SETTLE)
        now = thread_cpu(pid, INDEX)
        if now == last:
            break
        last = now
    return max(0.0, time.perf_counter() - started - SETTLE)


def bench_enqueue(layout: Layout, scratch: Path, daemon: Launched,
                  n: int) -> list[str]:
    que = layout.queue_dir(daemon.name) / "que"
    used0, mine0, rss0 = inodes(scratch), inodes_under(layout.root), daemon.rss_kb()
    rate, ids = enqueue(layout, daemon.name, n)
    note(f"bulk enqueue of {n:,}, create_many by {bulk.BATCH:,}", f"{rate:8,.0f} msgs/s")
    note("search index caught up, after the last create", f"{settled(daemon.proc.pid):8.1f} s")
    per, rss = inodes_under(que) / n, daemon.rss_kb()  # judged: the queue's own files aside
    note("inodes per queued message, in que/", f"{per:8.2f} (under the root "
         f"{(inodes_under(layout.root) - mine0) / n:.4f}; statvfs "
         f"{(inodes(scratch) - used0) / n:.4f})", "<= 2", per <= 2)
    kb, mib = (rss - rss0) / n, f"{rss / 1024:8.1f} MiB"
    note(f"queue daemon RSS, {n:,} queued", f"{mib}, {kb:.2f} KB a message (idle "
         f"{rss0 / 1024:.1f}; linear to 1M: {(rss0 + kb * MILLION) / 1024:.0f} MiB)",
         "<= 256 MiB at 1M", rss / 1024 <= 256 if n >= MILLION else None,
         f"{mib}, {kb:.2f} KB a msg")
    return ids


# ----------------------------------------------------------------- pages
def get_ms(port: int, path: str) -> float:
    """ms to the whole answer of one GET on a new connection (an error if not 200)."""
    started = time.perf_counter()
    status, _size, _headers = raw_get(port, path, {"Accept": "text/html"})
    took = (time.perf_counter() - started) * 1000
    if status != 200:
        raise SystemExit(f"GET {path}: HTTP {status}")
    return took


def pages(name: str, msg_id: str, word: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """The pages an operator looks at, a line each: (what, [(which, path)])."""
    return [("dashboard /", [("", "/")]),
            ("queue page tabs", [(s, f"/q/{name}?state={s}") for s in STATES]),
            ("a message's page", [("", f"/q/{name}/{msg_id}")]),
            ("JSON", [("/q.json", "/q.json"), ("/q/<q>.json", f"/q/{name}.json")]),
            ("search", [(f"param1:{word}", "/search?q=" + quote(f"param1:{word}")),
                        ("a word", "/search?q=" + quote(word))])]


def time_pages(port: int, groups: list[tuple[str, list[tuple[str, str]]]], when: str) -> None:
    """Each page's median of REPEATS after a warm-up; a line for each group."""
    for what, paths in groups:
        took = []
        for which, path in paths:
            get_ms(port, path)  # warm-up
            took.append((which, statistics.median(get_ms(port, path) for _ in range(REPEATS))))
        slow = max(took, key=lambda got: got[1])
        note(f"{when}: {what}", ", ".join(f"{which} {ms:.1f}".lstrip() for which, ms in took)
             + " ms", f"< {PAGE_MS:.0f} ms", slow[1] < PAGE_MS,
             f"slowest {slow[1]:.1f} ms {slow[0]}".rstrip())


# ----------------------------------------------------------------- start-up
def first_accept(layout: Layout, daemon: Launched) -> float:
    """perf_counter() once a probe create (to prep) is taken."""
    deadline = time.perf_counter() + WAIT
    while time.perf_counter() < deadline and daemon.proc.poll() is None:
        try:
            with QueueClient(layout, daemon.name) as client:
                client.call("create", msg={"param1": "probe"}, state="prep")
            return time.perf_counter()
        except (RQError, OSError):
            time.sleep(0.002)
    raise SystemExit(f"{daemon.name}: no create taken after the restart")


def first_start(mark: Path) -> float:
    """time.time() of the first start since ``mark`` was removed (its mtime)."""
    deadline = time.monotonic() + WAIT
    while not mark.exists():
        if time.monotonic() > deadline:
            raise SystemExit("no message started after the restart")
        time.sleep(0.002)
    return mark.stat().st_mtime


def restart(layout: Layout, live: list[Launched], sig: signal.Signals, how: str) -> Launched:
    """End the last daemon by ``sig``, start it again released, time it, gate it again."""
    name = live[-1].name
    que = counts(layout, name)["que"]
    live[-1].end(sig)
    flag(layout, name).unlink(missing_ok=True)
    gate(layout, name).unlink()  # released right at the restart
    wall0 = time.time()
    daemon = Launched(layout, name, live)
    accept = first_accept(layout, daemon) - daemon.started
    first = first_start(flag(layout, name)) - wall0
    gate(layout, name).touch()
    daemon.ready()
    while counts(layout, name)["run"]:
        time.sleep(0.01)
    ran = que - counts(layout, name)["que"]
    note(f"after {how}, {que:,} queued: a create taken", f"{accept:8.2f} s", "<= 2 s",
         accept <= 2)
    note(f"after {how}: the first message started", f"{first:8.2f} s", "<= 10 s", first <= 10)
    note(f"after {how}: READY=1; RSS; ran before gated again",
         f"{daemon.ready_after:8.2f} s; {daemon.rss_kb() / 1024:.1f} MiB; {ran} messages")
    return daemon


# ----------------------------------------------------------------- drain
def drain(layout: Layout, name: str, total: int, port: int | None = None,
          daemon: Launched | None = None
          ) -> tuple[list[tuple[float, int]], list[float], list[int]]:
    """Remove the gate and sample (seconds, messages ended) until ``total`` have
    ended; with ``port``, the que tab's time every PAGE_EVERY s, and then
    ``daemon``'s RSS (KB).  Gated again."""
    samples, looks, rss = [(0.0, 0)], [], []
    with QueueClient(layout, name) as client:
        ended0 = ended(client)
        started = time.perf_counter()
        gate(layout, name).unlink()
        look = moved = started + PAGE_EVERY
        while samples[-1][1] < total:
            time.sleep(POLL)
            now = time.perf_counter()
            samples.append((now - started, ended(client) - ended0))
            if samples[-1][1] > samples[-2][1]:
                moved = now
            elif now - moved > STALLED:
                raise SystemExit(f"{name}: the drain stalled at {samples[-1][1]:,}")
            if port is not None and now >= look:
                looks.append(get_ms(port, f"/q/{name}?state=que"))
                look += PAGE_EVERY
                if daemon is not None:
                    rss.append(daemon.rss_kb())
    gate(layout, name).touch()
    return samples, looks, rss


def ended(client: QueueClient) -> int:
    got = client.call("counts")["counts"]
    return int(got["done"] + got["err"] + got.get("relayed", 0))


def at(samples: list[tuple[float, int]], k: float) -> float:
    """Seconds until ``k`` had ended (linear between the samples around it)."""
    for (t0, n0), (t1, n1) in zip(samples, samples[1:], strict=False):
        if n1 >= k:
            return t0 + (t1 - t0) * (k - n0) / (n1 - n0) if n1 > n0 else t1
    return samples[-1][0]


def rate(samples: list[tuple[float, int]], a: float, b: float) -> float:
    return (b - a) / max(at(samples, b) - at(samples, a), 1e-9)


def bench_baseline(layout: Layout, live: list[Launched]) -> float:
    """msgs/s of a drain of BASE_N on a fresh queue (same script, same workers)."""
    daemon = new_queue(layout, "base", live)
    try:
        enqueue(layout, "base", BASE_N)
        samples, _, _ = drain(layout, "base", BASE_N)
    finally:
        daemon.end(signal.SIGTERM)
    got = rate(samples, 0, BASE_N)
    note(f"baseline: a drain of {BASE_N:,} on a fresh queue", f"{got:8,.0f} msgs/s")
    return got


def bench_drain(layout: Layout, daemon: Launched, port: int, base: float, n: int) -> None:
    """The deep drain (``n``: the run's N, a few of which ran at the restarts)."""
    total = counts(layout, daemon.name)["que"]
    samples, looks, rss = drain(layout, daemon.name, total, port, daemon)
    if rss:
        note(f"queue daemon RSS while {total:,} drain (every {PAGE_EVERY:g} s)",
             f"{statistics.median(rss) / 1024:8.1f} MiB median, the most "
             f"{max(rss) / 1024:.1f}", "<= 256 MiB at 1M",
             max(rss) / 1024 <= 256 if n >= MILLION else None,
             short=f"{max(rss) / 1024:.1f} MiB at most")
    first, tenth = rate(samples, 0, total * 0.01), rate(samples, 0, total * 0.1)
    late, whole = rate(samples, total * 0.98, total * 0.99), rate(samples, 0, total)
    note(f"drain of {total:,}: the first 1 % / the first tenth",
         f"{first:8,.0f} / {tenth:,.0f} msgs/s")
    note("drain: from 2 % to 1 % left", f"{late:8,.0f} msgs/s")
    note("drain: first 1 % vs 2 % to 1 % left", f"{first / late:8.2f}x "
         f"(the first tenth: {tenth / late:.2f}x)", ">= 0.9x", first / late >= 0.9)
    note("drain: the whole, vs the baseline", f"{whole:8,.0f} msgs/s = {whole / base:.2f}x "
         f"(in {samples[-1][0]:.1f} s)")
    if looks:
        ms = statistics.median(looks)
        note(f"drain: the que tab every {PAGE_EVERY:g} s ({len(looks)} looks, median)",
             f"{ms:8.1f} ms (the slowest {max(looks):.0f} ms)", f"< {PAGE_MS:.0f} ms",
             ms < PAGE_MS)


# ----------------------------------------------------------------- the run
def table() -> None:
    print(f"\n{'figure':<48} {'value':<34} {'target':<30} verdict")
    for name, value, target, verdict in ROWS:
        print(f"{name[:48]:<48} {value.strip()[:34]:<34} {target[:30]:<30} {verdict}")
    missed = [name for name, _v, _t, verdict in ROWS if verdict == "MISS"]
    print(f"depth: {len(missed)} of {len(ROWS)} target(s) missed")


def run(layout: Layout, scratch: Path, n: int, live: list[Launched]) -> None:
    web, port = start_web(layout)
    try:
        ids = bench_enqueue(layout, scratch, new_queue(layout, "depth", live), n)
        paths = pages("depth", ids[len(ids) // 2], f"m{n // 2}")
        time_pages(port, paths, f"{n:,} queued")
        restart(layout, live, signal.SIGKILL, "SIGKILL")
        deep = restart(layout, live, signal.SIGTERM, "SIGTERM")
        base = bench_baseline(layout, live)
        bench_drain(layout, deep, port, base, n)
        settled(deep.proc.pid)
        after = deep.rss_kb() / 1024
        note(f"queue daemon RSS after the drain, {n:,} done (index caught up)",
             f"{after:8.1f} MiB", "<= 256 MiB at 1M", after <= 256 if n >= MILLION else None)
        time_pages(port, paths, f"{n:,} done")
    finally:
        stop(web)


def main(argv: list[str]) -> int:
    n = MILLION if "--million" in argv else int(os.environ.get("BENCH_DEPTH_N", N_DEFAULT))
    print(f"bench_depth: N = {n:,}, {WORKERS} workers; loadavg at the start: "
          f"{LOADAVG.read_text().strip()}", flush=True)
    scratch, layout = scratch_layout("depth-")
    live: list[Launched] = []
    try:
        run(layout, scratch, n, live)
    except BaseException:
        for daemon in live:  # what each daemon said last, before the scratch goes
            alive = "running" if daemon.proc.poll() is None else f"exit {daemon.proc.returncode}"
            lines = daemon.log.read_text(errors="replace").splitlines()
            quiet = [line for line in lines if ": started: " not in line and ": done: " not in line]
            print(f"--- {daemon.name} ({alive}), its last lines:", *quiet[-20:], sep="\n")
        raise
    finally:
        for daemon in live:
            daemon.end(signal.SIGTERM)
        subprocess.run(["rm", "-rf", "--one-file-system", str(scratch)], check=False)
    print(f"loadavg at the end: {LOADAVG.read_text().strip()}")
    table()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
