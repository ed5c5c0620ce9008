"""Unit tests of the pool's ends and redeliveries around NATS: an end is
recorded, then acked, and tried again past ``ack_wait`` until NATS answers;
a redelivery runs only once the pool's bucket has said nobody ended it and
no other host has a later delivery.
A fake link stands in for nats-py (the real one is in test_pool_e2e, where
a stream leader's host is killed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from rqsys.pool.acks import RETRY, Acks
from rqsys.pool.insist import Insist
from rqsys.pool.redelivery import DEFER, Redeliveries


class NoAnswer(Exception):
    """What nats-py raises while no stream leader answers (its text)."""


class Bridge:
    """Runs each coroutine at once and calls back (the real one: on its thread)."""

    def submit(self, coro: Coroutine[Any, Any, Any], then: Any = None) -> None:
        try:
            result, error = asyncio.run(coro), None
        except NoAnswer as exc:
            result, error = None, exc
        if then is not None:
            then(result, error)


class Link:
    """Answers lookups from ``records`` (an exception: no answer); logs calls.
    ``down``: how many records, and acks, fail first; ``refuse``: deliveries
    whose ack always fails."""

    def __init__(self, *records: Any, down: dict[str, int] | None = None,
                 refuse: tuple[str, ...] = ()) -> None:
        self.records, self.down, self.refuse = list(records), down or {}, refuse
        self.calls: list[tuple[Any, ...]] = []

    async def lookup(self, msg_id: str) -> Any:
        self.calls.append(("lookup", msg_id))
        got = self.records.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    async def record(self, msg_id: str, record: dict[str, Any]) -> None:
        self._answer(("record", msg_id, record["state"]))

    async def ack(self, delivery: str, timeout: float = 1.0) -> None:
        self._answer(("ack", delivery))

    def _answer(self, call: tuple[Any, ...]) -> None:
        self.calls.append(call)
        if call[1] in self.refuse:
            raise NoAnswer("nats: timeout")
        if self.down.get(call[0]):
            self.down[call[0]] -= 1
            raise NoAnswer("nats: no responders available for request")


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, str]] = []

    def event(self, kind: str, text: str, msg_id: str = "") -> None:
        self.lines.append((kind, text, msg_id))


def redeliveries(link: Link, log: Log | None = None
                 ) -> tuple[Redeliveries, list[tuple[str, str]]]:
    decided: list[tuple[str, str]] = []
    return Redeliveries(link, Bridge(), log or Log(),  # type: ignore[arg-type]
                        lambda i, _m: decided.append(("run", i)),
                        lambda i, r: decided.append(("skip", r["host"])),
                        lambda i: decided.append(("let go", i))), decided


def test_a_redelivery_another_host_ended_is_not_run() -> None:
    red, decided = redeliveries(Link({"state": "done", "host": "c", "count": 0}))
    red.add("m1", {"msg_id": "m1"}, 1)
    assert decided == [("skip", "c")] and red.wait(time.monotonic()) is None


def test_a_redelivery_nobody_recorded_runs_at_once() -> None:
    red, decided = redeliveries(Link(None))
    red.add("m1", {"msg_id": "m1"}, 1)
    assert decided == [("run", "m1")]


@pytest.mark.parametrize("later", [2, 3])  # this is delivery 2 (count 1); c took 3 or 4
def test_a_redelivery_another_host_has_a_later_delivery_of_is_let_go(later: int) -> None:
    red, decided = redeliveries(Link({"state": "run", "host": "c", "count": later - 1}))
    red.add("m1", {"msg_id": "m1"}, 1)
    assert decided == [("let go", "m1")] and red.wait(time.monotonic()) is None


@pytest.mark.parametrize(("later", "then"), [
    ({"state": "done", "host": "c"}, ("skip", "c")),  # c ended it while NATS was away
    ({"state": "run", "host": "c"}, ("run", "m1")),  # c is gone: it runs here, DEFER later
])
def test_a_redelivery_another_host_took_is_looked_up_again_after_defer(
        later: dict[str, str], then: tuple[str, str]) -> None:
    link = Link({"state": "run", "host": "c", "count": 0}, later)
    red, decided = redeliveries(link)
    red.add("m1", {"msg_id": "m1"}, 1)
    now = time.monotonic()
    assert decided == [] and DEFER - 0.5 < (red.wait(now) or 0) <= DEFER
    red.turn(now + DEFER - 0.5)  # not yet
    assert decided == [] and len(link.calls) == 1
    red.turn(now + DEFER + 0.01)
    assert decided == [then] and red.wait(now) is None


def test_a_redelivery_never_runs_without_an_answer() -> None:
    link, log = Link(*[NoAnswer("nats: no response from stream")] * 5, None), Log()
    red, decided = redeliveries(link, log)
    red.add("m1", {"msg_id": "m1"}, 1)
    for _second in range(5):  # NATS away for five seconds: asked each second
        assert decided == [] and (red.wait(time.monotonic()) or 0) <= RETRY
        red.turn(time.monotonic() + RETRY)
    assert decided == [("run", "m1")] and len(link.calls) == 6
    assert [text for _k, text, _i in log.lines] == [  # once, not a line a second
        "pool: redelivery not looked up (nats: no response from stream): asked again every 1s"]


class Store:
    class dirty:  # noqa: N801 - the store's attribute of that name
        flushes = 1

        @staticmethod
        def due() -> None:
            return None


def test_an_end_is_recorded_then_acked_and_tried_until_nats_answers() -> None:
    # Given NATS not answering for longer than ack_wait (ack_wait 4 s): ten
    # records fail, then the record goes through and five acks fail
    link, log = Link(down={"record": 10, "ack": 5}), Log()
    acks = Acks(Store(), link, Bridge(), None, log)  # type: ignore[arg-type]
    acks.add("m1", "delivery-1", [], {"state": "done", "host": "a"})  # type: ignore[arg-type]
    # When the turns go on, a second apart
    for _second in range(20):
        acks.turn()
        acks.ack_at = 0.0  # a second has passed
    # Then an ack is sent only after its record went through, and it is tried
    # again past ack_wait until it too is confirmed
    sent = [c[0] for c in link.calls]
    assert sent[:10] == ["record"] * 10  # a failed record: no ack yet
    assert sent[10:] == ["record", "ack"] * 6
    assert acks.ended == [] and not acks.sending and acks.wait(time.monotonic()) is None
    # And the failure is logged once, the late success once
    assert [k for k, _t, _i in log.lines] == ["err", "pool"]
    assert "until NATS answers" in log.lines[0][1]
    assert log.lines[1][1] == "end recorded and acked after 16 tries"


def test_at_stop_every_end_is_sent_and_one_failing_does_not_stop_the_others() -> None:
    link, log = Link(refuse=("delivery-2",)), Log()
    acks = Acks(Store(), link, Bridge(), None, log)  # type: ignore[arg-type]
    for n in (1, 2, 3):
        acks.add(f"m{n}", f"delivery-{n}", [], {"state": "done", "host": "a"})  # type: ignore[arg-type]
    asyncio.run(acks.final())
    assert {c for c in link.calls if c[0] == "ack"} == {
        ("ack", "delivery-1"), ("ack", "delivery-2"), ("ack", "delivery-3")}
    assert [(k, i) for k, _t, i in log.lines] == [("err", "m2")]
    assert "it will run again on some host" in log.lines[0][1]


def test_a_key_let_go_is_tried_until_nats_answers() -> None:
    link, log = Link(down={"record": 3}), Log()
    insist = Insist(Bridge(), log)  # type: ignore[arg-type]
    insist.submit(lambda: link.record("m1", {"state": "single"}), "single key not let go", "m1")
    for _second in range(3):  # NATS away for three seconds
        assert (insist.wait(time.monotonic()) or 0) > 0
        insist.turn(time.monotonic() + RETRY)
    assert [c[0] for c in link.calls] == ["record"] * 4 and insist.wait(0.0) is None
    assert [(k, i) for k, _t, i in log.lines] == [("err", "m1")]  # once


def test_a_delivery_that_comes_again_while_undecided_is_judged_by_the_newest() -> None:
    # Given delivery 2 held, its lookup not answered, and c's record of delivery 2
    link = Link(NoAnswer("nats: timeout"), {"state": "run", "host": "c", "count": 1},
                {"state": "done", "host": "c", "count": 1})
    red, decided = redeliveries(link)
    red.add("m1", {"msg_id": "m1"}, 1)
    # When delivery 3 comes here meanwhile (the worker holds the newest)
    red.newer("m1", 2)
    red.turn(time.monotonic() + RETRY)
    # Then c's take is an earlier delivery than the one held: not let go, but
    # looked up again after DEFER, when c has recorded its end
    assert decided == []
    red.turn(time.monotonic() + DEFER)
    assert decided == [("skip", "c")] and not red.undecided


def test_at_stop_a_key_still_waiting_is_tried_once_more() -> None:
    link, log = Link(down={"record": 1}), Log()
    insist = Insist(Bridge(), log)  # type: ignore[arg-type]
    insist.submit(lambda: link.record("m1", {"state": "single"}), "single key not let go", "m1")
    asyncio.run(insist.final())
    assert [c[0] for c in link.calls] == ["record"] * 2 and not insist.waiting
    assert [(k, i) for k, _t, i in log.lines] == [("err", "m1")]  # the first failure only
