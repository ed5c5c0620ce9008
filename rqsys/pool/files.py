"""Attachments of pool messages in the pool's JetStream object store (coroutines for
the ``bridge``): put at enqueue, fetched and checked by the host that takes the
message, removed once its end is acked.

The enqueuing host reads each file straight from the descriptor the client
sent (nothing is written to its disk) into object ``<msg_id>/<name>`` of
bucket ``rq-pool-<pool>`` (``replicas`` copies), hashing it with MD5 on
the way; a file whose MD5 is not the one the client sent is refused and its
object removed.  The message then carries ``[{name, md5, size}]`` in its
``Rq-Attachments`` header.  The host that takes it writes each object into
the staged message's ``attach/``: JetStream's SHA-256 of the object is
checked while it is read (nats-py), then the client's MD5 of the file.  A
missing object or a mismatch is :class:`BadAttachment`: the message ends
with that error, never runs with a wrong file.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nats.js.api import ObjectStoreConfig
from nats.js.errors import BadObjectMetaError, DigestMismatchError, ObjectNotFoundError

from rqsys.errors import BadRequest, RQError
from rqsys.store import durable
from rqsys.store.attachments import file_md5, md5_path
from rqsys.store.layout import check_attach_name

if TYPE_CHECKING:
    from rqsys.pool.link import Link

HEADER = "Rq-Attachments"  # a pool message's attachments: JSON [{name, md5, size}]

Outgoing = tuple[str, str, int]  # an attachment to put: name, md5 sent ("": unchecked), fd


class BadAttachment(RQError):
    """An attachment of a pool message is missing or not the file sent: it cannot run."""


def specs_of(headers: dict[str, str] | None) -> list[dict[str, Any]]:
    """The attachments a pool message's headers name (none: [])."""
    raw = (headers or {}).get(HEADER)
    return list(json.loads(raw)) if raw else []


def object_name(msg_id: str, name: str) -> str:
    return f"{msg_id}/{name}"


class _Md5Reader:
    """A file descriptor read from offset 0, hashed on the way (nats-py calls
    ``readinto`` on a worker thread: the bridge's loop is not held up)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.offset = fd, 0
        self.md5 = hashlib.md5(usedforsecurity=False)

    def readinto(self, buf: bytearray) -> int:
        data = os.pread(self.fd, len(buf), self.offset)
        buf[:len(data)] = data
        self.offset += len(data)
        self.md5.update(data)
        return len(data)


class PoolFiles:
    """One pool's object store bucket, created at its first use."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.obs: Any = None

    async def _store(self) -> Any:
        if self.obs is None:
            s = self.link.s
            self.obs = await self.link.js.create_object_store(
                s.bucket, config=ObjectStoreConfig(
                    description=f"rqsys pool {s.pool}: attachments", replicas=s.replicas))
        return self.obs

    async def put(self, msg_id: str, files: list[Outgoing]) -> list[dict[str, Any]]:
        """Each file into the bucket; their specs for the header.  Closes the fds."""
        try:
            obs = await self._store()
            specs = []
            for name, md5, fd in files:
                reader = _Md5Reader(fd)
                info = await obs.put(object_name(msg_id, check_attach_name(name)), reader)
                got = reader.md5.hexdigest()
                if md5 and got != md5:
                    raise BadRequest(f"attachment {name}: md5 mismatch (sent {md5}, got {got})")
                specs.append({"name": name, "md5": got, "size": int(info.size or 0)})
        except BaseException:
            with contextlib.suppress(Exception):  # what was put of it is of no use
                await self.drop(msg_id, [name for name, _md5, _fd in files])
            raise
        finally:
            for _name, _md5, fd in files:
                os.close(fd)
        return specs

    async def publish(self, msg_id: str, msg: dict[str, Any], record: dict[str, Any],
                      files: list[Outgoing], headers: dict[str, str] | None = None) -> None:
        """Put the files, then publish the message naming them (and ``headers``).
        A publish that fails keeps the objects: it may have reached the stream."""
        specs = await self.put(msg_id, files) if files else []
        headers = dict(headers or {})
        if specs:
            record = dict(record, attachments={s["name"]: s for s in specs})
            headers[HEADER] = json.dumps(specs)
        await self.link.publish(msg_id, msg, record, headers or None)

    async def fetch(self, msg_id: str, specs: list[dict[str, Any]], adir: Path) -> None:
        """Each attachment into ``adir`` (a staged message's), checked twice."""
        obs = await self._store()
        for spec in specs:
            name = check_attach_name(spec.get("name"))
            path = adir / name
            try:
                with open(path, "wb") as out:
                    await obs.get(object_name(msg_id, name), writeinto=out)
            except (ObjectNotFoundError, BadObjectMetaError) as exc:
                raise BadAttachment(f"attachment {name}: not in the pool's object store "
                                    f"({type(exc).__name__})") from exc
            except DigestMismatchError as exc:
                raise BadAttachment(f"attachment {name}: corrupted in the pool's object "
                                    "store (SHA-256 mismatch)") from exc
            got = await asyncio.to_thread(file_md5, path)
            if got != spec.get("md5"):
                raise BadAttachment(f"attachment {name}: not the file sent "
                                    f"(md5 sent {spec.get('md5')}, got {got})")
            durable.write_new(md5_path(path), got.encode(), sync=False)

    async def drop(self, msg_id: str, names: list[str]) -> None:
        """Remove a message's objects (those already gone are no error)."""
        obs = await self._store()
        for name in names:
            try:
                await obs.delete(object_name(msg_id, name))
            except ObjectNotFoundError:
                pass


def local_files(store: Any, state: str, msg_id: str) -> list[Outgoing]:
    """A local message's attachments, opened, for :meth:`PoolFiles.put`."""
    return [(path.name, store.attachment_md5(path), os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            for path in store.attachments(state, msg_id)]
