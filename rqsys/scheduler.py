"""The in-memory que of one queue: which message runs next (priority, due
time, arrival), blocking keys and coalescing.

Two heaps: messages not yet due wait in ``_heap`` by due time; once due they
move to ``_ready``, ordered by ``priority`` (smaller first, default 0, as
Oban and Solid Queue), then due time, then id (arrival).  A message that is
not due never holds back one that is, whatever their priorities.  The order
is strict: a due message of a better priority always starts first, so a
steady stream of them can starve worse ones (no ageing: what a user asks
for is what runs; give work that must not wait behind others its own queue).
With every priority 0 the order is the one without priorities: due time,
then id.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import Any

from rqsys.message import due_time, param_key

Msg = dict[str, Any]
Ready = tuple[int, float, str]  # (priority, due, id)


def priority(msg: Msg) -> int:
    return int(msg.get("priority") or 0)


class Schedule:
    """Queued messages, popped best priority then oldest-due first, honouring
    blocking_params.

    The heap may hold stale entries (deleted or re-timed messages); they are
    skipped when popped, so every operation stays O(log n).
    """

    def __init__(self, blocking: list[int], coalesce: list[int]) -> None:
        self.blocking = list(blocking)
        self.coalesce = list(coalesce)
        self.msgs: dict[str, Msg] = {}
        self._heap: list[tuple[float, str]] = []  # not due yet when pushed: (due, id)
        self._ready: list[Ready] = []  # due
        self._waiting: dict[tuple[str, ...], list[Ready]] = defaultdict(list)
        self._by_coalesce: dict[tuple[str, ...], set[str]] = defaultdict(set)

    def __len__(self) -> int:
        return len(self.msgs)

    def __contains__(self, msg_id: str) -> bool:
        return msg_id in self.msgs

    def add(self, msg_id: str, msg: Msg) -> None:
        self.remove(msg_id)
        self.msgs[msg_id] = msg
        heapq.heappush(self._heap, (due_time(msg), msg_id))
        key = param_key(msg, self.coalesce)
        if key is not None:
            self._by_coalesce[key].add(msg_id)

    def remove(self, msg_id: str) -> Msg | None:
        msg = self.msgs.pop(msg_id, None)
        if msg is not None:
            key = param_key(msg, self.coalesce)
            if key is not None:
                self._by_coalesce[key].discard(msg_id)
        return msg

    def _live(self, entry: tuple[float, str]) -> bool:
        msg = self.msgs.get(entry[1])
        return msg is not None and due_time(msg) == entry[0]

    def _live_ready(self, entry: Ready) -> bool:
        msg = self.msgs.get(entry[2])
        return msg is not None and (priority(msg), due_time(msg)) == entry[:2]

    def next_due(self) -> float | None:
        """The earliest due time of a runnable entry, or None."""
        while self._ready and not self._live_ready(self._ready[0]):
            heapq.heappop(self._ready)
        while self._heap and not self._live(self._heap[0]):
            heapq.heappop(self._heap)
        dues = [entry[1] for entry in self._ready[:1]] + [entry[0] for entry in self._heap[:1]]
        return min(dues) if dues else None

    def _promote(self, now: float) -> None:
        """Entries due by ``now`` move to the ready heap (priority order)."""
        while self._heap and self._heap[0][0] <= now:
            due, msg_id = heapq.heappop(self._heap)
            if self._live((due, msg_id)):
                heapq.heappush(self._ready, (priority(self.msgs[msg_id]), due, msg_id))

    def pop_ready(self, now: float, busy_keys: set[tuple[str, ...]]) -> tuple[str, Msg] | None:
        """The next due message whose blocking key is free, removed from the que."""
        self._promote(now)
        while self._ready:
            entry = heapq.heappop(self._ready)
            if not self._live_ready(entry):
                continue
            key = param_key(self.msgs[entry[2]], self.blocking)
            if key is not None and key in busy_keys:
                self._waiting[key].append(entry)
                continue
            msg = self.remove(entry[2])
            assert msg is not None
            return entry[2], msg
        return None

    def release(self, key: tuple[str, ...] | None) -> None:
        """A blocking key became free: its waiting messages compete again."""
        if key is None:
            return
        for entry in self._waiting.pop(key, []):
            heapq.heappush(self._ready, entry)

    def take_coalesced(self, msg: Msg) -> list[tuple[str, Msg]]:
        """Remove and return the queued messages with ``msg``'s coalesce key,
        whatever their due time (RQ's ``handle_dups``)."""
        key = param_key(msg, self.coalesce)
        if key is None:
            return []
        taken = []
        for msg_id in sorted(self._by_coalesce.pop(key, ())):
            found = self.remove(msg_id)
            if found is not None:
                taken.append((msg_id, found))
        return taken

    def find_same_params(self, msg: Msg) -> str | None:
        """A queued message with the same dest and params (for single_que)."""
        want = param_key(msg, [1, 2, 3, 4])
        for msg_id, other in self.msgs.items():
            if other.get("dest") == msg.get("dest") and param_key(other, [1, 2, 3, 4]) == want:
                return msg_id
        return None

    def ordered_ids(self) -> list[str]:
        return sorted(self.msgs)
