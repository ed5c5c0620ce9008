"""Closing fds in runs of neighbours (rqsys.fdclose)."""

from __future__ import annotations

import os

from rqsys.fdclose import FdBatch, close_fds


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


def test_a_batch_closes_what_it_holds_when_told_or_when_full():
    batch = FdBatch(limit=4)
    first = list(os.pipe())
    batch.add(first)
    assert all(_is_open(fd) for fd in first)  # held until the turn ends
    batch.close()
    assert not any(_is_open(fd) for fd in first)
    more = [fd for _ in range(2) for fd in os.pipe()]
    batch.add(more[:3])
    assert all(_is_open(fd) for fd in more)
    batch.add(more[3:])  # the fourth fills it: all four closed at once
    assert not any(_is_open(fd) for fd in more)
    batch.close()  # nothing held: nothing closed
