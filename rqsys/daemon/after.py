"""Dependencies: queued messages that wait for the messages named in their
``after`` (URLs, here or on other hosts) to be ``done``.

A waiting message stays in ``que`` (status ``waiting for N``), parked in
the schedule.  Its dependencies' ends come from three places, none polled
by the loop: this queue's own ends (an ``EventLog`` sink), another local
queue's through its daemon's ``watch`` op and another host's by a bounded
poll, both on the follower's thread (``afterwatch``).  A dependency ending
in ``err`` fails the waiting message (``que → err``, with the reason)
unless its ``after_policy`` is ``wait``; a deleted or unknown one
(``gone``) always fails it.  ``relayed`` counts as done.

Nothing of the waiting is written: at start each queued message's
dependencies are looked at again (recovery derives the waiting state from
the message and its dependencies' states).
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rqsys import tunables
from rqsys.daemon.afterwatch import Follower, check_all
from rqsys.errors import BadRequest, NotFound, RQError
from rqsys.message import split_message_url
from rqsys.observe.events import listening
from rqsys.store import MSG_ID_RE, QueueStore, QueueView
from rqsys.wire.client import is_local_url

if TYPE_CHECKING:
    from rqsys.background import Background
    from rqsys.daemon.context import QueueContext
    from rqsys.daemon.server import Reply, Request
    from rqsys.daemon.transitions import Transitions
    from rqsys.observe.events import EventLog

Msg = dict[str, Any]
SATISFIED = ("done", "relayed")
CHECKS = "after"  # the background lane asking other hosts about new messages' dependencies
RECHECK = 30.0  # a dependency in err elsewhere, for a message that waits anyway: looked at again


class After:
    """The waiting messages of one queue and what each still waits for."""

    def __init__(self, ctx: QueueContext, store: QueueStore, transitions: Transitions,
                 log: EventLog, selector: selectors.BaseSelector, background: Background
                 ) -> None:
        self.ctx, self.store, self.selector = ctx, store, selector
        self.transitions, self.ledger = transitions, transitions.ledger
        self.check_deadline = tunables.seconds_from_env(tunables.AFTER_CHECK_DEADLINE_ENV,
                                                        tunables.AFTER_CHECK_DEADLINE)
        self.background = background
        self.waits: dict[str, set[str]] = {}  # waiting id -> URLs not done yet
        self.waiters: dict[str, set[str]] = {}  # URL -> waiting ids
        self.ended: list[tuple[str, str, str]] = []  # (URL, state, status) to apply
        self.later: list[tuple[str, str, str]] = []  # for messages being rewritten: next turn
        self.follower: Follower | None = None
        self.following: set[str] = set()  # URLs the follower was asked about, not yet told
        log.sinks.append(self._sink)

    # ------------------------------------------------------------ at create
    def normalise(self, msg: Msg) -> list[str]:
        """``msg["after"]`` as full URLs (a bare id: this queue's); refuses
        what can be refused here, and returns the remote URLs to check."""
        urls = [self.ctx.url(u) if MSG_ID_RE.match(u) else u for u in msg.get("after", [])]
        msg["after"] = urls
        remote = []
        for url in urls:
            try:
                where = self._local(url)
            except BadRequest as exc:
                raise BadRequest(f"after: {exc}") from exc
            if where is None:
                remote.append(url)
            elif self._state(*where) == "gone":
                raise BadRequest(f"after: no message {url}")
        return remote

    def check_remote(self, urls: list[str], r: Request, create: Callable[[], Reply | None]
                     ) -> None:
        """Ask the hosts of ``urls`` whether they know them (off the loop), then
        ``create`` and answer, or answer why not."""
        def then(_result: Any, error: BaseException | None) -> None:
            try:
                if error is not None:
                    raise error
                reply = create()
            except Exception as exc:  # the client hears it; the loop goes on
                r.fail(exc)
                return
            if reply is not None:
                r.answer(reply)

        deadline = time.monotonic() + self.check_deadline  # from its arrival, not its turn
        self.background.submit(lambda: check_all(urls, deadline), then, CHECKS)

    def _local(self, url: str) -> tuple[str, str] | None:
        """(queue, id) when ``url`` is a message of this host, else None."""
        queue, msg_id = split_message_url(url)
        return (queue, msg_id) if is_local_url(url, self.ctx.sysconfig) else None

    def _state(self, queue: str, msg_id: str) -> str:
        """A local message's state now (a few stats), ``gone`` when there is none."""
        if queue == self.ctx.name and msg_id in self.ledger.running:
            return "run"
        store = self.store if queue == self.ctx.name else QueueView(
            self.ctx.layout.queue_dir(queue))
        try:
            return store.find(msg_id)
        except (NotFound, RQError, OSError):
            return "gone"

    # ------------------------------------------------------------ waiting
    def on_queued(self, msg_id: str, msg: Msg) -> None:
        """A message came into que (created, committed, retried, loaded): it
        waits until its dependencies are done."""
        urls = set(msg.get("after") or ())
        if not urls:
            return
        self.waits[msg_id] = set(urls)
        self.transitions.wait_for_others(msg_id, True)
        for url in urls:
            self.waiters.setdefault(url, set()).add(msg_id)
            try:
                self._look(url)
            except RQError as exc:  # not a message URL (a file edited by hand)
                self.ended.append((url, "gone", str(exc)))
        self._show(msg_id)

    def _look(self, url: str, delay: float = 0.0) -> None:
        where = self._local(url)
        if where is not None and where[0] == self.ctx.name:
            state = self._state(*where)
            if state in (*SATISFIED, "err", "gone"):
                self.ended.append((url, state, self.store.read_status(state, where[1])
                                   if state != "gone" else ""))
            return  # else its end comes through the sink
        if url not in self.following:
            self.following.add(url)
            self._follower().follow(url, delay)

    def _follower(self) -> Follower:
        if self.follower is None:
            self.follower = Follower(self.ctx.layout, self._local)
            self.selector.register(self.follower, selectors.EVENT_READ,
                                   lambda _k, _m: self._followed())
        return self.follower

    def _followed(self) -> None:
        if self.follower is not None:
            for ended in self.follower.take():
                self.following.discard(ended[0])
                self.ended.append(ended)

    @listening(*SATISFIED, "err", "deleted")
    def _sink(self, kind: str, text: str, msg_id: str, fields: dict[str, Any]) -> None:
        """This queue's own events: an end of a dependency, a waiting one deleted."""
        if kind == "deleted" and msg_id:
            self._forget(msg_id)
            kind = "gone"
        elif kind not in (*SATISFIED, "err") or fields.get("RQ_STATE") != kind:
            return
        if not self.waiters:
            return  # nothing waits for any message: no URL made for each end
        url = self.ctx.url(msg_id)
        if url in self.waiters:
            self.ended.append((url, kind, text))

    # ------------------------------------------------------------ a loop phase
    def settle(self) -> None:
        """Apply the dependencies' ends heard of (a failure may fail others in turn)."""
        self.ended, self.later = self.later + self.ended, []
        while self.ended:
            url, state, status = self.ended.pop(0)
            for msg_id in sorted(self.waiters.get(url, ())):
                self._apply(msg_id, url, state, status)
        if self.follower is not None and not self.waits:
            self.selector.unregister(self.follower)
            self.follower.close()
            self.follower = None
            self.following.clear()

    def _apply(self, msg_id: str, url: str, state: str, status: str) -> None:
        if msg_id not in self.ledger.schedule:  # out while run_now rewrites it: once back
            self.later.append((url, state, status))
            return
        if state in SATISFIED:
            self._met(msg_id, url)
            return
        why = f"dependency {url} ended in {state}" + (f": {status}" if status else "")
        if state == "gone":
            why = f"dependency {url} is gone" + (f" ({status})" if status else "")
        policy = self.ledger.schedule.msgs.get(msg_id, {}).get("after_policy", "fail")
        if state == "err" and policy == "wait":
            self._show(msg_id, f" ({why}; waiting for a retry)")
            where = self._local(url)
            if where is None or where[0] != self.ctx.name:  # else the sink tells its retry's end
                self._look(url, RECHECK)
            return
        self._forget(msg_id)
        self.transitions.fail_queued(msg_id, why)

    def _met(self, msg_id: str, url: str) -> None:
        self.waits.get(msg_id, set()).discard(url)
        self.waiters.get(url, set()).discard(msg_id)
        if not self.waiters.get(url, True):
            del self.waiters[url]
        if self.waits.get(msg_id):
            self._show(msg_id)
            return
        self.waits.pop(msg_id, None)
        self.store.write_status("que", msg_id, "")
        self.transitions.wait_for_others(msg_id, False)

    def _forget(self, msg_id: str) -> None:
        for url in self.waits.pop(msg_id, ()):
            self.waiters.get(url, set()).discard(msg_id)
            if not self.waiters.get(url, True):
                del self.waiters[url]
        self.transitions.wait_for_others(msg_id, False, wake=False)

    def _show(self, msg_id: str, more: str = "") -> None:
        self.store.write_status("que", msg_id, f"waiting for {len(self.waits[msg_id])}{more}")

    def close(self) -> None:
        if self.follower is not None:
            self.follower.close()
