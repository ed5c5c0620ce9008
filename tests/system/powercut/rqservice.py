"""rqsys inside the guest: ``rqsys serve`` started, waited for, stopped, and its clients.

The queues come from a scandir the host wrote (``pc`` and ``pc2`` drain with
``echo done >&3``, some messages after a short sleep); ``relay`` is rqsys's
own.  In the no-sync mode the daemons run with an ``LD_PRELOAD`` library that
turns ``fsync``, ``fdatasync`` and ``syncfs`` into no-ops (recovery never does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
QUEUES = ("pc", "pc2", "relay")
READY_TIMEOUT = 480.0  # a dozen Pythons start slowly under TCG
STOP_TIMEOUT = 240.0
ROLES = ("burst", "burst", "attach", "relay")  # two bursts: creates meet in group commits


class ServiceError(RuntimeError):
    """rqsys did not start or stop as it should."""


class Service:
    """``rqsys serve --root ROOT`` in its own session, with its log on the channel."""

    def __init__(self, plan: dict[str, Any], nosync: bool, log: Path) -> None:
        self.plan = plan
        self.root = Path(plan["root"])
        self.log = log
        self.env = self._env(nosync)
        self.proc: subprocess.Popen[bytes] | None = None

    def _env(self, nosync: bool) -> dict[str, str]:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1",
                   PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        if self.plan.get("pythonpath"):
            env["PYTHONPATH"] = self.plan["pythonpath"]
        if nosync:
            env["LD_PRELOAD"] = self.plan["nosync_so"]
        return env

    def configure(self) -> None:
        """Root and config on the first boot: full ids name 127.0.0.1 (the
        relay's far end answers with URLs it must reach again)."""
        cfg = self.root / "config" / "config.json"
        if not cfg.exists():
            cfg.parent.mkdir(parents=True, exist_ok=True)
            cfg.write_text(json.dumps({"host": "127.0.0.1", "port": self.plan["port"]}))
            os.sync()

    def hold_queues(self) -> None:
        """Pause the queues before rqsys starts (what ``rq adminoper --oper
        pause`` leaves on disk), so that the check sees the recovered queues
        with no script moving messages under it."""
        for name in QUEUES:
            qdir = self.root / "queue" / name
            if qdir.is_dir():
                (qdir / "admin_state").write_text("PAUSE\n")
        os.sync()

    def release_queues(self) -> None:
        from rqsys.store import Layout
        from rqsys.wire.client import QueueClient

        for name in QUEUES:
            with QueueClient(Layout.from_root(self.root), name, timeout=60) as client:
                client.call("adminoper", oper="resume")

    def start(self) -> None:
        self.configure()
        argv = [self.plan["python"], "-m", "rqsys", "--root", str(self.root), "serve",
                "--scandir", self.plan["scandir"], "--port", str(self.plan["port"])]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.wait_ready()

    def wait_ready(self) -> None:
        """Every queue answers on its socket and the web front end on its port."""
        deadline = time.monotonic() + READY_TIMEOUT
        pending = [*QUEUES, "web"]
        while pending:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServiceError(f"rqsys serve exited {self.proc.returncode} (see {self.log})")
            if time.monotonic() > deadline:
                raise ServiceError(f"not ready after {READY_TIMEOUT}s: {pending}")
            pending = [name for name in pending if not self._answers(name)]
            if pending:
                time.sleep(0.2)

    def _answers(self, name: str) -> bool:
        if name == "web":
            url = f"http://127.0.0.1:{self.plan['port']}/q.json"
            try:
                with urllib.request.urlopen(url, timeout=10) as answer:
                    return bool(answer.status == 200)
            except OSError:
                return False
        from rqsys.errors import RQError
        from rqsys.store import Layout
        from rqsys.wire.client import QueueClient

        try:
            with QueueClient(Layout.from_root(self.root), name, timeout=30) as client:
                client.call("counts")
            return True
        except RQError:
            return False

    def stop(self) -> None:
        """TERM and wait (a clean stop flushes every batched transition)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise ServiceError(f"rqsys serve ignored TERM for {STOP_TIMEOUT}s") from None
        if code != 0:
            raise ServiceError(f"rqsys serve exited {code} on TERM (see {self.log})")

    def start_clients(self, ack_dir: Path, boot: int) -> list[subprocess.Popen[bytes]]:
        """One client per role, each reporting its acknowledgements to its own file."""
        ack_dir.mkdir(exist_ok=True)
        clients = []
        for n, role in enumerate(self.plan.get("roles", ROLES)):
            argv = [self.plan["python"], str(HERE / "workload.py"), "--role", role,
                    "--root", str(self.root), "--acks", str(ack_dir / f"{boot}.{n}.{role}.jsonl"),
                    "--seed", str(int(self.plan["seed"]) * 100 + n), "--port",
                    str(self.plan["port"]), "--scratch", str(self.root.parent / "scratch")]
            log = open(ack_dir.parent / f"client.{boot}.{n}.{role}.log", "ab")  # noqa: SIM115
            env = dict(self.env)
            env.pop("LD_PRELOAD", None)  # clients sync nothing; only rqsys is under test
            clients.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL))
            log.close()
        return clients


def python_path_for(plan: dict[str, Any]) -> None:
    """Let init itself import the rqsys under test (a private copy if the plan names one)."""
    if plan.get("pythonpath"):
        sys.path.insert(0, plan["pythonpath"])
