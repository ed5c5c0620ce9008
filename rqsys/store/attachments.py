"""Attachments: uploads taken in, checked and placed; links into clones; file MD5s.

An upload is its own file in ``.tmp/`` until placed: hard-linked to the
sender's file when that has no name (an unnamed ``O_TMPFILE``, as the web's
uploads are) or is another message's attachment (a dup), on this file
system; else copied (a reflink where the file system has them).  A
client's named file is never linked: its sender editing it would change the
queued message (the MD5 taken once no longer matching).  Filling it
(copy, sync, MD5) is the slow part and touches only the upload's own file,
so the daemon runs it on a thread; placing it is one rename.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from rqsys.errors import BadRequest
from rqsys.store import durable
from rqsys.store.layout import check_attach_name

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_upload_seq = itertools.count(1)  # upload file names are unique within the process


@dataclass
class Upload:
    """An attachment on its way in: its own file in ``.tmp/`` until placed."""

    path: str
    linked: bool  # a hard link to the sender's file; else still to be copied


def file_md5(path: Path | str) -> str:
    """The hex MD5 of a file's content (attachments are checked against it)."""
    import hashlib  # here: OpenSSL's libcrypto is 3.5 MiB of a daemon's RSS, for attachments only

    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def md5_path(path: Path) -> Path:
    """Where an attachment's MD5 is recorded: ``.<name>.md5`` beside it."""
    return path.with_name(f".{path.name}.md5")


def new_upload(tmp_dir: str, src_fd: int, link: bool = False) -> Upload:
    """Start taking in an attachment sent as an open file: its own file in
    ``tmp_dir``, hard-linked to the sender's when that has no name, is the
    store's, or ``link`` says so (a file the sender hands over for good), and
    it lives on this file system (through ``/proc/self/fd``, instantly: the
    web's large uploads are never copied), else to be copied by :func:`fill_upload`."""
    path = f"{tmp_dir}/upload.{os.getpid()}.{next(_upload_seq)}"
    linkable = link or os.fstat(src_fd).st_nlink == 0 or _in_store(
        src_fd, Path(tmp_dir).parent.parent)
    return Upload(path, linkable and _link_fd(src_fd, Path(path)))


def _in_store(fd: int, queues: Path) -> bool:
    """Whether the open file is one of the store's (``<root>/queue/...``)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith(f"{os.path.realpath(queues)}/")
    except OSError:
        return False


def fill_upload(upload: Upload, src_fd: int) -> str:
    """The slow part, for a thread: copy the file in if it was not linked,
    make its data durable, and return its MD5.  It touches only the
    upload's own file."""
    if not upload.linked:
        _copy_fd(src_fd, Path(upload.path))
    durable.fsync_path(upload.path)
    return file_md5(upload.path)


def place_upload(upload: Upload, adir: Path, name: str, md5: str, actual: str,
                 sync: bool) -> Path:
    """Put a filled upload into ``adir`` as ``name`` if its MD5 is the one
    sent (``actual`` is what :func:`fill_upload` found), md5 file beside it."""
    check_attach_name(name)
    if actual != md5:
        raise BadRequest(f"attachment {name}: md5 mismatch (sent {md5}, got {actual})")
    dest = adir / name
    durable.write_new(md5_path(dest), md5.encode(), sync=sync)
    durable.replace(upload.path, dest, sync=sync)
    return dest


def drop_upload(upload: Upload) -> None:
    """Remove an upload that was not placed (recovery would, at the next start)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(upload.path)


def link_into(files: list[Path], adir: Path) -> None:
    """Hard-link attachments (and their MD5 files) into another message's ``adir``."""
    for path in files:
        os.link(path, adir / path.name)
        md5 = md5_path(path)
        if md5.exists():
            os.link(md5, adir / md5.name)


def _link_fd(src_fd: int, dest: Path) -> bool:
    # linkat(AT_SYMLINK_FOLLOW) on the /proc magic link: os.link only
    # calls linkat (not link, which would link the symlink) given a dir fd.
    proc_fds = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(str(src_fd), dest, src_dir_fd=proc_fds, follow_symlinks=True)
        return True
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.ENOENT, errno.EPERM, errno.EACCES):
            return False
        raise
    finally:
        os.close(proc_fds)


def _copy_fd(src_fd: int, dest: Path) -> None:
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.ioctl(out, FICLONE, src_fd)  # xfs, btrfs: shared blocks, copied on write
            return
        except OSError:
            pass  # not that file system, or another one: copied
        os.lseek(src_fd, 0, os.SEEK_SET)
        while os.sendfile(out, src_fd, None, 1 << 24) > 0:
            pass
    finally:
        os.close(out)
