"""``rq ls``: one state's message ids of a queue, optionally by tag."""

from __future__ import annotations

import argparse

from rqsys.client import QueueClient
from rqsys.store import STATES, Layout


def ls_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue", required=True)
    parser.add_argument("--state", default="que", choices=list(STATES),
                        help="que (run order), run, or the others newest first (default que)")
    parser.add_argument("--tag", help="only messages carrying this tag")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--limit", type=int, default=50, help="at most this many ids (50)")


def cmd_ls(layout: Layout, args: argparse.Namespace) -> str:
    """``ok <how many match>``, then one id a line."""
    request = {"state": args.state, "offset": args.offset, "limit": args.limit}
    if args.tag:
        request["tag"] = args.tag
    with QueueClient(layout, args.queue) as client:
        got = client.call("list", **request)
    return "\n".join([str(got["total"]), *got["ids"]])
