"""Copying trees for a backup or a restore: sendfile, modes, owners, times, links kept.

Contents go through ``shutil.copyfile`` (``sendfile(2)`` on Linux: an
attachment of gigabytes is never read into Python, and the destination may
be another file system).  A file with several links (an attachment a clone
shares) is copied once and linked again in the copy.  Sockets and fifos
are passed over; so is an entry that vanished while the tree was copied
(counted in :attr:`Copier.vanished`, for a message's copy to notice).
Nothing here syncs: the caller ends with one ``syncfs`` of the destination.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

from rqsys.store.attachments import file_md5

Skip = Callable[[str], bool]  # by the entry's path relative to the tree's top


def _never(_rel: str) -> bool:
    return False


class Copier:
    """Copies trees, keeping their hard links within everything it copied."""

    def __init__(self) -> None:
        self._links: dict[tuple[int, int], str] = {}  # (dev, ino) -> its first copy
        self._owners = os.geteuid() == 0  # root keeps owners (a queue's own user)
        self.vanished = 0

    def tree(self, src: Path, dest: Path, skip: Skip = _never, rel: str = "") -> None:
        """Copy directory ``src`` to ``dest`` (made; or completed, if it exists)."""
        try:
            top = os.lstat(src)
            entries = sorted(os.listdir(src))
        except FileNotFoundError:
            self.vanished += 1
            return
        dest.mkdir(exist_ok=True)
        for name in entries:
            inner = f"{rel}/{name}" if rel else name
            if not skip(inner):
                self.entry(src / name, dest / name, skip, inner)
        self.keep(top, dest)

    def entry(self, src: Path, dest: Path, skip: Skip = _never, rel: str = "") -> None:
        """Copy one entry of any kind to ``dest`` (which must not exist)."""
        try:
            st = os.lstat(src)
            if stat.S_ISDIR(st.st_mode):
                self.tree(src, dest, skip, rel)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dest)
                self.keep(st, dest)
            elif stat.S_ISREG(st.st_mode):
                self._file(src, dest, st)
        except FileNotFoundError:
            self.vanished += 1

    def _file(self, src: Path, dest: Path, st: os.stat_result) -> None:
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1 and key in self._links:
            os.link(self._links[key], dest)
            return
        shutil.copyfile(src, dest, follow_symlinks=False)
        self.keep(st, dest)
        if st.st_nlink > 1:
            self._links[key] = str(dest)

    def keep(self, st: os.stat_result, dest: Path) -> None:
        """The source's mode, owner (as root) and times on its copy."""
        link = stat.S_ISLNK(st.st_mode)
        if self._owners:
            os.chown(dest, st.st_uid, st.st_gid, follow_symlinks=False)
        if not link:
            os.chmod(dest, stat.S_IMODE(st.st_mode))
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def summary(top: Path) -> tuple[int, int]:
    """(entries, bytes) of a tree: its files and links, and its files' sizes."""
    count = size = 0
    for base, dirs, files in os.walk(top):
        count += len(files) + sum(1 for d in dirs if os.path.islink(os.path.join(base, d)))
        for name in files:
            st = os.lstat(os.path.join(base, name))
            size += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return count, size


def describe(path: Path) -> list[object]:
    """What the manifest says of a file outside the messages: [size, md5]
    for a file, ["->", target] for a symbolic link."""
    if path.is_symlink():
        return ["->", os.readlink(path)]
    return [path.stat().st_size, file_md5(path)]


def tree_files(top: Path) -> list[str]:
    """The files and links under ``top``, relative to it (what :func:`describe` covers)."""
    found = []
    for base, dirs, files in os.walk(top):
        rel = os.path.relpath(base, top)
        names = files + [d for d in dirs if os.path.islink(os.path.join(base, d))]
        found += [os.path.normpath(os.path.join(rel, name)) for name in names]
    return sorted(found)


def is_empty_dir(path: Path) -> bool:
    """True when ``path`` is missing or an empty directory."""
    try:
        return not os.listdir(path)
    except FileNotFoundError:
        return True
