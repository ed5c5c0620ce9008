"""A pool queue's limits held across all its hosts: each message's places in
``concurrency``, ``blocking_params`` and ``rate_limit``, taken and given back
in the pool's KV bucket by compare-and-set (coroutines for the ``bridge``).

A plain queue counts its limits in memory (``rqsys.daemon.gates``); each
host of a pool would count only its own runs, so the pool's hosts count
them in the pool's bucket, one key per limit and tuple of its ``by``
params (the key is known once the message is fetched):

* ``limit.c.<hash>`` (``concurrency``, ``blocking_params``): the holders,
  ``[msg_id, host, instance, at]`` each.  A place is taken by adding one
  while fewer than ``limit`` are there, and given back by removing it (the
  key is deleted when empty).  A host that finds the key full drops the
  holders whose daemon is gone: its ``load.<host>`` (written at join and
  every third of ``ack_wait``) names another instance of the daemon (it
  was restarted), says it stopped, or is older than ``ack_wait``.  A dead
  host's places so come back within ``ack_wait``, when JetStream hands its
  messages out again.  (Per-key TTLs need nats-server 2.11; Debian 12 has
  2.9.)
* ``limit.r.<hash>`` (``rate_limit``): the window, ``{"t": [start times],
  "r": {"<msg_id>@<host>": when taken}}``.  A start time counts for ``per``
  seconds; a place taken and not yet started counts for ``per`` +
  COUNTED_AFTER after it was taken, and its message goes back to the pool
  unless it starts within START_SLACK (``rqsys.pool.admission``), so a
  start is always counted in every window it falls in.  The host that
  starts it turns its place into its start time (times rounded up to the
  ms: later, never earlier).

Every change reads the key and writes it with the revision read (``create``
when absent); a write another host made meanwhile makes it read again.
Times are the hosts' clocks (keep them in step: NTP).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError

from rqsys.daemon.gates import params_of
from rqsys.errors import Unavailable
from rqsys.pool.link import Link
from rqsys.pool.settings import HOST_KEY_RE

START_SLACK = 2.0  # seconds from a rate place to its start, else the message goes back
COUNTED_AFTER = START_SLACK + 1.0  # an unstarted rate place counts per + this (a turn's time)
TRIES = 8  # writes raced by other hosts before the take is answered "ask again"
SAME = object()  # a change that writes nothing
WRONG_LAST = (10071, 10164)  # JetStream: not the last revision (a compare-and-set lost)


Change = Callable[[Any], Awaitable[tuple[Any, Any]]]  # value -> (new value, result)


@dataclass(frozen=True)
class Rule:
    """One limit of the queue config."""

    what: str  # "blocking_params", "concurrency" or "rate_limit"
    by: tuple[int, ...]
    limit: int
    per: float = 0.0  # rate_limit only

    @property
    def rate(self) -> bool:
        return self.what == "rate_limit"


@dataclass(frozen=True)
class Place:
    """A message's place in one limit: the rule and its key in the bucket."""

    rule: Rule
    key: str


@dataclass(frozen=True)
class Refused:
    """A place that is full: which, and when to ask again (None: soon)."""

    place: Place | None  # None: its key was raced by other hosts TRIES times
    at: float | None = None  # wall time a rate place frees


def rules_of(cfg: dict[str, Any]) -> tuple[Rule, ...]:
    """The limits of a queue config that the pool holds across its hosts."""
    rules = []
    if cfg.get("blocking_params"):
        rules.append(Rule("blocking_params", tuple(cfg["blocking_params"]), 1))
    conc = cfg.get("concurrency")
    if conc:
        rules.append(Rule("concurrency", tuple(conc.get("by", [])), int(conc["limit"])))
    rate = cfg.get("rate_limit")
    if rate:
        rules.append(Rule("rate_limit", tuple(rate.get("by", [])), int(rate["limit"]),
                          float(rate["per"])))
    return tuple(rules)


def places_of(rules: tuple[Rule, ...], msg: dict[str, Any]) -> list[Place]:
    """A message's places, in the order they are taken: concurrency first
    (by key: hosts take them in one order), its start in the rate last."""
    places = []
    for rule in rules:
        same = json.dumps([rule.what, list(rule.by), list(params_of(msg, list(rule.by)))])
        digest = hashlib.sha256(same.encode()).hexdigest()[:40]
        places.append(Place(rule, f"limit.{'r' if rule.rate else 'c'}.{digest}"))
    return sorted(places, key=lambda p: (p.rule.rate, p.key))


# ---------------------------------------------------------------- the values
def take_held(held: list[list[Any]], me: list[Any], limit: int) -> list[list[Any]] | None:
    """The holders with ``me`` added, or None when ``limit`` hold it.  (The
    same message held by another host or run is another holder: a delivery
    that host may still run.)"""
    if any(h[:3] == me[:3] for h in held):
        return held  # taken already (an answer lost, asked again)
    return None if len(held) >= limit else [*held, me]


def window(value: dict[str, Any] | None, now: float, per: float) -> dict[str, Any]:
    """A rate window without what counts no more at ``now``."""
    value = value or {}
    return {"t": [t for t in value.get("t", []) if t > now - per],
            "r": {i: t for i, t in value.get("r", {}).items() if t > now - per - COUNTED_AFTER}}


def take_start(win: dict[str, Any], name: str, now: float, rule: Rule) -> float | None:
    """Take place ``name`` in the window (None), or say when one frees (wall time)."""
    if name in win["r"]:
        return None
    if len(win["t"]) + len(win["r"]) < rule.limit:
        win["r"][name] = _ms(now)
        return None
    return min([t + rule.per for t in win["t"]]
               + [t + rule.per + COUNTED_AFTER for t in win["r"].values()])


def mark_started(win: dict[str, Any], name: str, at: float) -> None:
    """Place ``name``'s message started at ``at``: the place becomes a start time."""
    win["r"].pop(name, None)
    win["t"] = sorted([*win["t"], _ms(at)])


def _ms(at: float) -> float:
    """A time rounded up to the ms (counted a little longer, never shorter)."""
    return math.ceil(at * 1000) / 1000


def _dead(held: list[Any], load: dict[str, Any] | None, ack_wait: float) -> bool:
    """Whether a holder's daemon is gone, by its host's ``load`` record."""
    if load is None or load.get("stopped"):
        return True
    if load.get("instance", held[2]) != held[2]:
        return True  # restarted since
    return time.time() - float(load.get("at", 0)) > ack_wait


# ---------------------------------------------------------------- the bucket
class Raced(Unavailable):
    """A key written by other hosts between each read and write, TRIES times."""


class Places:
    """This host's places in its pool's limits, taken and given back in the bucket."""

    def __init__(self, link: Link) -> None:
        self.link = link

    async def take(self, msg_id: str, places: list[Place]) -> Refused | float:
        """All of ``places`` for ``msg_id``, or none: when they were taken
        (wall time), or the one that is full.  Raised: NATS did not answer
        (the caller gives back all of them: some may have been taken)."""
        taken: list[Place] = []
        now = time.time()
        for place in places:
            change = (self._take_start if place.rule.rate else self._take_held)(msg_id, place, now)
            try:
                refused = await self._change(place.key, change)
            except Raced:
                refused = Refused(None)
            if refused is not None:
                if taken:
                    await self.give_back(msg_id, taken, started=False)
                return refused  # type: ignore[no-any-return]
            taken.append(place)
        return now

    async def give_back(self, msg_id: str, places: list[Place], started: bool) -> None:
        """``msg_id``'s places given back: it ended, or goes back to the pool
        (``started`` False: its rate place too; else that one stays its start)."""
        for place in places:
            if not place.rule.rate:
                await self._change(place.key, self._let_go(msg_id))
            elif not started:
                await self._change(place.key, self._unstart(msg_id, place.rule))

    async def started(self, msg_id: str, place: Place, at: float) -> None:
        """``msg_id`` started at ``at``: its rate place is its start time now."""
        mine = self._mine(msg_id)

        async def change(value: Any) -> tuple[Any, Any]:
            win = window(value, time.time(), place.rule.per)
            mark_started(win, mine, at)
            return win, None
        await self._change(place.key, change)

    def _mine(self, msg_id: str) -> str:
        """A rate place's name: the message on this host (a delivery of it
        another host took is another place, and may be another start)."""
        return f"{msg_id}@{self.link.s.host}"

    # ------------------------------------------------------------ changes
    def _take_held(self, msg_id: str, place: Place, now: float) -> Change:
        me = [msg_id, self.link.s.host, self.link.instance, _ms(now)]

        async def change(value: Any) -> tuple[Any, Any]:
            held = list((value or {}).get("held", []))
            if len(held) >= place.rule.limit and not any(h[:3] == me[:3] for h in held):
                held = await self._living(held)
            new = take_held(held, me, place.rule.limit)
            return (SAME, Refused(place)) if new is None else ({"held": new}, None)
        return change

    def _take_start(self, msg_id: str, place: Place, now: float) -> Change:
        mine = self._mine(msg_id)

        async def change(value: Any) -> tuple[Any, Any]:
            win = window(value, now, place.rule.per)
            at = take_start(win, mine, now, place.rule)
            return (SAME, Refused(place, at)) if at is not None else (win, None)
        return change

    def _let_go(self, msg_id: str) -> Change:
        host = self.link.s.host

        async def change(value: Any) -> tuple[Any, Any]:
            held = list((value or {}).get("held", []))
            left = [h for h in held if not (h[0] == msg_id and h[1] == host)]
            if len(left) == len(held):
                return SAME, None
            return ({"held": left} if left else None), None
        return change

    def _unstart(self, msg_id: str, rule: Rule) -> Change:
        mine = self._mine(msg_id)

        async def change(value: Any) -> tuple[Any, Any]:
            win = window(value, time.time(), rule.per)
            if win["r"].pop(mine, None) is None:
                return SAME, None
            return win, None
        return change

    async def _living(self, held: list[list[Any]]) -> list[list[Any]]:
        """The holders whose daemon is alive (each host's load read once)."""
        loads: dict[str, dict[str, Any] | None] = {}
        for host in {h[1] for h in held}:
            if host == self.link.s.host:  # this daemon is this instance
                loads[host] = {"instance": self.link.instance, "at": time.time()}
                continue
            try:
                entry = await self.link.kv.get(f"load.{HOST_KEY_RE.sub('_', host)}")
                loads[host] = json.loads(entry.value)
            except KeyNotFoundError:
                loads[host] = None
        return [h for h in held if not _dead(h, loads[h[1]], self.link.s.ack_wait)]

    async def _change(self, key: str, change: Change) -> Any:
        """Read ``key``, ``change`` its value, write it if its revision is still
        the one read; again when another host wrote between.  The change's result."""
        kv = self.link.kv
        for _ in range(TRIES):
            try:
                entry = await kv.get(key)
                value, revision = json.loads(entry.value), entry.revision
            except KeyNotFoundError:
                value, revision = None, 0
            new, result = await change(value)
            if new is SAME:
                return result
            data = json.dumps(new, separators=(",", ":")).encode()
            try:
                if new is None:
                    await kv.delete(key, last=revision)
                elif revision:
                    await kv.update(key, data, last=revision)
                else:
                    await kv.create(key, data)
            except KeyWrongLastSequenceError:
                continue
            except APIError as exc:  # nats-py's delete does not name it
                if exc.err_code not in WRONG_LAST:
                    raise
                continue
            return result
        raise Raced(f"pool limit {key}: written by other hosts {TRIES} times over")
