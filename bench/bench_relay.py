"""Relay throughput between two rqsys hosts in network namespaces.

Figures: small messages relayed per second (a's relay queue, 4 workers, to
b's web), and one 1 GB attachment relayed in MB/s beside ``curl`` uploading
the same file to the same server (b's ``attach/new``) from the same
namespace in the same run (target: relay >= 70 % of curl).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from netns import NetLab, Rqsys, netns_available, wait_until  # noqa: E402

from rqsys.client import QueueClient  # noqa: E402

SMALL = 400
BIG_MB = 1024
SINK = "#!/bin/bash\necho 'done ok' >&3\n"


def relayed_count(a: Rqsys) -> int:
    return int(a.call("relay", "counts")["counts"]["relayed"])


def bench_small(a: Rqsys, b: Rqsys) -> float:
    start_count = relayed_count(a)
    started = time.monotonic()
    with QueueClient(a.layout, "relay") as client:
        for n in range(SMALL):
            client.call("create", msg={"dest": f"{b.url}q/sink", "param1": str(n)})
    wait_until(lambda: relayed_count(a) - start_count >= SMALL, 300, "small messages relayed")
    return SMALL / (time.monotonic() - started)


def make_big(path: Path) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as out:
        for _ in range(BIG_MB):
            out.write(block)


def bench_big_relay(a: Rqsys, b: Rqsys, big: Path) -> float:
    import hashlib

    digest = hashlib.md5()
    with open(big, "rb") as src:
        while chunk := src.read(1 << 22):
            digest.update(chunk)
    fd = os.open(big, os.O_RDONLY)
    start_count = relayed_count(a)
    try:
        started = time.monotonic()
        a.call("relay", "create", fds=[fd], msg={"dest": f"{b.url}q/sink"},
               attachments=[{"name": big.name, "md5": digest.hexdigest()}])
    finally:
        os.close(fd)
    wait_until(lambda: relayed_count(a) > start_count, 600, "the 1 GB relay")
    return BIG_MB / (time.monotonic() - started)


def bench_big_curl(lab: NetLab, a: Rqsys, b: Rqsys, big: Path) -> float:
    url = b.call("sink", "create", msg={"dest": "sink"}, state="prep")["url"]
    started = time.monotonic()
    got = lab.run("a", ["curl", "-sS", "--fail", "-F", f"filedata=@{big}",
                        f"{url}/attach/new"], timeout=600)
    elapsed = time.monotonic() - started
    if got.returncode != 0 or "Attached successfully" not in got.stdout:
        raise SystemExit(f"curl upload failed: {got.stdout} {got.stderr}")
    return BIG_MB / elapsed


def main() -> int:
    if not netns_available():
        print("bench_relay: needs root and iproute2 (network namespaces); skipped")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp:
        base = Path(tmp)
        lab = NetLab()
        hosts = []
        try:
            for name in ("a", "b"):
                lab.host(name)
                hosts.append(Rqsys(lab, name, base / name))
            a, b = hosts
            entry = b.scandir / "sink"
            entry.mkdir()
            (entry / "run").write_text(SINK)
            (entry / "run").chmod(0o755)
            (entry / "config.json").write_text('{"num_workers": 4}')
            for host in hosts:
                host.start(wait_queues=("relay",))
                wait_until(host.http_ok, 30, "web")
            rate = bench_small(a, b)
            print(f"relay, small messages a -> b: {rate:.0f} msgs/s ({SMALL} messages)")
            big = base / "big.bin"
            make_big(big)
            curl = bench_big_curl(lab, a, b, big)
            relay = bench_big_relay(a, b, big)
            print(f"1 GB attachment: relay {relay:.0f} MB/s, curl {curl:.0f} MB/s "
                  f"-> {100 * relay / curl:.0f} % of curl (target >= 70 %)")
        finally:
            for host in hosts:
                host.stop()
            lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
