"""Whether a due message may start now: the queue's concurrency limits
(``blocking_params`` is the limit-1 case) and its rate limit, each counted
globally or per tuple of parameters.

A *gate* answers for one message: free, or held under a *wait key* until a
running message of the same key ends (concurrency) or until a time
(rate: the oldest start in the window leaves it).  The schedule parks held
messages under their wait key and hands them back when the gate says so;
nothing polls.  Counts are kept in memory: after a restart nothing runs,
and the rate windows start empty (a restart may allow up to ``limit``
starts at once, never more per window than the limit afterwards).  A pool
queue's limits are also held across its hosts (``rqsys.pool.limits``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

Msg = dict[str, Any]
Key = tuple[str, ...]
WaitKey = tuple[Any, ...]  # ("c", rule number, *params) or ("r", *params)
Wake = tuple[WaitKey, "float | None"]  # a wait key, and when its next message may try
SWEEP_EVERY = 4096  # rate windows kept before the idle ones are dropped


def params_of(msg: Msg, by: list[int]) -> Key:
    """The tuple of the listed params (1-based); () counts the whole queue."""
    return tuple(str(msg.get(f"param{n}", "")) for n in by)


class Concurrency:
    """At most ``limit`` running messages per tuple of the ``by`` params."""

    def __init__(self, by: list[int], limit: int) -> None:
        self.by, self.limit = list(by), int(limit)
        self.running: dict[Key, int] = {}

    def full(self, key: Key) -> bool:
        return self.running.get(key, 0) >= self.limit

    def started(self, key: Key) -> None:
        self.running[key] = self.running.get(key, 0) + 1

    def ended(self, key: Key) -> None:
        left = self.running.get(key, 0) - 1
        if left > 0:
            self.running[key] = left
        else:
            self.running.pop(key, None)


class RateLimit:
    """At most ``limit`` starts per ``per`` seconds per tuple of the ``by``
    params (a sliding window of the last starts' times)."""

    def __init__(self, limit: int, per: float, by: list[int]) -> None:
        self.limit, self.per, self.by = int(limit), float(per), list(by)
        self.starts: dict[Key, collections.deque[float]] = {}

    def next_start(self, key: Key, now: float) -> float | None:
        """None when a start is allowed at ``now``, else when one will be."""
        times = self.starts.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.per:
            times.popleft()
        return times[0] + self.per if len(times) >= self.limit else None

    def started(self, key: Key, now: float) -> None:
        times = self.starts.setdefault(key, collections.deque(maxlen=self.limit))
        times.append(now)
        if len(self.starts) > SWEEP_EVERY:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Drop the windows with no start left in them (one per tuple ever seen)."""
        for key in [k for k, t in self.starts.items() if not t or t[-1] <= now - self.per]:
            del self.starts[key]


class Gate:
    """The concurrency rules and the rate limit of one queue."""

    def __init__(self, rules: Iterable[Concurrency] = (), rate: RateLimit | None = None) -> None:
        self.rules, self.rate = list(rules), rate

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Gate:
        """``blocking_params`` (limit 1), ``concurrency`` and ``rate_limit`` of a queue config."""
        rules = [Concurrency(cfg["blocking_params"], 1)] if cfg.get("blocking_params") else []
        conc = cfg.get("concurrency")
        if conc:
            rules.append(Concurrency(conc.get("by", []), conc["limit"]))
        rate = cfg.get("rate_limit")
        return cls(rules, RateLimit(rate["limit"], rate["per"], rate.get("by", []))
                   if rate else None)

    def hold(self, msg: Msg, now: float) -> tuple[WaitKey, float | None] | None:
        """None when ``msg`` may start now; else its wait key, and the time
        it may start (None: when a message of its key ends)."""
        for number, rule in enumerate(self.rules):
            key = params_of(msg, rule.by)
            if rule.full(key):
                return ("c", number, *key), None
        if self.rate is not None:
            key = params_of(msg, self.rate.by)
            when = self.rate.next_start(key, now)
            if when is not None:
                return ("r", *key), when
        return None

    def started(self, msg: Msg, now: float | None) -> list[Wake]:
        """``msg`` started (``now`` None: it was running before, a reload).
        Its wait keys, each with when the next message held under it may
        try (None: now); a full concurrency key waits for an end instead."""
        wakes: list[Wake] = []
        for number, rule in enumerate(self.rules):
            key = params_of(msg, rule.by)
            rule.started(key)
            if not rule.full(key):
                wakes.append((("c", number, *key), None))
        if self.rate is not None and now is not None:
            key = params_of(msg, self.rate.by)
            self.rate.started(key, now)
            wakes.append((("r", *key), self.rate.next_start(key, now)))
        return wakes

    def ended(self, msg: Msg) -> list[Wake]:
        """``msg`` stopped running: the wait keys it frees a place in."""
        wakes: list[Wake] = []
        for number, rule in enumerate(self.rules):
            key = params_of(msg, rule.by)
            rule.ended(key)
            wakes.append((("c", number, *key), None))
        return wakes

    def adopt(self, old: Gate) -> None:
        """After a reload: keep the old rate windows when the limit counts alike."""
        if self.rate is not None and old.rate is not None and self.rate.by == old.rate.by:
            for key, times in old.rate.starts.items():
                self.rate.starts[key] = collections.deque(times, maxlen=self.rate.limit)

