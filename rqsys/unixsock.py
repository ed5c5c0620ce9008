"""Unix listening sockets that appear on disk only once they listen.

A client that finds the path must be able to connect: binding at the final
path leaves a window in which the file exists but nothing listens, and a
connect then fails with ``ECONNREFUSED`` (read by clients as "queue not
running").  So the socket is bound under a temporary name beside the final
one, put in listening state, and only then renamed into place; a stale file
at the final path is replaced by that same rename.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

BACKLOG = 128


def listen_unix(path: Path | str, backlog: int = BACKLOG) -> socket.socket:
    """A non-inheritable AF_UNIX stream socket listening at ``path``."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    # A short temporary name: AF_UNIX paths are limited to 107 bytes.
    temp = final.with_name(f".{os.getpid()}.sock-tmp")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        if temp.exists() or temp.is_symlink():
            temp.unlink()
        sock.bind(str(temp))
        sock.listen(backlog)
        os.rename(temp, final)
    except BaseException:
        sock.close()
        try:
            temp.unlink()
        except FileNotFoundError:
            pass
        raise
    return sock
