#!/usr/bin/env python3
"""The relay queue's script: deliver one message to another RQ host, exactly once.

RQ's two-phase protocol over HTTP, in RQ's dialect (``_method`` inside the
``mesg`` JSON, ``x_format=json`` on every call), so an RQ and an rqsys far
end behave alike: ``POST <queue url>/new_message`` (``_method: prep``) ->
the new message URL is kept durably in ``job/relay_id`` -> each attachment
is uploaded and the MD5 the far end echoes is compared with ours ->
``POST <msg url>`` (``_method=commit``) -> ``GET <msg url>.json`` shows the
far message committed and holding every attachment with our MD5 (skipped
for a message without attachments whose commit was answered ``ok``) ->
``relayed <url>`` on fd 3.  A far end that ran the message without all of
its attachments is an err that says so, never ``relayed``.  Run again after
any crash, it resumes from ``relay_id``: a message the far end already
committed is only checked and reported, one still in prep gets its missing
attachments and the commit, one the far end no longer knows is prepared
again.  Unreachable or failing peers resend with back-off (count² × 10 s,
capped); a refused message or a loop ends in err.

Loops: each relayed message carries ``relay_via``, the base URLs of the
hosts whose relay sent it; a host that finds itself there, or too many hops,
is a loop.  A URL naming this very host is relayed like any other (as RQ
does): the message arrives through this host's own web front end.

Settings (the relay queue's ``env_vars``): BACKOFF_UNIT, BACKOFF_MAX,
RELAY_TIMEOUT (seconds per HTTP request), and for fault-injection tests
RELAY_HOLD_AT=uploaded|committed (stop there once and wait to be killed).

The same relay runs in a long-lived relay worker (``relayworker``), for
processes of the small ``rqrelay`` script; there it stops at the next step
once that process is gone (``cancel``).
"""

from __future__ import annotations

import json
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from rqsys.errors import BadRequest, RQError
from rqsys.observe.tracing import trace_id
from rqsys.scripts.jobkit import Job
from rqsys.scripts.rqhttp import Connections, Peer, PeerError, PeerRefused, PeerUnknown
from rqsys.store import QueueStore, check_msg_id, check_queue_name, file_md5

MAX_HOPS = 16
KEPT_FIELDS = ("src", "param1", "param2", "param3", "param4", "max_count", "post_run_webhook")
COMMITTED_STATES = ("que", "run", "done", "err", "relayed")
COMMITTED = "relay_committed"  # job/ note: the far end took the commit of this URL
RUN_MARK = "relay run to"  # first line of each run in job/stdio.log (as RQ logs its dest)


class RelayLoop(RQError):
    """The message would go round in circles."""


class RelayIncomplete(RQError):
    """The far end holds the message, but not whole (it ran or will run without data)."""


class Cancelled(RQError):
    """The process this relay ran for is gone: stop before the next step."""


class Cancel(Protocol):
    """Set once the process a relay runs for is gone (a ``threading.Event`` will do)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Relay:
    """Relays one message (the job's) to its destination queue URL."""

    def __init__(self, job: Job, conns: Connections | None = None,
                 cancel: Cancel | None = None) -> None:
        self.job = job
        self.in_worker = cancel is not None  # only the relay worker watches a process
        self.cancel: Cancel = cancel or threading.Event()
        self.target = target_queue_url(str(job.msg.get("dest", "")), job.host)
        self.peer = Peer(self.target, float(job.env.get("RELAY_TIMEOUT") or 60), conns)
        self.far_attachments: dict[str, Any] = {}
        self.known_prep = False  # the far end has shown the message in prep
        self.forgotten = False  # committed by a run before, gone from the far end since

    def run(self) -> int:
        where = ", in the relay worker" if self.in_worker else ""  # no getpid a message
        self.job.log(f"{RUN_MARK} {self.target} "
                     f"(RQ_COUNT {self.job.env.get('RQ_COUNT', '?')}{where})")
        self.check_loop()
        if self.job.env.get("RQ_FORCE_REMOTE") == "1":
            self.job.log("FORCE REMOTE")  # RQ's relay log words, which its operators grep for
        url, committed = self.resume()
        if not committed:
            if not url:
                url = self.prepare()
            self.upload_attachments(url)
            self.hold("uploaded")
            self.step()
            committed = self.commit(url)
            self.job.write_passing_note(COMMITTED, url)
            self.hold("committed")
        if (not committed or self.job.attachments()) and not self.forgotten:
            self.verify(url)
        self.job.say("relayed", url)
        return 0

    # -- loops -------------------------------------------------------------------
    def check_loop(self) -> None:
        via = list(self.job.msg.get("relay_via") or [])
        if self.job.host and self.job.host in via:
            raise RelayLoop(f"relay loop: {self.job.host} already relayed this message "
                            f"(via {' -> '.join(via)})")
        if len(via) >= MAX_HOPS:
            raise RelayLoop(f"relay loop: {len(via)} hops (via {' -> '.join(via)})")

    def outgoing(self) -> dict[str, Any]:
        """The message as the far end gets it (this hop added to relay_via)."""
        msg = {k: self.job.msg[k] for k in KEPT_FIELDS if k in self.job.msg}
        via = list(self.job.msg.get("relay_via") or [])
        msg.update(dest=self.target, orig_msg_id=self.orig_msg_id(),
                   relay_via=[*via, self.job.host])
        return msg

    def trace_header(self) -> dict[str, str]:
        """The hop's W3C ``traceparent``: this run's span, when the relay queue's
        daemon traces (a header: RQ, which knows no such field, ignores it)."""
        parent = self.job.env.get("TRACEPARENT", "")
        return {"traceparent": parent} if trace_id(parent) else {}

    def orig_msg_id(self) -> str:
        """The id the far message carries back to its first queue."""
        return str(self.job.msg.get("orig_msg_id") or self.job.full_id)

    # -- the two phases ----------------------------------------------------------
    def resume(self) -> tuple[str, bool]:
        """(URL prepared by an earlier run or "", whether the far end committed it)."""
        url = self.job.read_whole_note("relay_id")
        if not url:
            return "", False
        try:
            url_parts(url, 3)
        except BadRequest:  # written in place: a crash in the middle can leave garbage
            self.job.say("run", f"job/relay_id holds no message URL ({url[:80]!r}); "
                         "preparing again")
            return "", False
        try:
            state, info = self.far_state(url)
        except PeerUnknown:
            if self.job.read_whole_note(COMMITTED) == url:  # it ran there and was cleaned
                self.job.log(f"far end no longer knows {url}, committed before: relayed")
                self.forgotten = True
                return url, True
            self.job.say("run", f"far end no longer knows {url}; preparing again")
            return "", False
        theirs = info.get("orig_msg_id")
        if theirs and theirs != self.orig_msg_id():  # a stale block's URL (no journal)
            self.job.say("run", f"job/relay_id names {url}, another message's "
                         f"({theirs}); preparing again")
            return "", False
        if state in COMMITTED_STATES:
            return url, True
        if state != "prep":
            raise PeerError(f"{url}: unexpected state {state!r}")
        self.far_attachments = info["_attachments"]
        self.known_prep = True
        return url, False

    def prepare(self) -> str:
        self.step()
        self.job.log(f"attempting remote {self.target}")
        mesg = dict(self.outgoing(), _method="prep")  # RQ reads _method inside mesg
        url = self.peer.post_form(f"{self.target}/new_message", {"mesg": json.dumps(mesg)},
                                  self.trace_header())
        try:
            url_parts(str(url), 3)
        except BadRequest as exc:
            raise PeerError(f"prep answered {url!r}, not a message URL") from exc
        self.job.write_whole_note("relay_id", str(url))  # durable before the commit
        if self.job.attachments():  # uploads take a while: worth a status line
            self.job.say("run", f"prepared {url}")
        else:  # the commit follows at once: only the log (a status line costs the daemon)
            self.job.log(f"run prepared {url}")
        return str(url)

    def upload_attachments(self, url: str) -> None:
        paths = self.job.attachments()
        if paths and not self.known_prep:
            self.check_still_prep(url)
        for path in paths:
            want = local_md5(path)
            have = self.far_attachments.get(path.name) or {}
            if isinstance(have, dict) and have.get("md5") == want:
                continue  # uploaded before a restart
            answer = self.upload(url, path)
            echoed = answer.split("-", 1)[0]
            if echoed != want:
                raise PeerError(f"attachment {path.name}: MD5 mismatch (ours {want}, "
                                f"far end got {echoed}); not committed")
            self.job.say("run", f"attached {path.name} ({path.stat().st_size} bytes)")

    def upload(self, url: str, path: Path) -> str:
        """Upload one attachment; the far end's answer (its MD5 first)."""
        vanished = f"{url} vanished during its upload; preparing again"
        try:
            return str(self.peer.upload(f"{url}/attach/new", path))
        except PeerUnknown as exc:  # an rqsys far end: 404
            raise PeerError(vanished) from exc
        except PeerRefused:  # RQ's "cannot find message": lost since, or no longer in prep
            try:
                self.far_state(url)
            except PeerUnknown as exc:
                raise PeerError(vanished) from exc
            raise

    def check_still_prep(self, url: str) -> None:
        """A far end that ignored ``_method: prep`` has queued the message already."""
        state = self.far_state(url)[0]
        if state != "prep":
            raise RelayIncomplete(f"far end queued {url} at once ({state}, not prep): it runs "
                                  "without its attachments; not relayed")

    def commit(self, url: str) -> bool:
        """Commit the far message; whether the far end answered ``ok`` (then a
        message without attachments needs no check: it is committed, and whole)."""
        try:
            self.peer.post_form(url, {"_method": "commit"})
            return True
        except PeerUnknown as exc:
            raise PeerError(f"{url} vanished before its commit; preparing again") from exc
        except PeerRefused:
            try:
                state = self.far_state(url)[0]
            except PeerUnknown as exc:  # RQ's "cannot find message" for one it lost
                raise PeerError(f"{url} vanished at its commit; preparing again") from exc
            if state not in COMMITTED_STATES:
                raise  # RQ says "cannot find message" for one it has already committed
            return False

    def verify(self, url: str) -> None:
        """Relayed only when the far end shows the message committed and whole."""
        state, info = self.far_state(url)
        if state not in COMMITTED_STATES:
            raise PeerError(f"{url} is {state!r} after its commit; trying again")
        far = info["_attachments"]
        for path in self.job.attachments():
            want, have = local_md5(path), far.get(path.name) or {}
            got = have.get("md5") if isinstance(have, dict) else None
            if got != want:
                raise RelayIncomplete(
                    f"far message {url} is {state} without attachment {path.name} "
                    f"(far MD5 {got or 'none'}, ours {want}); not relayed")

    def far_state(self, url: str) -> tuple[str | None, dict[str, Any]]:
        """The far message's state and JSON (``state.json`` asked when the JSON lacks it)."""
        info = self.peer.get_json(f"{url}.json")
        info = info if isinstance(info, dict) else {}
        info["_attachments"] = info.get("_attachments") or {}
        if not isinstance(info["_attachments"], dict):  # name -> {md5, size}
            raise PeerError(f"{url}.json: _attachments is not an object; asking again later")
        state = info.get("state")
        if not isinstance(state, str):
            state = state_of(self.peer.get_json(f"{url}/state.json"))
        return state, info

    def step(self) -> None:
        """Before a step that changes the far end: stop if our process is gone."""
        if self.cancel.is_set():
            raise Cancelled("the relay's process is gone")

    def hold(self, step: str) -> None:
        """Fault injection for tests: stop after ``step`` once, until killed."""
        if self.job.env.get("RELAY_HOLD_AT") != step or self.job.read_note(f"held-{step}"):
            return
        self.job.write_note(f"held-{step}", str(self.job.pid))
        self.cancel.wait()
        self.step()


def target_queue_url(dest: str, host: str) -> str:
    """The far queue's URL: ``dest`` itself, or this host's URL for a forced local name."""
    remote = dest.startswith(("http://", "https://"))
    url = dest.rstrip("/") if remote else f"{host.rstrip('/')}/q/{dest}"
    try:
        url_parts(url, 2)
    except BadRequest as exc:
        raise PeerRefused(f"dest {dest!r} is not a queue URL (http://host:port/q/name)") from exc
    return url


def state_of(answer: Any) -> str | None:
    """The state in a ``state.json`` answer: ``{"state": s}``, ``["ok", s]`` or ``s``."""
    if isinstance(answer, dict):
        answer = answer.get("state")
    elif isinstance(answer, list) and len(answer) == 2 and answer[0] == "ok":
        answer = answer[1]
    return answer if isinstance(answer, str) else None


def url_parts(url: str, n: int) -> list[str]:
    """The last ``n`` path parts of a queue (2) or message (3) URL: ``q, name[, id]``."""
    parts = [p for p in urlsplit(url).path.split("/") if p][-n:]
    if (len(parts) != n or parts[0] != "q" or not url.startswith(("http://", "https://"))
            or not url.isascii()):  # an HTTP request line carries ASCII alone
        raise BadRequest(f"not a {'queue' if n == 2 else 'message'} URL: {url!r}")
    check_queue_name(parts[1])
    if n == 3:
        check_msg_id(parts[2])
    return parts


def local_md5(path: Path) -> str:
    """The MD5 recorded when the attachment was stored (computed if missing)."""
    return QueueStore.attachment_md5(path).strip() or file_md5(path)


def relay(job: Job, conns: Connections | None = None, cancel: Cancel | None = None) -> int:
    """Relay the job's message; the script's exit code (RQ's exit rules)."""
    try:
        return Relay(job, conns, cancel).run()
    except PeerError as exc:
        return job.resend(str(exc))
    except (PeerRefused, PeerUnknown, RelayLoop, RelayIncomplete) as exc:
        job.say("err", str(exc))
        return 0
    except Exception as exc:  # noqa: BLE001 - a far end's answer we did not foresee, or a bug
        job.log(traceback.format_exc())
        return job.resend(f"relay failed: {type(exc).__name__}: {exc}")


def main() -> int:
    return relay(Job(), Connections())  # one process, one message: its requests share one


if __name__ == "__main__":
    sys.exit(main())
