#!/usr/bin/env python3
"""The cleaner queue's script: prune old done/relayed messages and acknowledged errs.

param1: age in days (default 3; a decimal is fine); param2: one queue name,
or empty / ``all`` for every queue; param3: if given, an age in days for
abandoned prep messages.  Each queue's own daemon does the removal
(``prune`` over its socket: it is the sole writer of its directory and keeps
its counts right): messages in ``done/`` and ``relayed/`` that ended more than
N days ago (the newer mtime of the message directory and its ``status``
file), whole hourly shards at once where they are all old, and messages in
``err/`` that an operator acknowledged by creating an ``ack`` file in them
(``touch queue/<q>/err/<id>/ack``).  With param3, prep messages nobody has
touched for that many days go too (the newest mtime of the directory, its
``msg`` and ``attach/``): uploads never committed, or a relay's prepared
copy whose sender crashed before it could resume.  que and run are never
touched, nor prep without param3.  A daily timer (``timers/cleaner.json``)
sends it one message a day.
"""

from __future__ import annotations

import math
import sys

from rqsys.errors import BadRequest, RQError
from rqsys.scripts.jobkit import Job
from rqsys.store import check_queue_name
from rqsys.wire.client import QueueClient

DEFAULT_DAYS = 3.0


def parse_days(text: str, label: str = "param1 (days)") -> float:
    if not text.strip():
        return DEFAULT_DAYS
    try:
        days = float(text)
    except ValueError as exc:
        raise BadRequest(f"{label} must be a number, got {text[:40]!r}") from exc
    if not math.isfinite(days) or days < 0:
        raise BadRequest(f"{label} must be 0 or more, got {text[:40]!r}")
    return days


def parse_prep_days(text: str) -> float | None:
    """param3: None (prep is kept) when empty."""
    return parse_days(text, "param3 (prep days)") if text.strip() else None


def queues_to_clean(job: Job, which: str) -> list[str]:
    if which.strip() in ("", "all"):
        return job.layout().queue_names()
    name = check_queue_name(which.strip())
    if name not in job.layout().queue_names():
        raise BadRequest(f"param2: no queue named {name}")
    return [name]


def clean(job: Job) -> int:
    try:
        days = parse_days(str(job.msg.get("param1", "")))
        names = queues_to_clean(job, str(job.msg.get("param2", "")))
        prep_days = parse_prep_days(str(job.msg.get("param3", "")))
    except BadRequest as exc:
        job.say("err", str(exc))
        return 0
    removed, failed = 0, []
    for name in names:
        try:
            with QueueClient(job.layout(), name, timeout=300) as client:
                reply = client.call("prune", days=days, prep_days=prep_days)
        except RQError as exc:
            failed.append(f"{name}: {exc}")
            continue
        removed += sum(reply["removed"].values())
        print(f"{name}: removed {reply['removed']}", flush=True)
    if failed:
        return job.resend(f"removed {removed}; not cleaned: {'; '.join(failed)}")
    job.say("done", f"removed {removed} message(s) older than {days:g} days "
                    f"from {len(names)} queue(s)")
    return 0


def main() -> int:
    return clean(Job())


if __name__ == "__main__":
    sys.exit(main())
