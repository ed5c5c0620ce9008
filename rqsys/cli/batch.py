"""``rq batch`` (make a batch from a JSON file) and ``rq batchstatus`` (how far along it is)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rqsys import config
from rqsys.batches import record
from rqsys.batches.create import create
from rqsys.errors import BadRequest, NotFound
from rqsys.store import Layout
from rqsys.wire.client import QueueClient

CALL_TIMEOUT = 300.0  # a request of 10,000 members takes seconds on a slow disk


def add_options(verb: str, parser: argparse.ArgumentParser) -> None:
    if verb == "batch":
        parser.add_argument("--file", required=True, metavar="FILE",
                            help="the batch as JSON (- for stdin): messages, and optional "
                            "on_done and on_err")
    else:
        parser.add_argument("--batch", required=True, metavar="ID", help="the batch's id")


def cmd_batch(layout: Layout, args: argparse.Namespace) -> str:
    """Make the batch; its URL once every member is in its queue."""
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        body = json.loads(text)
    except OSError as exc:
        raise BadRequest(f"cannot read {args.file}: {exc.strerror}") from exc
    except ValueError as exc:
        raise BadRequest(f"{args.file}: not valid JSON: {exc}") from exc

    def call(queue: str, op: str, **kw: Any) -> dict[str, Any]:
        with QueueClient(layout, queue, timeout=CALL_TIMEOUT) as client:
            return client.call(op, **kw)

    report = create(layout, body, call, f"rq uid {os.getuid()}")
    return f"{config.base_url(config.load_system_config(layout))}batches/{report['id']}"


def cmd_batchstatus(layout: Layout, args: argparse.Namespace) -> str:
    """``<ended>/<total> done N err N relayed N gone N`` and the callback's URL once made."""
    path = layout.batches / args.batch
    if not record.BATCH_ID_RE.match(args.batch) or not (path / "batch.json").is_file():
        raise NotFound(f"no batch {args.batch}")
    got = record.progress(path).report()
    words = [f"{got['ended']}/{got['total']}",
             *(f"{state} {n}" for state, n in got["counts"].items())]
    if got["failed"]:
        words.append(f"failed: {got['failed']}")
    if got["callback"]:
        words.append(f"callback {got['callback']}")
    return " ".join(words)
