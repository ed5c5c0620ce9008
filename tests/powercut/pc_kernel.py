"""The host's side of a guest kernel: disk images, boots, power cuts.

User-Mode Linux runs as ordinary host processes in one process group.  Its
root is the host's ``/`` over hostfs (read-only: the guest runs the host's
venv), rqsys's root is on a ubd disk image.  ubd completes a guest write only
after ``pwrite(2)`` to the image file, and a guest flush is an ``fsync`` of
it; SIGKILL of the whole group therefore keeps exactly what the guest's
block layer had completed and drops the guest's page cache: a power cut of
a machine whose disk has no volatile write cache (see README.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
UML = "/usr/bin/linux.uml"
IMAGE_SIZE = 512 << 20  # sparse; xfs wants 300 MB at least
GUEST_MEM = "768M"
MKFS = {
    # -i 4096: a message is five inodes, the default ratio runs out first
    "ext4": ["mkfs.ext4", "-q", "-F", "-i", "4096"],
    "ext4-nojournal": ["mkfs.ext4", "-q", "-F", "-i", "4096", "-O", "^has_journal"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
}
FSCK_TOOLS = {"ext4": "e2fsck", "ext4-nojournal": "e2fsck", "xfs": "xfs_repair"}
# With the FPU workaround UML keeps only the x87/SSE registers of guest
# threads, so glibc must not pick its AVX string functions (see launcher.py).
GLIBC_NO_AVX = ("glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,"
                "-AVX512CD,-FMA,-FMA4,-XSAVEC")
FPU_PANIC = "ptrace set fp regs failed"
NOSYNC_C = """/* LD_PRELOAD for the harness's proof mode: rqsys's syncs do nothing. */
int fsync(int fd) { (void)fd; return 0; }
int fdatasync(int fd) { (void)fd; return 0; }
int syncfs(int fd) { (void)fd; return 0; }
void sync(void) {}
"""


class KernelError(RuntimeError):
    """A guest did not boot, or did not do what its plan asked in time."""


def missing_parts() -> str:
    """Why the harness cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "power-cut tests need root (guest mounts, UML)"
    if not os.access(UML, os.X_OK):
        return f"{UML} missing (apt-get install user-mode-linux)"
    for tool in ("mkfs.ext4", "mkfs.xfs", "e2fsck", "xfs_repair"):
        if shutil.which(tool) is None:
            return f"{tool} missing (e2fsprogs, xfsprogs)"
    return ""


def make_image(path: Path, fs: str) -> None:
    """A sparse image formatted with ``fs`` (see MKFS)."""
    with open(path, "wb") as image:
        image.truncate(IMAGE_SIZE)
    subprocess.run([*MKFS[fs], str(path)], check=True, capture_output=True)


def build_nosync(workdir: Path) -> Path:
    """Compile the no-sync LD_PRELOAD library (gcc, at run time)."""
    src, lib = workdir / "nosync.c", workdir / "nosync.so"
    src.write_text(NOSYNC_C)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)],
                   check=True, capture_output=True)
    return lib


class Kernel:
    """One boot of UML: started in its own session, ended by SIGKILL of the group."""

    def __init__(self, image: Path | None, plan: Path, console: Path, fpu_workaround: bool,
                 python: str = sys.executable) -> None:
        self.image, self.plan, self.console = image, plan, console
        self.python = python
        self.fpu_workaround = fpu_workaround
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        disk = [f"ubd0={self.image}"] if self.image else []
        # init is the venv's Python; the words after "--" are its arguments
        argv = [UML, *disk, f"mem={GUEST_MEM}", "rootfstype=hostfs", "ro",
                f"init={self.python}", f"PCPLAN={self.plan}", "con=null", "con0=null,fd:1",
                f"uml_dir={self.plan.parent}",  # the mconsole dir goes with the run's files
                "quiet"]
        if self.fpu_workaround:
            argv = [sys.executable, str(HERE / "launcher.py"), *argv,
                    f"GLIBC_TUNABLES={GLIBC_NO_AVX}"]
        return [*argv, "--", str(HERE / "guest_init.py")]

    def start(self) -> None:
        with open(self.console, "ab") as console:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=console,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cut(self) -> None:
        """The power cut: SIGKILL every process of the kernel's group at once."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + 10
        while _group_alive(pgid):  # UML's helpers die with it; make sure
            if time.monotonic() > deadline:
                raise KernelError(f"UML process group {pgid} survives SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            time.sleep(0.05)

    def wait(self, timeout: float) -> int:
        """Wait for a guest that powers off by itself; cut it at the deadline."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.cut()
            raise KernelError(f"guest did not power off within {timeout}s") from None

    def console_tail(self, lines: int = 30) -> str:
        """The end of the console, without the kernel's stack dumps."""
        try:
            text = self.console.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        kept = [ln for ln in text.splitlines() if not ln.lstrip().startswith("[<")]
        return "\n".join(kept[-lines:])


def _group_alive(pgid: int) -> bool:
    """True while any process (not a zombie) has process group ``pgid``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
