"""A pool queue's host at work: it pulls only as many messages as it has free
workers, materialises each in its own store (``que/``, then ``run/`` as any
message), extends the ack deadline while it runs (on each turn that saw a
new status line, and every third of ``ack_wait``), acks once the store has
recorded and flushed the end, and naks with the delay of a ``resend``.

A message pulled here is *held* (its NATS delivery kept for the ack) from
the fetch until its end is acked or it is handed back.  What the local
store does with it is the daemon's usual business (``transitions``); this
class only watches which held messages are no longer queued or running, and
hands their ends to ``rqsys.pool.acks``; a redelivery waits for
``rqsys.pool.redelivery`` to say whether it runs, and a staged message for
``rqsys.pool.admission`` to have its places in the pool's limits.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from typing import Any

from rqsys.errors import BadRequest, NotFound
from rqsys.message import due_time
from rqsys.pool import batchends, unique
from rqsys.pool.acks import RETRY, SEND_TIMEOUT, Acks
from rqsys.pool.admission import Admission
from rqsys.pool.bridge import Bridge, why
from rqsys.pool.files import BadAttachment, PoolFiles, specs_of
from rqsys.pool.handback import HandBack
from rqsys.pool.insist import Insist
from rqsys.pool.limits import Places
from rqsys.pool.link import Link, NatsMsg
from rqsys.pool.parts import QueueParts
from rqsys.pool.redelivery import Redeliveries
from rqsys.store import Staged
from rqsys.store.layout import ENDED_STATES, TMP_DIR, check_msg_id

FETCH_WAIT = 1.0  # seconds a fetch waits for a first message (then the loop asks again)


class PoolWorker:
    """Pulls, materialises, extends, acks and naks one host's pool messages."""

    def __init__(self, parts: QueueParts, bridge: Bridge, link: Link) -> None:
        self.ctx, self.store, self.log = parts.ctx, parts.store, parts.log
        self.transitions, self.ledger = parts.transitions, parts.transitions.ledger
        self.intake, self.runner = parts.intake, parts.runner
        self.bridge, self.link = bridge, link
        self.held: dict[str, NatsMsg] = {}
        self.placing: set[str] = set()  # staged, waiting for the group commit
        self.singles: dict[str, str] = {}  # placing -> its single key, let go once stored here
        self.seen: dict[str, str] = {}  # last status line of each running held message
        self.fetching = False
        self.progress_at = 0.0
        self.fetch_at = 0.0  # a failed fetch is retried from then
        self.files = PoolFiles(link)
        self.acks = Acks(self.store, link, bridge, self.files, self.log)
        self.redeliveries = Redeliveries(link, bridge, self.log, self._run_redelivery,
                                         self._skip_redelivery, self._let_go)
        self.insist = Insist(bridge, self.log)  # single keys let go, places given back
        self.admission = Admission(self.ctx, Places(link), bridge, self.insist, self.log,
                                   self._late)
        self.hand_back = HandBack(parts, bridge, self.files)  # at start, before any pull
        self.load: tuple[int, float] = (-1, 0.0)  # in flight last told the pool, and when
        self.attached: dict[str, list[dict[str, Any]]] = {}  # attachments of held messages

    # ------------------------------------------------------------ each turn
    def turn(self) -> None:
        self._settle()
        self.acks.turn()
        now = time.monotonic()
        self.redeliveries.turn(now)
        self.insist.turn(now)
        self.admission.turn(now, self.ledger.schedule.__contains__, self.runner.workers)
        self._extend(now)
        self._tell_load(now)
        self._pull()

    def _tell_load(self, now: float) -> None:
        """This host's messages in flight into the bucket: when it changes (at most
        once a second) and every third of ack_wait (that says the host is alive)."""
        told, at = self.load
        if now - at < (1.0 if len(self.held) != told else self.link.s.ack_wait / 3):
            return
        self.load = (len(self.held), now)
        self.bridge.submit(self.link.record_load(len(self.held)))

    def next_wait(self, now: float) -> float | None:
        waits = [self.progress_at - now] if self.held else []
        told, at = self.load
        waits.append(at + (1.0 if len(self.held) != told else self.link.s.ack_wait / 3) - now)
        for wait in (self.acks.wait(now), self.redeliveries.wait(now), self.insist.wait(now),
                     self.admission.wait(now)):
            if wait is not None:
                waits.append(wait)
        if not self.fetching and self.fetch_at > now:
            waits.append(self.fetch_at - now)
        return min(waits) if waits else None

    def _free(self) -> int:
        if not self.runner.can_start():
            return 0
        taken = len(self.runner.workers) + len(self.ledger.schedule) + len(self.placing)
        return int(self.ctx.config["num_workers"]) - taken

    def _pull(self) -> None:
        free = self._free()
        if (self.fetching or free <= 0 or self.hand_back.pending
                or time.monotonic() < self.fetch_at):
            return
        self.fetching = True
        self.bridge.submit(self.link.fetch(free, FETCH_WAIT), self._fetched)

    def _fetched(self, msgs: Any, error: BaseException | None) -> None:
        self.fetching = False
        if error is not None:
            self.log.event("err", f"pool: fetch failed: {why(error)}")
            self.fetch_at = time.monotonic() + RETRY
            return
        for msg in msgs:
            try:
                self._take(msg)
            except (ValueError, KeyError, TypeError, BadRequest) as exc:  # the message itself
                self.log.event("err", f"pool: a message that cannot be taken is dropped "
                               f"from the pool: {type(exc).__name__}: {exc}")
                self.bridge.submit(self.link.term(msg))
            except Exception as exc:  # noqa: BLE001 - this host's trouble (a full disk)
                self._not_taken(msg)
                self.log.event("err", f"pool: cannot take a message here: {why(exc)}; "
                               f"back to the pool, for any host, in {RETRY:g} s")
                self.bridge.submit(self.link.nak(msg, RETRY))

    def _not_taken(self, delivery: NatsMsg) -> None:
        """Undo a take that failed half-way: no worker kept for it, nothing staged."""
        msg_id = json.loads(delivery.data)["msg_id"]  # parsed before: _take got past it
        if self.held.get(msg_id) is delivery:
            del self.held[msg_id]
            self.placing.discard(msg_id)
            self.singles.pop(msg_id, None)
            self.attached.pop(msg_id, None)
        shutil.rmtree(f"{self.store.qdir}/{TMP_DIR}/{msg_id}.que", ignore_errors=True)

    # ------------------------------------------------------------ a message arrives
    def _take(self, delivery: NatsMsg) -> None:
        msg = json.loads(delivery.data)
        msg_id = check_msg_id(msg["msg_id"])
        if msg_id in self.held:  # redelivered while held: acks go to the newest delivery
            self.held[msg_id] = delivery
            self.redeliveries.newer(msg_id, int(delivery.metadata.num_delivered) - 1)
            return
        delay = due_time(msg) - time.time()
        if delay > 1:
            self.bridge.submit(self.link.nak(delivery, delay))  # not due: back until then
            return
        state = self._local_state(msg_id)
        if state in ENDED_STATES:
            self.log.event("pool", f"delivered again after it ended here ({state}): "
                           "acked, not run again", msg_id)
            self.acks.add(msg_id, delivery, [], None, batch=batchends.end_of(msg, state))
            return
        if state:  # its local copy is being handed to the pool: take it after that
            self.bridge.submit(self.link.nak(delivery, RETRY))
            return
        if int(delivery.metadata.num_delivered) > 1:  # ended elsewhere, its ack lost?
            self.held[msg_id] = delivery
            self.placing.add(msg_id)  # a worker is kept for it meanwhile
            self.redeliveries.add(msg_id, msg, int(delivery.metadata.num_delivered) - 1)
            return
        self._materialise(msg_id, msg, delivery, specs_of(delivery.headers))

    def _run_redelivery(self, msg_id: str, msg: dict[str, Any]) -> None:
        self.placing.discard(msg_id)
        delivery = self.held.pop(msg_id)  # the newest, if it came again meanwhile
        self._materialise(msg_id, msg, delivery, specs_of(delivery.headers))

    def _skip_redelivery(self, msg_id: str, record: dict[str, Any]) -> None:
        """Another host ended it and lost its ack: running it again would be a duplicate."""
        self.placing.discard(msg_id)
        self.log.event("pool", f"delivered again after it ended on {record.get('host')} "
                       f"({record['state']}): acked, not run again", msg_id)
        self.acks.add(msg_id, self.held.pop(msg_id), [], None,
                      batch=batchends.end_of(record.get("msg"), str(record["state"])))

    def _let_go(self, msg_id: str) -> None:
        """A delivery another host has a later one of: neither run, acked nor naked."""
        self.placing.discard(msg_id)
        self.held.pop(msg_id)

    def _local_state(self, msg_id: str) -> str:
        try:
            return self.store.find(msg_id)
        except NotFound:
            return ""

    def _materialise(self, msg_id: str, msg: dict[str, Any], delivery: NatsMsg,
                     specs: list[dict[str, Any]]) -> None:
        """Into this store's que/ (the group commit places it; a turn starts it),
        once its attachments, if any, are fetched from the object store."""
        count = int(delivery.metadata.num_delivered) - 1  # RQ_COUNT shows redeliveries
        msg = dict(msg, count=count, due=0)
        tmp = f"{self.store.qdir}/{TMP_DIR}/{msg_id}.que"
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crash while it was staged
        os.mkdir(tmp)
        self.held[msg_id] = delivery
        self.placing.add(msg_id)
        single = (delivery.headers or {}).get(unique.SINGLE_HEADER)
        if single:  # let go once stored here (no longer queued in the pool: _placed)
            self.singles[msg_id] = single
        # Its timeline says which delivery this is: a redelivery is a second run
        staged = Staged(msg_id, tmp, msg, origin=f"pool {self.link.s.pool} delivery {count + 1}")
        if not specs:
            self._stage(staged)
            return
        self.attached[msg_id] = specs
        self.bridge.submit(self.files.fetch(msg_id, specs, staged.attach_dir()),
                           self._files_fetched(staged))

    def _stage(self, staged: Staged) -> None:
        """Placed in que/ once it has its places in the pool's limits (if any)."""
        self.admission.ask(staged.msg_id, staged.msg, lambda: self._place(staged),
                           lambda delay, why: self._hand_back(staged, delay, why))

    def _place(self, staged: Staged) -> None:
        self.intake.add_placed(staged, "que", self._placed(staged.msg_id))
        self._record(staged.msg_id, staged.msg, "run", f"taken by {self.ctx.sysconfig['host']}")

    def _files_fetched(self, staged: Staged) -> Any:
        def then(_result: Any, error: BaseException | None) -> None:
            if error is None:
                self._stage(staged)
                return
            if isinstance(error, BadAttachment):
                self._refuse(staged, str(error))
                return
            self._hand_back(staged, RETRY, f"attachments not fetched ({why(error)})", "err")
        return then

    def _hand_back(self, staged: Staged, delay: float, why: str, kind: str = "pool") -> None:
        """A staged message goes back to the pool, for any host, in ``delay`` s."""
        msg_id = staged.msg_id
        self.store.discard(staged)
        self.placing.discard(msg_id)
        self.singles.pop(msg_id, None)  # still queued in the pool: its single key stays
        self.attached.pop(msg_id, None)
        self.log.event(kind, f"pool: {why}: handed back", msg_id)
        self.bridge.submit(self.link.nak(self.held.pop(msg_id), delay))

    def _refuse(self, staged: Staged, why: str) -> None:
        """A message that cannot run as sent ends err here, unrun: placed in que/
        without its files, then failed (so it is in this host's err/, and its
        end is recorded and acked as any end)."""
        status = f"not run: {why}"
        self.log.event("err", f"pool: {status}", staged.msg_id)
        shutil.rmtree(f"{staged.tmp}/attach", ignore_errors=True)  # what came is not kept
        staged.attached = False
        self.intake.add_placed(staged, "que", self._placed(staged.msg_id, status))

    def _placed(self, msg_id: str, refused: str = "") -> Any:
        def then(error: BaseException | None) -> None:
            self.placing.discard(msg_id)
            single = self.singles.pop(msg_id, None)
            if error is not None:  # still queued in the pool: its single key stays
                self.log.event("err", f"pool: not stored here, handed back: {error}", msg_id)
                self.admission.done(msg_id, started=False)
                self.bridge.submit(self.link.nak(self.held.pop(msg_id), 1.0))
                return
            if single:  # taken: a new single message may be made
                self.insist.submit(lambda: unique.release(self.link.kv, single, msg_id, 0),
                                     "single key not let go", msg_id)
            if refused:  # before this turn starts anything
                self.transitions.fail_queued(msg_id, refused, kind="attachment")
        return then

    # ------------------------------------------------------------ a message ends
    def settle_ends(self) -> None:
        """At stop: held messages that ended after the last turn (in the stop's
        grace) go to the acks; the rest are handed back by ``final``."""
        for msg_id in list(self.held):
            if msg_id not in self.placing and msg_id not in self.ledger.running:
                state = self._local_state(msg_id)
                if state in ENDED_STATES:
                    self._ended(msg_id, state)

    def _settle(self) -> None:
        """Held messages neither queued, placing nor running here have ended."""
        running, queued = self.ledger.running, self.ledger.schedule
        for msg_id in list(self.held):
            if (msg_id in running or msg_id in queued or msg_id in self.placing
                    or self.ledger.busy(msg_id)):
                continue
            self._ended(msg_id, self._local_state(msg_id))

    def _ended(self, msg_id: str, state: str) -> None:
        delivery, specs = self.held.pop(msg_id), self.attached.pop(msg_id, [])
        self.seen.pop(msg_id, None)
        self.admission.done(msg_id)  # its places given back
        if state == "que":  # a resend: back to the pool with its delay, for any host
            self._resend(msg_id, delivery)
            return
        if not state:  # deleted here
            self.acks.add(msg_id, delivery, specs, None,
                          batch=batchends.end_of(batchends.msg_in(delivery.data), ""))
            return
        status, msg = self.store.read_status(state, msg_id), self.store.read_msg(state, msg_id)
        key = unique.kv_key(msg)  # free at the end, or held unique_for more seconds
        self.acks.add(msg_id, delivery, specs, self._record_of(msg_id, msg, state, status, specs),
                      None if key is None else (key, float(msg.get("unique_for") or 0)),
                      batchends.end_of(msg, state))

    def _resend(self, msg_id: str, delivery: NatsMsg, status: str = "") -> None:
        msg = self.store.read_msg("que", msg_id)
        delay = max(0.0, due_time(msg) - time.time())
        self.transitions.delete(msg_id, lambda _error: None)
        self.bridge.submit(self.link.nak(delivery, delay))
        self._record(msg_id, msg, "que", status or f"resend in {delay:.0f}s (any host)")

    def _late(self, msg_id: str, why: str) -> bool:
        """A queued message holding places it did not use in time goes back to
        the pool (False: not now, a client is changing it)."""
        if self.ledger.busy(msg_id):
            return False
        delivery = self.held.pop(msg_id)
        self.attached.pop(msg_id, None)
        self.seen.pop(msg_id, None)
        self.log.event("pool", f"{why}: handed back", msg_id)
        self._resend(msg_id, delivery, f"handed back: {why}")
        return True

    # ------------------------------------------------------------ while it runs
    def _extend(self, now: float) -> None:
        """In-progress acks: for new status lines, and all held ones periodically."""
        due = [i for i, w in self.runner.workers.items()
               if i in self.held and self.seen.get(i) != w.status]
        for msg_id in due:
            self.seen[msg_id] = self.runner.workers[msg_id].status
        if now >= self.progress_at and self.held:
            due = list(self.held)
            self.progress_at = now + self.link.s.ack_wait / 3
        if due:
            self.bridge.submit(self.link.progress([self.held[i] for i in due]))

    def _record(self, msg_id: str, msg: dict[str, Any], state: str, status: str) -> None:
        record = self._record_of(msg_id, msg, state, status, self.attached.get(msg_id, []))
        self.bridge.submit(self.link.record(msg_id, record), self._recorded(msg_id))

    def _record_of(self, msg_id: str, msg: dict[str, Any], state: str, status: str,
                   specs: list[dict[str, Any]]) -> dict[str, Any]:
        """The message's entry in the pool's bucket (what lookups from every host show)."""
        return {"state": state, "host": self.ctx.sysconfig["host"], "status": status,
                "count": msg.get("count", 0), "url": self.ctx.url(msg_id), "msg": msg,
                "attachments": {s["name"]: s for s in specs}}

    def _recorded(self, msg_id: str) -> Any:
        def then(_result: Any, error: BaseException | None) -> None:
            if error is not None:  # not tried again: a late record would hide a newer one
                self.log.event("err", f"pool: state not recorded: {error}", msg_id)
        return then

    # ------------------------------------------------------------ stop
    async def final(self) -> None:
        """On the bridge, at stop: ack every end (the store is flushed), nak the
        rest, and tell the pool this host has stopped (0 in flight)."""
        await asyncio.gather(self.acks.final(), self.insist.final(),  # each at most 3 s
                             self.admission.final())
        for delivery in self.held.values():
            await self.link.nak(delivery, 0)
        await asyncio.wait_for(self.link.record_load(0, stopped=True), SEND_TIMEOUT)
        await self.link.close()
