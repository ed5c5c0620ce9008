"""Closing many file descriptors in as few system calls as their numbers allow."""

from __future__ import annotations

import os
from collections.abc import Iterable


def close_fds(fds: Iterable[int]) -> None:
    """Close ``fds``: each run of consecutive numbers in one ``close_range(2)``
    (a batch of ended scripts' pipes and pidfds, or of timelines, are mostly
    neighbours: the kernel hands out the lowest free numbers)."""
    ordered = sorted(set(fds))
    start = 0
    while start < len(ordered):
        end = start + 1
        while end < len(ordered) and ordered[end] == ordered[start] + end - start:
            end += 1
        if end - start == 1:
            os.close(ordered[start])
        else:
            os.closerange(ordered[start], ordered[end - 1] + 1)
        start = end


class FdBatch:
    """The fds a loop turn leaves to close, closed together when it ends.

    A run's fds (its pipes, the script's ends of them, its pidfd, its
    timeline) are made one after the other at its start, so they are
    neighbours; closed together at its end, they leave a hole the next
    start fills whole, and its end is one ``close_range`` again.  At most
    ``limit`` are held: a turn that ends many runs does not run out of fds.
    """

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._fds: list[int] = []

    def add(self, fds: Iterable[int]) -> None:
        self._fds.extend(fds)
        if len(self._fds) >= self.limit:
            self.close()

    def close(self) -> None:
        """Close what is held (at the end of the turn)."""
        fds, self._fds = self._fds, []
        close_fds(fds)
