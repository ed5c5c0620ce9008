"""Making a batch: its members in their queues, whole or not at all.

Everything is checked before anything is made (each message as a create
would check it, its queue here; a callback's not a pool queue).  Then the
spec is written durably, the members are made queue by queue
(``create_many``, ``BULK_MAX`` at a time, one group commit each; in a pool
queue one ``create`` each, POOL_RECORD at a time) and each such part's ids
are recorded durably; once all are, the batch is sealed and
the caller is answered.  Should a queue refuse a member, the members made
so far are deleted (a running one destroyed), the batch is marked
``failed`` with the reason, and the caller gets that reason: a batch is
never half made without saying so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rqsys import config, tunables
from rqsys.batches import callback, record
from rqsys.batches.callback import Call
from rqsys.errors import BadRequest, RQError, Unavailable
from rqsys.message import new_message
from rqsys.store import Layout

NOT_IN_MEMBERS = ("unique_key", "unique_for", "batch", "batch_of")
POOL_RECORD = 100  # a pool queue's members made (one create each) between two records


def create(layout: Layout, body: Any, call: Call, by: str) -> dict[str, Any]:
    """Make the batch ``body`` describes; its report (``rqsys.batches.record``)."""
    members, callbacks = check(layout, body)
    pools = {q for q, _msg in members if config.load_queue_config(layout, q).get("pool")}
    batch_id = record.new_id()
    queues: dict[str, list[dict[str, Any]]] = {}
    for queue, msg in members:
        queues.setdefault(queue, []).append(dict(msg, batch=batch_id))
    path = layout.make_batch_dir(batch_id)
    record.write_spec(path, {"id": batch_id, "created": time.time(), "by": by,
                             "total": len(members),
                             "queues": {q: len(msgs) for q, msgs in queues.items()},
                             **callbacks})
    made: dict[str, list[str]] = {}
    try:
        for queue, msgs in queues.items():
            made[queue] = []
            step, make = (POOL_RECORD, _make_pool) if queue in pools else (tunables.BULK_MAX, _make)
            for at in range(0, len(msgs), step):
                ids = make(call, queue, msgs[at:at + step], batch_id, at)
                record.add_members(path, queue, ids)
                made[queue] += ids
    except RQError as exc:
        _undo(path, call, made, exc)
        raise
    record.mark(path, "sealed", str(len(members)))
    callback.settle(path, call)  # every member may have ended already
    return record.progress(path).report()


def _make(call: Call, queue: str, msgs: list[dict[str, Any]], batch_id: str,
          first: int) -> list[str]:
    results = call(queue, "create_many", msgs=msgs, by=f"batch {batch_id}")["results"]
    ids = [r["msg_id"] for r in results if "msg_id" in r]
    for n, result in enumerate(results):
        if "msg_id" not in result:
            raise _Refused(queue, first + n, ids, str(result.get("error")))
    return ids


def _make_pool(call: Call, queue: str, msgs: list[dict[str, Any]], batch_id: str,
               first: int) -> list[str]:
    """A pool queue takes messages one by one (each published to the pool)."""
    ids: list[str] = []
    for n, msg in enumerate(msgs):
        try:
            ids.append(str(call(queue, "create", msg=msg, by=f"batch {batch_id}")["msg_id"]))
        except BadRequest as exc:
            raise _Refused(queue, first + n, ids, str(exc)) from exc
        except RQError as exc:  # NATS away, say: what was made is undone
            raise _Cut(f"messages: queue {queue}: member {first + n} not made: {exc}",
                       ids) from exc
    return ids


class _Refused(BadRequest):
    """A member its queue refused; the others of its request were made."""

    def __init__(self, queue: str, index: int, made: list[str], why: str) -> None:
        super().__init__(f"messages: queue {queue} refused its member {index}: {why}")
        self.made = made


class _Cut(Unavailable):
    """A pool queue that could not take a member; the ones before it were made."""

    def __init__(self, why: str, made: list[str]) -> None:
        super().__init__(why)
        self.made = made


def _undo(path: Path, call: Call, made: dict[str, list[str]], exc: RQError) -> None:
    if isinstance(exc, (_Refused, _Cut)):
        made[next(reversed(made))] += exc.made
    left = []
    for queue, ids in made.items():
        for msg_id in ids:
            try:
                try:
                    call(queue, "delete", msg_id=msg_id)
                except BadRequest:  # running: its script is stopped, and it is deleted
                    call(queue, "destroy", msg_id=msg_id)
            except RQError:  # its queue down, say: the mark names what is left
                left.append(f"{queue}/{msg_id}")
    undone = (f"{len(left)} member(s) not deleted: {', '.join(left[:10])}" if left
              else "the members made were deleted")
    record.mark(path, "failed", f"{exc} ({undone})")


def check(layout: Layout, body: Any) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """The members (queue, message) and the callbacks, checked; BadRequest names the field."""
    if not isinstance(body, dict) or set(body) - {"messages", "on_done", "on_err"}:
        raise BadRequest("a batch is an object: messages, and optional on_done and on_err")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages: a list of at least one message")
    local: dict[str, Any] = dict.fromkeys(layout.queue_names())  # -> its config, once read
    members = [_checked(layout, local, msg, f"messages[{n}]") for n, msg in enumerate(msgs)]
    callbacks = {}
    for name in ("on_done", "on_err"):
        if body.get(name) is not None:
            queue, msg = _checked(layout, local, body[name], name)
            if local[queue].get("pool"):
                raise BadRequest(f"{name}.dest: {queue} is a pool queue: a callback's "
                                 "queue is one of this host's own (its unique key is local)")
            callbacks[name] = {"queue": queue, "msg": msg}
    return members, callbacks


def _checked(layout: Layout, local: dict[str, Any], data: Any, where: str
             ) -> tuple[str, dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("dest"), str):
        raise BadRequest(f"{where}: a message with a dest (a queue of this host)")
    queue = data["dest"]
    if queue not in local:
        raise BadRequest(f"{where}.dest: no queue {queue!r} on this host")
    if local[queue] is None:
        local[queue] = config.load_queue_config(layout, queue)
    for name in NOT_IN_MEMBERS:
        if name in data:
            raise BadRequest(f"{where}.{name}: set by the batch, not taken")
    try:
        return queue, new_message(data, queue)
    except BadRequest as exc:
        raise BadRequest(f"{where}: {exc}") from exc
