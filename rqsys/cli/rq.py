"""The ``rq`` command line: RQ's client verbs (``rqsys`` is ``rqsys.cli.admin``).

``rq`` prints ``ok <x>`` or ``fail <why>`` in RQ's shapes and exits with the
codes of ``rqsys.cli.common``; both take ``--root DIR`` (or RQ_ROOT) to find
the state directory and the queue sockets.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from rqsys.cli import batch, debug, jobs, observe
from rqsys.cli.common import (  # the RET_ codes: rq's too (rqsys.cli.rq.RET_FAIL)
    RET_FAIL,
    RET_OK,
    RET_UNAVAILABLE,
    RET_USAGE,  # noqa: F401
    after_verb,
    check_verb,
    existing_root,
    one_queue,
    parser_verbs,
    queue_argument,
    root_option,
    say_failure,
)
from rqsys.cli.follow import Follow
from rqsys.cli.send import (
    add_msg_options,
    attach,
    cmd_sendmesg,
    message_from,
)
from rqsys.errors import RQError, Unavailable
from rqsys.run.protocol import progress
from rqsys.store import ADMIN_OPERS, STATES, Layout, QueueView
from rqsys.wire.client import QueueClient, find_message


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
        reply = attach(client, msg_id, args.pathname, args.name)
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
    """RQ's ``<state> - <text>``; ``--verbose`` adds how far along a running one
    says it is, and the last lines a failed run wrote."""
    reply = _msg_call(layout, args, "get" if args.verbose else "status")
    said = f"{reply['state']} - {reply['status']}" if reply["status"] else str(reply["state"])
    if not args.verbose:
        return said
    lines = [said]
    if reply["state"] == "run" and (done := progress(reply["status"])):
        counted = f"{done['done']}/{done['total']} " if "total" in done else ""
        lines.append(f"progress {counted}({done['fraction'] * 100:.0f}%)")
    if reply.get("last_lines"):
        lines += ["last lines:", *(f"  {line}" for line in reply["last_lines"])]
    return "\n".join(lines)


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


def cmd_cancel(layout: Layout, args: argparse.Namespace) -> str:
    """err with ``cancelled by <who>``; a running one once it has stopped."""
    queue, msg_id = find_message(layout, args.msg_id)
    with QueueClient(layout, queue) as client:
        stopping = client.call("cancel", msg_id=msg_id).get("stopping")
    if stopping:
        follow = Follow(layout, queue, msg_id)
        try:
            follow.wait()
        finally:
            follow.close()
    return "cancelled"


def cmd_run_now(layout: Layout, args: argparse.Namespace) -> str:
    _msg_call(layout, args, "run_now")
    return "run_now"


def cmd_adminoper(layout: Layout, args: argparse.Namespace) -> str:
    with QueueClient(layout, args.queue) as client:
        return str(client.call("adminoper", oper=args.oper)["admin"])


def _pools(layout: Layout, args: argparse.Namespace) -> str:
    from rqsys.pool.report import cmd_pools  # imports nothing of NATS

    return cmd_pools(layout, args)


def cmd_queues(layout: Layout, args: argparse.Namespace) -> str:
    """ok N, then one line a queue: name, admin state, the count of each state (tab-separated,
    read from the queue's files: no daemon is started)."""
    lines = []
    for name in layout.queue_names():
        view = QueueView(layout.queue_dir(name))
        counts = " ".join(f"{state}={view.count(state)}" for state in STATES)
        lines.append(f"{name}\t{view.admin_state()}\t{counts}")
    return "\n".join([str(len(lines)), *lines])


def cmd_timers(layout: Layout, args: argparse.Namespace) -> str:
    from rqsys.timers import listing

    entries = listing.list_timers(layout)
    return "\n".join([str(len(entries)), *listing.lines(entries)])


def cmd_triggers(layout: Layout, args: argparse.Namespace) -> str:
    from rqsys.triggers import listing

    entries = listing.list_triggers(layout)
    return "\n".join([str(len(entries)), *listing.lines(entries)])


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
    "cancel": (cmd_cancel, "a queued message to err; a running one stopped (TERM, KILL after "
                           "stop_grace), then to err; status 'cancelled by ...'"),
    "run_now": (cmd_run_now, "make a queued message due now"),
    "adminoper": (cmd_adminoper, "set a queue's admin state"),
    "queues": (cmd_queues, "ok N, then one line a queue: name, admin state, counts "
                           "(tab-separated)"),
    "timers": (cmd_timers, "ok N, then one line per timer: name, schedule, next run, last "
                           "run, last message URL and its state (tab-separated)"),
    "triggers": (cmd_triggers, "ok N, then one line per trigger: name, kind, queue, made, "
                               "duplicate, refused, last fire, last error (tab-separated)"),
    "ls": (jobs.cmd_ls, "ok <count>, then a queue's message ids, one a line (--tag)"),
    "batch": (batch.cmd_batch, "make a batch of messages (JSON: messages, on_done, on_err); "
                               "its URL once every member is queued"),
    "batchstatus": (batch.cmd_batchstatus, "ok <ended>/<total> done N err N relayed N "
                                           "gone N [callback URL]"),
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
        elif verb in ("timers", "queues", "triggers"):
            pass
        elif verb == "ls":
            jobs.ls_options(sub)
            observe.ls_options(sub)
        elif verb == "pools":
            pass
        elif verb in ("batch", "batchstatus"):
            batch.add_options(verb, sub)
        elif verb == "adminoper":
            queue_argument(sub)
            sub.add_argument("--oper", required=True, choices=list(ADMIN_OPERS))
        else:
            sub.add_argument("--msg_id", required=True, help="short id or full message URL")
        if verb == "statusmesg":
            sub.add_argument("--verbose", "-v", action="store_true",
                             help="also how far along (run) and the last lines (err)")
        if verb == "attachmesg":
            sub.add_argument("--pathname", required=True, help="the file to attach")
            sub.add_argument("--name", help="attachment name (default: the file's name)")
    observe.add_verbs(verbs, [after_verb()])
    text = "make a message's run again in a scratch directory, to run it or look into it"
    debug.add_options(verbs.add_parser("debug", help=text, description=text,
                                       parents=[after_verb()]))
    return parser


def rq_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = rq_parser()
    check_verb("rq", argv, parser_verbs(parser))
    args = parser.parse_args(argv)
    if hasattr(args, "queue_option"):
        one_queue("rq", args)
    try:
        layout = existing_root(args.root)
        if observe.takes(args):
            return observe.run(layout, args)
        if args.verb == "debug":
            return debug.cmd_debug(layout, args)
        if getattr(args, "bulk", None):  # its own lines: one per message
            return jobs.send_bulk(layout, args, message_from(args))
        print(f"ok {RQ_VERBS[args.verb][0](layout, args)}")
    except Unavailable as exc:
        say_failure("rq", exc)
        return RET_UNAVAILABLE
    except RQError as exc:
        say_failure("rq", exc)
        return RET_FAIL
    return RET_OK
