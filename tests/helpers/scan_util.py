"""Helpers for the rq-scan tests: rq-scan and ``rqsys serve`` as real processes.

Both write their log to a file the test reads; teardown is TERM -> wait ->
KILL (and a process that had to be killed fails the test).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import stop_process, wait_for

from rqsys.store import Layout
from rqsys.wire.client import QueueClient

# what would make rq-scan think it runs under the supervisor or systemd
SCRUB = ("RQ_SUPERVISOR_PID", "INVOCATION_ID", "NOTIFY_SOCKET", "JOURNAL_STREAM",
         "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_USEC")


DEADLINE = 60.0  # seconds to wait for an event; generous, as a loaded machine is slow


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUB}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LoggedProcess:
    """A real rqsys process in its own session, its stderr in a file."""

    def __init__(self, argv: list[str], logfile: Path, env: dict[str, str]) -> None:
        self.logfile = logfile
        self._log = logfile.open("a")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=self._log,
                                     start_new_session=True)

    def log(self) -> str:
        return self.logfile.read_text()

    def wait_log(self, text: str, timeout: float = DEADLINE, count: int = 1) -> str:
        def seen() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"process exited {self.proc.returncode}:\n{self.log()}")
            return self.log().count(text) >= count

        wait_for(seen, timeout, f"{text!r} x{count} in the log")
        return self.log()

    def stop(self, timeout: float = 30.0) -> int:
        code = stop_process(self.proc, timeout, str(self.proc.args))
        self._log.close()
        return code


def started(launch: Callable[[], LoggedProcess]) -> Iterator[Callable[[], LoggedProcess]]:
    """A fixture body: yields start(), which launches and remembers a process;
    afterwards every one must stop cleanly on SIGTERM."""
    procs: list[LoggedProcess] = []

    def start() -> LoggedProcess:
        procs.append(launch())
        return procs[-1]

    yield start
    for proc in procs:
        assert proc.stop() == 0, proc.log()


def start_scan(layout: Layout, scandir: Path, logfile: Path) -> LoggedProcess:
    """``rqsys scan`` alone (no supervisor, no systemd): queues are only installed."""
    argv = [sys.executable, "-m", "rqsys", "--root", str(layout.root), "scan",
            "--scandir", str(scandir)]
    proc = LoggedProcess(argv, logfile, clean_env(RQ_SOCKET_DIR=str(layout.socket_dir)))
    proc.wait_log("rq-scan ready", count=proc.log().count("rq-scan ready") + 1)
    return proc


def start_serve(layout: Layout, scandir: Path, logfile: Path) -> LoggedProcess:
    """``rqsys serve``: the supervisor with its queue daemons, web and rq-scan."""
    argv = [sys.executable, "-m", "rqsys", "--root", str(layout.root), "serve",
            "--scandir", str(scandir), "--port", str(free_port())]
    proc = LoggedProcess(argv, logfile, clean_env(RQ_SOCKET_DIR=str(layout.socket_dir)))
    proc.wait_log("rq-scan ready", count=proc.log().count("rq-scan ready") + 1)
    return proc


def call(layout: Layout, queue: str, op: str, **args: Any) -> dict[str, Any]:
    with QueueClient(layout, queue, timeout=DEADLINE) as client:
        return client.call(op, **args)


def make_entry(base: Path, name: str, body: str, **cfg: Any) -> Path:
    """A queue-script directory (outside the scandir) with an executable run."""
    import json

    entry = base / name
    entry.mkdir(parents=True, exist_ok=True)
    run = entry / "run"
    run.write_text(f"#!/bin/bash\n{body}\n")
    run.chmod(0o755)
    if cfg:
        (entry / "config.json").write_text(json.dumps(cfg))
    return entry


def wait_gone(path: Path, timeout: float = DEADLINE) -> None:
    wait_for(lambda: not path.exists(), timeout, f"{path} to go away")
