"""The daemon side of a pool queue: joining the pool, publishing creates,
lookups of messages other hosts hold, and stopping (see ``worker`` for the
pulling and running).

Everything NATS does runs on the ``bridge``; the daemon's loop only submits
coroutines and handles their results in its own turn.
"""

from __future__ import annotations

import concurrent.futures
import selectors
import time
from collections.abc import Callable
from typing import Any

from rqsys.daemon.afterwatch import refuse_after_in_pool
from rqsys.daemon.server import Handler, Reply, Request
from rqsys.daemon.unique import refuse_unique_in_pool
from rqsys.errors import BadRequest, NotFound, RQError, Unavailable
from rqsys.message import new_message
from rqsys.pool import unique
from rqsys.pool.batchends import PoolBatchEnds
from rqsys.pool.bridge import Bridge, why
from rqsys.pool.files import Outgoing, local_files
from rqsys.pool.ids import PoolIds
from rqsys.pool.link import Link, public_url
from rqsys.pool.parts import QueueParts
from rqsys.pool.settings import from_configs
from rqsys.pool.worker import PoolWorker
from rqsys.wire.schema import request

START_TIMEOUT = 30.0  # seconds to join the pool at start (connect, stream, bucket)
STOP_TIMEOUT = 5.0  # seconds to hand held messages back at stop
LOOKUP_OPS = ("get", "state", "status")  # answered from the pool's bucket when not here


class PoolMember:
    """One queue daemon's membership of its pool."""

    def __init__(self, parts: QueueParts) -> None:
        self.ctx, self.log = parts.ctx, parts.log
        self.store, self.transitions = parts.store, parts.transitions
        self.settings = from_configs(self.ctx.config, self.ctx.sysconfig)
        self.bridge = Bridge()
        self.link = Link(self.settings)
        self.worker = PoolWorker(parts, self.bridge, self.link)
        self.batch_watch = PoolBatchEnds(self.link, self.bridge, parts.batch_ends, self.log)
        self.ids: PoolIds = parts.ids  # the store's maker, numbered when the host joins

    # ------------------------------------------------------------ start, stop
    def on_joining(self, selector: selectors.BaseSelector) -> None:
        """Join the pool (before READY=1); an RQError says why it cannot."""
        try:
            number = self.bridge.call(self.link.open(), START_TIMEOUT)
        except concurrent.futures.TimeoutError as exc:
            self.bridge.close()
            raise Unavailable(f"pool {self.settings.pool}: NATS did not answer in "
                              f"{START_TIMEOUT:g}s (is JetStream on, with "
                              f"{self.settings.replicas} servers?)") from exc
        except RQError:
            self.bridge.close()
            raise
        except Exception as exc:  # JetStream refused: replicas, permissions
            self.bridge.close()
            raise Unavailable(f"pool {self.settings.pool}: {exc or type(exc).__name__}") from exc
        # The store's maker: the pool's ids and the local prep messages' (published at commit)
        self.ids.join(number)
        selector.register(self.bridge, selectors.EVENT_READ,
                          lambda _key, _mask: self.bridge.run_finished())
        self.worker.hand_back.start()
        self.batch_watch.start(number)
        self.log.event("daemon", f"pool {self.settings.pool}: joined as host {number} "
                       f"({', '.join(map(public_url, self.settings.servers))})")

    def on_closing(self) -> None:
        """At stop, after the store's last flush: ack what ended, hand the rest back."""
        try:
            self.worker.settle_ends()
            self.bridge.call(self.worker.final(), STOP_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - NATS redelivers after ack_wait anyway
            self.log.event("err", f"pool {self.settings.pool}: not handed back: {why(exc)}")
        self.bridge.close()

    # ------------------------------------------------------------ the loop
    def on_turn(self) -> None:
        """Once a loop turn, before due messages start."""
        for line in self.link.errors:
            self.log.event("err", f"pool {self.settings.pool}: {line}")
        self.link.errors.clear()
        self.worker.turn()

    def on_wait(self) -> float | None:
        return self.worker.next_wait(time.monotonic())

    @staticmethod
    def on_busy() -> bool:
        """A pool queue's daemon pulls: never idle."""
        return True

    # ------------------------------------------------------------ requests
    def create(self, r: Request) -> None:
        """A new message goes to the pool's stream; ``ok`` once JetStream has it."""
        self.ctx.check_accepting(strict=bool(r.args.get("refuse_paused")))
        self._check_plain(r)
        msg = new_message(r.args.get("msg"), self.ctx.name)
        self.ctx.check_dest(msg)
        msg_id = self.ids.next_id()
        msg["msg_id"] = msg_id
        if msg.get("batch"):  # a batch member: its end comes back through the bucket
            self.batch_watch.watch()
        url = self.ctx.url(msg_id)
        record = {"state": "que", "host": "", "status": "", "url": url, "msg": msg}

        def then(holder: Any, error: BaseException | None) -> None:
            if error is None and holder:  # its key is held: that message's URL
                r.answer({"ok": True, "msg_id": holder, "url": self.ctx.url(holder),
                          **({} if single else {"duplicate": True})})
            elif error is None:
                r.answer({"ok": True, "msg_id": msg_id, "url": url})
            elif isinstance(error, (BadRequest, Unavailable)):  # a file not as described
                r.fail(error)
            else:
                r.fail(Unavailable(f"pool {self.settings.pool}: not published: "
                                   f"{why(error)}"))

        files, key, single = self._outgoing(r), unique.kv_key(msg), bool(r.args.get("single"))
        if single:  # held while it is queued, in the pool (RQ's single_que)
            key = unique.single_key(msg)
        headers = {unique.SINGLE_HEADER: key} if single and key else None
        self.bridge.submit(self.worker.files.publish(msg_id, msg, record, files) if key is None
                           else unique.publish_once(self.link, self.worker.files, key, msg_id,
                                                    msg, record, files, headers), then)

    def on_diverting(self, msg: dict[str, Any], state: str, src_id: str,
                     done: Callable[[str, BaseException | None], None]) -> bool:
        """A clone, or a running script's dup to this queue, of a message this
        host holds: a new message to the pool, with the source's files put in
        the object store under the new id; ``done(new_id, error)`` once
        JetStream has it."""
        msg_id = self.ids.next_id()
        msg = dict(msg, msg_id=msg_id)
        record = {"state": "que", "host": "", "status": "", "url": self.ctx.url(msg_id),
                  "msg": msg}

        def then(_result: Any, error: BaseException | None) -> None:
            done(msg_id, None if error is None else Unavailable(
                f"pool {self.settings.pool}: not published: {why(error)}"))

        files = local_files(self.store, state, src_id)
        self.bridge.submit(self.worker.files.publish(msg_id, msg, record, files), then)
        return True

    @staticmethod
    def _outgoing(r: Request) -> list[Outgoing]:
        """The files sent with a create, for the object store (taken out of ``r.fds``)."""
        specs = r.args.get("attachments") or []
        if len(specs) != len(r.fds):
            raise BadRequest(f"{len(specs)} attachments described but {len(r.fds)} files sent")
        files = [(s["name"], s["md5"], fd) for s, fd in zip(specs, r.fds, strict=True)]
        r.fds.clear()  # closed once put
        return files

    def _check_plain(self, r: Request) -> None:
        """What a pool queue does not take, refused with the reason."""
        if r.args.get("single") and "unique_key" in (r.args.get("msg") or {}):
            raise BadRequest(f"queue {self.ctx.name} is a pool queue "
                             f"({self.settings.pool}): single and unique_key together "
                             "are not taken (one key a message)")

    def on_building_ops(self, table: dict[str, Handler], schemas: dict[str, Any]) -> None:
        """A new queued message goes to the pool, a prep one stays here until its
        commit sends it; ``get``, ``state`` and ``status`` of a message another
        host holds are answered from the pool's bucket; ``pool`` tells the
        pool's figures."""
        for op in LOOKUP_OPS:
            table[op] = self._or_from_pool(op, table[op])
        table["create"] = self._create_or_prep(table["create"])
        table["clone"] = self._clone_held(table["clone"])
        table["create_many"] = _one_by_one
        table["pool"], schemas["pool"] = self.figures, request()
        table["commit"] = self.commit

    def _create_or_prep(self, local: Handler) -> Handler:
        def handler(r: Request) -> Reply | None:
            refuse_after_in_pool(r.args.get("msg"))
            if r.args.get("state", "que") == "que":  # a prep message is local until commit
                self.create(r)  # answered once JetStream has it
                return None
            refuse_unique_in_pool(r.args.get("msg"))
            return local(r)
        return handler

    def _clone_held(self, local: Handler) -> Handler:
        def handler(r: Request) -> Reply | None:
            try:
                return local(r)
            except NotFound:
                raise NotFound(f"no message {r.args['msg_id']} on this host: a pool queue "
                               "clones a message on the host that holds it (its URL's "
                               "host)") from None
        return handler

    def commit(self, r: Request) -> Reply | None:
        """A prep message (made here, with its attachments) goes to the pool
        under its own id; the local copy is removed once JetStream has it."""
        msg_id = r.args["msg_id"]
        self.ctx.check_accepting()
        url = self.ctx.url(msg_id)
        try:
            state = self.store.find(msg_id)
        except NotFound:  # committed before (the pool has it), or unknown
            self.bridge.submit(self.link.lookup(msg_id), self._answer_lookup(r, "commit", msg_id))
            return None
        if state != "prep":
            return {"ok": True, "msg_id": msg_id, "url": url, "already": state}
        msg = dict(self.store.read_msg("prep", msg_id), msg_id=msg_id)
        record = {"state": "que", "host": "", "status": "", "url": url, "msg": msg}

        def then(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                r.fail(Unavailable(f"pool {self.settings.pool}: not published: "
                                   f"{why(error)}"))
                return
            self.transitions.delete(msg_id, lambda _error: None)  # the pool has it now
            r.answer({"ok": True, "msg_id": msg_id, "url": url})

        files = local_files(self.store, "prep", msg_id)
        self.bridge.submit(self.worker.files.publish(msg_id, msg, record, files), then)
        return None

    def figures(self, r: Request) -> None:
        """``pool``: JetStream's figures of the pool, and this host's part."""
        here = {"ok": True, "pool": self.settings.pool, "host": self.settings.host,
                "host_number": self.ids.host_number,
                "in_flight_here": len(self.worker.held)}

        def then(figures: Any, error: BaseException | None) -> None:
            if error is not None:
                r.fail(Unavailable(f"pool {self.settings.pool}: no figures: {error}"))
            else:
                r.answer({**here, **figures})

        self.bridge.submit(self.link.figures(), then)

    def _or_from_pool(self, op: str, local: Handler) -> Handler:
        def handler(r: Request) -> Reply | None:
            try:
                return local(r)
            except NotFound:
                pass
            msg_id = r.args["msg_id"]
            self.bridge.submit(self.link.lookup(msg_id), self._answer_lookup(r, op, msg_id))
            return None
        return handler

    def _answer_lookup(self, r: Request, op: str,
                       msg_id: str) -> Callable[[Any, BaseException | None], None]:
        def then(record: Any, error: BaseException | None) -> None:
            if error is not None:
                r.fail(Unavailable(f"pool {self.settings.pool}: lookup failed: {error}"))
            elif record is None:
                r.fail(NotFound(f"no message {msg_id} in pool {self.settings.pool}"))
            else:
                r.answer(_lookup_reply(op, record))
        return then


def _one_by_one(_r: Request) -> Reply | None:
    raise BadRequest("create_many: a pool queue takes messages one by one (create)")


def _lookup_reply(op: str, record: dict[str, Any]) -> Reply:
    if op == "commit":
        return {"ok": True, "msg_id": record["msg"].get("msg_id", ""),
                "url": record.get("url", ""), "already": record["state"]}
    reply: Reply = {"ok": True, "state": record["state"]}
    if op != "state":
        reply["status"] = record.get("status", "")
    if op == "get":
        reply.update(msg=record.get("msg", {}), url=record.get("url", ""),
                     host=record.get("host", ""), attachments=record.get("attachments", {}))
    return reply
