"""Closing fds in runs of neighbours (rqsys.fdclose)."""

from __future__ import annotations

import os

from rqsys.fdclose import close_fds


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_every_fd_given_is_closed_and_no_other():
    fds = [fd for _ in range(4) for fd in os.pipe()]  # 8 fds, mostly neighbours
    keep = fds[3]
    close_fds([fd for fd in fds if fd != keep] + [fds[0]])  # a repeat is closed once
    assert [fd for fd in fds if _is_open(fd)] == [keep]
    os.close(keep)
    close_fds([])
