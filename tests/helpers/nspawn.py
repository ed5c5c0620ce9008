"""A real systemd, booted with systemd-nspawn on a throw-away overlay of ``/``.

The container sees the host's file system (so the project's venv is there)
through an overlay whose upper layer is a tmpfs, and the checkout through an
overlay of its own bound at its path: nothing it writes reaches the host.
``Container.run`` runs a command inside with ``nsenter``.  Teardown powers
the container off, kills only its own leader if it will not go, and unmounts
the overlays and the tmpfs.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BOOT_TIMEOUT = 60.0
POWEROFF_TIMEOUT = 30.0
CONTAINER_PYTHON = "/opt/rq-python"
PROJECT = Path(__file__).resolve().parents[2]  # the checkout, with its .venv
SERVICES = ("rq@.service", "rq-web.service", "rq-scan.service", "rq-timer@.service",
            "rq-relay-worker.service")
PR_SET_PDEATHSIG = 1


def can_boot() -> str:
    """Why a container cannot be booted here ('' when it can)."""
    if os.geteuid() != 0:
        return "booting systemd in a container needs root"
    for tool in ("systemd-nspawn", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: systemd-container, util-linux)"
    return ""


class Container:
    """One booted container; ``run`` executes commands inside it."""

    def __init__(self, binds: dict[Path, str] | None = None) -> None:
        self.binds = binds or {}  # host directory -> where the container sees it
        self.base = Path(tempfile.mkdtemp(prefix="rq-nspawn-"))
        self.root = self.base / "merged"
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader = 0
        self._mounted: list[Path] = []

    # ------------------------------------------------------------ start/stop
    def boot(self) -> None:
        self._mount_overlay()
        checkout = self._mount_checkout()
        self._show_checkout_to_services()
        self.console = open(self.base.with_suffix(".console"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            ["systemd-nspawn", "-q", "-D", str(self.root), "--private-network",
             "--register=no", "--keep-unit", "--link-journal=no",
             # the checkout at its own path, even under the fresh tmpfs the
             # container gets on /tmp: --bind makes the missing parents there
             # (/tmp/ci/rqsys), where --overlay (systemd 252) makes only the last
             f"--bind={checkout}:{PROJECT}",
             *(f"--bind={host}:{inside}" for host, inside in self.binds.items()), "-b"],
            stdin=subprocess.DEVNULL, stdout=self.console, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_term_with_parent)
        self.leader = self._wait_leader()
        self._wait_running()

    def _mount_overlay(self) -> None:
        """A tmpfs for the container's writes, and the root overlay on it."""
        _mount("-t", "tmpfs", "tmpfs", str(self.base))
        self._mounted.append(self.base)
        self._overlay(Path("/"), "upper", "work", self.root)

    def _mount_checkout(self) -> Path:
        """The checkout as the container gets it: an overlay of it, writes in our tmpfs.
        The root overlay cannot show it where it is on a mount of its own (a
        host's tmpfs /tmp, say): an overlay does not cross into mounts below."""
        checkout = self.base / "checkout"
        self._overlay(PROJECT, "checkout-upper", "checkout-work", checkout)
        return checkout

    def _overlay(self, lower: Path, upper: str, work: str, merged: Path) -> None:
        """Mount an overlay of ``lower`` at ``merged``; ``upper``, ``work`` in our tmpfs."""
        for path in (self.base / upper, self.base / work, merged):
            path.mkdir()
        _mount("-t", "overlay", "overlay", "-o",
               f"lowerdir={lower},upperdir={self.base / upper},workdir={self.base / work}",
               str(merged))
        self._mounted.append(merged)

    def _show_checkout_to_services(self) -> None:
        """A checkout under /tmp (a CI clone, say) is hidden from the services
        by their PrivateTmp=; a drop-in binds it in, read-only.  Only this
        test container gets it: the units themselves stay as shipped."""
        if not PROJECT.is_relative_to("/tmp") and not PROJECT.is_relative_to("/var/tmp"):
            return
        for unit in SERVICES:
            dropin = self.path(f"/etc/systemd/system/{unit}.d/checkout.conf")
            dropin.parent.mkdir(parents=True, exist_ok=True)
            dropin.write_text(f"[Service]\nBindReadOnlyPaths={PROJECT}\n")

    def _wait_leader(self) -> int:
        """The container's PID 1 as seen from here.  Under load nspawn's first
        child can be its short-lived outer child, gone by the time it is
        entered: only a child that is PID 1 of its own pid namespace counts."""
        assert self.proc is not None
        deadline = time.monotonic() + BOOT_TIMEOUT
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}: "
                                   f"{self.console_text()}")
            pids = children.read_text().split() if children.exists() else []
            leader = next((int(pid) for pid in pids if _is_namespace_init(pid)), 0)
            if leader:
                return leader
            time.sleep(0.05)
        raise RuntimeError("systemd-nspawn started no container")

    def _wait_running(self) -> None:
        """Until systemd has booted ("offline" or no bus: PID 1 is not systemd yet)."""
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            result = self.run("systemctl", "is-system-running", "--wait", check=False,
                              timeout=BOOT_TIMEOUT)
            if result.stdout.strip() in ("running", "degraded"):
                return
            booting = "connect to bus" in result.stderr or result.stdout.strip() == "offline"
            if time.monotonic() > deadline or not booting:
                raise RuntimeError(f"container did not boot: {result.stdout} {result.stderr}")
            time.sleep(0.1)

    def shutdown(self) -> None:
        """Power off, kill the leader if needed, unmount; safe after a failed boot."""
        try:
            self._stop()
        finally:
            for path in reversed(self._mounted):
                subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)
            self._mounted.clear()
            shutil.rmtree(self.base, ignore_errors=True)
            if hasattr(self, "console"):
                self.console.close()
                self.base.with_suffix(".console").unlink(missing_ok=True)

    def _stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # nspawn asks the container to power off
        try:
            self.proc.wait(POWEROFF_TIMEOUT)
        except subprocess.TimeoutExpired:
            if self.leader:
                with contextlib.suppress(ProcessLookupError):  # it may be gone already
                    os.kill(self.leader, signal.SIGKILL)  # ends its whole pid namespace
            self.proc.wait(POWEROFF_TIMEOUT)

    def expose_python(self, venv: Path, base_prefix: str) -> None:
        """Let service users run ``venv``'s Python: bind its base under /opt inside.

        Here the interpreter may live under /root (pyenv), which no service
        user can enter (and ProtectHome= hides); a real host has it in /usr.
        Only the container's view changes: a bind mount and the venv's links.
        """
        if _world_reachable(Path(base_prefix)):
            return
        self.run("mkdir", "-p", CONTAINER_PYTHON)
        self.run("mount", "--bind", "-o", "ro", base_prefix, CONTAINER_PYTHON)
        for link in (venv / "bin").iterdir():
            if link.is_symlink() and os.readlink(link).startswith(base_prefix):
                target = CONTAINER_PYTHON + os.readlink(link)[len(base_prefix):]
                self.run("ln", "-sfn", target, str(link))
        self.run("sed", "-i", f"s|{base_prefix}|{CONTAINER_PYTHON}|g", str(venv / "pyvenv.cfg"))
        # The interpreter finds its libpython by an RPATH under base_prefix, which
        # the units cannot reach: the loader would take Debian's libpython3.11
        # (another patch release) and the extensions built for this one fail to
        # load (ssl: undefined symbol).  Point the loader at the bound copy first.
        self.run("sh", "-c", f"echo {CONTAINER_PYTHON}/lib > /etc/ld.so.conf.d/00-rq-python.conf"
                 " && ldconfig")

    def console_text(self) -> str:
        return self.base.with_suffix(".console").read_text(errors="replace")[-2000:]

    # ------------------------------------------------------------ inside
    def run(self, *argv: str, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the container (all its namespaces)."""
        result = subprocess.run(["nsenter", "-t", str(self.leader), "-a", *argv],
                                capture_output=True, text=True, timeout=timeout, input=input)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def path(self, inside: str) -> Path:
        """A path inside the container, as seen from the host."""
        return self.root / inside.lstrip("/")

    def show(self, unit: str, prop: str) -> str:
        return self.run("systemctl", "show", "-p", prop, "--value", unit).stdout.strip()


@contextmanager
def booted_with_units(venv: Path, *enable: str,
                      binds: dict[Path, str] | None = None) -> Iterator[Container]:
    """A booted container with ``venv``'s rqsys units installed and ``enable``d
    (``binds``: host directories it sees, at the paths named)."""
    box = Container(binds)
    try:
        box.boot()
        box.expose_python(venv, sys.base_prefix)
        box.run(str(venv / "bin" / "rqsys"), "install-units")
        if enable:
            box.run("systemctl", "enable", "--now", *enable)
        yield box
    finally:
        box.shutdown()


def _term_with_parent() -> None:
    """In nspawn's child: SIGTERM (a clean power-off) if the test process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _world_reachable(path: Path) -> bool:
    """True when every directory down to ``path`` may be entered by anyone."""
    return all(p.stat().st_mode & 0o001 for p in [*reversed(path.parents), path])


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, timeout=30)


def _is_namespace_init(pid: str) -> bool:
    """True when ``pid`` is PID 1 of a pid namespace of its own (NSpid: N 1)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    nspid = next((line.split()[1:] for line in status.splitlines()
                  if line.startswith("NSpid:")), [])
    return len(nspid) > 1 and nspid[-1] == "1"
