"""Shared fixtures: a state root, queues from script text, real daemons.

The tree is by what a test needs, and each folder is its marker (set here;
``--strict-markers`` refuses a test outside them): ``unit/<package>/`` (in
process: no subprocess, no socket to another process), ``integration/<area>/``
(real ``rqsys`` processes on a temporary root), ``system/`` (systemd in
containers, QEMU guests, power cuts, crash points, NATS, the browser, the
.deb, ``make``) and ``repo/`` (sizes, imports, README, man pages, nix).
Helpers the tests share are modules in ``helpers/`` (pyproject.toml puts it on the path).
``make test-fast`` runs unit and integration.

Daemons are started the way systemd would: a real NOTIFY_SOCKET receives
READY=1, the process is in its own session, teardown is TERM -> wait -> KILL
(and a daemon that had to be killed fails the test).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import host_report  # tests/helpers/, on the path by pyproject.toml's pythonpath
import pytest

from rqsys.scan.scandir import install_queue
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

HERE = Path(__file__).resolve().parent
REPO = HERE.parent  # the checkout
HELPERS = HERE / "helpers"
TIERS = ("unit", "integration", "system", "repo")  # folders of tests/, and their markers
IN_CI = os.environ.get("CI") == "true"
READY_TIMEOUT = 15.0


def pytest_collection_finish(session: pytest.Session) -> None:
    """What this host can run, first in the log, -q or not (tests/helpers/host_report.py):
    the probes of the system tests' parts (a QEMU boot, a container) only when
    some are to run, so that the unit tests start at once."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    probes = any(item.get_closest_marker("system") for item in session.items)
    for line in host_report.lines(probes):
        reporter.write_line(line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's marker is its folder under tests/ (unit, integration, system, repo)."""
    for item in items:
        tier = item.path.resolve().relative_to(HERE).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.path}: a test lives in one of tests/{{"
                                    f"{','.join(TIERS)}}}/, by what it needs")
        item.add_marker(getattr(pytest.mark, tier))


PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn",
                            "os.spawn", "os.exec", "os.system", "pty.spawn"})
_unit_calls: list[str] | None = None  # the process events of the unit test running, if one


def _audit(event: str, _args: tuple[Any, ...]) -> None:
    if _unit_calls is not None and event in PROCESS_EVENTS:
        _unit_calls.append(event)


sys.addaudithook(_audit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A unit test that starts a process fails: it belongs in integration/."""
    global _unit_calls
    unit = item.get_closest_marker("unit") is not None
    _unit_calls = [] if unit else None
    try:
        yield
    finally:
        calls, _unit_calls = _unit_calls, None
    if calls:
        pytest.fail(f"a unit test started a process ({', '.join(sorted(set(calls)))}): "
                    "move it to tests/integration/")


def need(condition: bool, reason: str) -> None:
    """Skip on a developer's machine when a real part is missing; fail in CI."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def stop_process(proc: subprocess.Popen[Any], timeout: float, what: str) -> int:
    """TERM, wait; KILL its process group and fail if it does not end by itself."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{what} ignored SIGTERM for {timeout}s")
    return proc.returncode


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def web_client(layout: Layout) -> Any:
    """The web app in process (falcon's TestClient), asked as a browser on this
    machine asks it: ``Host: localhost`` (falcon's own default names another
    host, which rqsys.web.hostnames refuses)."""
    import falcon.testing

    from rqsys import config
    from rqsys.web.app import create_app

    return falcon.testing.TestClient(create_app(layout, config.load_system_config(layout)),
                                     headers={"Host": "localhost"})


@pytest.fixture(scope="session")
def guests(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The suite's QEMU guests, all run at once when a test first asks: those
    of the test modules this session collected (tests/helpers/guest_runs.py)."""
    import guest_runs

    collected = {item.path.name for item in request.session.items}
    wanted = {name for name, module in guest_runs.MODULES.items() if module in collected}
    return guest_runs.run_all(tmp_path_factory.mktemp("guests"), wanted)


@pytest.fixture
def passable_tmp() -> Iterator[Path]:
    """A directory every user may pass through (pytest's tmp_path is its user's
    alone): for scripts run as another user (a queue's ``user``)."""
    import shutil
    import tempfile

    need(os.geteuid() == 0, "running a script as another user needs root")
    base = Path(tempfile.mkdtemp(prefix="rq-passable-", dir="/var/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    lay = Layout(tmp_path / "root", tmp_path / "root" / "sock")
    lay.make_dirs()
    lay.socket_dir.mkdir()
    return lay


@pytest.fixture
def make_queue(layout: Layout, tmp_path: Path) -> Callable[..., Path]:
    """make_queue(name, script_body, **config) -> the scandir entry directory."""

    def make(name: str, body: str, shebang: str = "#!/bin/bash", **cfg: Any) -> Path:
        import json

        entry = tmp_path / "scripts" / name
        entry.mkdir(parents=True, exist_ok=True)
        run = entry / "run"
        run.write_text(f"{shebang}\n{textwrap.dedent(body)}")
        run.chmod(0o755)
        if cfg:
            (entry / "config.json").write_text(json.dumps(cfg))
        install_queue(layout, name, entry)
        return entry

    return make


class DaemonProcess:
    """A real ``rqsys queue NAME`` process with its own NOTIFY_SOCKET."""

    def __init__(self, layout: Layout, name: str, env: dict[str, str] | None = None) -> None:
        self.layout, self.name = layout, name
        self.notify_path = layout.root / f".notify-{name}"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if self.notify_path.exists():
            self.notify_path.unlink()
        self.notify.bind(str(self.notify_path))
        self.notify.settimeout(0.2)
        self.messages: list[str] = []
        full_env = dict(os.environ, NOTIFY_SOCKET=str(self.notify_path), **(env or {}))
        full_env.pop("JOURNAL_STREAM", None)
        # stderr to a file: a pipe nobody reads would block a chatty daemon
        self.stderr_path = layout.root / f".stderr-{name}-{time.monotonic_ns()}"
        with open(self.stderr_path, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rqsys", "--root", str(layout.root), "queue", name],
                env=full_env, start_new_session=True, stderr=stderr, text=True)
        self.wait_notify("READY=1")

    def wait_notify(self, word: str, timeout: float = READY_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in self.messages:
                if word in msg.split("\n"):
                    self.messages.remove(msg)
                    return msg
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except TimeoutError:
                if self.proc.poll() is not None:
                    raise AssertionError(f"daemon exited {self.proc.returncode}: "
                                         f"{self.stderr_text()}"
                                         ) from None
        raise AssertionError(f"no {word} from {self.name} within {timeout}s")

    def client(self) -> QueueClient:
        return QueueClient(self.layout, self.name)

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        with self.client() as client:
            return client.call(op, **args)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.killpg(self.proc.pid, sig) if sig == signal.SIGKILL else self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> int:
        """TERM, wait; KILL and fail if it does not end by itself."""
        code = stop_process(self.proc, timeout, f"queue daemon {self.name}")
        self.notify.close()
        return code

    def stderr_text(self) -> str:
        return self.stderr_path.read_text()


@pytest.fixture
def daemon(layout: Layout) -> Iterator[Callable[..., DaemonProcess]]:
    """daemon(name) starts a real queue daemon; all are stopped at teardown."""
    started: list[DaemonProcess] = []

    def start(name: str, env: dict[str, str] | None = None) -> DaemonProcess:
        proc = DaemonProcess(layout, name, env)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.proc.poll() is None:
                proc.stop()
