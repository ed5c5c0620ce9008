"""The que's tail: plain queued messages past its window, on disk only, read back as it drains.

A queue daemon holds its queued messages in memory (``Schedule``): some
650 bytes each, 650 MB for a million.  A deep que needs only its head there.
Past ``tunables.QUE_WINDOW`` plain messages in memory (priority 0, no due
time, waiting for nothing: the messages a backlog is made of), a plain
message stays in ``que/`` and only its id is kept (about 80 bytes), in the
*tail*, in arrival order.  Such a message runs after every plain one in
memory (the run order is priority, due time, arrival: a plain one newer than
them sorts after them), so the tail is read back, oldest first, whenever the
plain ones in memory fall below half the window: at each start and each
turn, a slice at a time.  A message that is not plain (a priority, a due
time, ``after``) never goes to the tail: it is ordered among all.  A message
that sorts after the plain ones (a worse priority, a due time passed) does
not start while the tail holds any (``Schedule.behind_tail``): the tail is
read first.

Where the tail shows: the que tab, a tag's listing and a ``single_que``
create's look for the same params see the messages in memory only; the count
of que counts the tail's (a delete of one counted as it goes).  Queues whose
messages must all be compared (coalesce params, a pool's) have no tail.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rqsys.daemon.scheduler import Schedule
    from rqsys.store import QueueView

SLICE_S = 0.005  # a refill's reading at most a turn (messages run meanwhile: their ends wait)
CHECK_EVERY = 32  # messages read between looks at the clock


def plain(msg: dict[str, Any]) -> bool:
    """A message a backlog is made of: priority 0, no due time, waiting for nothing."""
    return not (msg.get("priority") or msg.get("due") or msg.get("after"))


class QueTail:
    """Ids of plain queued messages not in memory, oldest first."""

    def __init__(self, store: QueueView, window: int) -> None:
        self._store, self.window = store, window  # window 0: no tail (every message in memory)
        self._ids: collections.deque[str] = collections.deque()
        self._gone = 0  # deleted while here, not yet met by a refill
        self._out: set[str] = set()  # here still, but read in early (a cancel, a run_now)

    def __len__(self) -> int:
        return max(0, len(self._ids) - self._gone - len(self._out))

    def takes(self, que: Schedule, msg: dict[str, Any]) -> bool:
        """Whether a newly queued ``msg`` goes to the tail: it is plain and the
        window is full (or the tail has begun: it keeps the arrival order)."""
        return bool(self.window) and (bool(self._ids) or que.plain >= self.window) and plain(msg)

    def append(self, que: Schedule, msg_id: str) -> None:
        self._ids.append(msg_id)
        que.behind_tail = True

    def deleted(self) -> None:
        """A queued message not in memory was deleted: counted until a refill meets its gap."""
        if self._ids:
            self._gone += 1

    def take_out(self, msg_id: str) -> None:
        """``msg_id`` was read in ahead of its turn (a client's action on it): if
        it is here, it is passed over when met (a look through the ids: rare)."""
        if self._ids and msg_id in self._ids:
            self._out.add(msg_id)

    def refill(self, que: Schedule) -> None:
        """Read the oldest back into ``que`` while its plain ones are under half the
        window, or what it has sorts after them (``que.tail_hit``), for SLICE_S."""
        if not self._ids or (que.plain >= self.window // 2 and not que.tail_hit):
            return
        until, read = time.perf_counter() + SLICE_S, 0
        while self._ids and que.plain < self.window:
            msg_id = self._ids.popleft()
            if msg_id in self._out:
                self._out.discard(msg_id)
                continue
            msg = self._store.read_queued(msg_id)
            if isinstance(msg, dict):
                que.add(msg_id, msg)
            elif self._gone:
                self._gone -= 1  # deleted (None), or unreadable now: the next start moves it to err
            read += 1
            if read % CHECK_EVERY == 0 and time.perf_counter() > until:
                break
        que.tail_hit = False
        que.behind_tail = bool(self._ids)
