"""The send path ``rq sendmesg`` and ``rq run`` share: a message from the command
line's options, sent (its attachments after it, in prep), its URL back.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rqsys.cli import jobs
from rqsys.errors import BadRequest, RQError
from rqsys.store import Layout
from rqsys.wire.client import QueueClient, queue_for_dest

MSG_FIELDS = ("src", "param1", "param2", "param3", "param4", "orig_msg_id")
NUMBER_FIELDS = ("due", "count", "max_count", "timeout", "retry_max", "priority")


def message_from(args: argparse.Namespace) -> dict[str, Any]:
    msg: dict[str, Any] = {"dest": args.dest}
    for name in MSG_FIELDS:
        if getattr(args, name, None) is not None:
            msg[name] = getattr(args, name)
    for name in NUMBER_FIELDS:
        if getattr(args, name, None) is not None:
            msg[name] = getattr(args, name)
    if args.force_remote:
        msg["force_remote"] = True
    if getattr(args, "unique_key", None) is not None:
        msg["unique_key"] = args.unique_key
    if getattr(args, "unique_for", None) is not None:
        msg["unique_for"] = args.unique_for
    if getattr(args, "tags", None):
        msg["tags"] = args.tags
    if getattr(args, "slots", None) is not None:
        msg["slots"] = args.slots
    if getattr(args, "needs", None):
        msg["needs"] = needs_of(args.needs)
    msg.update(jobs.after_fields(args))
    return msg


def needs_of(words: list[str]) -> dict[str, Any]:
    """``memory=12G cpus=0.5 gpus=1`` -> the message's ``needs`` (the schema judges them)."""
    needs: dict[str, Any] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or key not in ("memory", "cpus", "gpus"):
            raise BadRequest(f"--need {word}: say memory=SIZE, cpus=N or gpus=N")
        try:
            needs[key] = value if key == "memory" else (int if key == "gpus" else float)(value)
        except ValueError:
            raise BadRequest(f"--need {word}: {value!r} is not a number") from None
    return needs


def created_url(reply: dict[str, Any]) -> str:
    """The new message's URL; a duplicate (its unique key held) says so on stderr."""
    if reply.get("duplicate"):
        print(f"rq: duplicate: {reply['url']} holds this unique key; no new message",
              file=sys.stderr)
    return str(reply["url"])


def client_for_dest(layout: Layout, dest: str, force_remote: bool = False) -> QueueClient:
    """As RQ's rq: a URL dest (this host's too) goes to the relay queue."""
    return QueueClient(layout, queue_for_dest(dest, force_remote))


def _md5_of(fd: int) -> str:
    import hashlib  # here: the queue daemon starts through this module (libcrypto: 3.5 MiB)

    digest = hashlib.md5()
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    os.lseek(fd, 0, os.SEEK_SET)
    return digest.hexdigest()


def attach(client: QueueClient, msg_id: str, pathname: str, name: str | None) -> dict[str, Any]:
    try:
        fd = os.open(pathname, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise BadRequest(f"cannot read {pathname}: {exc.strerror}") from exc
    try:
        md5 = _md5_of(fd)
    except OSError as exc:  # a directory opens, and fails at its first read
        os.close(fd)
        raise BadRequest(f"cannot read {pathname}: {exc.strerror}") from exc
    try:
        return client.call("attach", fds=[fd], msg_id=msg_id, md5=md5,
                           name=name or os.path.basename(pathname))
    finally:
        os.close(fd)


def cmd_sendmesg(layout: Layout, args: argparse.Namespace, state: str = "que",
                 single: bool = False) -> str:
    with client_for_dest(layout, args.dest, args.force_remote) as client:
        if not args.attach or state == "prep":
            reply = client.call("create", msg=message_from(args), state=state, single=single)
            return created_url(reply)
        reply = client.call("create", msg=message_from(args), state="prep")
        if reply.get("duplicate"):
            return created_url(reply)  # the holder is not ours to attach to
        try:
            for path in args.attach:
                attach(client, reply["msg_id"], path, None)
        except RQError as exc:
            raise type(exc)(f"{exc}; {_withdrawn(client, reply['msg_id'])}") from exc
        return str(client.call("commit", msg_id=reply["msg_id"])["url"])


def _withdrawn(client: QueueClient, msg_id: str) -> str:
    """A send whose attachment failed: its prep message deleted (it stayed in prep
    for ever), or what to do about it when the queue cannot be asked."""
    try:
        client.call("delete", msg_id=msg_id)
    except RQError as exc:
        return f"its message is left in prep ({exc}): rq delete --msg_id {msg_id}"
    return "nothing was sent"


def add_msg_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", required=True, help="queue name or full queue URL")
    for name in MSG_FIELDS:
        parser.add_argument(f"--{name}")
    parser.add_argument("--due", type=float, help="epoch seconds before which it will not run")
    parser.add_argument("--count", type=int, help="runs so far (kept, as RQ keeps it)")
    parser.add_argument("--max_count", type=int, help="runs allowed with resend (default 15)")
    parser.add_argument("--timeout", type=float,
                        help="seconds its script may run (at most the queue's timeout)")
    parser.add_argument("--retry_max", type=int, help="retries of a failed run (0: none)")
    parser.add_argument("--priority", type=int,
                        help="-1000 to 1000: among due messages, smaller runs first (default 0)")
    parser.add_argument("--tag", action="append", dest="tags", metavar="TAG",
                        help="a short word to find the message by (repeatable)")
    parser.add_argument("--slots", type=int, help="worker slots it takes (default 1)")
    parser.add_argument("--need", action="append", dest="needs", metavar="KEY=VALUE",
                        help="what it needs of the queue's budget: memory=12G, cpus=4, "
                        "gpus=1 (repeatable)")
    jobs.add_after_options(parser)
    parser.add_argument("--force_remote", action="store_true", help="send through relay")
    parser.add_argument("--relay-ok", dest="relay_ok", action="store_true",
                        help="RQ's consent to relay a URL dest; accepted, URLs always relay")
    parser.add_argument("--attach", action="append", metavar="PATH",
                        help="attach a file (repeatable)")
    parser.add_argument("--unique-key", dest="unique_key", metavar="KEY",
                        help="no new message while one with KEY is queued or running "
                        "('params': the key is param1..4)")
    parser.add_argument("--unique-for", dest="unique_for", type=float, metavar="SECS",
                        help="keep the key SECS seconds after its message ended")
