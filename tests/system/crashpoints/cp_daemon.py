"""Starting a queue daemon for crash points: plainly, or under strace that kills it at one syscall.

The daemon is started *under* strace (not attached with ``-p``) so that its
start, recovery included, is covered as well: ``-f`` follows every thread it
makes (spare maker, sync lane, MD5 checks, peer lanes; each thread is a
tracee of its own), and ``-b execve`` detaches from a queue script at its
``execve``, so a script's own syscalls are never counted nor killed (only the
few a vfork child makes before its exec are).  strace counts injections *per
syscall and per tracee*, so a crash point is ``(syscall, N)``: SIGKILL on
entry to the N-th call of that syscall in whichever thread makes it first.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

WRITE_SIDE = ("rename", "renameat", "renameat2", "fsync", "fdatasync", "write", "pwrite64",
              "openat", "mkdir", "mkdirat", "unlink", "unlinkat", "linkat", "syncfs")
STRACE = ("strace", "-f", "-qq", "-b", "execve", "--seccomp-bpf",
          "-e", "trace=" + ",".join(WRITE_SIDE))
OPEN_FOR_WRITING = ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TMPFILE")
READY_TIMEOUT = 20.0
TAG = "RQ_CRASHPOINT_ROOT"  # in the environment of a daemon and of the scripts it starts


class DaemonDied(Exception):
    """The daemon ended before it said READY=1."""


class Daemon:
    """One ``rqsys queue NAME`` process with a real NOTIFY_SOCKET, maybe under strace."""

    def __init__(self, root: Path, name: str, strace: tuple[str, ...] = ()) -> None:
        self.root, self.name, self.traced = root, name, bool(strace)
        notify_path = root / f".notify-{time.monotonic_ns()}"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(notify_path))
        self.notify.settimeout(0.1)
        env = dict(os.environ, NOTIFY_SOCKET=str(notify_path), **{TAG: str(root)})
        env.pop("JOURNAL_STREAM", None)
        cmd = [*strace, sys.executable, "-m", "rqsys", "--root", str(root), "queue", name]
        self.log_path = root / f".stderr-{time.monotonic_ns()}"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, start_new_session=True, stderr=log,
                                         stdin=subprocess.DEVNULL, stdout=log)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until READY=1; DaemonDied if the process ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if "READY=1" in self.notify.recv(4096).decode().split("\n"):
                    return
            except TimeoutError:
                if self.proc.poll() is not None:
                    raise DaemonDied(f"exit {self.proc.returncode}: {self.log_tail()}") from None
        raise AssertionError(f"no READY=1 within {timeout}s: {self.log_tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_dead(self, timeout: float) -> bool:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def pid(self) -> int:
        """The daemon's pid: strace's child when under strace (strace itself would
        take a SIGTERM as its own)."""
        if not self.traced:
            return self.proc.pid
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            return int(children.read_text().split()[0])
        except (OSError, IndexError, ValueError):
            return self.proc.pid

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM the daemon and wait; None if it had to be killed."""
        if self.proc.poll() is None:
            os.kill(self.pid(), signal.SIGTERM)
            if not self.wait_dead(timeout):
                self.kill()
                return None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the daemon's whole session (the daemon, strace), and reap it; then
        its scripts, as systemd ends a unit's cgroup once its main process died
        (each script has a process group of its own)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        kill_tagged(str(self.root))

    def close(self) -> None:
        """End whatever is left of its session and close the notify socket."""
        self.kill()
        self.notify.close()

    def log_tail(self, size: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-size:]


def kill_tagged(root: str) -> int:
    """SIGKILL every process started for ``root`` (its environment names it)."""
    wanted, killed = f"{TAG}={root}".encode() + b"\0", 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted in (entry / "environ").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):
            continue  # gone, or another user's
    return killed


def inject(syscall: str, n: int) -> tuple[str, ...]:
    """strace arguments killing the daemon at the n-th ``syscall`` of some thread."""
    return (*STRACE, "-o", "/dev/null", f"--inject={syscall}:signal=KILL:when={n}")


def calibrate(out_prefix: Path) -> tuple[str, ...]:
    """strace arguments writing one trace file per tracee (``PREFIX.<tid>``)."""
    return (*STRACE, "-ff", "-o", str(out_prefix))


def count_calls(out_prefix: Path) -> dict[str, list[int]]:
    """Per syscall, every N at which some tracee made a write-side call: all calls
    but ``openat``, which counts only when it opens for writing (the daemon's
    imports are hundreds of read-only opens, all one crash point before any work)."""
    found: dict[str, set[int]] = {}
    for path in out_prefix.parent.glob(out_prefix.name + ".*"):
        counts: dict[str, int] = {}
        for line in path.read_text(errors="replace").splitlines():
            name = line.split("(", 1)[0]
            if name not in WRITE_SIDE:
                continue
            counts[name] = counts.get(name, 0) + 1
            if name != "openat" or any(flag in line for flag in OPEN_FOR_WRITING):
                found.setdefault(name, set()).add(counts[name])
    return {name: sorted(ns) for name, ns in found.items()}
