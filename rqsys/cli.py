"""Command lines: ``rq`` (RQ's client verbs); ``rqsys`` (daemons and admin) is
in ``rqsys.cli_rqsys``, and ``python -m rqsys.cli`` runs it.

``rq`` prints ``ok <x>`` or ``fail <why>`` in RQ's shapes and exits with the
codes of ``rqsys.cli_common``; both take ``--root DIR`` (or RQ_ROOT) to find the state
directory and the queue sockets.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from rqsys import cli_jobs, cli_observe
from rqsys.cli_common import (  # the RET_ codes: rq's too (rqsys.cli.RET_FAIL)
    RET_FAIL,
    RET_OK,
    RET_UNAVAILABLE,
    RET_USAGE,  # noqa: F401
    after_verb,
    root_option,
)
from rqsys.client import QueueClient, find_message, queue_for_dest
from rqsys.errors import BadRequest, RQError, Unavailable
from rqsys.store import ADMIN_OPERS, Layout

MSG_FIELDS = ("src", "param1", "param2", "param3", "param4", "orig_msg_id")
NUMBER_FIELDS = ("due", "count", "max_count", "timeout", "retry_max", "priority")


# ---------------------------------------------------------------------- rq
def _message_from(args: argparse.Namespace) -> dict[str, Any]:
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
    msg.update(cli_jobs.after_fields(args))
    return msg


def _created_url(reply: dict[str, Any]) -> str:
    """The new message's URL; a duplicate (its unique key held) says so on stderr."""
    if reply.get("duplicate"):
        print(f"rq: duplicate: {reply['url']} holds this unique key; no new message",
              file=sys.stderr)
    return str(reply["url"])


def _client_for_dest(layout: Layout, dest: str, force_remote: bool = False) -> QueueClient:
    """As RQ's rq: a URL dest (this host's too) goes to the relay queue."""
    return QueueClient(layout, queue_for_dest(dest, force_remote))


def _md5_of(fd: int) -> str:
    import hashlib  # here: the queue daemon starts through this module (libcrypto: 3.5 MiB)

    digest = hashlib.md5()
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    os.lseek(fd, 0, os.SEEK_SET)
    return digest.hexdigest()


def _attach(client: QueueClient, msg_id: str, pathname: str, name: str | None) -> dict[str, Any]:
    try:
        fd = os.open(pathname, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise BadRequest(f"cannot read {pathname}: {exc.strerror}") from exc
    try:
        return client.call("attach", fds=[fd], msg_id=msg_id, md5=_md5_of(fd),
                           name=name or os.path.basename(pathname))
    finally:
        os.close(fd)


def cmd_sendmesg(layout: Layout, args: argparse.Namespace, state: str = "que",
                 single: bool = False) -> str:
    with _client_for_dest(layout, args.dest, args.force_remote) as client:
        if not args.attach or state == "prep":
            reply = client.call("create", msg=_message_from(args), state=state, single=single)
            return _created_url(reply)
        reply = client.call("create", msg=_message_from(args), state="prep")
        if reply.get("duplicate"):
            return _created_url(reply)  # the holder is not ours to attach to
        for path in args.attach:
            _attach(client, reply["msg_id"], path, None)
        return str(client.call("commit", msg_id=reply["msg_id"])["url"])


def cmd_prepmesg(layout: Layout, args: argparse.Namespace) -> str:
    return cmd_sendmesg(layout, args, state="prep")


def cmd_single_que(layout: Layout, args: argparse.Namespace) -> str:
    return cmd_sendmesg(layout, args, single=True)


def _msg_call(layout: Layout, args: argparse.Namespace, op: str, **extra: Any) -> dict[str, Any]:
    queue, msg_id = find_message(layout, args.msg_id)
    with QueueClient(layout, queue) as client:
        return client.call(op, msg_id=msg_id, **extra)


def cmd_attachmesg(layout: Layout, args: argparse.Namespace) -> str:
    queue, msg_id = find_message(layout, args.msg_id)
    with QueueClient(layout, queue) as client:
        reply = _attach(client, msg_id, args.pathname, args.name)
    return f"{reply['md5']}-Attached successfully for Message: {args.msg_id} attachment"


def cmd_attachstatusmesg(layout: Layout, args: argparse.Namespace) -> str:
    """RQ's shape: the number of attachments, then ``name md5 size path`` lines."""
    found = _msg_call(layout, args, "get")["attachments"]
    lines = [f"{name} {info['md5']} {info['size']} {info.get('path', '')}".rstrip()
             for name, info in sorted(found.items())]
    return "\n".join([str(len(lines)), *lines])


def cmd_statuscountmesg(layout: Layout, args: argparse.Namespace) -> str:
    return str(_msg_call(layout, args, "get")["msg"].get("count", 0))


def cmd_commitmesg(layout: Layout, args: argparse.Namespace) -> str:
    return str(_msg_call(layout, args, "commit")["url"])


def cmd_statusmesg(layout: Layout, args: argparse.Namespace) -> str:
    reply = _msg_call(layout, args, "status")
    return f"{reply['state']} - {reply['status']}" if reply["status"] else str(reply["state"])


def cmd_state(layout: Layout, args: argparse.Namespace) -> str:
    return str(_msg_call(layout, args, "state")["state"])


def cmd_clone(layout: Layout, args: argparse.Namespace) -> str:
    return str(_msg_call(layout, args, "clone")["url"])


def cmd_delete(layout: Layout, args: argparse.Namespace) -> str:
    _msg_call(layout, args, "delete")
    return "deleted"


def cmd_destroy(layout: Layout, args: argparse.Namespace) -> str:
    _msg_call(layout, args, "destroy")
    return "destroyed"


def cmd_run_now(layout: Layout, args: argparse.Namespace) -> str:
    _msg_call(layout, args, "run_now")
    return "run_now"


def cmd_adminoper(layout: Layout, args: argparse.Namespace) -> str:
    with QueueClient(layout, args.queue) as client:
        return str(client.call("adminoper", oper=args.oper)["admin"])


def _pools(layout: Layout, args: argparse.Namespace) -> str:
    from rqsys.pool.report import cmd_pools  # imports nothing of NATS

    return cmd_pools(layout, args)


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
    cli_jobs.add_after_options(parser)
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


def cmd_timers(layout: Layout, args: argparse.Namespace) -> str:
    from rqsys import timer_list

    entries = timer_list.list_timers(layout)
    return "\n".join([str(len(entries)), *timer_list.lines(entries)])


RQ_VERBS: dict[str, tuple[Callable[[Layout, argparse.Namespace], str], str]] = {
    "sendmesg": (cmd_sendmesg, "send a message (ok <full message url>)"),
    "prepmesg": (cmd_prepmesg, "create a message in prep (two-phase send)"),
    "single_que": (cmd_single_que, "queue unless an identical message is queued"),
    "attachmesg": (cmd_attachmesg, "attach a file to a prep message"),
    "attachstatusmesg": (cmd_attachstatusmesg, "ok N, then one 'name md5 size path' line each"),
    "statuscountmesg": (cmd_statuscountmesg, "ok <count> (runs so far)"),
    "commitmesg": (cmd_commitmesg, "commit a prep message to que"),
    "statusmesg": (cmd_statusmesg, "ok <state> [- <status text>]"),
    "state": (cmd_state, "ok <state>"),
    "clone": (cmd_clone, "copy a message (attachments hard-linked) to que"),
    "delete": (cmd_delete, "delete a message that is not running"),
    "destroy": (cmd_destroy, "kill a running message's scripts and delete it"),
    "run_now": (cmd_run_now, "make a queued message due now"),
    "adminoper": (cmd_adminoper, "set a queue's admin state"),
    "timers": (cmd_timers, "ok N, then one line per timer: name, schedule, next run, last "
                           "run, last message URL and its state (tab-separated)"),
    "ls": (cli_jobs.cmd_ls, "ok <count>, then a queue's message ids, one a line (--tag)"),
    "pools": (_pools,
              "pool queues here, with their pools' depth, in flight, redeliveries"),
}
SENDING = {"sendmesg", "prepmesg", "single_que"}


def rq_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rq", description="RQ client verbs")
    root_option(parser)
    verbs = parser.add_subparsers(dest="verb", required=True)
    for verb, (_fn, text) in RQ_VERBS.items():
        sub = verbs.add_parser(verb, help=text, description=text, parents=[after_verb()])
        if verb == "sendmesg":
            sub.add_argument("--bulk", metavar="FILE", help="send one JSON message per line "
                             "of FILE (- for stdin); the options below are their defaults")
        if verb in SENDING:
            add_msg_options(sub)
        elif verb == "timers":
            pass
        elif verb == "ls":
            cli_jobs.ls_options(sub)
            cli_observe.ls_options(sub)
        elif verb == "pools":
            pass
        elif verb == "adminoper":
            sub.add_argument("--queue", required=True)
            sub.add_argument("--oper", required=True, choices=list(ADMIN_OPERS))
        else:
            sub.add_argument("--msg_id", required=True, help="short id or full message URL")
        if verb == "attachmesg":
            sub.add_argument("--pathname", required=True, help="the file to attach")
            sub.add_argument("--name", help="attachment name (default: the file's name)")
    cli_observe.add_verbs(verbs, [after_verb()])
    return parser


def rq_main(argv: list[str] | None = None) -> int:
    args = rq_parser().parse_args(argv)
    if cli_observe.takes(args):
        return cli_observe.run(Layout.from_root(args.root), args)
    try:
        if getattr(args, "bulk", None):  # its own lines: one per message
            return cli_jobs.send_bulk(Layout.from_root(args.root), args, _message_from(args))
        print(f"ok {RQ_VERBS[args.verb][0](Layout.from_root(args.root), args)}")
    except Unavailable as exc:
        print(f"fail {exc}")
        print(f"rq: {exc}", file=sys.stderr)
        return RET_UNAVAILABLE
    except RQError as exc:
        print(f"fail {exc}")
        print(f"rq: {exc}", file=sys.stderr)
        return RET_FAIL
    return RET_OK


def main() -> int:
    """``python -m rqsys.cli`` runs ``rqsys`` (the supervisor starts children so)."""
    from rqsys.cli_rqsys import rqsys_main

    return rqsys_main()


if __name__ == "__main__":
    sys.exit(main())
