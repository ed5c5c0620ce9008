"""Trigger figures (issue 49), each beside a baseline measured in the same run.

* files -> messages: FILES small files written one by one into a directory
  a files trigger watches, under ``rqsys serve`` (its rq-scan), a no-op
  queue script; from the first file written to the last message made (the
  trigger's record counting them all), vs ``rq sendmesg --attach`` in a
  shell loop over the same files (the first BASELINE of them: each is a
  process start, ~0.1 s);
* webhook deliveries: signed (GitHub's HMAC, a delivery id each) over real
  HTTP to ``POST /hooks/<name>``, HOOKS one after another on one keep-alive
  connection and CLIENTS clients at once, vs plain ``POST
  /q/<q>/new_message`` with the same clients, to the same web.

    python bench/bench_triggers.py [--files N] [--baseline-files N] [--hooks N]
                                   [--clients N]

The scratch directory is under ``$BENCH_DIR`` (scratch.py).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import http.client
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

from bench_scan import free_port, make_entry, report, rqsys, wait_log, wait_socket
from procs import stop
from scratch import scratch_layout

from rqsys.store import Layout
from rqsys.triggers import record
from rqsys.wire.client import QueueClient

QUEUES = ("drop", "base", "hooked", "plain")
SECRET = b"bench-secret"
CONTENT = b"id,name,amount\n1,bench,42\n"  # a small file, as a drop of CSVs would be
BODY = json.dumps({"ref": "refs/heads/main", "repository": {"full_name": "bench/hooks"},
                   "commits": [{"id": "0" * 40, "message": "bench"}]}).encode()
STALL = 60.0  # seconds without one more message: the run is stuck, not slow
Post = Callable[[http.client.HTTPConnection, int], None]


def setup(scratch: Path, layout: Layout) -> Path:
    """Queues in a scandir, the files trigger ``drop`` and the webhook ``hook``;
    the watched directory returned."""
    scandir = scratch / "scandir"
    scandir.mkdir()
    for name in QUEUES:
        (scandir / name).symlink_to(make_entry(scratch / "scripts", name))
    incoming = scratch / "incoming"
    incoming.mkdir()
    secret = scratch / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    triggers = layout.root / "triggers"
    triggers.mkdir()
    (triggers / "drop.json").write_text(json.dumps(
        {"files": {"path": str(incoming)}, "msg": {"dest": "drop"}}))
    (triggers / "hook.json").write_text(json.dumps(
        {"webhook": {"secret": {"file": str(secret)}, "signature": "github",
                     "delivery_header": "X-GitHub-Delivery"},
         "msg": {"dest": "hooked"}, "params": {"param1": "$.repository.full_name"}}))
    return scandir


def warm_up(layout: Layout, port: int) -> None:
    """Every queue's daemon started (on its first connection) and the web answering,
    so that no figure holds a start."""
    for name in QUEUES:
        wait_socket(layout, name)
        with QueueClient(layout, name) as client:
            client.call("ping")
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            answer(conn, "GET", "/q.json", b"", {})
            conn.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def made(layout: Layout, name: str) -> int:
    return int(record.read(layout.root / "triggers", name)["made"])


def wait_made(layout: Layout, name: str, count: int) -> None:
    """Until the trigger's record counts ``count`` messages made (stuck: an error)."""
    seen, moved = made(layout, name), time.monotonic()
    while seen < count:
        time.sleep(0.01)
        now = made(layout, name)
        if now != seen:
            seen, moved = now, time.monotonic()
        elif time.monotonic() - moved > STALL:
            raise SystemExit(f"trigger {name}: {seen} of {count} made, none for {STALL:.0f} s")


def bench_files(layout: Layout, incoming: Path, count: int) -> tuple[float, float]:
    """(files -> messages per second, seconds spent writing the files)."""
    started = time.perf_counter()
    for i in range(count):
        (incoming / f"f{i:06d}.csv").write_bytes(CONTENT)
    written = time.perf_counter() - started
    wait_made(layout, "drop", count)
    return count / (time.perf_counter() - started), written


def bench_sendmesg(layout: Layout, incoming: Path, count: int) -> float:
    """``rq sendmesg`` in a shell loop over the first ``count`` files: messages per second."""
    rq = Path(sys.executable).parent / "rq"
    loop = ('files=("$1"/*); for f in "${files[@]:0:$2}"; do '
            '"$3" --root "$4" sendmesg --dest base --param1 "${f##*/}" --attach "$f" '
            '>/dev/null || exit 1; done')
    started = time.perf_counter()
    subprocess.run(["bash", "-c", loop, "loop", str(incoming), str(count), str(rq),
                    str(layout.root)], check=True)
    return count / (time.perf_counter() - started)


def post_hook(conn: http.client.HTTPConnection, i: int) -> None:
    mac = hmac.new(SECRET, BODY, hashlib.sha256).hexdigest()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
               "X-GitHub-Delivery": f"bench-{i}", "X-Hub-Signature-256": f"sha256={mac}"}
    answer(conn, "POST", "/hooks/hook", BODY, headers)


def post_plain(conn: http.client.HTTPConnection, i: int) -> None:
    form = urlencode({"mesg": json.dumps({"param1": f"p{i}"})})
    answer(conn, "POST", "/q/plain/new_message", form.encode(),
           {"Content-Type": "application/x-www-form-urlencoded"})


def answer(conn: http.client.HTTPConnection, method: str, path: str, body: bytes,
           headers: dict[str, str]) -> None:
    conn.request(method, path, body, headers)
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise SystemExit(f"{path}: HTTP {resp.status}: {data[:200]!r}")


def rate(port: int, post: Post, clients: int, per_client: int, first: int) -> float:
    """Requests per second over ``clients`` keep-alive clients, from a common start;
    each request numbered from ``first`` (a delivery id never sent before)."""
    barrier = threading.Barrier(clients + 1)
    failed: list[BaseException] = []

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/q.json")
        conn.getresponse().read()
        barrier.wait()
        try:
            for i in range(per_client):
                post(conn, first + n * per_client + i)
        except BaseException as exc:  # noqa: BLE001 - said by the main thread
            failed.append(exc)
        conn.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    if failed:
        raise SystemExit(f"a client failed: {failed[0]}")
    return clients * per_client / (time.perf_counter() - started)


def bench_hooks(port: int, hooks: int, clients: int) -> None:
    """Webhook and plain rates, one client then ``clients``, the plain one first
    in one and second in the other."""
    per = max(1, hooks // clients)
    for n, count in ((1, hooks), (clients, per)):
        order = [("plain", post_plain), ("hook", post_hook)]
        rates = {what: rate(port, post, n, count, first=n * 1_000_000)
                 for what, post in (order if n == 1 else order[::-1])}
        label = "1 client, sequential" if n == 1 else f"{n} clients at once"
        report(f"POST /q/<q>/new_message, {label} (baseline)", f"{rates['plain']:8.0f} msgs/s")
        report(f"POST /hooks/<name> signed, {label}",
               f"{rates['hook']:8.0f} msgs/s = {rates['hook'] / rates['plain']:.0%} of plain "
               f"({n * count} deliveries)")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--baseline-files", type=int, default=1_000,
                        help="files the rq sendmesg loop takes (0: all)")
    parser.add_argument("--hooks", type=int, default=1_000)
    parser.add_argument("--clients", type=int, default=4)
    return parser.parse_args()


def main() -> int:
    args = arguments()
    # a TERM (a timeout's) ends the run through its finally: rqsys serve stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch, layout = scratch_layout("triggers-")
    proc = None
    try:
        scandir = setup(scratch, layout)
        port = free_port()
        log = scratch / "serve.log"
        proc = rqsys(layout, "serve", "--scandir", str(scandir), "--port", str(port), log=log)
        wait_log(log, "rq-scan ready")
        warm_up(layout, port)
        incoming = scratch / "incoming"
        files_rate, written = bench_files(layout, incoming, args.files)
        base = min(args.baseline_files or args.files, args.files)
        sendmesg_rate = bench_sendmesg(layout, incoming, base)
        report(f"rq sendmesg --attach, shell loop ({base} files, baseline)",
               f"{sendmesg_rate:8.1f} msgs/s")
        report(f"files trigger, {args.files} files -> messages",
               f"{files_rate:8.1f} msgs/s = {files_rate / sendmesg_rate:.1f}x the loop "
               f"(writing them: {written:.2f} s)")
        bench_hooks(port, args.hooks, args.clients)
    finally:
        if proc is not None:
            stop(proc)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
