#!/usr/bin/env python3
"""The guest's init (PID 1 of the QEMU guest): one boot of a power-cut cycle.

The host names a plan file on the kernel command line (``PCPLAN=PATH``; the
kernel hands unknown ``name=value`` words to init as environment).  A boot
then does, as the plan says: check the file system read-only (``fsck``),
mount the disk image, let rqsys recover and check every message acknowledged
so far (``check``), start rqsys and the clients and run until the host kills
the kernel (``work``), or power off cleanly after a last fsck (``final``).

Everything the host must see goes to the channel directory, a host directory
shared read-write over 9p without a guest cache: a write there is QEMU's
``pwrite(2)`` on the host done before the guest's ``write`` returns, so it
survives the kill.  The root file system (the host's ``/`` over 9p) is
read-only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import checker  # noqa: E402  (the harness's own modules sit beside this file)
import rqservice  # noqa: E402

DISK = "/dev/vda"
GUEST_TMP = "/run/tmp"
RB_POWER_OFF = 0x4321FEDC
JOURNALLED = {"ext4": True, "ext4-nojournal": False, "xfs": True}


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, output captured (for the boot log on failure)."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc


def mount_basics(chan: str, chan_mount: list[str]) -> None:
    """tmpfs on /run (the guest's TMPDIR: the root is the host's, read-only,
    and its /tmp may hold the channel), the channel read-write, loopback up
    (the relay talks HTTP to this guest).  /proc, /sys and /dev the
    initramfs has mounted already."""
    os.makedirs("/dev/shm", exist_ok=True)  # devtmpfs has no shm/
    for path in ("/run", "/dev/shm"):
        sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", path)
    os.makedirs(GUEST_TMP, mode=0o1777)
    # queue sockets in /run, as under systemd (a path under the disk's mount
    # point can pass the 108 bytes a unix socket's name may have)
    os.environ.update(TMPDIR=GUEST_TMP, HOME=GUEST_TMP, RQ_SOCKET_DIR="/run/rq")
    sh("mount", *chan_mount, chan)
    sh("ip", "link", "set", "lo", "up")


class Boot:
    """One boot, driven by its plan; reports go to the channel directory."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.chan = Path(plan["chan"])
        self.boot = int(plan["boot"])
        self.mnt = plan.get("mnt", "")

    def event(self, word: str, **info: Any) -> None:
        """One line in the events file: the host waits on these."""
        line = json.dumps({"boot": self.boot, "event": word, "t": time.time(), **info})
        fd = os.open(self.chan / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def run(self) -> None:
        self.event("booted")
        if self.plan.get("fsck"):
            self.fsck("after-cut", replay=JOURNALLED[self.plan["fs"]])
            if not JOURNALLED[self.plan["fs"]]:
                self.repair()
        self.mount()
        log = self.chan / f"serve.{self.boot}.log"
        service = rqservice.Service(self.plan, nosync=bool(self.plan.get("nosync_so")), log=log)
        if self.plan.get("check"):
            service.hold_queues()
        service.start()  # each queue daemon recovers its queue before it answers
        if self.plan.get("check"):
            self.check()
        if self.plan.get("work"):
            self.work(service)
        service.stop()
        sh("umount", self.mnt)
        self.fsck("after-recovery", replay=False)
        self.event("final")

    def mount(self) -> None:
        opts = self.plan.get("mount_opts")
        sh("mount", *(["-o", opts] if opts else []), DISK, self.mnt)

    def fsck(self, when: str, replay: bool) -> None:
        """Read-only check.  A journalled file system is mounted and unmounted
        first: only the mount replays its journal (fsck -n would not)."""
        if replay:
            sh("mount", DISK, self.mnt)
            sh("umount", self.mnt)
        if self.plan["fs"] == "xfs":
            self.report_fsck(when, sh("xfs_repair", "-n", DISK, check=False))
        else:
            self.report_fsck(when, sh("e2fsck", "-fn", DISK, check=False))

    def repair(self) -> None:
        """What a boot does before it mounts ext4 without a journal: nothing
        makes it consistent after a crash but fsck (systemd-fsck runs
        ``e2fsck -p``; what preening refuses, an operator answers with -y)."""
        proc = sh("e2fsck", "-fp", DISK, check=False)
        if proc.returncode & 4:
            proc = sh("e2fsck", "-fy", DISK, check=False)
        self.report_fsck("repair", proc)

    def report_fsck(self, when: str, proc: subprocess.CompletedProcess[str]) -> None:
        name = f"fsck.{self.boot}.{when}.txt"
        (self.chan / name).write_text(f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
        self.event("fsck", when=when, code=proc.returncode, file=name)

    def check(self) -> None:
        """Compare the recovered queues (paused: nothing moves) with every
        acknowledgement the host holds."""
        self.event("recovered")
        result = checker.check_run(self.chan, Path(self.plan["root"]), self.boot,
                                   int(self.plan["port"]))
        (self.chan / f"check.{self.boot}.json").write_text(json.dumps(result))
        self.event("checked", lost=len(result["lost"]), corrupted=len(result["corrupted"]))

    def work(self, service: rqservice.Service) -> None:
        """Resume the queues, start the clients, then wait for the power cut."""
        service.release_queues()
        if self.plan.get("nosync_so"):
            # rqsys syncs nothing in this mode, not even its queues' config:
            # make what it set up durable (init's own sync), so that the cut
            # takes messages, not the queues themselves
            os.sync()
        clients = service.start_clients(self.chan / "acks", self.boot)
        self.event("started", clients=len(clients))
        while True:  # the host cuts the power; nothing here ends by itself
            _reap()
            time.sleep(0.5)


def _reap() -> None:
    """PID 1 adopts orphans (a killed daemon's scripts): reap them."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def power_off() -> None:
    os.sync()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.reboot(RB_POWER_OFF)


def main() -> None:
    os.environ["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    plan_path = os.environ.get("PCPLAN", "")
    plan = json.loads(Path(plan_path).read_text())
    rqservice.python_path_for(plan)
    try:
        mount_basics(plan["chan"], plan["chan_mount"])
        Boot(plan).run()
    except BaseException:
        print(traceback.format_exc(), file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):  # the channel may not be mounted yet
            (Path(plan["chan"]) / f"init.{plan['boot']}.err").write_text(traceback.format_exc())
    power_off()


if __name__ == "__main__":
    main()
