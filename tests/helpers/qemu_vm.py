"""A real Linux kernel under QEMU for the kernel-level tests: Debian's kernel, the host's / as root.

The guest boots Debian's own kernel (``linux-image-amd64``) with an
initramfs that carries only what reaching the root needs (virtio-pci and
9p), made once per kernel with Debian's ``mkinitramfs`` and kept under
``build/vm/``.  Its root is the host's ``/`` over virtio-9p, read-only, so
the guest runs this checkout's venv as it is (the role UML's hostfs played);
more host directories are shared read-write by tag (a write there is the
QEMU process's ``pwrite(2)`` made before the guest's ``write`` returns), and
a raw disk image is a virtio-blk disk.

KVM is used only where a probe boot under KVM reaches the guest's init in
:data:`KVM_PROBE_S` seconds: on some hosts ``/dev/kvm`` opens and a guest
then hangs after the firmware (nested virtualisation present, not working).
Elsewhere TCG, QEMU's own CPU emulation, which runs anywhere (and unlike
User-Mode Linux 6.1 does not crash on CPUs with AMX).  ``RQ_VM_ACCEL=kvm``
or ``tcg`` skips the probe, whose answer is kept for the host's boot.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
CACHE = PROJECT / "build" / "vm"
QEMU = "/usr/bin/qemu-system-x86_64"
INITRD_MODULES = ("virtio_pci", "virtio_blk", "9pnet_virtio", "9p")
KVM_PROBE_S = 20.0  # a KVM guest reaches init in 2-3 s; one that hangs never does
TCG_PROBE_S = 180.0  # TCG on a busy 2-core host
PROBE_WORD = "rq-vm-probe: init runs"
# How many times slower a guest runs than the host, roughly: under TCG the
# same Python work takes 20-35 times as long (measured: a loop 20x, imports
# 35x); waits measured in host seconds for an amount of guest work scale by it.
SLOWDOWN = {"kvm": 1.0, "tcg": 8.0}
MSIZE = 512000  # 9p's message size, virtio's largest: the default makes reads many round trips


class VMError(RuntimeError):
    """A guest could not be booted, or did not do what it was asked in time."""


def kernel_version() -> str:
    """The newest Debian kernel installed with its modules ('' when none is)."""
    found = [p.name.removeprefix("vmlinuz-") for p in Path("/boot").glob("vmlinuz-*")]
    found = [v for v in found if Path("/lib/modules", v).is_dir()]
    return max(found, key=_version_key, default="")


def _version_key(version: str) -> list[int]:
    return [int(part) for part in version.replace("-", ".").split(".") if part.isdigit()]


def missing() -> str:
    """Why a guest cannot be booted here ('' when it can)."""
    if os.geteuid() != 0:
        return "booting a QEMU guest with the host's / as its root needs root"
    if not os.access(QEMU, os.X_OK):
        return f"{QEMU} missing (Debian: qemu-system-x86)"
    if not kernel_version():
        return "no Debian kernel in /boot with its modules (Debian: linux-image-amd64)"
    if shutil.which("mkinitramfs") is None:
        return "mkinitramfs missing (Debian: initramfs-tools)"
    return ""


def initramfs(version: str) -> Path:
    """The guest's initramfs for ``version``: built once, then reused (a lock
    keeps two test processes from building it at the same time)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / f"initrd-{version}-{'-'.join(INITRD_MODULES)}.img"
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            _build_initramfs(version, out)
    return out


def _build_initramfs(version: str, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="rq-initramfs-") as tmp:
        conf = Path(tmp) / "conf"
        shutil.copytree("/etc/initramfs-tools", conf)
        # only the listed modules (and what they need): small, quick to unpack
        (conf / "initramfs.conf").write_text("MODULES=list\nBUSYBOX=auto\nCOMPRESS=gzip\n")
        (conf / "modules").write_text("".join(f"{m}\n" for m in INITRD_MODULES))
        part = out.with_suffix(".part")
        proc = subprocess.run(["mkinitramfs", "-d", str(conf), "-o", str(part), version],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise VMError(f"mkinitramfs failed ({proc.returncode}): {proc.stderr[-2000:]}")
        part.rename(out)


@dataclass
class Share:
    """A host directory the guest mounts by ``tag`` (9p over virtio)."""

    tag: str
    path: Path
    readonly: bool = False

    def argv(self) -> list[str]:
        opts = f"local,path={self.path},mount_tag={self.tag},security_model=passthrough," \
               "multidevs=remap"
        return ["-virtfs", opts + (",readonly=on" if self.readonly else "")]


def mount_options(cache: str = "none") -> str:
    """The guest's 9p mount options (``cache=loose`` only where the host
    changes nothing under the guest while it runs)."""
    return f"trans=virtio,version=9p2000.L,msize={MSIZE},cache={cache}"


@dataclass
class Guest:
    """One boot of a QEMU guest; ended by the guest powering off, or by SIGKILL
    of the QEMU process (a power cut: nothing the guest held in memory survives)."""

    init: list[str]  # the guest's PID 1 and its arguments, paths on the host's /
    console: Path
    env: dict[str, str] = field(default_factory=dict)  # kernel command-line words init gets
    shares: list[Share] = field(default_factory=list)
    disk: Path | None = None
    memory: str = "1G"
    accel: str = ""  # "kvm" or "tcg"; "" asks accel_mode()
    cmdline: list[str] = field(default_factory=list)  # more kernel command-line words
    proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        version = kernel_version()
        accel = self.accel or accel_mode()
        words = ["root=hostroot", "rootfstype=9p", f"rootflags={mount_options('loose')}", "ro",
                 "console=ttyS0", "panic=-1", "quiet", "loglevel=4", f"init={self.init[0]}",
                 # under TCG on a loaded host the IO-APIC timer check can miss its ticks and
                 # panic the boot ("IO-APIC + timer doesn't work"): the guest's timer is QEMU's
                 "no_timer_check",
                 *self.cmdline, *(f"{k}={v}" for k, v in self.env.items()), "--",
                 *self.init[1:]]
        argv = [QEMU, "-machine", "q35", "-accel", accel, "-cpu", "host" if accel == "kvm" else
                "max", "-smp", "1", "-m", self.memory, "-nodefaults", "-no-reboot",
                "-display", "none", "-serial", "stdio", "-nic", "none",
                "-kernel", f"/boot/vmlinuz-{version}", "-initrd", str(initramfs(version)),
                "-append", " ".join(words),
                *Share("hostroot", Path("/"), readonly=True).argv()]
        for share in self.shares:
            argv += share.argv()
        if self.disk is not None:
            argv += disk_argv(self.disk)
        return argv

    def start(self) -> None:
        argv = self.argv()
        with open(self.console, "ab") as console:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cut(self) -> None:
        """The power cut: SIGKILL of QEMU (one process; its session with it)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def wait(self, timeout: float) -> int:
        """Wait for a guest that powers off by itself; cut it at the deadline."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.cut()
            raise VMError(f"guest did not power off within {timeout:g}s") from None

    def console_tail(self, lines: int = 30) -> str:
        try:
            text = self.console.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def disk_argv(image: Path) -> list[str]:
    """A raw image as a virtio-blk disk that the guest sees without a volatile
    write cache (``write-cache=off``: the file system orders its writes by
    their completion, no FLUSH), each write completed once QEMU's
    ``pwrite(2)`` of it returned.  ``cache.no-flush=on`` keeps QEMU from
    ``fsync``-ing the image for that: the host does not crash, only QEMU
    dies, and the host's page cache keeps every completed write.  A SIGKILL
    of QEMU then keeps exactly what the guest's block layer had completed:
    a power cut of a machine whose disk has no volatile write cache."""
    drive = f"file={image},format=raw,if=none,id=disk0,aio=threads,cache.direct=off," \
            "cache.no-flush=on"
    return ["-drive", drive, "-device", "virtio-blk-pci,drive=disk0,write-cache=off"]


_ACCEL: dict[str, str] = {}


def accel_mode() -> str:
    """"kvm" where a probe boot under KVM reaches init quickly, else "tcg".  The
    probe's answer is kept for this host's boot (``build/vm/accel.json``)."""
    if os.environ.get("RQ_VM_ACCEL") in ("kvm", "tcg"):
        return os.environ["RQ_VM_ACCEL"]
    if "mode" not in _ACCEL:  # (not put in os.environ: every daemon a test starts has it)
        _ACCEL.update(_probed())
    return _ACCEL["mode"]


def _probed() -> dict[str, str]:
    """The probe's answer for this boot of the host, probed now if not yet."""
    key = {"boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
           "kernel": kernel_version(), "qemu": str(os.stat(QEMU).st_mtime)}
    kept = CACHE / "accel.json"
    with contextlib.suppress(OSError, ValueError):
        answer = json.loads(kept.read_text())
        if all(answer.get(k) == v for k, v in key.items()):
            return {"mode": answer["mode"], "why": answer["why"] + " (probed earlier this boot)"}
    mode, why = _probe()
    CACHE.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({**key, "mode": mode, "why": why}))
    return {"mode": mode, "why": why}


def accel_report() -> str:
    """One line for the suite's header: which accelerator, and why."""
    mode = accel_mode()
    return f"{mode} ({_ACCEL.get('why', 'RQ_VM_ACCEL=' + mode)})"


def _probe() -> tuple[str, str]:
    why = "no /dev/kvm"
    if _kvm_opens():
        seconds, failed = probe_boot("kvm", KVM_PROBE_S)
        if not failed:
            return "kvm", f"a KVM guest reached init in {seconds:.1f} s"
        why = f"/dev/kvm opens, but a KVM guest {failed}"
    seconds, failed = probe_boot("tcg", TCG_PROBE_S)
    if failed:
        raise VMError(f"{why}; a TCG guest {failed}")
    return "tcg", f"{why}; a TCG guest reached init in {seconds:.1f} s"


def _kvm_opens() -> bool:
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError:
        return False
    return True


def probe_boot(accel: str, timeout: float) -> tuple[float, str]:
    """Seconds until a guest's init printed its word, and "" (or what went wrong)."""
    initramfs(kernel_version())  # built before the clock starts
    with tempfile.TemporaryDirectory(prefix="rq-vm-probe-") as tmp:
        script = Path(tmp) / "init.sh"
        script.write_text(f"#!/bin/sh\necho '{PROBE_WORD}'\necho o >/proc/sysrq-trigger\n"
                          "sleep 30\n")
        script.chmod(0o755)
        guest = Guest(init=[str(script)], console=Path(tmp) / "console.txt", accel=accel,
                      memory="256M")
        started = time.monotonic()
        guest.start()
        try:
            while time.monotonic() - started < timeout and guest.running():
                if PROBE_WORD in guest.console_tail(200):
                    return time.monotonic() - started, ""
                time.sleep(0.1)
            seconds = time.monotonic() - started
            if PROBE_WORD in guest.console_tail(200):
                return seconds, ""
            if guest.running():
                return seconds, f"did not reach init in {timeout:g} s"
            last = guest.console_tail(1).strip()
            return seconds, f"ended after {seconds:.1f} s before init ({last or 'no output'})"
        finally:
            guest.cut()
