"""Unique keys and ``single`` of a pool queue, held in the pool's KV bucket
(coroutines for the ``bridge``).

A local queue keeps its keys in memory (``rqsys.daemon.unique``); a pool's
messages live on NATS and any host may enqueue, so its keys live in the
pool's bucket: ``unique.<sha256 of the key>`` holds ``{"id", "until"}``.
A create with ``unique_key`` first claims the key with the bucket's atomic
create (create-if-absent, replicated like the stream); if another message
holds it, the create is answered with that message's id (``duplicate``) and
nothing is published.  The host that ends the holder (``done``/``err``)
deletes the key, or, with ``unique_for``, writes when it lets go; a key whose
``until`` has passed is taken over with a compare-and-set on its revision.

``single`` (RQ's ``single_que``: nothing new while a message with the same
dest and params is queued) is the same claim on ``single.<sha256 of dest and
params>``, named in the message's ``Rq-Single`` header and let go by the host
that takes the message (it is no longer queued then).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from typing import Any

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from rqsys.daemon.unique import key_of
from rqsys.errors import Unavailable

TRIES = 5  # claims raced by other hosts before the create fails (Unavailable: retried)
SINGLE_HEADER = "Rq-Single"  # the bucket key a single message holds while queued


def kv_key(msg: dict[str, Any]) -> str | None:
    """The bucket key of a message's unique key (None without one)."""
    key = key_of(msg)
    return None if key is None else "unique." + hashlib.sha256(key.encode()).hexdigest()


def single_key(msg: dict[str, Any]) -> str:
    """The bucket key ``single`` holds: the message's dest and params."""
    same = json.dumps([msg.get("dest")] + [str(msg.get(f"param{n}", "")) for n in range(1, 5)])
    return "single." + hashlib.sha256(same.encode()).hexdigest()


async def claim(kv: Any, name: str, msg_id: str) -> str | None:
    """Hold ``name`` for ``msg_id``: None once held, else the holder's id."""
    value = json.dumps({"id": msg_id, "until": None}).encode()
    for _ in range(TRIES):
        try:
            await kv.create(name, value)
            return None
        except KeyWrongLastSequenceError:
            pass
        try:
            entry = await kv.get(name)
        except KeyNotFoundError:
            continue  # let go meanwhile: create again
        held = json.loads(entry.value)
        if held.get("until") is None or float(held["until"]) > time.time():
            return str(held["id"])
        try:  # its window has passed: take it over, unless another host just did
            await kv.update(name, value, last=entry.revision)
            return None
        except KeyWrongLastSequenceError:
            continue
    raise Unavailable(f"unique key {name}: claimed by other hosts {TRIES} times over; "
                      "try again")


async def release(kv: Any, name: str, msg_id: str, hold_for: float) -> None:
    """``msg_id`` has ended: its key is free, or held ``hold_for`` more seconds."""
    try:
        entry = await kv.get(name)
    except KeyNotFoundError:
        return
    if json.loads(entry.value).get("id") != msg_id:
        return  # taken over by a newer message already
    with contextlib.suppress(KeyWrongLastSequenceError):  # changed meanwhile: theirs now
        if hold_for > 0:
            until = json.dumps({"id": msg_id, "until": time.time() + hold_for}).encode()
            await kv.update(name, until, last=entry.revision)
        else:
            await kv.delete(name, last=entry.revision)


async def publish_once(link: Any, files: Any, name: str, msg_id: str, msg: dict[str, Any],
                       record: dict[str, Any], outgoing: list[Any],
                       headers: dict[str, str] | None = None) -> str | None:
    """Claim the key, then publish: None, or the holder's id (nothing published)."""
    try:
        holder = await claim(link.kv, name, msg_id)
    except BaseException:
        _close(outgoing)
        raise
    if holder is not None:
        _close(outgoing)
        return holder
    try:
        await files.publish(msg_id, msg, record, outgoing, headers)
    except BaseException:
        with contextlib.suppress(Exception):  # else it is held until its window, or forever
            await release(link.kv, name, msg_id, 0)
        raise
    return None


def _close(outgoing: list[Any]) -> None:
    for _name, _md5, fd in outgoing:
        os.close(fd)
