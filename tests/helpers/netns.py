"""A small private network of namespaces for multi-host tests (needs root + iproute2).

``NetLab`` makes one hub namespace holding a bridge and, per host, a
namespace joined to the hub by a veth pair, with its own address in
``10.213.1.0/24``.  Nothing touches the root namespace's interfaces, so the
hosts reach only each other (and their own loopback).  ``Rqsys`` runs
``rqsys serve`` inside a host; ``close()`` ends every process started and
deletes the namespaces.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rqsys.store import Layout
from rqsys.wire.client import QueueClient

SUBNET = "10.213.1"
_serial = itertools.count(1)


def netns_available() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


class NetLab:
    """Hub + hosts; ``host(name)`` returns the host's address."""

    def __init__(self) -> None:
        self.tag = f"rqt{os.getpid()}x{next(_serial)}"
        self.hub = f"{self.tag}-hub"
        self.hosts: dict[str, str] = {}
        self.procs: list[subprocess.Popen[Any]] = []
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def host(self, name: str) -> str:
        """Create host ``name`` (a namespace on the hub) and return its address."""
        addr = f"{SUBNET}.{len(self.hosts) + 2}"
        ns, veth = self.ns(name), f"v{len(self.hosts)}{os.getpid() % 100000}"
        _ip("netns", "add", ns)
        _ip("-n", self.hub, "link", "add", veth, "type", "veth", "peer", "name", "eth0",
            "netns", ns)
        _ip("-n", self.hub, "link", "set", veth, "master", "br0", "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.hosts[name] = addr
        return addr

    def popen(self, host: str, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``'s namespace (its own session)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(host), *argv],
                                start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str],
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.ns(host), *argv],
                              capture_output=True, text=True, timeout=timeout)

    def set_link(self, host: str, up: bool) -> None:
        """Cut or restore a host's network (its eth0)."""
        _ip("-n", self.ns(host), "link", "set", "eth0", "up" if up else "down")

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)
        for name in self.hosts:
            subprocess.run(["ip", "netns", "del", self.ns(name)], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.hub], capture_output=True)


def stop(proc: subprocess.Popen[Any], timeout: float = 20) -> None:
    """TERM the process's session, wait; KILL if it does not end."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


class Rqsys:
    """``rqsys serve`` in a host of a NetLab, its root under ``base``."""

    def __init__(self, lab: NetLab, host: str, base: Path, port: int = 3333,
                 queues: dict[str, dict[str, Any]] | None = None) -> None:
        self.lab, self.host, self.port = lab, host, port
        self.addr = lab.hosts[host]
        self.layout = Layout(base / "root", base / "root" / "sock")
        self.layout.make_dirs()
        # The test hosts talk over their veth, inside namespaces nothing else can reach.
        self.layout.config_file.write_text(json.dumps({
            "host": self.addr, "port": port, "addr": "0.0.0.0",
            "allow_unauthenticated_network": True}))
        self.scandir = base / "scandir"
        self.scandir.mkdir(parents=True, exist_ok=True)
        self.log_path = base / "serve.log"
        self.proc: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/"

    def start(self, wait_queues: tuple[str, ...] = ("relay",)) -> Rqsys:
        env = dict(os.environ)
        for key in ("NOTIFY_SOCKET", "JOURNAL_STREAM", "LISTEN_FDS", "LISTEN_PID"):
            env.pop(key, None)
        with open(self.log_path, "ab") as log:
            self.proc = self.lab.popen(self.host, [
                sys.executable, "-m", "rqsys", "--root", str(self.layout.root), "serve",
                "--scandir", str(self.scandir), "--port", str(self.port)],
                env=env, stdout=log, stderr=log)
        for name in wait_queues:
            wait_until(lambda n=name: self.pingable(n), 30, f"queue {name} on {self.host}")
        return self

    def pingable(self, queue: str) -> bool:
        try:
            self.call(queue, "ping")
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False

    def call(self, queue: str, op: str, **args: Any) -> dict[str, Any]:
        with QueueClient(self.layout, queue, timeout=30) as client:
            return client.call(op, **args)

    def http_ok(self, auth: str = "") -> bool:
        creds = ["-u", auth] if auth else []
        got = self.lab.run(self.host, ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                                       *creds, "--max-time", "3", f"{self.url}q.json"])
        return got.stdout.strip() == "200"

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)


def wait_until(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
