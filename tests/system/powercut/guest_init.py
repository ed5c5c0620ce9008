#!/usr/bin/env python3
"""The guest's init (PID 1 of the QEMU guest): one boot of a power-cut cycle.

The host names a plan file on the kernel command line (``PCPLAN=PATH``; the
kernel hands unknown ``name=value`` words to init as environment).  A boot
then does, as the plan says: check the file system read-only (``fsck``),
mount the disk image, let rqsys recover and check every message acknowledged
so far (``check``), start rqsys and the clients and run until the host kills
the kernel (``work``), or power off cleanly after a last fsck (``final``).
With ``migrate_cut``, the boot instead stops rqsys cleanly once its clients
have some acknowledgements, takes the root back to format 0 (no
``format.json``, as every rqsys before 0.2.0 left it) and migrates it with
``formats.ensure``, cutting its own power at the named point of the
migration (``echo b > /proc/sysrq-trigger``: a reboot with no sync and no
unmount, which QEMU, run with ``-no-reboot``, ends); a later boot with
``expect_format`` says which format rqsys's start left.

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
SYSRQ = "/proc/sysrq-trigger"
MIGRATE_CUTS = ("after-step", "in-stamp")  # where a migrate_cut boot cuts its power
MIGRATE_ACKS = 30  # acknowledgements before rqsys is stopped for the migration
MIGRATE_ACK_WAIT = 120.0  # seconds after the first: stop with what there is
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
        before = self.format_file() if self.plan.get("expect_format") else {}
        service.start()  # each queue daemon recovers its queue before it answers
        if self.plan.get("check"):
            self.check(format_before=before)
        if self.plan.get("migrate_cut"):
            self.migrate_cut(service, self.plan["migrate_cut"])  # ends in the power cut
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

    def check(self, format_before: dict[str, Any]) -> None:
        """Compare the recovered queues (paused: nothing moves) with every
        acknowledgement the host holds (and, with ``expect_format``, the
        root's format with this rqsys's)."""
        self.event("recovered")
        result = checker.check_run(self.chan, Path(self.plan["root"]), self.boot,
                                   int(self.plan["port"]))
        if self.plan.get("expect_format"):
            result["format"] = self.format_verdict(format_before)
        (self.chan / f"check.{self.boot}.json").write_text(json.dumps(result))
        self.event("checked", lost=len(result["lost"]), corrupted=len(result["corrupted"]),
                   format_ok=result.get("format", {}).get("ok"))

    def format_file(self) -> dict[str, Any]:
        """What the root's ``format.json`` says, read as an operator would
        (None: no such file), and the version files' temp files beside it."""
        root = Path(self.plan["root"])
        try:
            text: str | None = (root / "format.json").read_text(errors="replace")
        except FileNotFoundError:
            text = None
        try:
            said = json.loads(text) if text is not None else None
        except ValueError:
            said = {"unreadable": text[:200] if text else text}
        temps = sorted(p.name for p in root.glob(".format.json.*"))
        return {"said": said, "temps": temps}

    def format_verdict(self, before: dict[str, Any]) -> dict[str, Any]:
        """After rqsys's start: the root in this rqsys's format, said by this
        rqsys; before it, the cut must have left no version (format 0), or
        the migration's end was not what was tested."""
        from rqsys import __version__
        from rqsys.store import formats

        after = self.format_file()
        want = {"format": formats.FORMAT, "by": f"rqsys {__version__}"}
        said = after["said"] if isinstance(after["said"], dict) else {}
        why = []
        if before.get("said") is not None:
            why.append(f"format.json before rqsys started: {before['said']} (the cut "
                       "should have left none)")
        if said.get("format") != want["format"] or said.get("by") != want["by"]:
            why.append(f"format.json after rqsys started: {after['said']}, not {want}")
        return {"ok": not why, "why": "; ".join(why), "want": want, "before": before,
                "after": after}

    def migrate_cut(self, service: rqservice.Service, point: str) -> None:
        """Messages acknowledged, rqsys stopped cleanly, the root made format 0
        and migrated by ``formats.ensure`` with the power cut at ``point``."""
        from rqsys import __version__
        from rqsys.store import durable, formats

        if point not in MIGRATE_CUTS:
            raise ValueError(f"migrate_cut {point!r}: not one of {MIGRATE_CUTS}")
        service.release_queues()
        clients = service.start_clients(self.chan / "acks", self.boot)
        self.event("started", clients=len(clients))
        acks = self.wait_acks(MIGRATE_ACKS)
        for client in clients:  # no request in flight while rqsys stops
            client.kill()
            client.wait()
        service.stop()  # a clean stop: every acknowledged transition on disk
        root = Path(self.plan["root"])
        (root / formats.FILE).unlink()  # the root as rqsys 0.1.0 left it: format 0
        os.sync()
        if formats.read(root) is not None:
            raise RuntimeError(f"{root}: format.json still there")

        def cut(where: str) -> None:
            self.event("cut", point=where, acks=acks)  # on the host before the power goes
            with open(SYSRQ, "w") as trigger:
                trigger.write("b")  # reboot now: no sync, no unmount
            time.sleep(120)
            raise RuntimeError("still running two minutes after sysrq b")

        if point == "after-step":  # the step done, its version not written
            step = formats.STEPS[0]

            def step_then_cut(at: Path) -> None:
                step(at)
                cut(point)

            formats.STEPS[0] = step_then_cut
        else:  # in-stamp: the version's temp file written and synced, not renamed

            def write_then_cut(at: Path, version: int) -> None:
                data = json.dumps({"format": version,
                                   "by": f"rqsys {__version__}"}).encode() + b"\n"
                path = at / formats.FILE
                durable.write_new(path.with_name(f".{path.name}.{os.getpid()}.tmp"), data,
                                  sync=True)  # as durable.write_file_durably does
                cut(point)

            formats.write = write_then_cut  # type: ignore[assignment]
        self.event("migrating", point=point)
        formats.ensure(root)
        raise RuntimeError(f"formats.ensure returned without reaching {point!r}")

    def wait_acks(self, wanted: int) -> int:
        """Until the clients have ``wanted`` acknowledgements, or some and
        MIGRATE_ACK_WAIT seconds since the first; how many they have."""
        first = 0.0
        deadline = time.monotonic() + rqservice.READY_TIMEOUT
        while True:
            count = sum(p.read_bytes().count(b"\n")
                        for p in (self.chan / "acks").glob(f"{self.boot}.*.jsonl"))
            now = time.monotonic()
            if count and not first:
                first = now
            if count >= wanted or (first and now - first > MIGRATE_ACK_WAIT):
                return count
            if now > deadline:
                raise RuntimeError(f"no acknowledgement in {rqservice.READY_TIMEOUT}s")
            _reap()
            time.sleep(0.5)

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
