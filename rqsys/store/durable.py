"""Every rename, fsync, fdatasync and syncfs of the store, and nothing else.

A message's state is the directory it sits in and every state change is one
``rename(2)``; what makes a change survive a power cut is the fsync of the
directories it touched.  Keeping both here lets a reader check the whole
durability table (``recovery.py``) against one short file.  Nothing else in
the store renames or syncs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from rqsys.store import dirsync
from rqsys.tunables import FLUSH_INTERVAL

NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
# Where a batch of renames' directories comes in :meth:`DirtyDirs.flush`: the
# destinations of the daemon's moves (shards, done, err, relayed: 0) before
# their sources (que -> run -> done; .tmp/ and prep/ -> que), so that on a
# file system writing directories one by one (ext4 without a journal) a
# message is never on disk in neither.  (Names as in layout.py, which imports
# this module.)
SOURCE_RANK = {"run": 1, "que": 2, "prep": 3, ".tmp": 4}


# -- syncs -------------------------------------------------------------------
def fsync_path(path: Path | str) -> None:
    """fsync a file or directory by path."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_fds(fds: Iterable[int]) -> None:
    """fsync open files (a batch of new spares' msg files)."""
    for fd in fds:
        os.fsync(fd)


def fsync_dirs(paths: Iterable[str | Path], missing_ok: bool = False) -> None:
    """fsync directories; with ``missing_ok``, skip any gone meanwhile."""
    for path in paths:
        try:
            fsync_path(path)
        except FileNotFoundError:
            if not missing_ok:
                raise


def fsync_tree(adir: Path) -> None:
    """fsync every entry of a directory, then the directory (attachments)."""
    for path in adir.iterdir():
        fsync_path(path)
    fsync_path(adir)


def syncfs(path: Path | str) -> None:
    """Flush the whole file system holding ``path`` (one journal commit)."""
    from rqsys._native._rqspawn import ffi, lib  # type: ignore[import-not-found]

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if lib.syncfs(fd) != 0:  # an OSError, as every other write's: its callers answer it
            raise OSError(ffi.errno, f"syncfs {path}: {os.strerror(ffi.errno)}")
    finally:
        os.close(fd)


class DirtyDirs:
    """Directories whose entries changed but are not yet synced.

    Batched transitions record their parents here; :meth:`flush` fsyncs them
    at most once per ``interval`` unless forced (at exit), so that a busy
    queue pays one journal commit per interval, not per message.
    """

    def __init__(self, interval: float = FLUSH_INTERVAL) -> None:
        self._interval = interval
        self._dirs: set[str] = set()
        self._flushed_at = 0.0
        self.flushes = 0  # how many flushes synced something (a pool acks after one)

    def add(self, *paths: str) -> None:
        self._dirs.update(paths)

    def due(self) -> float | None:
        """Seconds until the fsyncs are due (None: nothing to flush)."""
        if not self._dirs:
            return None
        return max(0.0, self._flushed_at + self._interval - time.monotonic())

    def flush(self, force: bool = False) -> None:
        """fsync the recorded directories if due (or ``force``)."""
        if not self._dirs or (not force and self.due() != 0.0):
            return
        self._flushed_at = time.monotonic()
        dirs, self._dirs = self._dirs, set()
        ordered = sorted(dirs, key=lambda d: SOURCE_RANK.get(os.path.basename(d), 0))
        fsync_dirs(ordered, missing_ok=True)  # missing: an empty shard the cleaner removed
        self.flushes += 1


# -- writes ------------------------------------------------------------------
def write_file_durably(path: Path, data: bytes) -> None:
    """Write ``path`` through a temp file, fsync it, rename, fsync the dir."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_new(tmp, data, sync=True)
    os.replace(tmp, path)
    fsync_path(path.parent)
    if dirsync.unjournalled_ext4(path):  # the new inode's block group too (spares._make)
        syncfs(path.parent)


def write_note_durably(path: Path, data: bytes) -> None:
    """Write a small note in place (made, or emptied first), fdatasync it and
    fsync its directory: half the cost of :func:`write_file_durably` (no
    second inode, no rename).  A crash in the middle may leave the note short
    or empty, so ``data`` ends in a newline and its reader takes it only whole
    (and checks what it says: without a journal its blocks may hold garbage)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    _write_fd(fd, data, sync=True, data_only=True)
    fsync_path(path.parent)
    if dirsync.unjournalled_ext4(path.parent):  # the new inode's block group too
        syncfs(path.parent)


def write_new(path: str | Path, data: bytes, sync: bool) -> None:
    """Write ``path`` from scratch, fsynced if ``sync``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    _write_fd(os.open(path, flags, 0o644), data, sync)


def write_msg(path: str, data: bytes, sync: bool, fd: int = -1) -> None:
    """Write a new message's ``msg``: over the spare's blank one when there
    is one (``fd``, open for writing, closed here), else into a new file.

    A spare's msg already holds MSG_BLANK bytes of spaces, written and synced
    with the spare, and JSON ignores the spaces left after the message.  A
    message that fits overwrites blocks the file already has, at the same
    size, so fdatasync has only that data to write: no inode, no journal
    commit.
    """
    if fd < 0:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            write_new(path, data, sync)
            return
    _write_fd(fd, data, sync, data_only=True)


def _write_fd(fd: int, data: bytes, sync: bool, data_only: bool = False) -> None:
    """Write all of ``data`` at the start of ``fd`` (a spare's msg was left at
    its end), fsync (or fdatasync) it if asked, close it."""
    try:
        view, at = memoryview(data), 0
        while at < len(data):
            at += os.pwrite(fd, view[at:], at)
        if sync:
            (os.fdatasync if data_only else os.fsync)(fd)
    finally:
        os.close(fd)


def append_durably(path: Path | str, data: bytes) -> None:
    """Append ``data`` in one write(2) (O_APPEND: whole beside other writers'),
    fdatasync it; a file made now has its directory fsynced too."""
    made = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if made:
        fsync_path(os.path.dirname(os.path.abspath(path)))


def overwrite(path: Path | str, data: bytes) -> None:
    """Rewrite a small advisory file in place, not synced (``status``,
    ``count``), never truncating it to zero first (ext4 would then flush it
    on close, costing a disk write per call)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, data, 0)
        if os.fstat(fd).st_size > len(data):  # a no-op truncate still costs a journal handle
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


# -- renames -----------------------------------------------------------------
def rename(old: str | Path, new: str | Path) -> None:
    """Rename, not synced: the caller records both parents in DirtyDirs (or, as
    the stats journal's rotation, needs the new name only until its snapshot)."""
    os.rename(old, new)


def rename_into_shard(old: str, new: str) -> None:
    """Rename, creating the hour's shard directory only when it is missing."""
    try:
        os.rename(old, new)
    except FileNotFoundError:
        if not os.path.exists(old):
            raise
        shard = os.path.dirname(new)
        os.makedirs(shard, exist_ok=True)
        # once an hour: the new shard's inode on disk before any message is
        # in it alone (ext4 without a journal would otherwise lose the shard)
        fsync_dirs([shard, os.path.dirname(shard)])
        if dirsync.unjournalled_ext4(shard):  # its block group too (spares._make)
            syncfs(shard)
        os.rename(old, new)


def dir_size(path: str) -> int:
    """A directory's size (-1 if missing), to see whether a rename grew it."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


def sync_if_grown(path: str, size_before: int) -> int:
    """fsync directory ``path`` if it grew since ``size_before``; its size now.

    With ``chattr +D`` (dirsync.py) ext4 without a journal writes a
    directory's blocks synchronously, but not its inode: when an entry took a
    new block, the inode that maps that block must reach the disk before the
    entry's source directory does.  (``size_before`` may be an older size,
    as the store keeps them: a directory never shrinks, so a stale one only
    costs a needless fsync.)
    """
    size = dir_size(path)
    if size_before >= 0 and size != size_before:
        fsync_path(path)
    return size


def rename_durably(old: Path, new: Path) -> None:
    """Rename, then fsync both parent directories, the new one first."""
    os.rename(old, new)
    fsync_dirs([new.parent] if new.parent == old.parent else [new.parent, old.parent])


def replace(src: str | Path, dest: Path, sync: bool) -> None:
    """Rename over ``dest``; fsync its directory if ``sync``."""
    os.replace(src, dest)
    if sync:
        fsync_path(dest.parent)


def remove_dir(path: Path, doomed: Path) -> None:
    """Rename ``path`` out of sight to ``doomed`` (durably), then delete it.

    FileNotFoundError if ``path`` is missing; once renamed, a crash leaves
    ``doomed`` in ``.tmp/``, which recovery removes.
    """
    os.rename(path, doomed)
    fsync_path(path.parent)
    remove_tree(doomed)


def remove_renamed(parent: Path, doomed: Path) -> None:
    """The second half of :func:`remove_dir`, once ``path`` was renamed to
    ``doomed`` by :func:`rename`: fsync the directory it left, then delete it."""
    fsync_path(parent)
    remove_tree(doomed)


def remove_tree(path: str | Path) -> None:
    """Delete a tree as far as it goes (what is left, recovery tries again at
    the next start).  Directories a script made read-only (Go's module cache
    is 0555) are made writable by their owner and it is tried again: without
    that the daemon (user rq, without CAP_DAC_OVERRIDE) left them in .tmp/,
    and recovery failed at every start."""
    try:
        shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except OSError:
        _make_writable(str(path))
    shutil.rmtree(path, ignore_errors=True)


def _make_writable(path: str) -> None:
    """Each directory under ``path`` writable and searchable by its owner,
    parents first (a 0000 one is opened only once it is)."""
    if os.path.islink(path):
        return  # never its target's mode
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    _make_writable(entry.path)


def unlink_durably(path: Path) -> None:
    """Remove a file and fsync its directory (FileNotFoundError if missing)."""
    path.unlink()
    fsync_path(path.parent)


# -- logs kept by size (the audit trail) ---------------------------------------
def open_log(path: Path | str) -> int:
    """An append-only log file's fd (made if missing; its directory fsynced then)."""
    made = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    if made:
        fsync_path(os.path.dirname(os.path.abspath(path)))
    return fd


def fsync_logs(fds: Iterable[int], closing: Iterable[int] = ()) -> None:
    """fdatasync a log's open file and those rotated away (``closing``, closed after)."""
    for fd in closing:
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    for fd in fds:
        os.fdatasync(fd)


def rotate_log(path: Path | str, keep: int) -> None:
    """``path`` -> ``path.1`` -> ... -> ``path.<keep>`` (the oldest dropped), then
    the directory fsynced: the next write makes ``path`` anew."""
    for n in range(keep - 1, 0, -1):
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}.{n}", f"{path}.{n + 1}")
    os.rename(path, f"{path}.1")
    fsync_path(os.path.dirname(os.path.abspath(path)))
