#!/usr/bin/env python3
"""Power cuts of a real kernel running rqsys: boots, cuts and verdicts (the host's entry point).

For each file system: a fresh disk image; boot 0 starts rqsys and its
clients, and the host cuts the power at a random moment after they started;
each later boot checks the file system (read-only), lets rqsys recover,
checks every acknowledged message, starts the clients again, and is cut in
turn; the last boot only recovers, checks, and runs fsck once more.  Prints
``powercut: N cuts, A acked, L lost, C corrupted`` per file system and in
total; exits 1 on any loss or corruption (or, with ``--nosync``, when
nothing was lost: that mode proves the harness can fail).

With ``--migrate-cut POINT,...`` each file system gets one image per point
instead: boot 0 stops rqsys cleanly after some acknowledgements, takes the
root back to format 0 and migrates it with the guest cutting its own power at
that point; boot 1 checks every message and that rqsys's start finished the
migration (``format.json``).

    python tests/system/powercut/run.py --cycles 20 --fs ext4,ext4-nojournal,xfs
    python tests/system/powercut/run.py --fs ext4 --migrate-cut after-step,in-stamp --jobs 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import pc_kernel  # noqa: E402
import qemu_vm  # noqa: E402  (tests/helpers/, put on the path by pc_kernel)
import rqservice  # noqa: E402
from qemu_vm import Guest, VMError  # noqa: E402
from tally import Tally, fsck_findings, report, total  # noqa: E402

VENV_PYTHON = HERE.parents[2] / ".venv" / "bin" / "python"
BOOT_TIMEOUT = 600.0  # a check boot on a full image, under TCG on a busy host
MIGRATE_CUTS = ("after-step", "in-stamp")  # guest_init.MIGRATE_CUTS (imported by the guest)
QUEUE_SCRIPT = """#!/bin/sh
# drains one message: param2 milliseconds of work first, then done
ms=${RQ_PARAM2:-0}
[ "$ms" -gt 0 ] && sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
echo "done drained" >&3
"""


@dataclass
class Options:
    cycles: int
    fs: list[str]
    nosync: bool = False
    min_delay: float = 0.3
    max_delay: float = 6.0
    seed: int = 0
    per_image: int = 10
    workdir: Path | None = None
    keep: bool = False
    pythonpath: str = ""
    port: int = 3333
    roles: list[str] = field(default_factory=lambda: list(rqservice.ROLES))
    quiet: bool = False
    jobs: int = 1
    mount_opts: str = ""  # e.g. "dirsync", for experiments
    migrate_cuts: list[str] = field(default_factory=list)  # one image per point, one cut each


class ImageRun:
    """Several cuts on one disk image: boot 0 works, boots 1..n-1 check and
    work, boot n only checks.  Reports land in ``chan/``."""

    def __init__(self, opts: Options, fs: str, base: Path, cuts: int,
                 rng: random.Random, tally: Tally, migrate_cut: str = "") -> None:
        self.opts, self.fs, self.cuts = opts, fs, cuts
        self.migrate_cut = migrate_cut  # boot 0 cuts itself in a migration (then cuts == 1)
        self.rng, self.tally = rng, tally
        self.base, self.workdir = base, base.parent.parent
        self.chan, self.mnt, self.image = base / "chan", base / "mnt", base / "disk.img"
        self.events_seen = 0
        for path in (self.chan, self.mnt):
            path.mkdir(parents=True)

    def plan(self, boot: int, **steps: bool) -> Path:
        plan = {"boot": boot, "fs": self.fs, "chan": str(self.chan), "mnt": str(self.mnt),
                "root": str(self.mnt / "rq"), "scandir": str(self.workdir / "scandir"),
                "port": self.opts.port, "python": str(VENV_PYTHON),
                "pythonpath": self.opts.pythonpath, "seed": self.rng.randrange(1 << 30),
                "roles": self.opts.roles, "mount_opts": self.opts.mount_opts,
                "chan_mount": pc_kernel.chan_mount(), **steps,
                "nosync_so": str(self.workdir / "nosync.so") if self.opts.nosync else ""}
        path = self.chan / f"plan.{boot}.json"
        path.write_text(json.dumps(plan, indent=1))
        return path

    def run(self) -> None:
        pc_kernel.make_image(self.image, self.fs)
        for boot in range(self.cuts + 1):
            first, last = boot == 0, boot == self.cuts
            if self.migrate_cut:
                steps = ({"migrate_cut": self.migrate_cut} if first
                         else {"fsck": True, "check": True, "expect_format": True})
                plan = self.plan(boot, **steps)
            else:
                plan = self.plan(boot, fsck=not first, check=not first, work=not last)
            kernel = pc_kernel.kernel(self.image, plan, self.chan / f"console.{boot}.txt")
            kernel.start()
            try:
                self.one_boot(kernel, boot, last)
            finally:
                kernel.cut()
            self.collect(boot)

    def one_boot(self, kernel: Guest, boot: int, last: bool) -> None:
        if last:
            self.wait_event(kernel, boot, "final")
            return
        if self.migrate_cut:
            self.wait_self_cut(kernel, boot)
            return
        self.wait_event(kernel, boot, "started")
        self.wait_first_ack(kernel, boot)
        # the window in guest work: TCG runs the clients many times slower
        slowdown = qemu_vm.SLOWDOWN[qemu_vm.accel_mode()]
        time.sleep(self.rng.uniform(self.opts.min_delay, self.opts.max_delay) * slowdown)
        if not kernel.running():
            raise VMError(f"guest stopped before the cut:\n{kernel.console_tail()}")
        kernel.cut()
        self.tally.cuts += 1

    def wait_event(self, kernel: Guest, boot: int, word: str) -> dict[str, Any]:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            for event in self.events(boot):
                if event["event"] == word:
                    return event
            err = self.chan / f"init.{boot}.err"
            if err.exists() or not kernel.running():
                time.sleep(0.5)  # let the console catch up
                raise VMError(f"{self.fs} boot {boot} failed before {word!r}:\n"
                                  f"{_read(err)}\n{kernel.console_tail()}")
            time.sleep(0.05)
        raise VMError(f"{self.fs} boot {boot}: no {word!r} in {BOOT_TIMEOUT}s:\n"
                          f"{kernel.console_tail()}")

    def wait_self_cut(self, kernel: Guest, boot: int) -> None:
        """A migration's cut: the guest says where it cuts, then reboots by
        sysrq, and QEMU (``-no-reboot``) exits by itself: that is the cut."""
        self.wait_event(kernel, boot, "started")
        deadline = time.monotonic() + BOOT_TIMEOUT
        while kernel.running() and time.monotonic() < deadline:
            time.sleep(0.2)
        if kernel.running():
            raise VMError(f"{self.fs} boot {boot}: still running {BOOT_TIMEOUT}s after its "
                          f"clients started, no cut:\n{kernel.console_tail()}")
        cuts = [e for e in self.events(boot) if e["event"] == "cut"]
        err = self.chan / f"init.{boot}.err"  # sysrq did not reboot it: no cut, a clean stop
        if not cuts or err.exists():
            raise VMError(f"{self.fs} boot {boot}: the guest ended without cutting at "
                          f"{self.migrate_cut!r}:\n{_read(err)}\n"
                          f"{kernel.console_tail()}")
        self.tally.cuts += 1
        self.tally.migrate_cuts.append(cuts[-1]["point"])

    def wait_first_ack(self, kernel: Guest, boot: int) -> None:
        """The cut is timed from the clients' first acknowledgement."""
        deadline = time.monotonic() + BOOT_TIMEOUT
        acks = self.chan / "acks"
        while not any(p.stat().st_size for p in acks.glob(f"{boot}.*.jsonl")):
            if time.monotonic() > deadline or not kernel.running():
                raise VMError(f"{self.fs} boot {boot}: no acknowledgement from the "
                                  f"clients:\n{kernel.console_tail()}")
            time.sleep(0.05)

    def events(self, boot: int) -> list[dict[str, Any]]:
        lines = _read(self.chan / "events.jsonl").splitlines()
        return [e for e in map(json.loads, lines) if e["boot"] == boot]

    def collect(self, boot: int) -> None:
        """Fold this boot's check and fsck reports into the tally."""
        check = self.chan / f"check.{boot}.json"
        if check.exists():
            result = json.loads(check.read_text())
            fsck = "".join(_read(self.chan / f"fsck.{boot}.{when}.txt")
                           for when in ("after-cut", "repair"))
            self.tally.add_check(result, fsck)
            self.last_acked = int(result["acked"])
        for event in self.events(boot):
            if event["event"] == "fsck":
                text = _read(self.chan / event["file"])
                self.tally.fsck.append({"image": self.base.name, "boot": boot,
                                        "when": event["when"], "code": event["code"],
                                        "findings": fsck_findings(text)})


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def write_scandir(workdir: Path) -> None:
    """Queues ``pc`` and ``pc2``, two workers each, draining with ``echo done >&3``."""
    for name in ("pc", "pc2"):
        entry = workdir / "scandir" / name
        entry.mkdir(parents=True)
        (entry / "run").write_text(QUEUE_SCRIPT)
        (entry / "run").chmod(0o755)
        (entry / "config.json").write_text(json.dumps({"num_workers": 2}))


def stage_rqsys(workdir: Path, pythonpath: str) -> str:
    """Copy the rqsys under test into the work directory and compile it.

    The guest's root is read-only (no ``__pycache__`` can be written there,
    and compiling every import in the guest costs seconds per process), and
    edits made to the checkout during a long run must not change the code
    under test halfway.  Returns the PYTHONPATH the guest uses.
    """
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    where = subprocess.run([str(VENV_PYTHON), "-c", "import rqsys; print(rqsys.__path__[0])"],
                           env=env, cwd="/", capture_output=True, text=True, check=True)
    dest = workdir / "src"
    shutil.copytree(where.stdout.strip(), dest / "rqsys",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([str(VENV_PYTHON), "-m", "compileall", "-q", str(dest)], check=True)
    return str(dest)


def run_fs(opts: Options, fs: str, workdir: Path, rng: random.Random) -> Tally:
    tally = Tally(fs)
    started = time.monotonic()
    if "/" in fs:  # "ext4/after-step": one image, cut in a migration at that point
        fs, point = fs.split("/", 1)
        base = workdir / fs / f"migrate-{point}"
        image_run = ImageRun(opts, fs, base, 1, rng, tally, migrate_cut=point)
        try:
            image_run.run()
        except VMError as exc:
            tally.failures.append(f"{base}: {exc}")
        finally:
            image_run.image.unlink(missing_ok=True)
        tally.acked += getattr(image_run, "last_acked", 0)
        tally.seconds = time.monotonic() - started
        return tally
    done, gen = 0, 0
    while done < opts.cycles:
        cuts = min(opts.per_image, opts.cycles - done)
        base = workdir / fs / f"image{gen}"
        image_run = ImageRun(opts, fs, base, cuts, rng, tally)
        try:
            image_run.run()
        except VMError as exc:  # recorded; the next image starts afresh
            tally.failures.append(f"{base}: {exc}")
        finally:
            image_run.image.unlink(missing_ok=True)
        tally.acked += getattr(image_run, "last_acked", 0)
        done, gen = done + cuts, gen + 1
        if not opts.quiet:
            print(f"  {fs} image {gen}: {tally.line()}", flush=True)
    tally.seconds = time.monotonic() - started
    return tally


def run(opts: Options) -> list[Tally]:
    """Every file system's cuts.  The work directory is removed afterwards
    unless kept, or unless something failed: then its logs are the evidence."""
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="powercut.", dir="/var/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    clean = False
    try:
        tallies = run_in(opts, workdir)
        clean = total(tallies).clean()
        return tallies
    finally:
        if opts.keep or not clean:
            print(f"powercut: logs in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def run_in(opts: Options, workdir: Path) -> list[Tally]:
    write_scandir(workdir)
    opts.pythonpath = stage_rqsys(workdir, opts.pythonpath)
    if opts.nosync:
        pc_kernel.build_nosync(workdir)
    runs = [f"{fs}/{point}" for fs in opts.fs for point in opts.migrate_cuts] or opts.fs
    with ThreadPoolExecutor(max(1, opts.jobs)) as pool:  # one guest per job
        tallies = list(pool.map(
            lambda n: run_fs(opts, runs[n], workdir, random.Random(opts.seed + n)),
            range(len(runs))))
    (workdir / "report.json").write_text(json.dumps([t.__dict__ for t in tallies], indent=1))
    return tallies


def parse_args(argv: list[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=3, help="power cuts per file system")
    p.add_argument("--fs", default="ext4,ext4-nojournal,xfs", help="comma-separated")
    p.add_argument("--nosync", action="store_true",
                   help="rqsys's fsync/fdatasync/syncfs made no-ops: must lose messages")
    p.add_argument("--max-delay", type=float, default=6.0, help="latest cut, seconds")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--per-image", type=int, default=10, help="cuts before a fresh image")
    p.add_argument("--workdir", type=Path, help="default: a new /var/tmp/powercut.*")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    p.add_argument("--pythonpath", default="", help="rqsys to test instead of the venv's")
    p.add_argument("--mount-opts", default="", help="the guest mounts the image with -o ...")
    p.add_argument("--jobs", type=int, default=1, help="file systems run at once (one guest each)")
    p.add_argument("--migrate-cut", default="",
                   help=f"instead of random cuts, one image per point ({','.join(MIGRATE_CUTS)}):"
                        " the guest cuts its power there in a migration of the root's format")
    args = p.parse_args(argv)
    fs = [f for f in args.fs.split(",") if f]
    unknown = set(fs) - set(pc_kernel.MKFS)
    if unknown:
        p.error(f"unknown file system(s): {', '.join(sorted(unknown))}")
    points = [m for m in args.migrate_cut.split(",") if m]
    if set(points) - set(MIGRATE_CUTS):
        p.error(f"unknown migrate cut(s): {', '.join(sorted(set(points) - set(MIGRATE_CUTS)))}")
    return Options(cycles=args.cycles, fs=fs, nosync=args.nosync, max_delay=args.max_delay,
                   seed=args.seed, per_image=args.per_image, workdir=args.workdir,
                   keep=args.keep, pythonpath=args.pythonpath,
                   jobs=args.jobs, mount_opts=args.mount_opts, migrate_cuts=points)


def main(argv: list[str] | None = None) -> int:
    missing = pc_kernel.missing_parts()
    if missing:
        print(f"powercut: cannot run: {missing}", file=sys.stderr)
        return 2
    opts = parse_args(argv)
    what = (f"a cut in a migration at each of {', '.join(opts.migrate_cuts)}"
            if opts.migrate_cuts else f"{opts.cycles} cuts")
    print(f"powercut: seed {opts.seed}, {what} on each of {', '.join(opts.fs)}"
          + (" (no-sync proof mode)" if opts.nosync else ""), flush=True)
    print(f"powercut: QEMU with {qemu_vm.accel_report()}", flush=True)
    tallies = run(opts)
    report(tallies)
    failed = not total(tallies).clean()
    return int(not failed) if opts.nosync else int(failed)


if __name__ == "__main__":
    sys.exit(main())
