"""Helpers for tests that drive a real queue daemon (owned by the queue core tests)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import wait_for

from rqsys import config
from rqsys.store import Layout, QueueStore

FINAL = ("done", "err", "relayed")


def send(proc: Any, **msg: Any) -> str:
    """Create a message in proc's queue; returns its id."""
    return str(proc.call("create", msg=msg)["msg_id"])


def settle(proc: Any, msg_id: str, states: tuple[str, ...] = FINAL,
           timeout: float = 10.0) -> dict[str, Any]:
    """Wait until the message is in one of ``states``; returns the status reply."""
    return wait_for(lambda: _status_if(proc, msg_id, states), timeout,
                    f"{msg_id} to reach {'/'.join(states)}")


def _status_if(proc: Any, msg_id: str, states: tuple[str, ...]) -> dict[str, Any] | None:
    reply = proc.call("status", msg_id=msg_id)
    return reply if reply["state"] in states else None


def store_of(layout: Layout, name: str) -> QueueStore:
    return QueueStore(layout.queue_dir(name))


def job_file(layout: Layout, name: str, msg_id: str, filename: str) -> Path:
    """A file in the message's job/ directory, in whichever state it is now."""
    store = store_of(layout, name)
    return store.msg_dir(store.find(msg_id), msg_id) / "job" / filename


def install_with_script(layout: Layout, name: str, script: str, **overlay: Any) -> None:
    """Install a queue whose config names ``script`` as given (e.g. a symlink)."""
    layout.create_queue_dir(name, config.queue_config(name, script, overlay))


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return False


def write_gate(path: Path) -> None:
    """Open a gate file a waiting script polls for."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("go\n")


def stray_temps(layout, queue="q"):
    """Entries of a queue's .tmp/ other than the spare directories its daemon
    keeps ready for new messages (their msg is blank): a half-made message
    would show here."""
    tmp = layout.queue_dir(queue) / ".tmp"
    return [p for p in tmp.iterdir() if not p.name.startswith("spare.") or _has_msg(p)]


def _has_msg(spare):
    try:
        return bool((spare / "msg").read_bytes().strip())
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return False  # still being made


def drain(background, timeout: float = 10.0) -> None:
    """Run a Background's callbacks, as the daemon's loop would, until none is due."""
    import select
    import time

    deadline = time.monotonic() + timeout
    while background.busy():
        left = deadline - time.monotonic()
        assert left > 0, "background jobs did not end in time"
        if select.select([background], [], [], left)[0]:
            background.run_finished()


@contextmanager
def stopped(proc: Any) -> Iterator[None]:
    """The daemon process frozen (SIGSTOP) until the block ends."""
    proc.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        proc.proc.send_signal(signal.SIGCONT)


@contextmanager
def failing_calls(pid: int, calls: str, inject: str, tid: int | str | None = None
                  ) -> Iterator[None]:
    """Within the block, the daemon's (or one of its threads') system calls
    ``calls`` fail as strace's ``inject=`` says (``error=EIO``, ``when=3+``...):
    a real failing disk, at the real call; attached before the block begins."""
    import shutil

    from conftest import need

    need(shutil.which("strace") is not None, "strace (Debian strace)")
    task = tid or pid
    tracer = subprocess.Popen(["strace", "-qq", "-o", "/dev/null", "-e", f"trace={calls}",
                               "-e", f"inject={calls}:{inject}", "-p", str(task)],
                              stderr=subprocess.PIPE)
    status = Path(f"/proc/{pid}/task/{task}/status")
    try:
        wait_for(lambda: "TracerPid:\t0\n" not in status.read_text(), 10, "strace attached")
        yield
    finally:
        tracer.terminate()
        tracer.wait(10)


# the rq command
RQ = [sys.executable, "-c", "import sys; from rqsys.cli.rq import rq_main; sys.exit(rq_main())"]


def rq(layout, *args, code=0):
    """Run ``rq --root <layout's root> args``; assert its exit ``code`` and stream shapes."""
    proc = subprocess.run([*RQ, "--root", str(layout.root), *args], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    if code == 0:
        assert proc.stderr == ""
    elif code != 2:
        assert proc.stdout.startswith("fail ")
        assert proc.stderr.startswith("rq: ") and proc.stderr.count("\n") == 1
    return proc.stdout.rstrip("\n")
