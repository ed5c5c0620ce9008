"""``rq`` verbs that watch the queues: ``stats``, ``wait``, ``tail``, ``run``
and ``ls`` (a table of verbs that ``rqsys.cli.rq`` adds to ``rq``'s own).  Each
prints its own lines and returns its exit code: 0 done (or relayed), 1 err,
gone or refused, 3 a daemon that cannot be reached."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from rqsys.cli import audit, send
from rqsys.cli.common import RET_FAIL, RET_OK, RET_UNAVAILABLE, queue_argument
from rqsys.cli.follow import Follow, describe, verdict_code
from rqsys.errors import BadRequest, RQError, Unavailable
from rqsys.message import split_message_url
from rqsys.observe import timeline
from rqsys.run.resources import room_text
from rqsys.search import query
from rqsys.store import Layout, QueueView, check_queue_name
from rqsys.wire.client import QueueClient, find_message

Verb = Callable[[Layout, argparse.Namespace], int]


def cmd_stats(layout: Layout, args: argparse.Namespace) -> int:
    """A queue's numbers: totals, then each window's counts, throughput and times."""
    with QueueClient(layout, check_queue_name(args.queue)) as client:
        got = client.call("stats")
    if args.json:
        got.pop("ok", None)
        print(json.dumps(got, indent=2, sort_keys=True))
        return RET_OK
    for line in stats_lines(got):
        print(line)
    return RET_OK


def stats_lines(got: dict[str, Any]) -> list[str]:
    totals = got["totals"]
    lines = [f"queue {got['queue']}: {got['admin']}, "
             + ", ".join(f"{s} {n}" for s, n in got["counts"].items()),
             "since ever: " + ", ".join(f"{k} {v}" for k, v in totals.items())]
    for name, win in got["windows"].items():
        lines.append(f"last {name}: done {win['done']}, err {win['err']}, relayed "
                     f"{win['relayed']}, resend {win['resend']}, retry {win['retry']}, "
                     f"{win['throughput_per_s'] * 60:.2f}/min; "
                     f"wait {_pcts(win['wait'])}; run {_pcts(win['run'])}")
    for day, counts in list(got["days"].items())[-7:]:
        lines.append(f"{day}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return [*lines, f"room: {room_text(got['room'])}"]  # what runs holds now


def _pcts(times: dict[str, Any]) -> str:
    if not times["count"]:
        return "none"
    return " ".join(f"{q} <={_secs(times[q])}" for q in ("p50", "p95", "p99"))


def _secs(value: float) -> str:
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.0f}s"


def cmd_wait(layout: Layout, args: argparse.Namespace) -> int:
    """Block until each message has ended; a line each: ``<url> <state> - <status>``."""
    code = RET_OK
    for ref in args.msg_ids:
        follow = Follow(layout, *find_message(layout, ref))
        try:
            follow.wait()
        finally:
            follow.close()
        print(f"{follow.url} {describe(follow.state, follow.status)}", flush=True)
        code = max(code, verdict_code(follow.state))
    return code


def cmd_tail(layout: Layout, args: argparse.Namespace) -> int:
    """Print job/stdio.log; with -f, follow it until the message ends, then
    exit with its verdict (the verdict line on stderr)."""
    follow = Follow(layout, *find_message(layout, args.msg_id))
    try:
        if not args.follow:
            follow.tail(sys.stdout.buffer, args.from_end, follow=False)
            return RET_OK
        return _follow(follow, args.from_end)
    finally:
        follow.close()


def _follow(follow: Follow, from_end: bool) -> int:
    follow.tail(sys.stdout.buffer, from_end)
    print(f"rq: {follow.url} {describe(follow.state, follow.status)}", file=sys.stderr)
    return verdict_code(follow.state)


def cmd_run(layout: Layout, args: argparse.Namespace) -> int:
    """Send a message, follow its output, exit with its verdict."""
    url = send.cmd_sendmesg(layout, args)
    follow = Follow(layout, *split_message_url(url))
    try:
        return _follow(follow, False)
    finally:
        follow.close()


def cmd_ls(layout: Layout, args: argparse.Namespace) -> int:
    """A state's messages (newest first; que in due order) with their times."""
    queue = check_queue_name(args.queue)
    request = {"state": args.state, "offset": args.offset, "limit": args.limit}
    if args.tag:
        request["tag"] = args.tag
    if getattr(args, "since", None):  # from the search index
        request["since"] = query.parse_when(args.since, "--since")
    with QueueClient(layout, queue) as client:
        ids = (client.call("list", **request)["ids"] if "since" not in request else
               [row["id"] for row in client.call("search", **request)["rows"]])
    view = QueueView(layout.queue_dir(queue))
    rows = [row for msg_id in ids if (row := _row(view, args.state, msg_id)) is not None]
    if args.json:
        print(json.dumps(rows, indent=2))
        return RET_OK
    for row in rows:
        print(" ".join([row["msg_id"], row["state"], *(_when(row[k]) for k in (
            "created_at", "started_at", "ended_at")), _dur(row["run_s"]), row["status"]]))
    return RET_OK


def _row(view: QueueView, state: str, msg_id: str) -> dict[str, Any] | None:
    try:
        msg = view.read_msg(state, msg_id)
    except RQError:
        return None  # it moved on since it was listed
    times = timeline.times(timeline.read_folded(view.msg_dir(state, msg_id)),
                           float(msg.get("due") or 0))
    return {"msg_id": msg_id, "state": state, **times,
            "status": view.read_status(state, msg_id),
            **{k: v for k, v in msg.items() if k.startswith("param")}}


def _when(at: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)) if at else "-"


def _dur(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f}s"


def cmd_groups(layout: Layout, args: argparse.Namespace) -> int:
    """A queue's failure groups, largest first: key, count, last seen, reason."""
    with QueueClient(layout, check_queue_name(args.queue)) as client:
        groups = client.call("groups")["groups"]
    if args.json:
        print(json.dumps(groups, indent=2))
        return RET_OK
    for group in groups:
        print(f"{group['key']} {group['count']} {_when(group['first_seen'])} "
              f"{_when(group['last_seen'])} {group['reason']}")
    return RET_OK


def cmd_retry(layout: Layout, args: argparse.Namespace) -> int:
    """err → que: one message, a failure group, or every err message of a queue."""
    if args.msg_id:
        queue, msg_id = find_message(layout, args.msg_id, args.queue)
        with QueueClient(layout, queue) as client:
            client.call("retry", msg_id=msg_id)
        print(f"retried {msg_id}")
        return RET_OK
    if args.group and not args.queue:
        raise BadRequest("--group needs --queue")
    queue = check_queue_name(args.queue or args.all_err)
    with QueueClient(layout, queue) as client:
        keys = [args.group] if args.group else [
            g["key"] for g in client.call("groups")["groups"]]
        count = sum(client.call("group", group=key, action="retry")["count"] for key in keys)
    print(f"retried {count}")
    return RET_OK


def _add_groups(parser: argparse.ArgumentParser) -> None:
    queue_argument(parser)
    parser.add_argument("--json", action="store_true", help="one JSON list")


def _add_retry(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("msg_id", nargs="?", metavar="ID", help="short id or full URL")
    which.add_argument("--group", help="a failure group's key (rq groups; needs --queue)")
    which.add_argument("--all-err", dest="all_err", metavar="QUEUE",
                       help="every err message of QUEUE")
    parser.add_argument("--queue", help="the queue of --group (or of a short id)")


def _add_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("msg_ids", nargs="+", metavar="ID", help="short id or full URL")


def _add_tail(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("msg_id", metavar="ID", help="short id or full message URL")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="follow until the message ends; exit with its verdict")
    parser.add_argument("--from-end", dest="from_end", action="store_true",
                        help="start at the end of the output so far")


def _add_run(parser: argparse.ArgumentParser) -> None:
    send.add_msg_options(parser)


def ls_options(parser: argparse.ArgumentParser) -> None:
    """``rq ls``'s options of this module (the others: ``rqsys.cli.jobs``)."""
    parser.add_argument("--json", action="store_true",
                        help="the messages as one JSON list, with their times")
    parser.add_argument("--long", action="store_true",
                        help="a line each: id, state, created, started, ended, run time, status")


def takes(args: argparse.Namespace) -> bool:
    """Whether this module runs the command (``rq ls --json`` or ``--long`` too)."""
    return args.verb in VERBS or (args.verb == "ls" and (args.json or args.long))


def _add_stats(parser: argparse.ArgumentParser) -> None:
    queue_argument(parser)
    parser.add_argument("--json", action="store_true", help="the daemon's whole answer")


VERBS: dict[str, tuple[Verb, Callable[[argparse.ArgumentParser], None], str]] = {
    "stats": (cmd_stats, _add_stats, "a queue's counts, throughput and wait/run percentiles"),
    "wait": (cmd_wait, _add_wait, "wait until messages end (0 all done, 1 any err)"),
    "tail": (cmd_tail, _add_tail, "print a message's output; -f follows it to its end"),
    "run": (cmd_run, _add_run, "send a message, follow its output, exit with its verdict"),
    "groups": (cmd_groups, _add_groups, "a queue's err messages grouped by reason"),
    "retry": (cmd_retry, _add_retry, "err back to que: a message, a group, or all"),
    "audit": (audit.cmd_audit, audit.add_options, "the audit trail: who changed what, from "
              "where, and how it ended (newest first)"),
}


def add_verbs(verbs: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add this module's verbs to ``rq``'s subparsers."""
    for verb, (_fn, setup, text) in VERBS.items():
        setup(verbs.add_parser(verb, help=text, description=text, parents=parents))


def run(layout: Layout, args: argparse.Namespace) -> int:
    """Run one of this module's verbs: its code, or rq's for an error."""
    try:
        return (cmd_ls if args.verb == "ls" else VERBS[args.verb][0])(layout, args)
    except Unavailable as exc:
        print(f"rq: {exc}", file=sys.stderr)
        return RET_UNAVAILABLE
    except RQError as exc:
        print(f"rq: {exc}", file=sys.stderr)
        return RET_FAIL
