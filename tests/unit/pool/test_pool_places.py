"""Unit tests of a pool queue's limits held across its hosts: the places a
message takes (one key per limit and tuple of ``by`` params), the
compare-and-set on a bucket many hosts write at once (never more holders
than the limit, never more starts in a window), a dead host's places taken
back, and the admission of a staged message: placed, kept waiting, sent
back to the pool, or sent back when it does not start in time.
A fake bucket stands in for JetStream's KV (the real one is in
tests/system/test_pool_limits.py)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from rqsys.pool import admission as admission_module
from rqsys.pool.acks import RETRY
from rqsys.pool.admission import BACK_DELAY, HOLD_BY, POLL, Admission
from rqsys.pool.insist import Insist
from rqsys.pool.limits import (
    COUNTED_AFTER,
    START_SLACK,
    Place,
    Places,
    Refused,
    Rule,
    mark_started,
    places_of,
    rules_of,
    take_start,
    window,
)

ACK_WAIT = 30.0


class Bucket:
    """JetStream's KV as the limits use it: revisions, create-if-absent,
    update and delete if the revision is still the one read.  ``shuffle``
    yields to the other coroutines around each call (hosts racing)."""

    def __init__(self, shuffle: random.Random | None = None) -> None:
        self.values: dict[str, tuple[bytes, int]] = {}
        self.revision = 0
        self.shuffle = shuffle
        self.down = False
        self.writes = 0

    async def _yield(self) -> None:
        if self.down:
            raise TimeoutError("nats: timeout")
        if self.shuffle is not None:
            for _ in range(self.shuffle.randint(0, 3)):
                await asyncio.sleep(0)

    async def get(self, key: str) -> Any:
        await self._yield()
        if key not in self.values:
            raise KeyNotFoundError()
        value, revision = self.values[key]
        return SimpleNamespace(value=value, revision=revision)

    async def create(self, key: str, value: bytes) -> None:
        await self._yield()
        if key in self.values:
            raise KeyWrongLastSequenceError()
        self._write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> None:
        await self._yield()
        if key not in self.values or self.values[key][1] != last:
            raise KeyWrongLastSequenceError()
        self._write(key, value)

    async def delete(self, key: str, last: int) -> None:
        await self._yield()
        if key not in self.values or self.values[key][1] != last:
            raise KeyWrongLastSequenceError()
        del self.values[key]

    async def put(self, key: str, value: bytes) -> None:
        self._write(key, value)

    def _write(self, key: str, value: bytes) -> None:
        self.revision += 1
        self.writes += 1
        self.values[key] = (value, self.revision)

    def json(self, key: str) -> Any:
        return json.loads(self.values[key][0]) if key in self.values else None


def host(bucket: Bucket, name: str, instance: str = "i1") -> Places:
    """One host's places, and its load record written as its link does."""
    link = SimpleNamespace(kv=bucket, instance=instance,
                           s=SimpleNamespace(host=name, ack_wait=ACK_WAIT))
    alive(bucket, name, instance)
    return Places(link)  # type: ignore[arg-type]


def alive(bucket: Bucket, name: str, instance: str = "i1", ago: float = 0.0,
          stopped: bool = False) -> None:
    bucket.values[f"load.{name}"] = (json.dumps({
        "host": name, "in_flight": 1, "at": time.time() - ago, "stopped": stopped,
        "instance": instance}).encode(), 0)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


WHOLE = {"concurrency": {"limit": 2}}
BY = {"concurrency": {"by": [1], "limit": 1}}
RATE = {"rate_limit": {"limit": 2, "per": 2}}


# ---------------------------------------------------------------- rules and keys
def test_the_pool_holds_blocking_params_concurrency_and_rate_limit() -> None:
    rules = rules_of({"blocking_params": [1], "concurrency": {"limit": 3, "by": [2]},
                      "rate_limit": {"limit": 5, "per": 60}})
    assert rules == (Rule("blocking_params", (1,), 1), Rule("concurrency", (2,), 3),
                     Rule("rate_limit", (), 5, 60.0))
    assert rules_of({"num_workers": 4}) == ()  # no limit: nothing asked of NATS


def test_a_key_per_limit_and_tuple_of_its_params() -> None:
    rules = rules_of({"blocking_params": [1], "concurrency": {"limit": 2, "by": [1]},
                      **RATE})
    x1, x2, y = ({"param1": p, "param2": q} for p, q in (("x", "1"), ("x", "2"), ("y", "1")))
    keys = {n: [p.key for p in places_of(rules, m)] for n, m in (("x1", x1), ("x2", x2),
                                                                 ("y", y))}
    assert keys["x1"] == keys["x2"]  # param2 is no limit's
    assert keys["x1"][:2] != keys["y"][:2] and keys["x1"][2] == keys["y"][2]
    assert len(set(keys["x1"])) == 3  # blocking_params and concurrency by [1]: two limits
    assert [p.rule.rate for p in places_of(rules, x1)] == [False, False, True]  # rate last
    assert all(k.startswith(("limit.c.", "limit.r.")) for k in keys["x1"])


# ---------------------------------------------------------------- the rate window
def test_a_rate_window_counts_starts_for_per_and_places_a_while_longer() -> None:
    rule = Rule("rate_limit", (), 2, 2.0)
    win = window(None, 100.0, rule.per)
    assert take_start(win, "m1", 100.0, rule) is None
    assert take_start(win, "m2", 100.5, rule) is None
    assert take_start(win, "m3", 101.0, rule) == 100.0 + 2 + COUNTED_AFTER  # none started
    mark_started(win, "m1", 100.2)
    assert take_start(win, "m3", 101.0, rule) == 100.2 + 2  # m1's start leaves first
    win = window(win, 102.3, rule.per)  # m1's start has left, m2's place has not
    assert win == {"t": [], "r": {"m2": 100.5}}
    assert take_start(win, "m3", 102.3, rule) is None


# ---------------------------------------------------------------- the bucket
async def race(hosts: list[Places], places: list[Place], count: int) -> list[Any]:
    """``count`` messages taking their places at once, from the hosts in turn."""
    return list(await asyncio.gather(*(hosts[n % len(hosts)].take(f"m{n}", places)
                                       for n in range(count))))


def test_concurrency_holders_never_exceed_the_limit_however_hosts_race() -> None:
    for seed in range(20):
        bucket = Bucket(random.Random(seed))
        hosts = [host(bucket, name) for name in "abc"]
        places = places_of(rules_of({"concurrency": {"limit": 3}}), {})
        got = run(race(hosts, places, 12))
        taken = [g for g in got if not isinstance(g, Refused)]
        assert len(taken) == 3, (seed, got)
        assert len(bucket.json(places[0].key)["held"]) == 3


def test_a_place_given_back_frees_it_and_the_last_deletes_the_key() -> None:
    bucket = Bucket()
    a, b = host(bucket, "a"), host(bucket, "b")
    places = places_of(rules_of(WHOLE), {})
    assert isinstance(run(a.take("m1", places)), float)
    assert isinstance(run(b.take("m2", places)), float)
    assert run(a.take("m3", places)) == Refused(places[0])
    assert run(a.take("m1", places)) is not None  # asked again (a lost answer): still its
    run(b.give_back("m1", places, started=True))  # not b's to give back
    assert len(bucket.json(places[0].key)["held"]) == 2
    run(a.give_back("m1", places, started=True))
    assert isinstance(run(a.take("m3", places)), float)
    run(a.give_back("m3", places, started=True))
    run(b.give_back("m2", places, started=True))
    assert places[0].key not in bucket.values


@pytest.mark.parametrize(("how", "taken"), [
    ({}, False),  # alive: its places hold
    ({"ago": ACK_WAIT + 1}, True),  # not heard from within ack_wait: dead
    ({"instance": "i2"}, True),  # restarted: the old run's places are dead
    ({"stopped": True}, True),  # stopped cleanly (its give-backs failed)
])
def test_a_dead_hosts_places_are_taken_back_by_the_host_that_finds_them_full(
        how: dict[str, Any], taken: bool) -> None:
    bucket = Bucket()
    a, b = host(bucket, "a"), host(bucket, "b")
    places = places_of(rules_of(WHOLE), {})
    run(b.take("m1", places))
    run(b.take("m2", places))
    alive(bucket, "b", **{"instance": "i1", **how})
    got = run(a.take("m3", places))
    assert isinstance(got, float) is taken
    if taken:
        assert [h[0] for h in bucket.json(places[0].key)["held"]] == ["m3"]


def test_a_message_another_host_holds_a_place_for_takes_its_own() -> None:
    bucket = Bucket()
    a, b = host(bucket, "a"), host(bucket, "b")
    places = places_of(rules_of(WHOLE), {})
    run(b.take("m1", places))  # b took m1, was cut off: JetStream gave it to a
    run(b.take("m2", places))
    assert isinstance(run(a.take("m1", places)), Refused)  # b may still run it
    alive(bucket, "b", ago=ACK_WAIT + 1)
    assert isinstance(run(a.take("m1", places)), float)
    assert bucket.json(places[0].key)["held"][0][:2] == ["m1", "a"]


def test_a_hosts_own_places_of_its_last_run_are_dead_at_once() -> None:
    bucket = Bucket()
    places = places_of(rules_of(WHOLE), {})
    old = host(bucket, "a", "i1")
    run(old.take("m1", places))
    run(old.take("m2", places))
    new = host(bucket, "a", "i2")  # the daemon killed and started again
    assert isinstance(run(new.take("m1", places)), float)  # same id, new run: taken anew


def test_rate_starts_never_exceed_the_limit_however_hosts_race() -> None:
    for seed in range(20):
        bucket = Bucket(random.Random(seed))
        hosts = [host(bucket, name) for name in "ab"]
        places = places_of(rules_of(RATE), {})
        got = run(race(hosts, places, 8))
        refused = [g for g in got if isinstance(g, Refused)]
        assert len(refused) == 6, (seed, got)
        assert all(r.at is not None and r.at > time.time() for r in refused)


def test_a_rate_place_becomes_a_start_or_is_given_back_unstarted() -> None:
    bucket = Bucket()
    a = host(bucket, "a")
    places = places_of(rules_of(RATE), {})
    key = places[0].key
    run(a.take("m1", places))
    run(a.take("m2", places))
    run(a.started("m1", places[0], time.time()))
    assert list(bucket.json(key)["r"]) == ["m2@a"] and len(bucket.json(key)["t"]) == 1
    run(a.give_back("m2", places, started=False))  # back to the pool unstarted
    assert bucket.json(key)["r"] == {}
    assert isinstance(run(a.take("m3", places)), float)
    run(a.give_back("m1", places, started=True))  # a start stays counted
    assert len(bucket.json(key)["t"]) == 1


def test_all_places_or_none() -> None:
    bucket = Bucket()
    a = host(bucket, "a")
    rules = rules_of({**WHOLE, **RATE})
    for n in range(2):
        run(a.take(f"m{n}", places_of(rules, {})))
        run(a.give_back(f"m{n}", places_of(rules, {})[:1], started=True))  # ended
    got = run(a.take("m2", places_of(rules, {})))  # concurrency free, rate full
    assert isinstance(got, Refused) and got.place is not None and got.place.rule.rate
    assert places_of(rules, {})[0].key not in bucket.values  # its concurrency given back


# ---------------------------------------------------------------- admission
class Bridge:
    """Runs each coroutine at once and calls back (the real one: on its thread)."""

    def submit(self, coro: Coroutine[Any, Any, Any], then: Any = None) -> None:
        try:
            result, error = asyncio.run(coro), None
        except Exception as exc:  # noqa: BLE001 - handed to then, as the bridge does
            result, error = None, exc
        if then is not None:
            then(result, error)


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str]] = []

    def event(self, kind: str, text: str, msg_id: str = "") -> None:
        self.lines.append((kind, text, msg_id))


class Clock:
    def __init__(self) -> None:
        self.mono, self.wall = 1000.0, time.time()

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def forward(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


@dataclass
class Host:
    admission: Admission
    places: Places
    clock: Clock
    went: list[str] = field(default_factory=list)
    back: list[tuple[str, float, str]] = field(default_factory=list)
    late: list[str] = field(default_factory=list)

    def ask(self, msg_id: str, msg: dict[str, Any] | None = None) -> None:
        self.admission.ask(msg_id, msg or {}, lambda: self.went.append(msg_id),
                           lambda delay, why: self.back.append((msg_id, delay, why)))

    def turn(self, queued: tuple[str, ...] = (), running: dict[str, Any] | None = None
             ) -> None:
        self.admission.turn(self.clock.mono, queued.__contains__, running or {})


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(admission_module, "time", clock)
    return clock


def admitting(bucket: Bucket, name: str, config: dict[str, Any], clock: Clock) -> Host:
    places, bridge, log = host(bucket, name), Bridge(), Log()
    late: list[str] = []

    def was_late(msg_id: str, _why: str) -> bool:
        late.append(msg_id)
        return True
    adm = Admission(SimpleNamespace(config=config), places, bridge,  # type: ignore[arg-type]
                    Insist(bridge, log), log, was_late)  # type: ignore[arg-type]
    got = Host(adm, places, clock)
    got.late = late
    return got


def test_a_queue_without_limits_places_at_once_asking_nothing(clock: Clock) -> None:
    bucket = Bucket()
    a = admitting(bucket, "a", {"num_workers": 2}, clock)
    a.ask("m1")
    assert a.went == ["m1"] and bucket.writes == 0


def test_a_full_whole_queue_limit_keeps_the_message_waiting_until_a_place_frees(
        clock: Clock) -> None:
    bucket = Bucket()
    a, b = admitting(bucket, "a", WHOLE, clock), admitting(bucket, "b", WHOLE, clock)
    b.ask("m1")
    b.ask("m2")
    a.ask("m3")
    assert b.went == ["m1", "m2"] and a.went == [] and a.back == []
    clock.forward(HOLD_BY * 5)  # however long: no other message could run instead
    a.turn()
    assert a.went == [] and a.back == []
    assert 0 <= (a.admission.wait(clock.mono) or 0) <= POLL
    b.admission.done("m1")  # m1 ended on b
    clock.forward(POLL)
    a.turn()
    assert a.went == ["m3"]


def test_a_full_limit_of_its_params_sends_it_back_to_the_pool_after_hold_by(
        clock: Clock) -> None:
    bucket = Bucket()
    a = admitting(bucket, "a", BY, clock)
    a.ask("m1", {"param1": "x"})
    a.ask("m2", {"param1": "x"})
    a.ask("m3", {"param1": "y"})  # another param passes
    assert a.went == ["m1", "m3"]
    clock.forward(HOLD_BY)
    a.turn()
    assert [(i, d) for i, d, _w in a.back] == [("m2", BACK_DELAY)]
    assert "concurrency of its params full" in a.back[0][2]


def test_a_place_given_back_here_wakes_the_message_waiting_for_it_at_once(
        clock: Clock) -> None:
    bucket = Bucket()
    a = admitting(bucket, "a", BY, clock)
    a.ask("m1", {"param1": "x"})
    a.ask("m2", {"param1": "x"})
    a.admission.done("m1")
    a.turn()  # no poll waited for
    assert a.went == ["m1", "m2"]


def test_nats_not_answering_sends_it_back_and_nothing_starts(clock: Clock) -> None:
    bucket = Bucket()
    a = admitting(bucket, "a", WHOLE, clock)
    bucket.down = True
    a.ask("m1")
    assert a.went == [] and [(i, d) for i, d, _w in a.back] == [("m1", RETRY)]
    assert "did not answer" in a.back[0][2]


def test_a_message_not_started_in_time_goes_back_and_gives_its_places_back(
        clock: Clock) -> None:
    bucket = Bucket()
    a = admitting(bucket, "a", {**WHOLE, **RATE}, clock)
    a.ask("m1")
    key = places_of(rules_of(RATE), {})[0].key
    assert a.went == ["m1"] and list(bucket.json(key)["r"]) == ["m1@a"]
    clock.forward(START_SLACK - 0.1)
    a.turn(queued=("m1",))
    assert a.late == []
    clock.forward(0.2)
    a.turn(queued=("m1",))
    assert a.late == ["m1"]
    assert bucket.json(key)["r"] == {}  # its rate place given back unstarted
    assert places_of(rules_of(WHOLE), {})[0].key not in bucket.values


def test_a_start_is_counted_at_its_time_and_an_end_keeps_it(clock: Clock) -> None:
    bucket = Bucket()
    a = admitting(bucket, "a", RATE, clock)
    a.ask("m1")
    key = places_of(rules_of(RATE), {})[0].key
    a.turn(running={"m1": SimpleNamespace(started=123.25)})
    assert bucket.json(key) == {"t": [123.25], "r": {}}
    a.admission.done("m1")
    clock.forward(START_SLACK + 1)
    a.turn()
    assert a.late == []  # it ran: never late
