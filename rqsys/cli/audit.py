"""`rq audit`: the audit trail's records, newest first, read from the root's `audit/` files."""

from __future__ import annotations

import argparse
import json
import time

from rqsys.observe import audit, auditread
from rqsys.store import Layout


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--actor", default="", help="only this actor's records (an HTTP user, "
                        "or a socket client's user name)")
    parser.add_argument("--action", default="", help="only this action (delete, retry, pause, "
                        "bulk_delete, new_queue, ...)")
    parser.add_argument("--queue", default="", help="only this queue's records")
    parser.add_argument("--since", default="", help="from this time on (epoch seconds or "
                        "ISO 8601, UTC unless it names its zone)")
    parser.add_argument("--until", default="", help="before this time")
    parser.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    parser.add_argument("--json", action="store_true", help="each record as its JSON line")


def cmd_audit(layout: Layout, args: argparse.Namespace) -> int:
    """Print the matching records, newest first: a time and the record's text a line."""
    flt = auditread.Filter(
        args.actor, args.action, args.queue,
        auditread.parse_time(args.since, "--since") if args.since else None,
        auditread.parse_time(args.until, "--until") if args.until else None)
    for rec in auditread.records(layout.audit_dir, flt)[:max(args.limit, 0)]:
        if args.json:
            print(json.dumps(rec, ensure_ascii=False))
        else:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(rec["time"])))
            print(f"{stamp} {audit.text(rec).removeprefix('audit: ')}")
    return 0
