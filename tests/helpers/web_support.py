"""A real ``rqsys web`` process for the web tests, started as systemd would.

The test binds the TCP socket and hands it over as fd 3 with LISTEN_FDS /
LISTEN_PID / LISTEN_FDNAMES=web; READY=1 arrives on a real NOTIFY_SOCKET.
Teardown is TERM -> wait -> KILL (and a kill fails the test).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import stop_process

from rqsys.store import Layout

READY_TIMEOUT = 15.0
LAUNCH = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
          "os.environ.update(LISTEN_FDS='1', LISTEN_FDNAMES='web', LISTEN_PID=str(os.getpid())); "
          "os.execv(sys.executable, [sys.executable, '-m', 'rqsys', '--root', sys.argv[2], "
          "'web'])")


class WebServer:
    """A running ``rqsys web`` on 127.0.0.1:<port>, with the given config.json."""

    def __init__(self, layout: Layout, **config: Any) -> None:
        self.layout = layout
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        cfg = {"host": "127.0.0.1", "port": self.port, "addr": "127.0.0.1", **config}
        layout.config_file.write_text(json.dumps(cfg))
        self.root = str(cfg.get("relative_root", "/")).rstrip("/")
        self.notify_path = layout.root / f".notify-web-{self.port}"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(0.2)
        env = dict(os.environ, NOTIFY_SOCKET=str(self.notify_path))
        env.pop("JOURNAL_STREAM", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(self.sock.fileno()), str(layout.root)],
            pass_fds=(self.sock.fileno(),), env=env, start_new_session=True,
            stderr=subprocess.PIPE, text=True)
        self.sock.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            try:
                if "READY=1" in self.notify.recv(4096).decode().split("\n"):
                    return
            except TimeoutError:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read() if self.proc.stderr else ""
                    raise AssertionError(f"web exited {self.proc.returncode}: {err}") from None
        raise AssertionError("no READY=1 from rqsys web")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.root}"

    def path(self, path: str) -> str:
        return self.root + path

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def request(self, method: str, path: str, body: bytes | str | None = None,
                headers: dict[str, str] | None = None, prefixed: bool = True
                ) -> tuple[int, http.client.HTTPMessage, bytes]:
        conn = self.connect()
        try:
            conn.request(method, self.path(path) if prefixed else path, body=body,
                         headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()

    def form(self, path: str, fields: dict[str, str], **kw: Any) -> tuple[int, Any]:
        from urllib.parse import urlencode

        headers = {"Content-Type": "application/x-www-form-urlencoded", **kw.pop("headers", {})}
        status, _h, data = self.request("POST", path, urlencode(fields), headers, **kw)
        return status, json.loads(data) if data else None

    def get_json(self, path: str) -> tuple[int, Any]:
        status, headers, data = self.request("GET", path)
        assert headers.get_content_type() == "application/json", (path, headers, data[:200])
        return status, json.loads(data)

    def peak_rss_kb(self) -> int:
        """VmHWM: the highest resident set size the web process ever had."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM in /proc status")

    def stop(self, timeout: float = 10.0) -> None:
        stop_process(self.proc, timeout, "rqsys web")
        self.notify.close()


@pytest.fixture
def web_server(layout: Layout) -> Iterator[Callable[..., WebServer]]:
    """web_server(**config) starts ``rqsys web``; all are stopped at teardown."""
    started: list[WebServer] = []

    def start(**config: Any) -> WebServer:
        server = WebServer(layout, **config)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def tree_snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under ``root`` with a digest of its contents.

    Spare directories (empty message directories a daemon keeps ready in
    ``.tmp/``) and the search index (a copy its thread writes when it likes)
    are left out: neither is a change to the store.
    """
    snap: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames
                       if not (os.path.basename(dirpath) == ".tmp" and d.startswith("spare."))]
        for name in dirnames:
            snap[os.path.relpath(os.path.join(dirpath, name), root)] = "dir"
        for name in filenames:
            if name.startswith("search.sqlite"):
                continue
            path = os.path.join(dirpath, name)
            if os.path.islink(path) or not os.path.isfile(path):
                snap[os.path.relpath(path, root)] = "other"
                continue
            with open(path, "rb") as fh:
                snap[os.path.relpath(path, root)] = hashlib.md5(fh.read()).hexdigest()
    return snap


def multipart(field: str, filename: str, data: bytes, boundary: str = "rqsysBOUNDARY") -> tuple[
        bytes, str]:
    """A multipart/form-data body with one file part (and its Content-Type)."""
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; "
            f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n")
    body = head.encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"
