#!/usr/bin/env python3
"""The webhook queue's script: POST an ended message's JSON to its webhook URLs.

When a message with ``post_run_webhook`` (a list of URLs) reaches done, err or
relayed, its queue daemon puts a message in the local ``webhook`` queue
(:func:`rqsys.special.webhook_message`): param1 is the ended message's URL, param2 its
state, param3 the JSON document POSTed (``{"msg_id", "state", "status",
"msg"}``).  Every URL that answers 2xx is noted in ``job/webhook_sent`` and
not called again; if any failed, the message resends with back-off
(BACKOFF_UNIT / BACKOFF_MAX in the queue's env_vars), and after max_count
tries it ends in err naming the URLs that never answered 2xx.
"""

from __future__ import annotations

import json
import sys

from rqsys.errors import RQError
from rqsys.scripts.jobkit import Job
from rqsys.scripts.rqhttp import Peer

TIMEOUT = 10.0


def post(url: str, body: bytes, timeout: float) -> str:
    """POST ``body`` to ``url``: "" on 2xx, else why not."""
    try:
        peer = Peer(url, timeout)
        reply = peer.request("POST", url, body, {"Content-Type": "application/json"})
    except RQError as exc:
        return str(exc)
    if 200 <= reply.status < 300:
        return ""
    return f"{url}: HTTP {reply.status}"


def notify(job: Job) -> int:
    payload = job.msg.get("param3") or ""
    try:
        urls = json.loads(payload)["msg"]["post_run_webhook"]
    except (ValueError, KeyError, TypeError):
        job.say("err", "param3 is not a webhook payload with msg.post_run_webhook")
        return 0
    sent = set(job.read_note("webhook_sent").split())
    timeout = float(job.env.get("WEBHOOK_TIMEOUT") or TIMEOUT)
    failures = []
    for url in (u for u in urls if u not in sent):
        why = post(url, payload.encode(), timeout)
        if why:
            failures.append(why)
            continue
        sent.add(url)
        job.write_note("webhook_sent", "\n".join(sorted(sent)))
    if failures:
        return job.resend("; ".join(failures))
    job.say("done", f"notified {len(urls)} URL(s)")
    return 0


def main() -> int:
    return notify(Job())


if __name__ == "__main__":
    sys.exit(main())
