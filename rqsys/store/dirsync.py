"""Which file systems write a rename's two directory halves out of order, and
the ``FS_DIRSYNC_FL`` flag (``chattr +D``) that puts them in order.

ext4 without a journal writes each directory block on its own: after
``rename(.tmp/X, que/X)`` the block of ``.tmp/`` that no longer holds X can
reach the disk before the block of ``que/`` that now does (another fsync
that syncs ``.tmp/``, a syncfs, writeback), and a power cut then leaves X in
no directory (``e2fsck`` puts it in ``lost+found/``).  With the flag on the
destination, ext4 writes the destination's block synchronously inside
``rename(2)``, before it even removes the source's entry.  Journalling file
systems (ext4 with a journal, xfs) commit a rename whole and need nothing.
"""

from __future__ import annotations

import fcntl
import os
from array import array
from pathlib import Path

from rqsys.errors import StoreError

FS_IOC_GETFLAGS = 0x80086601  # _IOR('f', 1, long); the kernel reads and writes an int
FS_IOC_SETFLAGS = 0x40086602  # _IOW('f', 2, long)
FS_DIRSYNC_FL = 0x00010000


def unjournalled_ext4(path: Path | str) -> bool:
    """True when ``path`` is on ext4 mounted without a journal.

    ext4 names each mounted file system in ``/sys/fs/ext4/<device>/``, whose
    ``journal_task`` reads ``<none>`` when there is no journal; the device is
    found from the path's ``st_dev`` through ``/sys/dev/block``.  Asked once
    per device: a store asks it at every new shard and durable note.
    """
    dev = os.stat(path).st_dev
    known = _UNJOURNALLED.get(dev)
    if known is None:
        known = _UNJOURNALLED[dev] = _ask_sysfs(dev)
    return known


_UNJOURNALLED: dict[int, bool] = {}  # st_dev -> its answer (a mount does not change it)


def _ask_sysfs(dev: int) -> bool:
    block = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    try:
        with open(f"/sys/fs/ext4/{os.path.basename(block)}/journal_task") as f:
            return f.read().strip() == "<none>"
    except OSError:  # not ext4 (or no sysfs): nothing to order
        return False


def volatile_write_cache(path: Path | str) -> bool:
    """True when the disk under ``path`` says it has a volatile write cache
    (``queue/write_cache`` reads ``write back``).  ``+D``'s synchronous
    directory writes carry no cache flush, so such a disk can still put a
    rename's source block down before its destination's when its power goes
    (docs/DURABILITY.md); the daemon warns of it once at start.  A
    partition's queue is its disk's."""
    dev = os.stat(path).st_dev
    block = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (f"{block}/queue", f"{block}/../queue"):
        try:
            with open(f"{queue}/write_cache") as f:
                return f.read().strip() == "write back"
        except OSError:
            continue  # a partition (no queue/ of its own), or no sysfs
    return False


def set_dirsync(path: Path | str) -> None:
    """Make updates of directory ``path`` synchronous (``chattr +D``); new
    subdirectories (the hour's shards) inherit it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            flags = array("i", [0])
            fcntl.ioctl(fd, FS_IOC_GETFLAGS, flags, True)
            if not flags[0] & FS_DIRSYNC_FL:
                flags[0] |= FS_DIRSYNC_FL
                fcntl.ioctl(fd, FS_IOC_SETFLAGS, flags, True)
        finally:
            os.close(fd)
    except OSError as exc:
        raise StoreError(f"cannot make {path} update synchronously (chattr +D), "
                         f"which ext4 without a journal needs: {exc}") from exc
