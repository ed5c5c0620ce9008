"""The job-control verbs of ``rq``: ``ls`` (a queue's message ids, by tag),
``sendmesg --bulk`` (many messages, one create_many per batch) and
``sendmesg --after`` (dependencies)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import IO, Any

from rqsys.cli.common import queue_argument
from rqsys.errors import BadRequest
from rqsys.search import query
from rqsys.store import STATES, Layout
from rqsys.wire import bulk as bulkinput
from rqsys.wire.client import QueueClient, queue_for_dest


def ls_options(parser: argparse.ArgumentParser) -> None:
    queue_argument(parser)
    parser.add_argument("--state", default="que", choices=list(STATES),
                        help="que (run order), run, or the others newest first (default que)")
    parser.add_argument("--tag", help="only messages carrying this tag")
    parser.add_argument("--since", help="only messages created since: 2h, 3d, an ISO date "
                        "or a Unix time (from the search index)")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--limit", type=int, default=50, help="at most this many ids (50)")


def cmd_ls(layout: Layout, args: argparse.Namespace) -> str:
    """``ok <how many match>``, then one id a line."""
    request = {"state": args.state, "offset": args.offset, "limit": args.limit}
    if getattr(args, "since", None):
        return _ls_since(layout, args, request)
    if args.tag:
        request["tag"] = args.tag
    with QueueClient(layout, args.queue) as client:
        got = client.call("list", **request)
    return "\n".join([str(got["total"]), *got["ids"]])


def _ls_since(layout: Layout, args: argparse.Namespace, request: dict[str, Any]) -> str:
    """``ls --since``: the search index, newest first (``total`` counted up to 10,000)."""
    request["since"] = query.parse_when(args.since, "--since")
    if args.tag:
        request["tag"] = args.tag
    with QueueClient(layout, args.queue) as client:
        got = client.call("search", **request)
    return "\n".join([str(got["total"]), *(row["id"] for row in got["rows"])])


def send_bulk(layout: Layout, args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    """``rq sendmesg --bulk FILE|-``: one JSON message a line, to ``--dest``'s queue;
    prints ``ok <url>`` or ``fail <index>: <why>`` per message, in order, as each
    batch is answered.  Exit 0 when all were created, else 1 (3: no daemon)."""
    failed = 0
    with _open(args.bulk) as lines, QueueClient(layout, queue_for_dest(args.dest)) as client:
        def create_many(msgs: list[Any]) -> list[dict[str, Any]]:
            return list(client.call("create_many", msgs=msgs)["results"])

        for got in bulkinput.send(bulkinput.ndjson(lines), create_many, defaults):
            if "error" in got:
                failed += 1
                print(f"fail {got['index']}: {got['error']}", flush=True)
            else:
                print(f"ok {got['url']}", flush=True)
    return 1 if failed else 0


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return os.fdopen(os.dup(sys.stdin.fileno()), "rb")
    try:
        return open(path, "rb")
    except OSError as exc:
        raise BadRequest(f"--bulk {path}: {exc.strerror}") from exc


def add_after_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--after", action="append", metavar="URL",
                        help="run only once this message is done (its URL, or an id of the "
                        "same queue; repeatable)")
    parser.add_argument("--after-policy", dest="after_policy", choices=["fail", "wait"],
                        help="when one of them ends in err: fail this one too (default) "
                        "or wait for its retry")


def after_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The message fields of ``--after`` and ``--after-policy``."""
    fields: dict[str, Any] = {}
    if getattr(args, "after", None):
        fields["after"] = args.after
    if getattr(args, "after_policy", None):
        fields["after_policy"] = args.after_policy
    return fields
