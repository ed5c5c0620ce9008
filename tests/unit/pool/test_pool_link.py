"""Unit tests of the pool's NATS link around JetStream (stubbed: the failing
bucket is what is tested; tests/test_pool_*.py run the real cluster)."""

from __future__ import annotations

import asyncio

import pytest
from nats.errors import TimeoutError as NatsTimeout

from rqsys.pool import link as link_module
from rqsys.pool.link import Link
from rqsys.pool.settings import PoolSettings

SETTINGS = PoolSettings(pool="p", replicas=1, ack_wait=30, servers=("nats://x",), creds="",
                        tls={}, connect_timeout=1, host="a")


class Stream:
    def __init__(self) -> None:
        self.held: list[str] = []

    async def publish(self, _subject: str, _data: bytes, headers: dict[str, str]) -> None:
        self.held.append(headers["Nats-Msg-Id"])


class Bucket:
    """A bucket whose leader is being elected for ``fails`` tries."""

    def __init__(self, fails: int) -> None:
        self.fails, self.records = fails, []

    async def create(self, key: str, _value: bytes) -> None:
        if self.fails:
            self.fails -= 1
            raise NatsTimeout()
        self.records.append(key)


@pytest.fixture(autouse=True)
def _no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(link_module, "PUBLISH_RETRIES", (0.0, 0.0))


@pytest.mark.parametrize(("fails", "recorded"), [(2, True), (10, False)])
def test_a_published_message_is_published_whatever_its_record_does(fails: int,
                                                                   recorded: bool) -> None:
    # Given a stream that takes the message, and a bucket failing `fails` tries
    link = Link(SETTINGS)
    link.js, link.kv = Stream(), Bucket(fails)
    # When it is published, Then the publish succeeds (it raised, and the client
    # told "not published" made it again: a review found it); the record is
    # written once the bucket answers, or the log is told it was not
    async def publish() -> None:
        await link.publish("20260101.0000.00.000.1", {"dest": "q"}, {"state": "que"})
        # answered after one try: the record's retries go on behind it (awaited,
        # they took longer than a client waits for its answer)
        assert link.kv.records == [] and len(link._recording) == 1
        await asyncio.gather(*link._recording)
    asyncio.run(publish())
    assert link.js.held == ["20260101.0000.00.000.1"]
    assert link.kv.records == (["20260101.0000.00.000.1"] if recorded else [])
    assert bool(link.errors) is not recorded
    if not recorded:
        assert "record of 20260101.0000.00.000.1 not written (it is published)" in link.errors[0]


def test_a_stream_electing_its_leader_is_published_to_again() -> None:
    # nats-py answers "no responders" from a stream without a leader as
    # NoStreamResponseError, which the retry did not name: the create failed at
    # once while a server was stopped (tests/system/test_pool_e2e.py, 1 run in 8)
    from nats.js.errors import NoStreamResponseError

    class Electing(Stream):
        def __init__(self) -> None:
            super().__init__()
            self.refusals = 2

        async def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
            if self.refusals:
                self.refusals -= 1
                raise NoStreamResponseError
            await super().publish(subject, data, headers)
    link = Link(SETTINGS)
    link.js, link.kv = Electing(), Bucket(0)
    asyncio.run(link.publish("20260101.0000.00.000.2", {"dest": "q"}, {"state": "que"}))
    assert link.js.held == ["20260101.0000.00.000.2"]
