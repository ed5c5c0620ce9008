"""Where a message changes state: the only place in the daemon that moves one.

A message's state is the store directory it is in (``rqsys.store.STATES``);
``new`` is a message staged in ``.tmp/`` and ``gone`` a deleted one.  Each
method below is one transition, commented ``src → dest``: it checks that the
message is where the transition starts (its guard), moves it in the store and
keeps the daemon's picture in step: the que in memory (``Schedule``), the
messages running, and the counts of the other states, which only this class
changes.

    new  → que | prep            placed        a create, clone or dup
    prep → que                   commit
    que  → run                   start_next    a script starts
    que  → done | relayed        end           a rider of a primary that ended so
    run  → que                   unstart       the script could not be started
    run  → que                   end           resend, or requeued at stop (rewrite first)
    run  → done | err | relayed  end
    que  → err                   unreadable    at start (queload; run → que is recovery's)
    que  → err                   cancel        cancelled (``cancelled by <who>``)
    que  → err                   fail_queued   a message it waits for failed (``after``),
                                               a pool message's file did not arrive whole
    que  → que                   run_now       due now (rewrite first)
    err  → que                   retries.retry a client's retry of a failed message
    any  → gone                  delete, prune, end (destroyed while running)

Durability is the store's table (``rqsys.store``): a rewrite of ``msg`` that
must be on disk before the move (resend) or the answer (run_now), and the
directory syncs an answer waits for (commit), are handed to the background
``sync`` lane, so the loop never waits for the disk; meanwhile the message is
*busy*: no other transition takes it, and a client's delete or run_now of it
waits until the rewrite is durable (a moment), then runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rqsys.daemon.gates import Gate
from rqsys.daemon.ledger import (
    COUNTED,
    MOVES,
    Done,
    Ended,
    Ledger,
    Msg,
    Offload,
    Riders,
    batch_of,
    guard,
)
from rqsys.daemon.removals import Removals
from rqsys.daemon.retries import Retries
from rqsys.errors import BadRequest, NoSpace, RQError
from rqsys.run.verdict import Outcome
from rqsys.store import Staged
from rqsys.store.durable import fsync_dirs

__all__ = ["COUNTED", "MOVES", "Done", "Ended", "Ledger", "Msg", "Offload", "Riders",
           "Transitions", "batch_of"]


class Transitions:
    """Every state change of the daemon's messages, kept in step with their
    picture (``ledger``); err → que, a client's retry, is ``retries``'s."""

    def __init__(self, ledger: Ledger, offload: Offload, slow: Offload | None = None) -> None:
        self.ledger, self.store, self.log = ledger, ledger.store, ledger.log
        self.moments = ledger.moments
        self._offload = offload  # runs work on the sync lane, then a callback on the loop
        self._slow = slow or offload  # the same, on a lane of its own (prunes)
        self.retries = Retries(ledger, offload)
        self.removals = Removals(ledger, offload, self._slow)

    # ------------------------------------------------------------ start-up
    def unreadable(self, msg_id: str, error: RQError) -> None:
        """que → err: a queued message nobody can read cannot run (found at start,
        ``rqsys.daemon.queload``)."""
        self.log.event("err", f"unreadable queued message moved to err: {error}", msg_id,
                       RQ_STATE="que")
        self.store.write_status("que", msg_id, f"unreadable message: {error}")
        if self.ledger.moved(msg_id, "que", "err"):
            self.ledger.counted("err", 1)

    # ------------------------------------------------------------ creation
    def placed(self, batch: list[Staged], state: str) -> tuple[list[Staged], OSError | None]:
        """new → que | prep: published messages renamed into place; those a
        failed rename left durable in ``.tmp/``, and why (placed later)."""
        guard(state in ("que", "prep"), f"a new message cannot go to {state}")
        left, error = self.store.place(batch, state)
        for staged in batch[:len(batch) - len(left)]:
            self.ledger.placed_blank(staged.msg_id)
            for hook in self.moments.placed:
                hook(staged.msg_id, staged.msg, state)
            if state == "prep":
                self.ledger.counted("prep", 1)
            else:
                self.ledger.queued(staged.msg_id, staged.msg)
            self.log.event("created", f"in {state}", staged.msg_id, RQ_STATE=state,
                           RQ_BY=staged.origin)
        return left, error

    def commit(self, msg_id: str, done: Done) -> None:
        """prep → que; ``done`` is called once the move is durable.  While a
        bulk move sends the message away, the commit waits for its answer (it
        was committed here while its copy went there: it ran twice)."""
        if self.ledger.wait_while_busy(msg_id, lambda: self.commit(msg_id, done), done):
            return
        state = self.store.find(msg_id)
        if state != "prep":
            raise BadRequest(f"message {msg_id} is in {state}, not prep")
        self.ledger.move(msg_id, "prep", "que")
        self.log.record("committed", msg_id, RQ_STATE="que")
        self.ledger.counted("prep", -1)
        self.ledger.queued(msg_id, self.store.read_msg("que", msg_id))
        dirs = [self.store.state_dir("que"), self.store.state_dir("prep")]  # destination first
        self._offload(lambda: fsync_dirs(dirs), lambda _r, error: done(error))

    # ------------------------------------------------------------ running
    def start_next(self, now: float) -> tuple[str, Msg, Msg] | None:
        """que → run: the next due message its gate lets start, or None."""
        while (picked := self.ledger.pop_ready(now)) is not None:
            msg_id, queued = picked
            guard(msg_id not in self.ledger.running, f"{msg_id} is running already")
            try:
                if self.ledger.moved(msg_id, "que", "run"):
                    break
            except NoSpace:  # a full disk seen first here: it waits in que for room
                self.ledger.requeue(msg_id, queued)
                return None
            self.ledger.dropped(queued)  # its keys' parked messages compete again
        if picked is None:
            return None
        msg = dict(queued, count=int(queued.get("count", 0)))  # RQ's count, raised by end
        self.ledger.begin_run(msg_id, msg, time.time())  # rate windows count from now
        return msg_id, queued, msg

    def wait_for_others(self, msg_id: str, waiting: bool, wake: bool = True) -> None:
        """que → que: it waits for the messages its ``after`` names, or no longer
        (``rqsys.daemon.after``; ``wake``: it competes again now)."""
        self.ledger.wait_for_others(msg_id, waiting, wake)

    def reconfigure(self, gate: Gate, config: dict[str, Any]) -> None:
        """A reload: the que's new gate (the running counted in it), coalesce
        params and room; every parked message competes again."""
        self.ledger.reconfigure(gate, config)

    def slots_outside(self, held: int) -> None:
        """Slots still held by ended runs whose processes are being stopped
        (their scopes): no start takes them meanwhile."""
        self.ledger.outside(held)

    def hold_moving(self, msg_ids: list[str]) -> None:
        """que | prep | done | err | relayed → (held): a bulk move's step is being
        copied to another queue; busy until ``release_moving``."""
        self.ledger.hold_moving(msg_ids)

    def release_moving(self, msg_id: str, then: Callable[[], None] | None = None) -> None:
        """The other queue answered: ``then`` (the delete of one it took), or
        the message stays here as it was."""
        self.ledger.release_moving(msg_id, then)

    def take_from_que(self, msg_id: str) -> Msg | None:
        """que → que: out of the que in memory, its directory left in que/ (a
        pool's hand-back at start, until the pool has it); None: not queued."""
        return self.ledger.unqueue(msg_id)

    def return_to_que(self, msg_id: str, msg: Msg) -> None:
        """que → que: one ``take_from_que`` took is back in the que, as it was."""
        self.ledger.requeue(msg_id, msg)

    def take_blank_status(self, msg_id: str) -> bool:
        """Whether a message that has just started has a blank status file (it
        was placed by this daemon and never ran; loaded ones are not known)."""
        return self.ledger.take_blank(msg_id)

    def coalesce(self, msg_id: str, msg: Msg, url: str) -> None:
        """Queued messages with ``msg``'s coalesce params ride along, whatever
        their due time (RQ's ``handle_dups``): out of the que in memory, left
        in que/ on disk until the primary ends (a crash meanwhile leaves them
        queued).  ``url``: the primary's, for their ``duplicate`` status."""
        riders = self.ledger.take_riders(msg)
        if riders:
            self.ledger.ride(msg_id, url, riders)
            self.log.event("coalesced", f"{len(riders)} queued message(s) ride along", msg_id,
                           RQ_STATE="run", RQ_RIDERS=[rider for rider, _msg in riders])

    def unstart(self, msg_id: str, queued: Msg, why: str) -> None:
        """run → que: its script could not be started; it waits as it was."""
        running = self.ledger.end_run(msg_id)
        guard(running is not None, f"{msg_id} is not running")
        self.store.write_status("run", msg_id, why)
        if self.ledger.moved(msg_id, "run", "que"):
            self.ledger.requeue(msg_id, queued)

    def end(self, msg_id: str, outcome: Outcome, written: str | None) -> list[Ended]:
        """run → done | err | relayed | que | gone, with its riders; returns
        those that ended in done, err or relayed (``written``: what its status
        file holds, not written again; None when not known)."""
        msg = self.ledger.end_run(msg_id)
        guard(msg is not None, f"{msg_id} is not running")
        assert msg is not None
        ended = self._settle(msg_id, msg, outcome, written)
        url, riders = self.ledger.riders_of(msg_id)
        if self.ledger.is_busy(msg_id):  # on its way back to the que (resend): riders wait for it
            self._hold(msg_id, riders)
            return ended or []
        state = outcome.state if ended is not None else "gone"  # gone: riders run on their own
        for rider_id, rider in riders:
            ended = (ended or []) + self._settle_rider(rider_id, rider, state, url)
        return ended or []

    def _hold(self, primary: str, riders: list[tuple[str, Msg]]) -> None:
        """que → que: the riders of a resent primary rejoin the que in the same
        loop turn as it, so the next run of their params takes it along again
        (RQ's resend coalesce); until then they are busy."""
        for rider_id, _rider in riders:
            self.ledger.mark_busy(rider_id, f"waiting for {primary} to be requeued")
        self.ledger.hold_riders(primary, riders)

    def _settle_rider(self, msg_id: str, msg: Msg, state: str, url: str) -> list[Ended]:
        """que → done | relayed as its primary did (RQ: status ``duplicate
        <primary url>``); when the primary did not succeed, it waits again in
        the que and runs on its own."""
        if state not in ("done", "relayed"):
            self.ledger.requeue(msg_id, msg)
            return []
        outcome = Outcome(state, f"duplicate {url}")
        self.ledger.take_blank(msg_id)
        self.store.write_status("que", msg_id, outcome.text)
        self._advisory(self.store.write_count("que", msg_id, int(msg.get("count", 0))), msg_id)
        if not self.ledger.moved(msg_id, "que", state):
            return []
        self.ledger.counted(state, 1)
        self.log.event(state, outcome.text, msg_id, RQ_COUNT=msg.get("count", 0), RQ_STATE=state,
                       **batch_of(msg))
        return [(msg_id, msg, outcome)]

    def _settle(self, msg_id: str, msg: Msg, outcome: Outcome,
                written: str | None = None) -> list[Ended] | None:
        """The end of its run; None when its directory was gone."""
        if outcome.state == "deleted":  # run → gone: destroyed while running
            self._offload(self.store.delete_later(msg_id, "run"), self._log_failed(msg_id))
            self.log.event("deleted", "destroyed while running", msg_id, **batch_of(msg))
            return []
        if outcome.text != written:
            self.store.write_status("run", msg_id, outcome.text)
        msg = dict(msg, count=int(msg.get("count", 0)) + outcome.recount, **outcome.fields)
        if outcome.state == "que":
            self._requeue(msg_id, msg, outcome)
            return []
        # run → done | err | relayed
        guard(outcome.state in ("done", "err", "relayed"), f"no state {outcome.state}")
        self._advisory(self.store.write_count("run", msg_id, msg["count"]), msg_id)
        try:
            if not self.ledger.moved(msg_id, "run", outcome.state):
                return None
        except NoSpace as exc:  # past the spares' room: in run/, run again at the next start
            self.log.event("err", f"{outcome.state} not recorded: {exc}", msg_id)
            return None
        self.ledger.counted(outcome.state, 1)
        self.log.event(outcome.state, outcome.text, msg_id, RQ_COUNT=msg["count"],
                       RQ_STATE=outcome.state, **batch_of(msg),
                       **({"RQ_KIND": outcome.kind} if outcome.kind else {}),
                       **({"RQ_LAST_LINE": outcome.last_line} if outcome.last_line else {}),
                       **({"RQ_LAST_LINES": outcome.tail} if outcome.tail else {}))
        return [(msg_id, msg, outcome)]

    def _log_failed(self, msg_id: str) -> Callable[[Any, BaseException | None], None]:
        def then(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                self.log.event("err", f"not removed until the next start: {error}", msg_id)
        return then

    def _advisory(self, why: str, msg_id: str) -> None:
        """A file the state does not hang on that was not written: told, and on."""
        if why:
            self.log.event("warning", why, msg_id)

    def _requeue(self, msg_id: str, msg: Msg, outcome: Outcome) -> None:
        """run → que (resend, or the daemon stopping): the msg with its new
        count and due is made durable off the loop first, then moved."""
        msg = dict(msg, due=time.time() + outcome.delay if outcome.delay else 0)
        self.ledger.mark_busy(msg_id, "being requeued")

        def moved(_result: Any, error: BaseException | None) -> None:
            if error is not None:
                self.log.event("err", f"new count and due not saved: {error}", msg_id)
            if self.ledger.moved(msg_id, "run", "que"):
                self.ledger.requeue(msg_id, msg)
                self.log.event("retry" if outcome.kind == "retry" else "resend", outcome.text,
                               msg_id, RQ_COUNT=msg.get("count", 0), RQ_STATE="que",
                               RQ_DUE=msg["due"],
                               **({"RQ_LAST_LINES": outcome.tail} if outcome.tail else {}))
            self.ledger.free(msg_id)

        self._offload(lambda: self.store.write_msg("run", msg_id, msg), moved)

    def fail_queued(self, msg_id: str, text: str, kind: str = "after") -> None:
        """que → err: a queued message that cannot run (what it waits for failed;
        ``kind`` "attachment": a pool message's file did not arrive whole)."""
        msg = self.ledger.unqueue(msg_id)
        guard(msg is not None, f"{msg_id} is not queued")
        self.store.write_status("que", msg_id, text)  # (a retry sets it aside)
        if not self.ledger.moved(msg_id, "que", "err"):
            return
        self.ledger.counted("err", 1)
        self.log.event("err", text, msg_id, RQ_STATE="err", RQ_KIND=kind, **batch_of(msg))

    def cancel(self, msg_id: str, text: str, done: Done) -> None:
        """que → err, ``text`` its status (a running one is the runner's to
        stop); ``done`` once durable.  A bulk action under way waits first."""
        if self.ledger.wait_while_busy(msg_id, lambda: self.cancel(msg_id, text, done), done):
            return
        why = self.ledger.busy(msg_id)
        if why:
            raise BadRequest(why)
        state = self.store.find(msg_id)
        if state != "que" or not self._in_memory(msg_id):
            raise BadRequest(f"message {msg_id} is in {state}: only a queued or running "
                             "message can be cancelled")
        self.fail_queued(msg_id, text, kind="cancel")
        dirs = [self.store.state_dir("err"), self.store.state_dir("que")]  # destination first
        self._offload(lambda: fsync_dirs(dirs), lambda _r, error: done(error))

    def _in_memory(self, msg_id: str) -> bool:
        """Whether ``msg_id`` is in the que in memory; read in first from que/ if
        it is only there (in the tail, not read yet since the start)."""
        if msg_id not in self.ledger.schedule and self.ledger.on_disk_only:
            msg = self.store.read_queued(msg_id)
            if isinstance(msg, dict):
                self.ledger.read_in(msg_id, msg)
        return msg_id in self.ledger.schedule

    # ------------------------------------------------------------ client requests
    def run_now(self, msg_id: str, done: Done) -> None:
        """que → que, due now: out of the que until its rewritten msg is durable."""
        if self.ledger.wait_while_busy(msg_id, lambda: self.run_now(msg_id, done), done):
            return
        msg = self.ledger.unqueue(msg_id) if self._in_memory(msg_id) else None
        if msg is None:
            raise BadRequest(f"message {msg_id} is not queued")
        msg = dict(msg, due=0)
        self.ledger.mark_busy(msg_id, "being rescheduled")

        def rescheduled(_result: Any, error: BaseException | None) -> None:
            self.ledger.requeue(msg_id, msg)
            self.log.record("run_now", msg_id, RQ_STATE="que")
            done(error)
            self.ledger.free(msg_id)

        self._offload(lambda: self.store.write_msg("que", msg_id, msg), rescheduled)

    def delete(self, msg_id: str, done: Done, by: str = "") -> None:
        """prep | que | done | err | relayed → gone (``removals``)."""
        self.removals.delete(msg_id, done, by)

    def prune(self, now: float, days: float, prep_days: float | None,
              done: Done) -> dict[str, int]:
        """done | relayed | acknowledged err | untouched prep → gone (``removals``)."""
        return self.removals.prune(now, days, prep_days, done)
