"""Real ``nats-server`` processes for pool tests: one on loopback, or a
JetStream cluster of three in the hosts of a ``netns.NetLab``."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need, wait_for

from rqsys.store import Layout

CLIENT_PORT, ROUTE_PORT, HTTP_PORT = 4222, 6222, 8222
OK = 'echo "run working $RQ_PARAM1" >&3\necho "done ran $RQ_PARAM1 count $RQ_COUNT" >&3\n'


def nats_available() -> bool:
    return shutil.which("nats-server") is not None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_conf(name: str, addr: str, port: int, store: Path, peers: list[str],
                extra: str = "") -> str:
    """A nats-server config: JetStream on, clustered with ``peers`` when given."""
    conf = (f'server_name: "{name}"\nlisten: "{addr}:{port}"\n'
            f'jetstream {{ store_dir: "{store}" }}\n{extra}\n')
    if peers:
        routes = ", ".join(f'"nats-route://{p}:{ROUTE_PORT}"' for p in peers)
        conf += (f'cluster {{ name: "rqpool", listen: "{addr}:{ROUTE_PORT}", '
                 f'routes: [{routes}] }}\n')
    return conf


def wait_port(addr: str, port: int, timeout: float = 20) -> None:
    """Wait until something accepts on addr:port (from this namespace)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((addr, port), 0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nats-server on {addr}:{port} not up in {timeout}s"
                                     ) from None
            time.sleep(0.05)


def cluster_conf(name: str, addr: str, store: Path, peers: list[str]) -> str:
    """A clustered server of a NetLab host, with its monitoring port for /healthz."""
    return server_conf(name, addr, CLIENT_PORT, store, peers, f'http: "{addr}:{HTTP_PORT}"')


class LocalNats:
    """One nats-server with JetStream on 127.0.0.1 (``extra``: more config)."""

    def __init__(self, base: Path, extra: str = "") -> None:
        self.port = free_port()
        base.mkdir(parents=True, exist_ok=True)
        conf = base / "nats.conf"
        conf.write_text(server_conf("solo", "127.0.0.1", self.port, base / "js", [], extra))
        self.log = open(base / "nats.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc: subprocess.Popen[Any] = subprocess.Popen(
            ["nats-server", "-c", str(conf)], stdout=self.log, stderr=self.log,
            start_new_session=True)
        wait_port("127.0.0.1", self.port)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def solo(tmp_path: Path) -> Iterator[LocalNats]:
    """One nats-server with JetStream on loopback for the test."""
    need(nats_available(), "nats-server (Debian package nats-server)")
    server = LocalNats(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pool_queue(solo: LocalNats, layout: Layout, make_queue: Callable[..., Path],
               daemon: Callable[..., Any]) -> Callable[..., Any]:
    """pool_queue(pool, script=OK, **config): the daemon of queue ``pq``, a
    queue of pool ``pool`` (one replica) on the ``solo`` nats-server."""
    def start(pool: str, script: str = OK, **config: Any) -> Any:
        use_nats(layout, solo.url)
        make_queue("pq", script, pool={"name": pool, "replicas": 1}, **config)
        return daemon("pq")
    return start


def pause_pulls(pq: Any) -> None:
    """Pause a pool queue and wait until no pull of its is out: what is
    created stays in the pool until it resumes."""
    pq.call("adminoper", oper="pause")
    wait_for(lambda: pq.call("pool")["waiting_pulls"] == 0, 10, "no pull out")


def use_nats(layout: Layout, *servers: str) -> None:
    layout.config_file.write_text(json.dumps({"host": "127.0.0.1", "port": 3333,
                                              "nats": {"servers": list(servers),
                                                       "connect_timeout": 1}}))
