"""Where a queue daemon's event loop spends its time.

Three sums since the daemon started: waiting for events (``idle_s``, in
the selector), inside the spawn helper (``spawn_s``: mostly blocked until
the started script has exec'd, as the helper's vfork makes the loop wait
for the child, and the helper's own system calls), and the loop thread's
CPU time (``cpu_s``).  The last two overlap (the helper's calls are loop
CPU); what none of them holds is other waits (the disk under a rename, a
CPU the loop was ready for but not given).  An operator reads the first
as the loop's headroom: a loop seldom idle is the queue's ceiling,
whatever its ``num_workers`` (``rqsys_queue_loop_*_seconds_total``,
docs/OBSERVING.md).
"""

from __future__ import annotations

import time


class LoopClock:
    """The loop's idle seconds and its seconds in the spawn helper, added as they pass."""

    def __init__(self) -> None:
        self.idle_s = 0.0
        self.spawn_s = 0.0

    def report(self) -> dict[str, float]:
        """The three sums (called on the loop's thread: its CPU time)."""
        return {"idle_s": round(self.idle_s, 6), "spawn_s": round(self.spawn_s, 6),
                "cpu_s": round(time.thread_time(), 6)}
