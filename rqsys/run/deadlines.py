"""When running scripts must be stopped: timed actions on the loop's clock, and
the timeout of each run (the queue's ``timeout``, a message's own, what an
earlier, cut-short run already used).

No thread and no polling: the loop's selector waits at most until the
earliest deadline (``wait``), and each turn runs the actions that are due
(``fire``).  An action armed for a script that has ended meanwhile is
dropped by its owner (the runner checks that the worker still runs).

The timeout of a run is its budget: the smaller of the queue's and the
message's ``timeout`` (0 or absent: none), less ``timeout_used``, the time
earlier runs of the same message used before the daemon stopped or crashed
under them.  A resend or a retry is a new run with the whole budget again.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

from rqsys.errors import BadRequest
from rqsys.run.verdict import Worker
from rqsys.store.recovery import TIME_USED as USED

Action = Callable[[], None]


class Deadlines:
    """Actions due at monotonic times, earliest first."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Action]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def after(self, seconds: float, action: Action) -> None:
        """Run ``action`` on the loop ``seconds`` from now."""
        heapq.heappush(self._heap, (self._clock() + seconds, next(self._seq), action))

    def wait(self) -> float | None:
        """Seconds until the next action is due (None: nothing armed)."""
        return max(0.0, self._heap[0][0] - self._clock()) if self._heap else None

    def fire(self) -> None:
        """Run every action that is due now."""
        now = self._clock()
        while self._heap and self._heap[0][0] <= now:
            heapq.heappop(self._heap)[2]()


def timeout_of(msg: dict[str, Any], cfg: dict[str, Any]) -> float:
    """The whole timeout of a message in this queue (0: none)."""
    limits = [float(t) for t in (cfg.get("timeout"), msg.get("timeout")) if t]
    return min(limits) if limits else 0.0


def budget(msg: dict[str, Any], cfg: dict[str, Any]) -> float | None:
    """Seconds this run of ``msg`` may take (None: no timeout; may be <= 0:
    earlier runs used it all)."""
    whole = timeout_of(msg, cfg)
    return whole - float(msg.get(USED) or 0) if whole else None


def check_timeout(msg: dict[str, Any], cfg: dict[str, Any]) -> None:
    """At create: a message's ``timeout`` may not be over its queue's."""
    mine, queue = msg.get("timeout"), cfg.get("timeout")
    if mine and queue and float(mine) > float(queue):
        raise BadRequest(f"timeout: {mine:g} s is more than queue {cfg['name']}'s "
                         f"timeout of {float(queue):g} s")


def timed_out_text(msg: dict[str, Any], cfg: dict[str, Any]) -> str:
    return f"timed out after {timeout_of(msg, cfg):g} s"


def time_used(worker: Worker | None) -> float:
    """What a requeued message has used of its timeout: a run the daemon's
    stop cut short adds its time; a resend or a retry starts afresh."""
    if worker is None or worker.stop_reason != "stopping":
        return 0.0
    return float(worker.msg.get(USED) or 0) + time.time() - worker.started

