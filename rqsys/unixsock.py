"""Unix listening sockets that appear on disk only once they listen.

A client that finds the path must be able to connect: binding at the final
path leaves a window in which the file exists but nothing listens, and a
connect then fails with ``ECONNREFUSED`` (read by clients as "queue not
running").  So the socket is bound under a temporary name beside the final
one, put in listening state, and only then renamed into place; a stale file
at the final path is replaced by that same rename.

The temporary name is reached through ``/proc/self/fd/<dir>/``, so its length
never counts against the 107 bytes an ``AF_UNIX`` path may have: any final
path a client can connect to can be made.  (This rename is of a socket, not
of message data: the store's rule that only ``durable`` renames is about
messages.)
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from pathlib import Path

BACKLOG = 128
MAX_PATH = 107  # bytes of sun_path, less its terminating NUL


def listen_unix(path: Path | str, backlog: int = BACKLOG) -> socket.socket:
    """A non-inheritable AF_UNIX stream socket listening at ``path``."""
    final = Path(path)
    if len(os.fsencode(final)) > MAX_PATH:
        raise OSError(errno.ENAMETOOLONG, f"a socket path has at most {MAX_PATH} bytes",
                      str(final))
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = f".{os.getpid()}.{threading.get_native_id()}.sock-tmp"  # unique per thread
    dir_fd = os.open(final.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _bind_and_move(dir_fd, temp, final.name, backlog)
    finally:
        os.close(dir_fd)


def _bind_and_move(dir_fd: int, temp: str, name: str, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        _unlink(temp, dir_fd)
        sock.bind(f"/proc/self/fd/{dir_fd}/{temp}")
        sock.listen(backlog)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        sock.close()
        _unlink(temp, dir_fd)
        raise
    return sock


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
