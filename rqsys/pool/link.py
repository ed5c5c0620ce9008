"""The NATS side of a pool: connection, stream, consumer, KV bucket, and the
calls the daemon makes through them (coroutines run on the ``bridge``).

The stream is a work-queue stream on ``rq.pool.<name>`` with ``replicas``
copies; one durable pull consumer is shared by every host (explicit acks,
redelivery after ``ack_wait``, no limit on deliveries).  A KV bucket of the
same replicas holds each message's state, host and status, and the host
numbers (see ``ids``).  Creating them is idempotent: every host does it at
start and the first one wins.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid
from typing import Any

import nats
from nats.aio.msg import Msg as NatsMsg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StreamConfig
from nats.js.errors import (
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)

from rqsys.errors import ConfigError, Unavailable
from rqsys.pool.ids import MAX_HOSTS
from rqsys.pool.settings import HOST_KEY_RE, PoolSettings

START_ATTEMPTS = 2  # tries of each server at start, before the start fails
# A server cut off (not closed) is noticed after PING_INTERVAL * (MAX_PINGS_OUT + 1)
# seconds, and another taken: nats-py's default (2 min, 2 pings) would leave a
# host's publishes timing out for up to 6 minutes.
PING_INTERVAL, MAX_PINGS_OUT = 3, 2
PUBLISH_RETRIES = (0.2, 0.5, 1.0, 2.0, 4.0)  # seconds between tries of a publish (see publish)
DUPLICATE_WINDOW = 600.0  # seconds JetStream remembers a Nats-Msg-Id (a retried publish)
MAX_PENDING = 10_000  # messages handed out and not yet acked, over all hosts
CLOSE_FLUSH = 2  # seconds to send the last acks and naks at stop

__all__ = ["Link", "NatsMsg"]


class Link:
    """One host's connection to its pool."""

    def __init__(self, settings: PoolSettings) -> None:
        self.s = settings
        self.nc: Any = None
        self.js: Any = None
        self.kv: Any = None
        self.sub: Any = None
        self.errors: list[str] = []  # asynchronous errors, for the daemon's log
        self._recording: set[asyncio.Task[bool]] = set()  # first records tried again
        self.instance = uuid.uuid4().hex[:12]  # this daemon's run (limits: its places)

    # ------------------------------------------------------------ start
    async def open(self) -> int:
        """Connect, make sure stream, consumer and bucket exist; this host's number."""
        self.nc = await self._connect()
        self.js = self.nc.jetstream()
        await self._stream()
        self.kv = await self.js.create_key_value(bucket=self.s.bucket, history=1,
                                                 replicas=self.s.replicas)
        self.sub = await self.js.pull_subscribe(
            self.s.subject, durable=self.s.consumer, stream=self.s.stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=self.s.ack_wait,
                                  max_deliver=-1, max_ack_pending=MAX_PENDING))
        number = await self._host_number()
        await self.record_load(0)  # this instance, before it takes a place in a limit
        return number

    async def _connect(self) -> Any:
        """Connect, trying each server twice; once connected, reconnect forever."""
        try:
            nc = await nats.connect(
                servers=list(self.s.servers), name=f"rqsys {self.s.host} {self.s.pool}",
                connect_timeout=self.s.connect_timeout, allow_reconnect=True,
                max_reconnect_attempts=START_ATTEMPTS, reconnect_time_wait=0.5,
                ping_interval=PING_INTERVAL, max_outstanding_pings=MAX_PINGS_OUT,
                user_credentials=self.s.creds or None, tls=self._tls(),
                error_cb=self._error, disconnected_cb=self._note("disconnected"),
                reconnected_cb=self._note("reconnected"))
        except Exception as exc:  # unreachable, refused, bad credentials, TLS
            # Every distinct reason: the server's own ("Authorization Violation") is
            # often followed by the connection's reset, which alone would hide it.
            why = "; ".join(dict.fromkeys(self.errors)) or f"{exc or type(exc).__name__}"
            self.errors.clear()
            raise Unavailable(f"pool {self.s.pool}: cannot reach NATS at "
                              f"{', '.join(public_url(u) for u in self.s.servers)}: {why}") from exc
        nc.options["max_reconnect_attempts"] = -1  # a server that goes later comes back
        return nc

    def _tls(self) -> ssl.SSLContext | None:
        if not self.s.tls:
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.s.tls.get("ca") or None)
            if self.s.tls.get("cert"):
                ctx.load_cert_chain(self.s.tls["cert"], self.s.tls.get("key") or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"config.json: nats/tls: {exc}") from exc
        return ctx

    async def _stream(self) -> None:
        try:
            await self.js.stream_info(self.s.stream)
        except NotFoundError:
            await self.js.add_stream(StreamConfig(
                name=self.s.stream, subjects=[self.s.subject],
                retention=RetentionPolicy.WORK_QUEUE, num_replicas=self.s.replicas,
                duplicate_window=DUPLICATE_WINDOW))

    async def _host_number(self) -> int:
        """Claim ``host.<n>`` in the bucket (or find the one this host has)."""
        me = self.s.host.encode()
        for n in range(1, MAX_HOSTS + 1):
            try:
                await self.kv.create(f"host.{n}", me)
                return n
            except KeyWrongLastSequenceError:
                if (await self.kv.get(f"host.{n}")).value == me:
                    return n
        raise Unavailable(f"pool {self.s.pool}: all {MAX_HOSTS} host numbers are taken")

    async def close(self) -> None:
        """Send what is buffered (the last acks and naks), then close.  Not
        ``drain``: a pull subscription's drain waits out its pending fetch."""
        if self.nc is not None:
            try:
                await self.nc.flush(CLOSE_FLUSH)
            finally:
                await self.nc.close()

    async def _error(self, exc: Exception) -> None:
        self.errors.append(f"NATS: {exc or type(exc).__name__}")

    def _note(self, what: str) -> Any:
        async def note() -> None:
            self.errors.append(f"NATS {what}")
        return note

    # ------------------------------------------------------------ messages
    async def publish(self, msg_id: str, msg: dict[str, Any], record: dict[str, Any],
                      headers: dict[str, str] | None = None) -> None:
        """Publish ``msg`` (answered once JetStream acks it), and its first record.

        A publish that finds no stream leader (an election after a server came
        back) or no answer is tried again: the same ``Nats-Msg-Id`` makes a
        second copy impossible within DUPLICATE_WINDOW."""
        data = json.dumps(msg).encode()
        for delay in (*PUBLISH_RETRIES, None):
            try:
                await self.js.publish(self.s.subject, data,
                                      headers={**(headers or {}), "Nats-Msg-Id": msg_id})
                break
            except (NoStreamResponseError, NoRespondersError, NatsTimeout,  # nats-py says
                    ServiceUnavailableError):  # NoStreamResponse for a stream without leader
                if delay is None:
                    raise
                await asyncio.sleep(delay)
        if not await self._first_record(msg_id, record, ()):
            task = asyncio.get_running_loop().create_task(  # the answer does not wait for
                self._first_record(msg_id, record, PUBLISH_RETRIES))  # the retries (30 s)
            self._recording.add(task)
            task.add_done_callback(self._recording.discard)

    async def _first_record(self, msg_id: str, record: dict[str, Any],
                            retries: tuple[float, ...]) -> bool:
        """The record of a published message, tried once more after each of
        ``retries``; whether it is written.  Never a failure of the publish:
        the message is in the stream (a client told it was not made it again;
        a host that takes it records it, ``record``)."""
        for delay in (*retries, None):
            try:
                await self.kv.create(msg_id, json.dumps(record).encode())
                return True
            except KeyWrongLastSequenceError:
                return True  # a host has pulled it already and said so
            except Exception as exc:  # noqa: BLE001 - the bucket's leader may be elected anew
                if delay is None:
                    if retries:  # the last try of the background ones
                        self.errors.append(f"record of {msg_id} not written (it is "
                                           f"published): {exc or type(exc).__name__}")
                    return False
                await asyncio.sleep(delay)
        return False

    async def fetch(self, batch: int, wait: float) -> list[NatsMsg]:
        """Up to ``batch`` messages, waiting at most ``wait`` s for the first."""
        try:
            return list(await self.sub.fetch(batch, timeout=wait))
        except (TimeoutError, NatsTimeout):  # nats-py raises either when none came
            return []

    async def record(self, msg_id: str, record: dict[str, Any]) -> None:
        """The message's state, host and status, for lookups from every host."""
        await self.kv.put(msg_id, json.dumps(record).encode())

    async def lookup(self, msg_id: str) -> dict[str, Any] | None:
        try:
            entry = await self.kv.get(msg_id)
        except KeyNotFoundError:
            return None
        return dict(json.loads(entry.value))

    async def figures(self) -> dict[str, int]:
        """The pool as JetStream sees it: depth, not yet delivered, in flight, redelivered."""
        stream = await self.js.stream_info(self.s.stream)
        consumer = await self.js.consumer_info(self.s.stream, self.s.consumer)
        return {"depth": stream.state.messages, "pending": consumer.num_pending,
                "in_flight": consumer.num_ack_pending, "redelivered": consumer.num_redelivered,
                "waiting_pulls": consumer.num_waiting, "hosts": await self._loads()}

    async def record_load(self, in_flight: int, stopped: bool = False) -> None:
        """This host's messages in flight, for every host's figures (``load.<host>``);
        ``stopped``: its daemon stopped cleanly (not alive, nothing in flight);
        ``instance`` says which run of it holds its places in the limits."""
        load = {"host": self.s.host, "in_flight": in_flight, "at": time.time(),
                "stopped": stopped, "instance": self.instance}
        await self.kv.put(f"load.{self.s.host_key}", json.dumps(load).encode())

    async def _loads(self) -> dict[str, dict[str, Any]]:
        """Each host of the pool: its messages in flight and whether it is alive
        (it said so within ``ack_wait``; else JetStream is giving its messages out
        again and its in flight counts no more), or stopped (cleanly: said so)."""
        loads = {}
        for n in range(1, MAX_HOSTS + 1):
            try:
                host = (await self.kv.get(f"host.{n}")).value.decode()
            except KeyNotFoundError:
                break
            try:
                load = json.loads((await self.kv.get(f"load.{HOST_KEY_RE.sub('_', host)}")).value)
            except KeyNotFoundError:
                load = {"in_flight": 0, "at": 0}
            stopped = bool(load.get("stopped"))
            alive = time.time() - float(load["at"]) <= self.s.ack_wait and not stopped
            loads[host] = {"number": n, "alive": alive, "stopped": stopped,
                           "in_flight": int(load["in_flight"]) if alive else 0}
        return loads

    @staticmethod
    async def ack(msg: NatsMsg, timeout: float = 1.0) -> None:
        """Ack, answered (a delivery acked already: nothing to do)."""
        if not msg.is_acked:
            await msg.ack_sync(timeout=timeout)

    @staticmethod
    async def nak(msg: NatsMsg, delay: float) -> None:
        await msg.nak(delay=delay or None)

    @staticmethod
    async def term(msg: NatsMsg) -> None:
        await msg.term()

    @staticmethod
    async def progress(msgs: list[NatsMsg]) -> None:
        for msg in msgs:
            await msg.in_progress()


def public_url(url: str) -> str:
    """A server URL without the secret it may carry: a password (``user:***@``)
    or a token, which NATS takes as the user part alone (``***@``)."""
    scheme, sep, rest = url.partition("://")
    user, at, host = rest.rpartition("@")
    if not at:
        return url
    name, colon, _password = user.partition(":")
    return f"{scheme}{sep}{name + colon if colon else ''}***@{host}"
