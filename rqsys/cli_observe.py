"""``rq`` verbs that watch the queues: ``stats`` (and its table of verbs, which
``rqsys.cli`` adds to ``rq``'s own).  Each verb prints its own lines and
returns its exit code."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from rqsys.client import QueueClient
from rqsys.errors import RQError, Unavailable
from rqsys.store import Layout, check_queue_name

RET_OK, RET_FAIL, RET_UNAVAILABLE = 0, 1, 3
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
    return lines


def _pcts(times: dict[str, Any]) -> str:
    if not times["count"]:
        return "none"
    return " ".join(f"{q} <={_secs(times[q])}" for q in ("p50", "p95", "p99"))


def _secs(value: float) -> str:
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.0f}s"


def _add_stats(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", help="queue name")
    parser.add_argument("--json", action="store_true", help="the daemon's whole answer")


VERBS: dict[str, tuple[Verb, Callable[[argparse.ArgumentParser], None], str]] = {
    "stats": (cmd_stats, _add_stats, "a queue's counts, throughput and wait/run percentiles"),
}


def add_verbs(verbs: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add this module's verbs to ``rq``'s subparsers."""
    for verb, (_fn, setup, text) in VERBS.items():
        setup(verbs.add_parser(verb, help=text, description=text, parents=parents))


def run(layout: Layout, args: argparse.Namespace) -> int:
    """Run one of this module's verbs: its code, or rq's for an error."""
    try:
        return VERBS[args.verb][0](layout, args)
    except Unavailable as exc:
        print(f"rq: {exc}", file=sys.stderr)
        return RET_UNAVAILABLE
    except RQError as exc:
        print(f"rq: {exc}", file=sys.stderr)
        return RET_FAIL
