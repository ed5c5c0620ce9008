"""The que's run order for listing it (the que tab): a sorted list, its removals left behind.

The que tab lists queued messages in the order they start.  The order is
sorted when first asked; kept exactly (a ``del`` a start), a deep que made
every start O(n): with a million queued and the tab viewed once, a drain
spent most of its time moving the list.  Here a removal only counts: the
entry stays until a listing walks past it (removals are mostly at the head,
where each start takes the first) or the stale ones are half the list (then
one pass drops them).  Adds append when they sort last (a new message of the
default priority does) and are inserted otherwise.  A listing walks from
the head, skipping entries no longer live (removed, or re-keyed: the
schedule's ``live`` says) and any second entry of one id (taken out and put
back unchanged).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

Ready = tuple[int, float, int, str]  # (priority, due, arrival, id): the run order
COMPACT_MIN = 4096  # fewer stale entries than this are never worth a pass


class RunOrder:
    """The sorted run keys of a que, built when first asked for."""

    def __init__(self, live: Callable[[Ready], bool]) -> None:
        self._live = live
        self._keys: list[Ready] | None = None
        self._stale = 0  # removals since the last pass (an upper bound of the dead entries)

    @property
    def built(self) -> bool:
        """Whether it has been asked for (until then adds and removals cost nothing)."""
        return self._keys is not None

    def add(self, key: Ready) -> None:
        keys = self._keys
        if keys is None:
            return
        if not keys or key >= keys[-1]:
            keys.append(key)
        else:
            bisect.insort(keys, key)

    def removed(self) -> None:
        if self._keys is None:
            return
        self._stale += 1
        if self._stale >= max(COMPACT_MIN, len(self._keys) // 2):
            self._compact()

    def ids(self, every: Callable[[], Iterable[Ready]], offset: int,
            limit: int | None) -> list[str]:
        """Ids ``offset`` to ``offset + limit`` in run order (``every``: all the
        que's keys, for the first sort)."""
        if self._keys is None:
            self._keys, self._stale = sorted(every()), 0
        self._drop_dead_head()
        got: list[str] = []
        seen: set[str] = set()
        skip = offset
        for key in self._keys:
            if limit is not None and len(got) >= limit:
                break
            if key[3] in seen or not self._live(key):
                continue
            seen.add(key[3])
            if skip:
                skip -= 1
            else:
                got.append(key[3])
        return got

    def _drop_dead_head(self) -> None:
        """The dead entries at the head (started ones) out, in one ``del``."""
        keys = self._keys
        assert keys is not None
        head = 0
        while head < len(keys) and not self._live(keys[head]):
            head += 1
        if head:
            del keys[:head]
            self._stale = max(0, self._stale - head)

    def _compact(self) -> None:
        assert self._keys is not None
        seen: set[str] = set()
        kept = []
        for key in self._keys:
            if key[3] not in seen and self._live(key):
                seen.add(key[3])
                kept.append(key)
        self._keys, self._stale = kept, 0
