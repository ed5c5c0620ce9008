"""The host's side of the power-cut guest: disk images, boots under QEMU, power cuts.

The guest is Debian's kernel under QEMU (``tests/helpers/qemu_vm.py``): its root is
the host's ``/`` over virtio-9p, read-only, so it runs the host's venv and
this directory's scripts as they are; rqsys's root is on a raw disk image,
a virtio-blk disk the guest sees without a volatile write cache, each of its
writes completed once QEMU has ``pwrite(2)``-n it to the image
(``qemu_vm.disk_argv``); the channel directory is shared read-write over 9p
without a guest cache, so every write the guest's clients made there is the
host's before their ``write`` returned.  SIGKILL of QEMU therefore keeps
exactly what the guest's block layer had completed and drops the guest's
page cache: a power cut of a machine whose disk has no volatile write cache
(see README.md).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "helpers"))  # the QEMU guest, shared with the limits

import qemu_vm  # noqa: E402
from qemu_vm import Guest, Share  # noqa: E402

IMAGE_SIZE = 512 << 20  # sparse; xfs wants 300 MB at least
GUEST_MEM = "1G"
CHAN_TAG = "chan"
MKFS = {
    # -i 4096: a message is five inodes, the default ratio runs out first
    "ext4": ["mkfs.ext4", "-q", "-F", "-i", "4096"],
    "ext4-nojournal": ["mkfs.ext4", "-q", "-F", "-i", "4096", "-O", "^has_journal"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
}
NOSYNC_C = """/* LD_PRELOAD for the harness's proof mode: rqsys's syncs do nothing. */
int fsync(int fd) { (void)fd; return 0; }
int fdatasync(int fd) { (void)fd; return 0; }
int syncfs(int fd) { (void)fd; return 0; }
void sync(void) {}
"""


def missing_parts() -> str:
    """Why the harness cannot run here ("" when it can)."""
    missing = qemu_vm.missing()
    if missing:
        return missing
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


def kernel(image: Path | None, plan: Path, console: Path, python: str = sys.executable) -> Guest:
    """One boot: init is ``guest_init.py`` run by ``python`` with the plan named
    in its environment; the plan's directory is the channel, shared read-write."""
    return Guest(init=[python, str(HERE / "guest_init.py")], console=console,
                 env={"PCPLAN": str(plan)}, shares=[Share(CHAN_TAG, plan.parent)],
                 disk=image, memory=GUEST_MEM)


def chan_mount() -> list[str]:
    """``mount`` arguments for the guest's channel (the plan carries them): 9p
    without a guest cache, so each write is the host's when it returns."""
    return ["-t", "9p", "-o", qemu_vm.mount_options("none"), CHAN_TAG]
