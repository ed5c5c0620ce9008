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
